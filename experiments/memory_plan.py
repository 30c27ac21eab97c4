"""Per-device memory of a GRPO job before running it, and the estimate checked on CPU.

  python experiments/memory_plan.py                      # Qwen2.5 1.5B / 7B / 32B on 8 x 80 GB
  python experiments/memory_plan.py --config=configs/hf_grpo.py \
    --config.model.checkpoint=/models/Qwen2.5-7B --config.mode=tlt --devices=8   # your job
  python experiments/memory_plan.py --check_cpu          # planned vs XLA's compiled programs

With --config, the plan is that job's (`tlt_jax.configuration.memory_plan`): its policy's
shape from the checkpoint's config.json (no weight is read) or the config's model, its
update, rollout and mode on --devices devices.

The plan (`tlt_jax.parallel.memory.plan_memory`) is arithmetic on the shapes; --check_cpu
compiles the policy update and mode tlt's drafter update of small models here and compares
the planned bytes with what XLA reports for the compiled programs (arguments + outputs +
temporaries). The drafter update at Qwen3-8B's width, compiled for an H100, is compared in
experiments/deviceless.py --drafter_updates.

Each case's plan carries mode tlt's drafter update beside the rollout (`plan_drafter_update`:
`configs/hf_grpo.py`'s logit chunks and attention remat, --drafter_batch, the target's
embedding and head in the compute dtype, one copy of which every freed device set reads).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments.forwards import DrafterUpdateProgram  # noqa: E402
from tlt_jax import configuration  # noqa: E402
from tlt_jax.models.config import ModelConfig  # noqa: E402
from tlt_jax.parallel.memory import (  # noqa: E402
  compiled_update_bytes,
  format_plan,
  measured_bytes,
  plan_drafter_update,
  plan_memory,
  qwen25,
)

_CONFIG = config_flags.DEFINE_config_file("config", None, "a job's config: plan that job")
_DEVICES = flags.DEFINE_integer("devices", 8, "devices of the node")
_CAPACITY = flags.DEFINE_float("capacity_gib", 80.0, "memory per device")
_CHECK = flags.DEFINE_bool("check_cpu", False, "compare the plan with compiled programs here")
_MICRO_BATCHES = flags.DEFINE_integer(
  "micro_batches", 4, "micro-batches an optimiser step sums its gradient over"
)
_DRAFTER_BATCH = flags.DEFINE_string(
  "drafter_batch", "4x4096", "mode tlt's drafter update batch, rows x row length"
)


def check_cpu() -> None:
  print("planned update bytes vs XLA's compiled policy update (one CPU device):")
  print(
    "| model | rows x width | vocab_chunk | remat | planned MiB | measured MiB | "
    "measured / planned |"
  )
  print("|---|---|---|---|---|---|---|")
  small = ModelConfig(
    vocab_size=4096,
    num_layers=4,
    d_model=256,
    num_heads=8,
    num_kv_heads=4,
    head_dim=32,
    mlp_dim=768,
  )
  wide_vocab = ModelConfig(
    vocab_size=32768,
    num_layers=2,
    d_model=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    mlp_dim=384,
  )
  for name, model in (("small 4x256", small), ("vocab 32k", wide_vocab)):
    for rows, width, chunk, remat in (
      (4, 256, 0, False),
      (4, 256, 1024, False),
      (8, 512, 0, False),
      (8, 512, 0, True),
    ):
      plan = plan_memory(
        model,
        devices=1,
        micro_batch_rows=rows,
        row_len=width,
        rollout_rows=1,
        slots=1,
        vocab_chunk=chunk,
        remat=remat,
      )
      got = compiled_update_bytes(model, rows, width, chunk, remat=remat)
      print(
        f"| {name} | {rows} x {width} | {chunk} | {remat} | {plan.update_peak / 2**20:.1f} | "
        f"{got / 2**20:.1f} | {got / plan.update_peak:.2f} |"
      )
  print("\nplanned vs XLA's compiled drafter update (mode tlt, one CPU device):")
  print("| target | rows x width | logit_chunk | planned MiB | measured MiB | measured / planned |")
  print("|---|---|---|---|---|---|")
  for name, model in (("small 4x256", small), ("vocab 32k", wide_vocab)):
    for rows, width, setting in ((4, 256, "0"), (4, 256, "256"), (8, 512, "0"), (8, 512, "1024")):
      program = DrafterUpdateProgram(model, rows, width, setting)
      planned, got = program.planned().total, measured_bytes(program.compile()[0])
      print(
        f"| {name} | {rows} x {width} | {setting} | {planned / 2**20:.1f} | {got / 2**20:.1f} | "
        f"{got / planned:.2f} |"
      )


def plan_job(config) -> None:
  """The plan of the job `config` describes, on --devices devices."""
  model = configuration.checkpoint(config)
  source = config.model.checkpoint
  if model is None:
    model = configuration.model_config(config, configuration.tokenizer(config))
    source = "the config's model"
  plan = configuration.memory_plan(config, model, _DEVICES.value)
  n = model.num_params
  size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
  print(
    f"mode {configuration.mode(config)}, {size} parameters ({source}), {_DEVICES.value} devices"
  )
  print(format_plan(plan, _CAPACITY.value))


def main(argv):
  del argv
  if _CHECK.value:
    check_cpu()
    return
  if _CONFIG.value is not None:
    plan_job(_CONFIG.value)
    return
  n = _DEVICES.value
  drafter_rows, drafter_width = map(int, _DRAFTER_BATCH.value.split("x"))
  # One packed row per data shard per micro-batch; rollout of 128 rows with 4k-token caches.
  cases = (
    ("1.5B", 1, 4096, False),
    ("7B", 1, 2048, False),
    ("7B", 1, 4096, False),
    ("7B", 1, 4096, True),
    ("32B", 1, 2048, False),
    ("32B", 1, 4096, True),
  )
  for size, rows, width, remat in cases:
    model = qwen25(size)
    drafter = plan_drafter_update(
      model,
      rows=drafter_rows,
      width=drafter_width,
      logit_chunk=1024,
      remat_attention=True,
    )
    for tensor in (1, 2) if size == "32B" else (1,):
      plan = plan_memory(
        model,
        devices=n,
        tensor=tensor,
        micro_batch_rows=rows * n // tensor,
        row_len=width,
        rollout_rows=128,
        slots=4096,
        vocab_chunk=8192,
        rollout_tensor=tensor if size == "32B" else 1,
        remat=remat,
        micro_batches=_MICRO_BATCHES.value,
        speculative=True,
        drafter=drafter,
      )
      print(
        f"\nQwen2.5-{size} ({model.num_params / 1e9:.2f}B parameters), {n} devices, "
        f"FSDP x tensor {n // tensor} x {tensor}; update micro-batch {rows} rows x {width} "
        f"tokens per data shard, {_MICRO_BATCHES.value} micro-batches a step"
        f"{', remat' if remat else ''}, loss over 8192-entry vocabulary chunks; rollout 128 rows "
        f"x 4096 slots; mode tlt's drafter update {drafter_rows} x {drafter_width} positions"
      )
      print(format_plan(plan, _CAPACITY.value))


if __name__ == "__main__":
  app.run(main)

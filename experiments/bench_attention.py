r"""Blocked causal attention vs dense, on a job's SFT step.

The full-sequence forward (SFT, the trainer's log-prob passes) attends in query blocks that
read only the keys up to their own end (`models.attention.attend_causal`), and under key
windows only the last keys their samples hold. This times one SFT step (forward, backward,
AdamW) of the config's policy on packed rows of its task's data, for dense attention,
several block sizes and, with `--windows`, each block size with those key windows too.
Settings are interleaved round by round, so machine drift hits them alike; output: median
seconds per step and speed-up over the first setting.

  python experiments/bench_attention.py
  python experiments/bench_attention.py --blocks=0,64,128,224 --rounds=5
  python experiments/bench_attention.py --config=configs/regime.py --blocks=128 \
      --windows=256,512 --steps=3
"""

from __future__ import annotations

import json
import time

import jax
import numpy as np
from absl import app, flags
from flax import nnx
from host import format_host, host_info  # noqa: E402  (experiments/, the script's folder)
from ml_collections import config_flags

from tlt_jax import configuration
from tlt_jax.data import get_tokenizer
from tlt_jax.data.tasks import get_task, sft_pairs
from tlt_jax.models import attention, transformer
from tlt_jax.warmstart import sft

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "job config")
_BLOCKS = flags.DEFINE_list("blocks", ["0", "64", "128", "224"], "query block sizes (0: dense)")
_WINDOWS = flags.DEFINE_list("windows", [], "key windows (tokens): each block also with them")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "interleaved rounds")
_STEPS = flags.DEFINE_integer("steps", 5, "timed steps per setting and round")
_OUT = flags.DEFINE_string("out", "", "optional JSON file for the results")


def _step_seconds(setting, batch, model_cfg, sft_cfg, steps: int) -> float:
  # The block size is read when the step is traced: set it, then build a fresh jit.
  block, windows = setting
  with attention.causal_block(block or 10**9):
    graphdef, params = nnx.split(transformer.init_model(model_cfg, seed=0))
    optimizer = sft.sft_optimizer(sft_cfg)
    opt_state = optimizer.init(params)
    step = sft.make_train_step(graphdef, optimizer, windows)
    params, opt_state, m = step(params, opt_state, batch)  # compile
    jax.block_until_ready(m)
    start = time.perf_counter()
    for _ in range(steps):
      params, opt_state, m = step(params, opt_state, batch)
    jax.block_until_ready(m)
  return (time.perf_counter() - start) / steps


def main(argv):
  del argv
  config = _CONFIG.value
  tokenizer = get_tokenizer(config.task.tokenizer)
  model_cfg = configuration.model_config(config, tokenizer)
  sft_cfg = configuration.sft_config(config)
  examples = get_task(config.task.name).generate(0, 2000, **config.task.params.to_dict())
  seqs = [sft.encode_example(tokenizer, p, t) for p, t in sft_pairs(examples)]
  batch = next(sft.pack_batches(seqs, sft_cfg.batch_rows, sft_cfg.row_len, seed=0))
  windows = tuple(int(w) for w in _WINDOWS.value)
  settings = [(int(b), ()) for b in _BLOCKS.value]
  settings += [(b, windows) for b, _ in settings if b and windows]
  name = lambda s: (
    (f"block {s[0]}" if s[0] else "dense")
    + (  # noqa: E731
      f" + windows {'/'.join(map(str, s[1]))}" if s[1] else ""
    )
  )
  host = host_info()
  print(format_host(host), flush=True)
  times: dict[str, list[float]] = {name(s): [] for s in settings}
  for r in range(_ROUNDS.value):
    for s in settings:
      times[name(s)].append(_step_seconds(s, batch, model_cfg, sft_cfg, _STEPS.value))
    print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()))
  first = float(np.median(times[name(settings[0])]))
  print(f"SFT step, {sft_cfg.batch_rows} x {sft_cfg.row_len} packed rows; median s (speed-up):")
  for k, v in times.items():
    med = float(np.median(v))
    print(f"  {k:>28}: {med:.3f}  ({first / med:.2f}x)")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"host": host, **times}, f, indent=1)


if __name__ == "__main__":
  app.run(main)

"""The memory planner: its arithmetic, and its estimate against XLA's compiled update."""

import dataclasses
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.parallel.memory import (
  GIB,
  compiled_update_bytes,
  format_plan,
  measured_bytes,
  plan_drafter_update,
  plan_memory,
  qwen25,
)

SMALL = ModelConfig(
  vocab_size=4096, num_layers=4, d_model=256, num_heads=8, num_kv_heads=4, head_dim=32, mlp_dim=768
)
SHAPES = dict(micro_batch_rows=4, row_len=256, rollout_rows=16, slots=512)


def test_sharding_divides_the_update_state():
  one = plan_memory(SMALL, devices=1, **SHAPES)
  fsdp = plan_memory(SMALL, devices=8, **SHAPES)
  replicated = plan_memory(SMALL, devices=8, fsdp=False, **SHAPES)
  assert one.params == SMALL.num_params * 4
  assert fsdp.params == one.params // 8 and fsdp.optimizer == 2 * fsdp.params
  assert replicated.params == one.params
  # Rollout rows split over the 8 data replicas.
  assert fsdp.kv_cache == one.kv_cache // 8


def test_vocab_chunks_shrink_the_logits():
  full = plan_memory(SMALL, devices=1, **SHAPES)
  chunked = plan_memory(SMALL, devices=1, vocab_chunk=512, **SHAPES)
  assert chunked.logits * 8 == full.logits


def test_qwen_7b_fits_8_h100s_with_fsdp_and_not_replicated():
  model = qwen25("7B")
  assert 7.0e9 < model.num_params < 7.8e9
  # One 2048-token row per device per micro-batch (no activation rematerialisation here:
  # attention probabilities of longer rows dominate, and the plan shows it).
  shapes = dict(micro_batch_rows=8, row_len=2048, rollout_rows=128, slots=4096, vocab_chunk=8192)
  fsdp = plan_memory(model, devices=8, **shapes)
  replicated = plan_memory(model, devices=8, fsdp=False, **shapes)
  assert fsdp.peak < 80 * GIB < replicated.peak
  assert "fits" in format_plan(fsdp, 80)


@pytest.mark.parametrize("chunk", [0, 1024])
def test_plan_is_within_a_factor_of_two_of_the_compiled_update(chunk):
  model = dataclasses.replace(SMALL, num_layers=2)
  plan = plan_memory(model, devices=1, vocab_chunk=chunk, **SHAPES)
  measured = compiled_update_bytes(model, SHAPES["micro_batch_rows"], SHAPES["row_len"], chunk)
  assert 0.5 <= measured / plan.update_peak <= 2.0, (measured, plan)


def _saved_for_backward(model: ModelConfig, rows: int, width: int, remat: bool) -> int:
  """Bytes a gradient of the policy's forward keeps for its backward pass (the residuals
  jax.vjp closes over, weights included), from shapes alone."""
  graphdef, params = nnx.split(init_model(model))
  tokens = jnp.zeros((rows, width), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(width), (rows, width))

  def loss(p):
    hidden, _, _ = nnx.merge(graphdef, p)(tokens, positions, remat=remat)
    return jnp.sum(hidden**2)

  saved = jax.eval_shape(lambda p: jax.vjp(loss, p)[1], params)
  return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(saved))


def test_remat_keeps_only_layer_inputs_and_the_plan_follows():
  """Long rows: without remat every layer's activations (attention probabilities among
  them) are kept for the backward pass; with it only each layer's input. The plan's remat
  estimate (layer inputs + one layer's activations live at a time) lies between the two.
  XLA's CPU compiler does not turn this into a smaller compiled update (experiments/
  RESULTS.md, 2026-11-25, remat on XLA CPU), so the check is on what the program keeps,
  not on the CPU compiler's temporaries."""
  rows, width = 8, 512
  plain = _saved_for_backward(SMALL, rows, width, remat=False)
  remat = _saved_for_backward(SMALL, rows, width, remat=True)
  assert remat < 0.1 * plain, (remat, plain)
  shapes = dict(micro_batch_rows=rows, row_len=width, rollout_rows=1, slots=1)
  planned = plan_memory(SMALL, devices=1, remat=True, **shapes).activations
  assert planned < plan_memory(SMALL, devices=1, **shapes).activations
  assert remat < planned < plain, (remat, planned, plain)


def _jaxlib_version() -> tuple[int, int]:
  return tuple(int(p) for p in metadata.version("jaxlib").split(".")[:2])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_micro_batches_of_a_narrower_compute_dtype_hold_one_more_gradient(dtype):
  """Summing the gradient over micro-batches in bfloat16 compute over float32 masters holds
  up to one more gradient's bytes in XLA's compiled update (jaxlib 0.10: 0.35 of it here,
  with rematerialised layers, 0.76 at Qwen2.5-1.5B's shape; 0.11: none), and none in
  float32 throughout: the plan adds one gradient then, and nothing otherwise."""
  model = ModelConfig(
    vocab_size=1024,
    num_layers=2,
    d_model=512,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
    mlp_dim=2048,
    dtype=dtype,
    param_dtype="float32",
  )
  shapes = dict(micro_batch_rows=2, row_len=16, rollout_rows=1, slots=1)
  one = plan_memory(model, devices=1, **shapes)
  four = plan_memory(model, devices=1, micro_batches=4, **shapes)
  single = compiled_update_bytes(model, 2, 16, remat=True, micro_batch=2)
  summed = compiled_update_bytes(model, 8, 16, remat=True, micro_batch=2)
  added = summed - single
  if dtype == "float32":
    assert four == one and abs(added) < 0.05 * four.grads, added
  else:
    assert four.update_peak - one.update_peak == four.grad_sum == four.grads
    assert added <= 1.05 * four.grads, (added, four.grads)
    if _jaxlib_version() < (0, 11):  # the compiler the plan's extra gradient is for
      assert added >= 0.2 * four.grads, (added, four.grads)


def test_drafter_plan_follows_its_settings_and_joins_the_rollout_peak():
  """The drafter update's plan: logit chunks replace the whole batch's logits, the attention
  remat its scores, rows split over the devices; `plan_memory` counts it beside the
  rollout."""
  model = qwen25("7B")
  plan = lambda **kw: plan_drafter_update(model, rows=4, width=4096, **kw)  # noqa: E731
  whole, chunked = plan(), plan(logit_chunk=1024)
  assert whole.logits == 2 * 4 * 4096 * model.vocab_size * 4
  assert chunked.logits < whole.logits / 8
  assert plan(remat_attention=True).activations < whole.activations / 2
  assert plan(devices=4).batch * 4 == whole.batch  # one row a device
  assert plan(devices=3).batch == whole.batch  # rows that do not divide stay whole
  assert whole.head == 2 * model.vocab_size * 3584 * 2  # embedding and head, bfloat16
  shapes = dict(micro_batch_rows=8, row_len=2048, rollout_rows=128, slots=4096, vocab_chunk=8192)
  base = plan_memory(model, devices=8, **shapes)
  tlt = plan_memory(model, devices=8, drafter=chunked, **shapes)
  assert tlt.drafter == chunked.total and tlt.rollout_peak == base.rollout_peak
  assert tlt.peak == max(base.update_peak, base.rollout_peak + chunked.total)
  assert ("drafter peak", base.rollout_peak + chunked.total) in tlt.rows()


@pytest.mark.parametrize("setting", ["0", "256"])
def test_drafter_plan_is_near_the_compiled_drafter_update(setting):
  """Planned bytes against XLA's for the compiled drafter update on this CPU (XLA:CPU keeps
  about twice the plan's whole-batch logits; an H100's programs are within 0.8-1.3 of it:
  experiments/deviceless.py --drafter_updates)."""
  from experiments.forwards import DrafterUpdateProgram

  program = DrafterUpdateProgram(SMALL, 4, 256, setting)
  ratio = measured_bytes(program.compile()[0]) / program.planned().total
  assert 1.0 <= ratio <= (2.0 if setting == "0" else 1.5), ratio


def test_rollout_state_counts_hidden_states_and_the_drafter_cache():
  """Per row and slot the rollout keeps a token and log-prob (8 bytes), the hidden state when
  it captures them, and the drafter's one-layer K and V when it drafts."""
  kw = dict(devices=8, micro_batch_rows=8, row_len=256, rollout_rows=16, slots=512)
  bare = plan_memory(SMALL, capture_hidden=False, **kw)
  hidden = plan_memory(SMALL, **kw)
  spec = plan_memory(SMALL, speculative=True, **kw)
  rows_slots = 2 * 512  # 16 rows over 8 data replicas
  assert bare.rollout_state == rows_slots * 8
  assert hidden.rollout_state - bare.rollout_state == rows_slots * SMALL.d_model * 4
  assert spec.rollout_state - hidden.rollout_state == rows_slots * 2 * 4 * 32 * 4
  assert spec.rollout_peak - bare.rollout_peak == spec.rollout_state - bare.rollout_state


def test_a_jobs_plan_follows_its_config():
  """`configuration.memory_plan`: the update's micro-batch at the engine's width (or
  `pack_width`), the rollout's rows over the data replicas, FSDP, and mode tlt's drafter
  update with the config's memory settings; baseline rollouts keep no drafter cache."""
  from configs import hf_grpo
  from tlt_jax import configuration

  model = qwen25("1.5B")
  config = hf_grpo.get_config()
  config.parallel.fsdp = True
  base = configuration.memory_plan(config, model, 8)
  width = config.engine.max_prompt_len + config.engine.max_new_tokens
  same = plan_memory(
    model,
    devices=8,
    micro_batch_rows=config.rl_update.micro_batch,
    row_len=width,
    rollout_rows=config.engine.max_batch,
    slots=width,
    vocab_chunk=8192,
    remat=True,
    micro_batches=2,
    capture_hidden=False,  # baseline rollouts keep no hidden states (`train.prepare`)
  )
  assert base == same, (base, same)
  config.mode = "tlt"
  tlt = configuration.memory_plan(config, model, 8)
  drafter = plan_drafter_update(model, rows=4, width=width, logit_chunk=1024, remat_attention=True)
  assert tlt.drafter == drafter.total and tlt.rollout_state > base.rollout_state
  config.rl_update.pack_width = 512
  assert configuration.memory_plan(config, model, 8).activations < tlt.activations


def test_memory_plan_script_plans_a_checkpoints_job(tmp_path):
  """`experiments/memory_plan.py --config=...` reads the policy's shape from a checkpoint's
  config.json (the weights' headers checked, none read) and prints that job's plan."""
  import os
  import subprocess
  import sys

  from bpe_helpers import write_qwen3_checkpoint

  write_qwen3_checkpoint(tmp_path / "ckpt")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cmd = [
    sys.executable,
    "experiments/memory_plan.py",
    "--config=configs/hf_grpo.py",
    f"--config.model.checkpoint={tmp_path / 'ckpt'}",
    "--config.mode=tlt",
    "--devices=2",
    "--capacity_gib=0.001",
  ]
  done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "mode tlt" in done.stdout and f"({tmp_path / 'ckpt'})" in done.stdout, done.stdout
  assert "drafter peak" in done.stdout and "fits  NO" in done.stdout, done.stdout


def test_a_job_over_its_devices_memory_is_warned_not_refused():
  """`configuration.memory_warning`: None where the device's bytes are unknown (a CPU) or
  hold the planned peak; else a message naming the phase that peaks and the bytes."""
  from configs import hf_grpo
  from tlt_jax import configuration

  model, config = qwen25("7B"), hf_grpo.get_config()
  config.mode = "tlt"
  peak = configuration.memory_plan(config, model, 8).peak
  assert configuration.memory_warning(config, model, 8, None) is None
  assert configuration.memory_warning(config, model, 8, peak) is None
  message = configuration.memory_warning(config, model, 8, 80 * GIB)
  assert message is not None and f"{peak / GIB:.1f} GiB a device" in message, message
  assert "over the device's 80.0 GiB" in message and "update" in message, message

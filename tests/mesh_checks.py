"""Checks that need several devices; run by tests/test_parallel.py in a subprocess.

`python tests/mesh_checks.py NAME [NAME ...]` with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (set by the caller before JAX starts), or
as one of two jax.distributed processes:
`python tests/mesh_checks.py distributed PROCESS_ID PORT OUT_DIR`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tiny_models import TINY_UNTIED

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.drafter import DrafterTrainConfig, OnlineDrafter
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.transformer import init_model
from tlt_jax.parallel import BatchPlacement, data_mesh, replicated, rows_sharding
from tlt_jax.parallel.sharding import (
  ROLLOUT_RULES,
  TRAIN_RULES,
  param_shardings,
  place,
  training_mesh,
)
from tlt_jax.rl import PolicyLossConfig, UpdateConfig, make_optimizer, make_policy_update
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine

MODEL = dataclasses.replace(TINY_UNTIED, num_layers=1)
ENGINE = EngineConfig(
  max_prompt_len=8,
  max_new_tokens=24,
  max_batch=16,
  chunk_steps=4,
  min_batch_bucket=1,
  min_cache_bucket=16,
  min_prompt_bucket=8,
)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [9], [10, 11, 12, 13, 14]]
LIMITS = [3, 22, 7, 12]  # per prompt: the batch compacts 16 -> 8 -> 4 rows
GREEDY = SamplingConfig(temperature=0.0)


def _models():
  tg, tp = nnx.split(init_model(MODEL, seed=3))
  dg, dp = nnx.split(init_drafter(MODEL, seed=4))
  return tg, tp, dg, dp


@functools.cache
def _plain_reference():
  """One device's plain greedy rollout of PROMPTS x 4 (key 0), the reference of several
  checks: rolled out once a process."""
  tg, tp, _, _ = _models()
  engine = RolloutEngine(tg, MODEL, dataclasses.replace(ENGINE, spec_threshold=0), GREEDY)
  return engine.generate(tp, PROMPTS, 4, key=0, max_new_tokens=LIMITS)


def check_placement():
  placement = BatchPlacement(data_mesh())
  assert [placement.num_devices(b) for b in (16, 8, 12, 6, 3, 1)] == [8, 8, 4, 2, 1, 1]
  assert len(placement.free_devices(2)) == 6 and placement.free_devices(8) == []


def check_sharded_rollout():
  """Rows split over the mesh and compacted onto fewer devices: the same tokens as one
  device, for plain decoding and for speculative decoding with the drafter."""
  tg, tp, dg, dp = _models()
  ref = _plain_reference()
  mesh = data_mesh()
  sharded = RolloutEngine(
    tg, MODEL, dataclasses.replace(ENGINE, spec_threshold=0), GREEDY, mesh=mesh
  )
  got = sharded.generate(tp, PROMPTS, 4, key=0, max_new_tokens=LIMITS)
  np.testing.assert_array_equal(got.tokens, ref.tokens)
  np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)
  devices = {e["devices"] for e in sharded.pool.summary() if e["key"].startswith("('decode'")}
  assert {8, 4} <= devices, f"decode ran on {devices} devices: expected 16 rows on 8, 4 on 4"
  buckets = sorted({e["batch"] for e in got.timeline}, reverse=True)
  assert buckets[0] == 16 and buckets[-1] <= 4, buckets
  spec_cfg = dataclasses.replace(ENGINE, spec_threshold=8, spec_strategies=("chain3",))
  spec = RolloutEngine(tg, MODEL, spec_cfg, GREEDY, sharded.pool, dg, mesh=mesh)
  out = spec.generate(tp, PROMPTS, 4, key=0, max_new_tokens=LIMITS, drafter_params=dp)
  assert any(e["phase"] == "spec" for e in out.timeline)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  # Sampled (coupled sampling): speculative decoding on the mesh, compacting onto fewer
  # devices, draws the very tokens plain decoding draws on one device with the same key.
  sampled = SamplingConfig(temperature=1.0, top_p=0.95)
  plain_cfg = dataclasses.replace(ENGINE, spec_threshold=0)
  ref = RolloutEngine(tg, MODEL, plain_cfg, sampled).generate(
    tp, PROMPTS, 4, key=5, max_new_tokens=LIMITS
  )
  spec = RolloutEngine(tg, MODEL, spec_cfg, sampled, sharded.pool, dg, mesh=mesh)
  out = spec.generate(tp, PROMPTS, 4, key=5, max_new_tokens=LIMITS, drafter_params=dp)
  assert out.spec_summary()["row_rounds"] > 0
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-4)


def check_tensor_rollout():
  """The rollout on a ("data", "tensor") mesh: rows over 4 pairs of devices, each pair
  holding the weights split by ROLLOUT_RULES (MLP width, heads, vocabulary). Plain and
  speculative decoding, greedy and sampled, 2 samples a prompt so that the batch compacts
  8 -> 4 -> 2 rows, onto fewer pairs: the tokens one
  device draws; the pairs a compacted bucket frees are the drafter's devices."""
  tg, tp, dg, dp = _models()
  mesh = training_mesh(tensor=2)
  placement = BatchPlacement(mesh)
  assert [placement.num_devices(b) for b in (16, 8, 6, 1)] == [4, 4, 2, 1]
  assert len(placement.free_devices(2)) == 4 and placement.free_devices(8) == []
  gate = placement.weights(tp, 16)["layers"][0]["mlp"]["gate_proj"]["kernel"][...]
  assert _shard_shape(gate) == (32, 32) and len(gate.sharding.device_set) == 8
  whole = placement.replicate(tp, 16)["layers"][0]["mlp"]["gate_proj"]["kernel"][...]
  assert _shard_shape(whole) == (32, 64)
  from tlt_jax.models.transformer import KVCache

  cache = placement.rows(KVCache.zeros(MODEL, 16, 32), 16)  # 2 kv heads over each pair
  assert _shard_shape(cache.k[0]) == (4, 1, 32, MODEL.head_dim)
  plain_cfg = dataclasses.replace(ENGINE, spec_threshold=0)
  spec_cfg = dataclasses.replace(ENGINE, spec_threshold=8, spec_strategies=("chain3",))
  for sampling, key in ((GREEDY, 0), (SamplingConfig(temperature=1.0, top_p=0.95), 5)):
    ref = RolloutEngine(tg, MODEL, plain_cfg, sampling).generate(
      tp, PROMPTS, 2, key=key, max_new_tokens=LIMITS
    )
    plain = RolloutEngine(tg, MODEL, plain_cfg, sampling, mesh=mesh)
    got = plain.generate(tp, PROMPTS, 2, key=key, max_new_tokens=LIMITS)
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-4)
    devices = {e["devices"] for e in plain.pool.summary() if e["key"].startswith("('decode'")}
    assert {8, 4} <= devices, devices  # 8 rows on 4 pairs, then 2 rows on 2 pairs
    spec = RolloutEngine(tg, MODEL, spec_cfg, sampling, plain.pool, dg, mesh=mesh)
    out = spec.generate(tp, PROMPTS, 2, key=key, max_new_tokens=LIMITS, drafter_params=dp)
    assert out.spec_summary()["row_rounds"] > 0
    np.testing.assert_array_equal(out.tokens, ref.tokens)


def check_trainer_tensor_rollout():
  """GRPO with the update FSDP x tensor sharded and the rollout tensor sharded, on the
  same 4 x 2 mesh (weights resharded from the training to the rollout layout each step,
  device to device): the same samples and metrics as one device."""
  import tempfile

  ref = _reference_run()
  with tempfile.TemporaryDirectory() as b:
    mesh = training_mesh(tensor=2)
    trainer = _trainer(b, mesh, rollout_mesh=mesh, shard_params=True)
    got = trainer.run(progress=False)
  assert trainer.engine.placement.tensor == 2
  for r, g in zip(ref, got, strict=True):
    assert g["rollout_tokens"] == r["rollout_tokens"] and g["reward_mean"] == r["reward_mean"]
    for k in ("loss/loss", "loss/grad_norm", "loss/approx_kl"):
      np.testing.assert_allclose(g[k], r[k], rtol=1e-4, atol=1e-6)


def _update_inputs(tp, rows=16, width=16):
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, MODEL.vocab_size, (rows, width)).astype(np.int32)
  mask = (np.arange(width)[None] >= 4).astype(np.float32) * np.ones((rows, 1), np.float32)
  batch = {
    "tokens": tokens,
    "mask": mask,
    "old_logp": np.full((rows, width), -3.0, np.float32),
    "advantages": rng.standard_normal(rows).astype(np.float32),
  }
  return batch


def _policy_update(tg, tp, batch, mesh=None, rules=None):
  """One update; on `mesh` rows split over "data" and params replicated, or placed by
  `rules` (e.g. TRAIN_RULES: FSDP and tensor sharding)."""
  ucfg = UpdateConfig(learning_rate=1e-2, total_steps=4, micro_batch=batch["tokens"].shape[0])
  optimizer = make_optimizer(ucfg)
  shardings = None if rules is None else param_shardings(tp, mesh, rules)
  update = make_policy_update(
    tg, optimizer, PolicyLossConfig(), ucfg.micro_batch, param_sharding=shardings
  )
  params = jax.tree.map(jnp.copy, tp)
  if mesh is not None:
    params = jax.device_put(params, shardings or replicated(mesh))
    batch = jax.device_put(batch, rows_sharding(mesh))
  opt_state = optimizer.init(params)
  params, opt_state, metrics = update(params, opt_state, batch, None)
  return params, metrics, opt_state


def check_sharded_update():
  """The policy update with rows split over the train mesh equals one device's."""
  tg, tp, _, _ = _models()
  batch = _update_inputs(tp)
  ref, ref_m, _ = _policy_update(tg, tp, batch)
  got, got_m, _ = _policy_update(tg, tp, batch, data_mesh())
  leaf = jax.tree.leaves(got)[0]
  assert len(leaf.sharding.device_set) == 8
  np.testing.assert_allclose(float(got_m["loss"]), float(ref_m["loss"]), rtol=1e-5)
  np.testing.assert_allclose(float(got_m["grad_norm"]), float(ref_m["grad_norm"]), rtol=1e-5)
  # Adam's first step is ~lr * sign(g): reduction-order noise on tiny gradients moves a few
  # entries by a fraction of lr (1e-2).
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-4)


def _shard_shape(x):
  return x.addressable_shards[0].data.shape


def check_fsdp_update():
  """The policy update with parameters and optimizer state split over a 4 x 2 ("data",
  "tensor") mesh (FSDP x tensor) equals one device's; every matrix is really split."""
  tg, tp, _, _ = _models()
  batch = _update_inputs(tp)
  ref, ref_m, _ = _policy_update(tg, tp, batch)
  mesh = training_mesh(tensor=2)
  assert dict(mesh.shape) == {"data": 4, "tensor": 2}
  got, got_m, opt_state = _policy_update(tg, tp, batch, mesh, TRAIN_RULES)
  gate = got["layers"][0]["mlp"]["gate_proj"]["kernel"][...]  # [32 embed, 64 mlp]
  assert gate.shape == (32, 64) and _shard_shape(gate) == (8, 32), _shard_shape(gate)
  embed = got["embed"]["embedding"][...]  # [40 vocab, 32 embed]: vocab over tensor
  assert _shard_shape(embed) == (20, 8), _shard_shape(embed)
  # Adam's moments follow their parameters' layout.
  moments = [x for x in jax.tree.leaves(opt_state) if getattr(x, "shape", None) == (32, 64)]
  assert moments and all(_shard_shape(m) == (8, 32) for m in moments)
  np.testing.assert_allclose(float(got_m["loss"]), float(ref_m["loss"]), rtol=1e-5)
  np.testing.assert_allclose(float(got_m["grad_norm"]), float(ref_m["grad_norm"]), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-4)


def check_fsdp_forward_and_rollout():
  """Log-probs under FSDP-sharded params equal one device's; the rollout engine takes the
  sharded params (resharded device to device to its layout) and draws the same tokens;
  the rollout layout (ROLLOUT_RULES) keeps the model dimension whole."""
  from tlt_jax.rl.update import token_logprobs

  tg, tp, _, _ = _models()
  tokens = jnp.asarray(_update_inputs(tp)["tokens"])
  fn = jax.jit(lambda p, t: token_logprobs(tg, p, t, 1.0)[0])
  ref = np.asarray(fn(tp, tokens))
  mesh = training_mesh(tensor=2)
  sharded = place(tp, mesh, TRAIN_RULES)
  np.testing.assert_allclose(np.asarray(fn(sharded, tokens)), ref, atol=1e-5)
  rollout = place(sharded, mesh, ROLLOUT_RULES)
  gate = rollout["layers"][0]["mlp"]["gate_proj"]["kernel"][...]
  assert _shard_shape(gate) == (32, 32)  # embed whole, mlp over tensor
  want = _plain_reference()
  engine = RolloutEngine(
    tg, MODEL, dataclasses.replace(ENGINE, spec_threshold=0), GREEDY, mesh=data_mesh()
  )
  got = engine.generate(sharded, PROMPTS, 4, key=0, max_new_tokens=LIMITS)
  np.testing.assert_array_equal(got.tokens, want.tokens)


def check_trainer_fsdp():
  """GRPO with the update on a 4 x 2 FSDP x tensor mesh (the rollout on the 8-device data
  mesh): the same samples and metrics as one device, params split after every step."""
  import tempfile

  ref = _reference_run()
  with tempfile.TemporaryDirectory() as b:
    trainer = _trainer(b, training_mesh(tensor=2), rollout_mesh=data_mesh(), shard_params=True)
    got = trainer.run(progress=False)
  gate = trainer.params["layers"][0]["mlp"]["gate_proj"]["kernel"][...]
  assert _shard_shape(gate) == (8, 32)
  for r, g in zip(ref, got, strict=True):
    assert g["rollout_tokens"] == r["rollout_tokens"] and g["reward_mean"] == r["reward_mean"]
    for k in ("loss/loss", "loss/grad_norm", "loss/approx_kl"):
      np.testing.assert_allclose(g[k], r[k], rtol=1e-4, atol=1e-6)


def check_trainer_fsdp_tlt():
  """TLT beside the FSDP x tensor update: speculative rollouts on the 8-device data mesh,
  the online drafter trained in the idle windows there, the policy split 4 x 2 for its
  update. Lossless: the samples and the policy's metrics are one device's without SD."""
  import tempfile

  ref = _reference_run()
  with tempfile.TemporaryDirectory() as b:
    trainer = _trainer(
      b, training_mesh(tensor=2), rollout_mesh=data_mesh(), shard_params=True, tlt=True
    )
    got = trainer.run(progress=False)
  gate = trainer.params["layers"][0]["mlp"]["gate_proj"]["kernel"][...]
  assert _shard_shape(gate) == (8, 32)
  assert sum(g["drafter/updates"] for g in got) >= 1, got
  assert all(g.get("spec/tokens", 0) > 0 for g in got), got  # speculative chunks ran
  drafter = trainer.scheduler.drafter.params
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(drafter))
  for r, g in zip(ref, got, strict=True):
    assert g["rollout_tokens"] == r["rollout_tokens"] and g["reward_mean"] == r["reward_mean"]
    for k in ("loss/loss", "loss/grad_norm", "loss/approx_kl"):
      np.testing.assert_allclose(g[k], r[k], rtol=1e-4, atol=1e-6)


def check_drafter_on_freed_devices():
  """A 2-row long-tail bucket uses 2 devices; the 6 it frees train the drafter, a batch row
  each, and the update there equals one device's (replicas stay identical: one SPMD
  program), with the logit term whole and over chunks of 40 of the batch's 144 positions."""
  tg, tp, dg, dp = _models()
  placement = BatchPlacement(data_mesh())
  free = placement.free_devices(2)
  assert len(free) == 6
  sub = data_mesh(free)
  rollout = _plain_reference()

  def one(mesh, chunk):
    cfg = DrafterTrainConfig(
      learning_rate=1e-2, warmup_steps=0, batch_rows=6, row_len=24, logit_chunk=chunk
    )
    d = OnlineDrafter(dg, jax.tree.map(jnp.copy, dp), cfg, slots=ENGINE.slots, feature_dim=32)
    d.observe(rollout, step=0)
    d.update(tp, mesh=mesh)
    return d.params

  for chunk in (0, 40):
    ref, got = one(None, chunk), one(sub, chunk)
    leaf = jax.tree.leaves(got)[0]
    assert leaf.sharding.device_set == set(free)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def _tlt_on_mesh():
  """A chain3 speculative engine on all devices, a plain single-device reference rollout, an
  online drafter that has observed it, and a scheduler for the freed devices only (budget 0)."""
  from tlt_jax.scheduler import SchedulerConfig, SliceScheduler

  tg, tp, dg, dp = _models()
  ref = _plain_reference()
  cfg = dataclasses.replace(ENGINE, spec_threshold=8, spec_strategies=("chain3",))
  engine = RolloutEngine(tg, MODEL, cfg, GREEDY, drafter_graphdef=dg, mesh=data_mesh())
  train = DrafterTrainConfig(learning_rate=1e-2, warmup_steps=0, batch_rows=2, row_len=24)
  drafter = OnlineDrafter(dg, dp, train, slots=ENGINE.slots, feature_dim=32)
  drafter.observe(ref, step=0)
  sched = SliceScheduler(
    drafter,
    SchedulerConfig(rollout_budget=0.0),
    placement=engine.placement,
    batch_buckets=cfg.batch_buckets,
  )
  return tp, engine, drafter, sched, ref


def check_tlt_on_freed_devices():
  """TLT on a mesh: as the long tail compacts onto fewer devices, the scheduler trains
  the drafter on the freed ones and pushes versions at chunk boundaries; the rollout's
  tokens stay those of one device without SD."""
  tp, engine, drafter, sched, ref = _tlt_on_mesh()
  hooks = []
  for _ in range(3):
    params = sched.begin_rollout(tp)
    out = engine.generate(
      tp, PROMPTS, 4, key=0, max_new_tokens=LIMITS, drafter_params=params, on_chunk=sched.on_chunk
    )
    sched.end_rollout()
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    hooks += [e for e in out.timeline if e["phase"] == "drafter_hook" and e["pushed"]]
  rec = sched.step_records()
  assert rec["drafter/freed_device_updates"] >= 2 and rec["drafter/pushes"] >= 1, rec
  assert rec["drafter/long_tail_updates"] == 0  # budget 0: only the freed devices trained
  assert hooks and all(e["batch"] <= 8 for e in hooks)
  # one window update on all devices after the freed-device ones: the state moves back
  sched.fill("reward", iter([True] + [False] * 3).__next__, tp)
  assert len(jax.tree.leaves(drafter.params)[0].sharding.device_set) == 8


def check_freed_meshes_prepared_before_rollout():
  """The freed devices' meshes (7, 6 and 4 devices for buckets 1, 2 and 4 of 8 devices), the
  policy's part the drafter reads on each (its layers stay off them) and the drafter update
  compiled for each are prepared in
  begin_rollout, the meshes once for all rollouts: inside a rollout, which trains the
  drafter on freed devices, no mesh is built, no copy made, no update compiled."""
  from tlt_jax.scheduler import slices

  tp, engine, drafter, sched, _ = _tlt_on_mesh()
  built = []
  real_data_mesh = slices.data_mesh

  def counting(devices):
    built.append(len(devices))
    return real_data_mesh(devices)

  slices.data_mesh = counting
  for _ in range(2):
    params = sched.begin_rollout(tp)
    meshes, programs = len(built), drafter._update._cache_size()
    copies = {ids: id(x) for ids, x in sched._free_targets.items()}
    for head in sched._free_targets.values():
      assert sorted(head.keys()) == sorted(k for k in tp if k != "layers"), head.keys()
    engine.generate(
      tp, PROMPTS, 4, key=0, max_new_tokens=LIMITS, drafter_params=params, on_chunk=sched.on_chunk
    )
    assert len(built) == meshes, "a mesh was built inside the rollout"
    assert drafter._update._cache_size() == programs, "the update compiled inside the rollout"
    assert {ids: id(x) for ids, x in sched._free_targets.items()} == copies
    sched.end_rollout()
  assert sorted(built) == [4, 6, 7], built  # once per device set, not per rollout
  rec = sched.step_records()
  assert rec["drafter/freed_device_updates"] >= 2, rec
  assert "drafter/unprepared_free_sets" not in rec, rec


def check_freed_sets_share_one_head_copy():
  """A bfloat16 policy over float32 masters: `begin_rollout` casts the part the drafter reads
  once, onto every rollout device, and each freed set's arrays are views of that copy (a
  device in three freed sets holds one head, not three)."""
  from tlt_jax.scheduler import SchedulerConfig, SliceScheduler

  bf16 = dataclasses.replace(MODEL, dtype="bfloat16")
  tg, tp = nnx.split(init_model(bf16, seed=3))
  dg, dp = nnx.split(init_drafter(bf16, seed=4))
  engine = RolloutEngine(tg, bf16, ENGINE, GREEDY, drafter_graphdef=dg, mesh=data_mesh())
  drafter = OnlineDrafter(
    dg, dp, DrafterTrainConfig(batch_rows=2, row_len=24), slots=ENGINE.slots, feature_dim=32
  )
  drafter.observe(_plain_reference(), step=0)
  sched = SliceScheduler(
    drafter, SchedulerConfig(), placement=engine.placement, batch_buckets=ENGINE.batch_buckets
  )
  sched.begin_rollout(tp)

  def buffers(tree):  # (device, leaf) -> the buffer it holds there
    out = {}
    for n, leaf in enumerate(jax.tree.leaves(tree)):
      assert leaf.dtype == jnp.bfloat16, leaf.dtype
      out |= {(s.device.id, n): s.data.unsafe_buffer_pointer() for s in leaf.addressable_shards}
    return out

  copy = buffers(sched._target)
  assert len({d for d, _ in copy}) == 8  # on every rollout device
  assert len(sched._free_targets) == 3, sched._free_targets.keys()
  for head in sched._free_targets.values():
    for key, pointer in buffers(head).items():
      assert pointer == copy[key], f"a freed set holds a head copy of its own at {key}"
  sched.end_rollout()


def _trainer(workdir, mesh, rollout_mesh=None, shard_params=False, tlt=False):
  """GRPO on the tiny policy; `tlt`: chain3 speculative rollouts with an online drafter
  that a slice scheduler trains in the idle windows (TLT mode)."""
  from rl_helpers import IdTokenizer, seven_reward, tiny_grpo

  from tlt_jax.rl.trainer import GRPOTrainer
  from tlt_jax.scheduler import SchedulerConfig, SliceScheduler

  tg, tp, dg, dp = _models()
  sampling = SamplingConfig(temperature=1.0)
  cfg = dataclasses.replace(ENGINE, stop_tokens=(0,))
  if tlt:
    # No bandit: it picks arms by measured tokens/s, so on a busy host a step could run
    # plain decode throughout and the check that every step ran speculative chunks flake.
    cfg = dataclasses.replace(
      cfg, spec_threshold=16, spec_strategies=("chain3",), spec_adaptive=False
    )
  engine = RolloutEngine(
    tg, MODEL, cfg, sampling, mesh=rollout_mesh or mesh, drafter_graphdef=dg if tlt else None
  )
  scheduler = None
  if tlt:
    train = DrafterTrainConfig(learning_rate=1e-2, warmup_steps=0, batch_rows=2, row_len=24)
    scheduler = SliceScheduler(
      OnlineDrafter(dg, dp, train, slots=cfg.slots, feature_dim=32),
      SchedulerConfig(),
      placement=engine.placement,
      batch_buckets=cfg.batch_buckets,
    )
  examples = [{"question": " ".join(map(str, p)), "answer": ""} for p in PROMPTS]
  return GRPOTrainer(
    tg,
    tp,
    engine,
    IdTokenizer(),
    examples,
    examples[:2],
    seven_reward,
    lambda ex: ex["question"],
    tiny_grpo(steps=2, group_size=8, checkpoint_every=2),
    PolicyLossConfig(),
    UpdateConfig(learning_rate=1e-3, total_steps=4, micro_batch=8, mini_batches=2),
    workdir,
    mesh=mesh,
    shard_params=shard_params,
    scheduler=scheduler,
  )


@functools.cache
def _reference_run():
  """`_trainer`'s run on one device, the reference of the trainer checks: run once a
  process."""
  import tempfile

  with tempfile.TemporaryDirectory() as workdir:
    return _trainer(workdir, None).run(progress=False)


def check_trainer_on_mesh():
  """GRPO with rollout rows and update rows split over 8 devices: the same samples
  (randomness is keyed per sequence, not per device) and the same metrics as one device."""
  import tempfile

  ref = _reference_run()
  with tempfile.TemporaryDirectory() as b:
    trainer = _trainer(b, data_mesh())
    got = trainer.run(progress=False)
  assert len(jax.tree.leaves(trainer.params)[0].sharding.device_set) == 8
  for r, g in zip(ref, got):
    assert g["rollout_tokens"] == r["rollout_tokens"] and g["reward_mean"] == r["reward_mean"]
    for k in ("loss/loss", "loss/grad_norm", "loss/approx_kl"):
      np.testing.assert_allclose(g[k], r[k], rtol=1e-4, atol=1e-6)


def distributed(process_id: int, port: int, out_dir: str):
  """One of two processes: a rollout sharded over this process's devices (prompts split
  by process), then one policy update over the global mesh (both processes' devices)."""
  jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
  assert jax.process_count() == 2 and len(jax.devices()) == 2 * len(jax.local_devices())
  tg, tp, _, _ = _models()
  mine = PROMPTS[process_id::2]
  engine = RolloutEngine(
    tg, MODEL, dataclasses.replace(ENGINE, max_batch=8), GREEDY, mesh=data_mesh(jax.local_devices())
  )
  out = engine.generate(tp, mine, 4, key=0, max_new_tokens=LIMITS[process_id::2])
  batch = _update_inputs(tp, rows=8)
  mesh = data_mesh()  # global: 2 processes x local devices
  glob = lambda x, spec: jax.make_array_from_process_local_data(spec, x)
  params = jax.tree.map(lambda x: glob(np.asarray(x), replicated(mesh)), tp)
  ucfg = UpdateConfig(learning_rate=1e-2, total_steps=4, micro_batch=16)
  optimizer = make_optimizer(ucfg)
  opt_state = jax.tree.map(lambda x: glob(np.asarray(x), replicated(mesh)), optimizer.init(tp))
  gbatch = {k: glob(v, rows_sharding(mesh)) for k, v in batch.items()}
  assert gbatch["tokens"].shape[0] == 16  # 8 rows from each process
  update = make_policy_update(tg, optimizer, PolicyLossConfig(), ucfg.micro_batch)
  new, _, metrics = update(params, opt_state, gbatch, None)
  # The same update with parameters and optimizer state FSDP-split over both processes'
  # devices: each process holds a quarter of every matrix.
  from jax.experimental import multihost_utils

  shardings = param_shardings(tp, mesh, TRAIN_RULES)
  fsdp_params = jax.tree.map(
    lambda x, sh: jax.make_array_from_callback(x.shape, sh, lambda idx: np.asarray(x)[idx]),
    tp,
    shardings,
  )
  fsdp_update = make_policy_update(
    tg, optimizer, PolicyLossConfig(), ucfg.micro_batch, param_sharding=shardings
  )
  fsdp_new, _, fsdp_m = fsdp_update(fsdp_params, optimizer.init(fsdp_params), gbatch, None)
  gate = fsdp_new["layers"][0]["mlp"]["gate_proj"]["kernel"][...]
  assert gate.addressable_shards[0].data.shape == (8, 64), gate.addressable_shards[0].data.shape
  fsdp_full = multihost_utils.process_allgather(nnx.to_pure_dict(fsdp_new), tiled=True)
  local = {
    "/".join(map(str, k)): np.asarray(v.addressable_data(0))
    for k, v in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(new))
  }
  np.savez(
    os.path.join(out_dir, f"process{process_id}.npz"),
    tokens=out.tokens,
    loss=np.asarray(metrics["loss"].addressable_data(0)),
    fsdp_loss=np.asarray(fsdp_m["loss"].addressable_data(0)),
    **{f"param:{k}": v for k, v in local.items()},
    **{
      "fsdp:" + "/".join(map(str, k)): np.asarray(v)
      for k, v in jax.tree_util.tree_leaves_with_path(fsdp_full)
    },
  )
  jax.distributed.shutdown()


if __name__ == "__main__":
  if sys.argv[1] == "distributed":
    distributed(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    print("ok distributed")
  else:
    for name in sys.argv[1:]:  # several checks share one start of JAX and its compiles
      globals()[f"check_{name}"]()
      print("ok", name, flush=True)

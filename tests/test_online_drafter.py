"""Online drafter pieces: the rollout buffer, the versioned drafter, the slice scheduler."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tlt_jax.drafter import DrafterBuffer, DrafterTrainConfig, OnlineDrafter
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.transformer import init_model
from tlt_jax.scheduler import SchedulerConfig, SliceScheduler

D = 4


def _rollout(n, width, prompt_len, length, step_mark=0):
  """Rows whose token t is 100*row + t and whose feature t is (row, t, step_mark, 1)."""
  rows = np.arange(n)[:, None]
  cols = np.arange(width)[None, :]
  tokens = (100 * rows + cols).astype(np.int32)
  hidden = np.stack(
    np.broadcast_arrays(rows, cols, np.full_like(cols, step_mark), np.ones_like(cols)), -1
  ).astype(np.float32)
  return tokens, hidden, np.full((n,), prompt_len), np.asarray(length)


def test_buffer_keeps_recent_steps_and_packs_aligned_pairs():
  buf = DrafterBuffer(capacity=6, slots=16, feature_dim=D, keep_steps=2)
  with pytest.raises(ValueError, match="empty"):
    buf.sample(np.random.default_rng(0), 2, 16)
  # rows 0..2; row 1 has no response pair (length - 2 < prompt_len): skipped
  assert buf.add(*_rollout(3, 12, 3, [12, 4, 9], step_mark=0), step=0) == 2
  assert len(buf) == 2
  assert buf.add(*_rollout(2, 10, 3, [10, 8], step_mark=1), step=1) == 2
  assert len(buf) == 4
  assert buf.add(*_rollout(1, 16, 3, [16], step_mark=2), step=2) == 1
  assert len(buf) == 3  # step 0 left the window (keep_steps = 2)
  with pytest.raises(ValueError, match="older"):
    buf.add(*_rollout(1, 16, 3, [16]), step=1)
  batch = buf.sample(np.random.default_rng(0), num_rows=3, row_len=16)
  assert batch["tokens"].shape == (3, 16) and batch["features"].shape == (3, 16, D)
  used = batch["segment_ids"] > 0
  assert np.all(batch["features"][used][:, 2] >= 1)  # only steps 1 and 2
  # EAGLE alignment: input token x_{t+1} with feature f_t, target f_{t+1}
  f, tgt, tok = batch["features"][used], batch["targets"][used], batch["tokens"][used]
  np.testing.assert_array_equal(tok % 100, f[:, 1] + 1)
  np.testing.assert_array_equal(tgt[:, 1], f[:, 1] + 1)
  np.testing.assert_array_equal(tgt[:, 0], f[:, 0])
  # the ring overwrites the oldest rows
  for s in range(3, 6):
    buf.add(*_rollout(2, 16, 3, [16, 16], step_mark=s), step=s)
  assert buf.rows_added == 11 and len(buf) == 4


def test_buffer_rejects_bad_rollouts():
  buf = DrafterBuffer(capacity=4, slots=8, feature_dim=D)
  tokens, hidden, p, n = _rollout(2, 8, 2, [8, 8])
  with pytest.raises(ValueError, match="capture_hidden"):
    buf.add(tokens, None, p, n, step=0)
  with pytest.raises(ValueError, match="columns"):
    buf.add(*_rollout(2, 9, 2, [9, 9]), step=0)
  with pytest.raises(ValueError, match="feature dim"):
    buf.add(tokens, hidden[..., :3], p, n, step=0)
  with pytest.raises(ValueError, match="capacity"):
    DrafterBuffer(capacity=0, slots=8, feature_dim=D)


MODEL = ModelConfig(
  vocab_size=24, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


@pytest.fixture(scope="module")
def online():
  tg, tp = nnx.split(init_model(MODEL, seed=0))
  dg, dp = nnx.split(init_drafter(MODEL, seed=1))
  cfg = DrafterTrainConfig(learning_rate=1e-2, warmup_steps=0, batch_rows=2, row_len=24)
  drafter = OnlineDrafter(dg, dp, tg, cfg, slots=24, feature_dim=MODEL.d_model)
  # Real target features for random sequences: the drafter learns to predict them.
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, MODEL.vocab_size, (8, 24)).astype(np.int32)
  positions = np.broadcast_to(np.arange(24), tokens.shape)
  hidden, _, _ = jax.jit(lambda p, t: nnx.merge(tg, p)(t, positions))(tp, tokens)
  return drafter, tp, tokens, np.asarray(hidden)


def test_online_drafter_learns_from_its_buffer(online):
  drafter, tp, tokens, hidden = online
  with pytest.raises(ValueError, match="empty"):
    drafter.update(tp)
  drafter.buffer.add(tokens, hidden, np.full((8,), 4), np.full((8,), 24), step=0)
  losses = [float(drafter.update(tp)["loss"]) for _ in range(30)]
  assert drafter.version == 30
  assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
  with pytest.raises(ValueError, match="batch_rows"):
    DrafterTrainConfig(batch_rows=0)


class _FakeDrafter:
  """Counts updates; each one advances the fake clock by `cost` seconds."""

  def __init__(self, clock, cost):
    self.clock, self.cost = clock, cost
    self.version, self.params, self.last_metrics = 0, {"w": jnp.zeros(())}, {}
    self.buffer = [0]

  def ready(self):
    return True

  def update(self, target, mesh=None):
    self.clock.t += self.cost
    self.version += 1
    self.params = {"w": jnp.full((), float(self.version))}
    return {"loss": jnp.zeros(())}


class _Clock:
  t = 0.0

  def __call__(self):
    return self.t


def test_scheduler_keeps_the_rollout_within_its_budget():
  clock = _Clock()
  drafter = _FakeDrafter(clock, cost=0.5)
  sched = SliceScheduler(drafter, SchedulerConfig(rollout_budget=0.1, long_tail_batch=4), clock)
  sched.begin_rollout(target_params={})  # compiles + times the update before the rollout
  assert drafter.version == 2 and sched.update_seconds == 0.5
  primed = clock.t
  pushes, last = 0, 0.0
  for i in range(200):  # chunks of 0.25 s; the long tail starts at chunk 40
    clock.t += 0.25
    got = sched.on_chunk(batch=16 if i < 40 else 2)
    if i < 40:
      assert drafter.version == 2 and got is None
    if got is not None:
      pushes += 1
      assert last < got["w"] <= drafter.version  # newer versions, never an unfinished one
      last = got["w"]
    elapsed = clock.t - primed
    assert sched._charged <= 0.1 * elapsed + 1e-9
  sched.end_rollout()
  rec = sched.step_records()
  assert rec["drafter/long_tail_updates"] == drafter.version - 2 > 5
  assert rec["drafter/pushes"] == pushes > 0
  assert rec["drafter/rollout_charged_s"] <= 0.1 * (clock.t - primed)
  assert rec["drafter/prime_s"] == pytest.approx(1.0)


def test_scheduler_fills_idle_windows_and_records_them():
  clock = _Clock()
  drafter = _FakeDrafter(clock, cost=0.2)
  sched = SliceScheduler(drafter, SchedulerConfig(max_window_updates=3), clock)
  busy_until = 0.5
  assert sched.fill("reward", lambda: clock.t < busy_until, {}) == 3  # 0.2, 0.4, 0.6
  assert sched.fill("checkpoint", lambda: False, {}) == 0
  rec = sched.step_records()
  assert rec["drafter/updates"] == 3
  assert rec["drafter/reclaimed_reward_s"] == pytest.approx(0.4)
  assert rec["drafter/overshoot_reward_s"] == pytest.approx(0.2)
  assert rec["drafter/reclaimed_s"] == pytest.approx(0.4)
  assert sched.step_records()["drafter/updates"] == 0  # reset per step
  with pytest.raises(ValueError, match="rollout_budget"):
    SchedulerConfig(rollout_budget=1.0)


def test_drafter_export_round_trip(online, tmp_path):
  """The standalone artifact (safetensors + config) loads back to the same drafter and
  refuses a target of another shape."""
  import dataclasses

  from tlt_jax.drafter.export import load_drafter, save_drafter

  drafter = online[0]
  path = save_drafter(tmp_path / "drafter", drafter.params, MODEL, version=drafter.version)
  assert sorted(p.name for p in path.iterdir()) == ["drafter_config.json", "model.safetensors"]
  graphdef, params, cfg, info = load_drafter(path, MODEL)
  assert cfg == MODEL and info["version"] == drafter.version
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(drafter.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert graphdef == drafter.graphdef
  with pytest.raises(ValueError, match="d_model"):
    load_drafter(path, dataclasses.replace(MODEL, d_model=32, num_heads=4))
  with pytest.raises(FileNotFoundError, match="drafter_config"):
    load_drafter(tmp_path)

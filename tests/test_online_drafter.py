"""Online drafter pieces: the rollout buffer, the versioned drafter, the slice scheduler."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tlt_jax.drafter import DrafterBuffer, DrafterTrainConfig, OnlineDrafter
from tlt_jax.drafter.online import buffer_positions
from tlt_jax.drafter.training import batch_targets, make_training_batch
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.drafter import init_drafter, target_head_params
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
  # EAGLE alignment: input token x_{t+1} with feature f_t, target f_{t+1} (the loss's
  # columns: a segment's last has no target of its own)
  f, tok = batch["features"][used], batch["tokens"][used]
  np.testing.assert_array_equal(tok % 100, f[:, 1] + 1)
  loss = batch["loss_mask"] > 0
  tgt, f = np.asarray(batch_targets(jnp.asarray(batch["features"])))[loss], batch["features"][loss]
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


def test_buffer_state_round_trips_exactly_and_saves_only_what_sampling_reads():
  """A wrapped ring with rows of an expired step: the saved state holds only the valid rows'
  used columns, and a buffer restored from it samples the same batches now and after
  more rollouts are added (same ring slots)."""
  buf = DrafterBuffer(capacity=5, slots=16, feature_dim=D, keep_steps=2)
  for s in range(4):  # 8 rows through a 5-row ring; step 0 and 1 expire
    buf.add(*_rollout(2, 12, 3, [12, 5 + s], step_mark=s), step=s)
  arrays, meta = buf.state_dict()
  valid = np.nonzero(buf.valid())[0]
  assert meta["rows"] == valid.size == 4 and meta["width"] == 12 < buf.slots
  # The valid rows' own positions (length - 1 each), not a dense [5, 16, D] ring.
  assert arrays["features"].shape == (int(buf.held(valid).sum()), D) == (11 + 6 + 11 + 7, D)
  assert meta["next"] == 3 and meta["rows_added"] == 8
  restored = DrafterBuffer(capacity=5, slots=16, feature_dim=D, keep_steps=2)
  restored.load_state_dict(arrays, meta)
  # Copies (an asynchronous write may outlive them): later adds cannot reach the saved state.
  own = {"step": buf.step, "prompt_len": buf.prompt_len, "length": buf.length}
  own.update(tokens=buf.tokens, features=buf.features)
  assert not any(np.shares_memory(arrays[k], v) for k, v in own.items())
  for b in (buf, restored):
    assert len(b) == 4 and b._next == 3 and b._at == buf._at and b.rows_added == 8
  np.testing.assert_array_equal(restored.step, buf.step)
  np.testing.assert_array_equal(restored.tokens[valid], buf.tokens[valid])
  for r in valid:
    np.testing.assert_array_equal(restored.row_features(r), buf.row_features(r))

  def same_batches():
    for seed in range(3):
      got = restored.sample(np.random.default_rng(seed), 3, 16)
      want = buf.sample(np.random.default_rng(seed), 3, 16)
      for k in want:
        np.testing.assert_array_equal(got[k], want[k])

  same_batches()
  for b in (buf, restored):
    b.add(*_rollout(3, 16, 3, [16, 9, 14], step_mark=4), step=4)
  same_batches()
  empty = DrafterBuffer(capacity=5, slots=16, feature_dim=D)
  arrays, meta = empty.state_dict()
  assert meta["rows"] == 0 and "features" not in arrays and all(a.size for a in arrays.values())
  with pytest.raises(ValueError, match="saved drafter buffer"):
    DrafterBuffer(capacity=6, slots=16, feature_dim=D).load_state_dict(arrays, meta)
  older = {k: v for k, v in meta.items() if k not in ("positions", "at")}
  with pytest.raises(ValueError, match="older layout"):
    DrafterBuffer(capacity=5, slots=16, feature_dim=D).load_state_dict(arrays, older)


def _dense_reference(adds, capacity, keep_steps):
  """The rows a dense [capacity, S, D] ring would sample after `adds` (each rollout's rows
  with a response pair, the last `capacity` of them, within the newest `keep_steps`)."""
  kept = []
  for tokens, hidden, p, n, step in adds:
    kept += [(tokens[i], hidden[i], p[i], n[i], step) for i in range(len(n)) if n[i] - 2 >= p[i]]
  newest = kept[-1][-1]
  return [r for r in kept[-capacity:] if r[-1] > newest - keep_steps]


def test_packed_features_sample_what_whole_rows_would():
  """Rows of mixed lengths through a ring that wraps: the packed buffer (default positions:
  only the row ring drops rows) samples exactly the batches `make_training_batch` packs
  from the same rows stored whole, for the same draws."""
  rng = np.random.default_rng(1)
  buf = DrafterBuffer(capacity=5, slots=16, feature_dim=D, keep_steps=2)
  adds = []
  for step in range(5):
    n = int(rng.integers(1, 4))
    tokens, hidden, p, _ = _rollout(n, 16, 3, [16] * n, step_mark=step)
    length = rng.integers(3, 17, n)
    hidden = hidden + rng.normal(size=hidden.shape).astype(np.float32)
    buf.add(tokens, hidden, p, length, step=step)
    adds.append((tokens, hidden, p, length, step))
  rows = _dense_reference(adds, 5, 2)
  assert len(buf) == len(rows) > 1
  order = np.nonzero(buf.valid())[0]
  # The valid rows, slot by slot, are the reference's rows in ring order.
  by_slot = sorted(order, key=lambda r: (buf.step[r], (r - buf._next) % buf.capacity))
  ref = dict(zip(by_slot, rows, strict=True))
  for r, (_, hidden, p, n, step) in ref.items():
    assert (buf.length[r], buf.prompt_len[r], buf.step[r]) == (n, p, step)
    np.testing.assert_array_equal(buf.row_features(r), hidden[: n - 1])
  for seed in range(4):
    got = buf.sample(np.random.default_rng(seed), 3, 16)
    idx = np.random.default_rng(seed).permutation(order)
    take = idx[np.cumsum(buf.length[idx] - 1) <= 3 * 16]  # a sample's columns: f_0..f_{n-2}
    width = int(buf.length[take].max())
    tokens = np.stack([ref[r][0][:width] for r in take])
    dense = np.zeros((take.size, width, D), np.float32)  # whole rows, zeros past f_{n-2}
    for i, r in enumerate(take):
      dense[i, : ref[r][3] - 1] = ref[r][1][: ref[r][3] - 1]
    lengths = np.array([ref[r][3] for r in take])
    want = make_training_batch(
      tokens, dense, np.full(take.size, 3), lengths, row_len=16, num_rows=3, skip_overflow=True
    )
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])


def test_a_batch_written_over_an_earlier_one_is_the_fresh_batch():
  """`sample(out=...)` rewrites every element of an earlier batch (padding included): the
  result equals a freshly allocated batch of the same draw; other shapes are refused."""
  buf = DrafterBuffer(capacity=6, slots=16, feature_dim=D, keep_steps=2)
  buf.add(*_rollout(3, 16, 3, [16, 6, 11], step_mark=0), step=0)
  buf.add(*_rollout(2, 16, 3, [9, 16], step_mark=1), step=1)
  earlier = buf.sample(np.random.default_rng(0), 3, 16)
  for v in earlier.values():
    v[...] = 7  # no element of the rewritten batch may keep this
  fresh = buf.sample(np.random.default_rng(1), 3, 16)
  got = buf.sample(np.random.default_rng(1), 3, 16, out=earlier)
  assert all(got[k] is earlier[k] for k in fresh)
  for k in fresh:
    np.testing.assert_array_equal(got[k], fresh[k])
  with pytest.raises(ValueError, match="out holds"):
    buf.sample(np.random.default_rng(1), 2, 16, out=fresh)


def test_rows_that_outgrow_the_positions_drop_the_oldest_first():
  """With room for 30 positions (two rows of 15 at most), each new row drops the oldest
  rows whose positions it needs, even while row slots are free; the rest keep their
  features, and a row wider than the ring cannot be built."""
  buf = DrafterBuffer(capacity=8, slots=16, feature_dim=D, keep_steps=8, positions=30)
  buf.add(*_rollout(3, 16, 3, [11, 11, 11], step_mark=0), step=0)  # 10 positions each
  assert len(buf) == 3 and buf._at == 30
  buf.add(*_rollout(1, 16, 3, [16], step_mark=1), step=1)  # 15: wraps, drops two rows
  assert len(buf) == 2 and list(buf.step[:4]) == [-1, -1, 0, 1]
  np.testing.assert_array_equal(buf.row_features(2)[:, 0], np.full(10, 2.0))
  np.testing.assert_array_equal(buf.row_features(3)[:, 1], np.arange(15.0))
  batch = buf.sample(np.random.default_rng(0), 2, 16)
  assert set(np.unique(batch["features"][batch["segment_ids"] > 0][:, 2])) == {0.0, 1.0}
  with pytest.raises(ValueError, match="one full row"):
    DrafterBuffer(capacity=8, slots=16, feature_dim=D, positions=15)


def test_buffer_bytes_pay_for_the_rows_tokens_then_positions():
  """`buffer_bytes` pays for the rows' tokens, the rest for packed positions: a real
  model's width keeps every one of `buffer_rows` (whole 8,192-slot rows would fit 32); the
  buffer keeps no more positions than its rows could fill."""
  cfg = DrafterTrainConfig(buffer_rows=512, buffer_bytes=2**31)
  assert buffer_positions(cfg, 8192, 4096) == (2**31 - 512 * 8192 * 4) // 8192
  positions = buffer_positions(cfg, 3032, 256)
  buf = DrafterBuffer(512, 3032, 256, dtype=jnp.bfloat16, positions=positions)
  assert positions > 514 * 3032 == buf.features.shape[0]
  with pytest.raises(ValueError, match="one full row"):
    buffer_positions(DrafterTrainConfig(buffer_rows=512, buffer_bytes=2**24), 8192, 4096)


MODEL = ModelConfig(
  vocab_size=24, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


@pytest.fixture(scope="module")
def online():
  tg, tp = nnx.split(init_model(MODEL, seed=0))
  dg, dp = nnx.split(init_drafter(MODEL, seed=1))
  cfg = DrafterTrainConfig(learning_rate=1e-2, warmup_steps=0, batch_rows=2, row_len=24)
  drafter = OnlineDrafter(dg, dp, cfg, slots=24, feature_dim=MODEL.d_model)
  # Real target features for random sequences: the drafter learns to predict them.
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, MODEL.vocab_size, (8, 24)).astype(np.int32)
  positions = np.broadcast_to(np.arange(24), tokens.shape)
  hidden, _, _ = jax.jit(lambda p, t: nnx.merge(tg, p)(t, positions))(tp, tokens)
  return drafter, tp, tokens, np.asarray(hidden)


def test_online_drafter_learns_from_its_buffer(online):
  drafter, tp, tokens, hidden = online
  with pytest.raises(ValueError, match="holds 0 rows it may sample, fewer than min_rows=1"):
    drafter.update(tp)
  drafter.buffer.add(tokens, hidden, np.full((8,), 4), np.full((8,), 24), step=0)
  sampled = drafter.sample_seconds
  losses = [float(drafter.update(tp)["loss"]) for _ in range(30)]
  assert drafter.version == 30 and drafter.sample_seconds > sampled  # host batch building
  assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
  with pytest.raises(ValueError, match="batch_rows"):
    DrafterTrainConfig(batch_rows=0)
  with pytest.raises(ValueError, match="logit_chunk must be an int >= 0"):
    DrafterTrainConfig(logit_chunk=-1)


def test_online_updates_wait_for_min_rows_the_buffer_may_sample(online):
  """min_rows: not ready, and no update, until the buffer holds that many rows of its
  newest keep_steps steps (a step's first engine call holds a prompt or two's samples)."""
  _, tp, tokens, hidden = online
  dg, dp = nnx.split(init_drafter(MODEL, seed=1))
  cfg = DrafterTrainConfig(batch_rows=2, row_len=24, min_rows=6, keep_steps=1)
  drafter = OnlineDrafter(dg, dp, cfg, slots=24, feature_dim=MODEL.d_model)

  def add(rows, step):
    drafter.buffer.add(tokens[rows], hidden[rows], np.full((4,), 4), np.full((4,), 24), step)

  add(slice(0, 4), step=0)
  assert not drafter.ready()
  with pytest.raises(ValueError, match="holds 4 rows it may sample, fewer than min_rows=6"):
    drafter.update(tp)
  assert drafter.version == 0
  add(slice(4, 8), step=0)
  assert drafter.ready()
  drafter.update(tp)
  add(slice(0, 4), step=1)  # keep_steps=1: step 0's rows no longer count
  assert len(drafter.buffer) == 4 and not drafter.ready()
  with pytest.raises(ValueError, match="min_rows must be a positive int"):
    DrafterTrainConfig(min_rows=0)


def _fresh_like(drafter, seed):
  """A new drafter with `drafter`'s settings and other initial weights."""
  return OnlineDrafter(
    drafter.graphdef,
    nnx.split(init_drafter(MODEL, seed=seed))[1],
    drafter.config,
    slots=24,
    feature_dim=MODEL.d_model,
  )


def test_updates_read_only_the_targets_embedding_and_head(online):
  """An update given the target's part outside its layers (`target_head_params`: what a
  freed device gets a copy of) is the update given the whole target."""
  drafter, tp, tokens, hidden = online
  if not drafter.ready():
    drafter.buffer.add(tokens, hidden, np.full((8,), 4), np.full((8,), 24), step=0)
  head = target_head_params(tp)
  assert "layers" in tp and sorted(head.keys()) == sorted(k for k in tp if k != "layers")
  twin = _fresh_like(drafter, seed=1)
  twin.load_state_dict(drafter.state_dict())
  want, got = drafter.update(tp), twin.update(head)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  jax.tree.map(np.testing.assert_array_equal, twin.params, drafter.params)
  # ... in the compute dtype, as the rollout's drafts read them (this policy's is float32).
  bf16 = dataclasses.replace(MODEL, dtype="bfloat16")
  d16 = OnlineDrafter(
    *nnx.split(init_drafter(bf16, seed=1)), drafter.config, slots=24, feature_dim=MODEL.d_model
  )
  reads = d16.target_reads(nnx.split(init_model(bf16, seed=0))[1])
  assert "layers" not in reads
  assert {x.dtype for x in jax.tree.leaves(reads)} == {jnp.dtype(jnp.bfloat16)}


def test_online_drafter_dry_run_changes_nothing_and_state_round_trips(online):
  """`dry_run` (compiling and timing before a rollout) leaves the drafter as it was; the
  checkpoint state (params, optimizer state, version, buffer) restores into a fresh
  drafter whose next update equals the original's."""
  drafter, tp, tokens, hidden = online
  if not drafter.ready():
    drafter.buffer.add(tokens, hidden, np.full((8,), 4), np.full((8,), 24), step=0)
  state = drafter.state_dict()
  drafter.dry_run(tp)
  assert drafter.version == state["meta"]["version"]
  for a, b in zip(jax.tree.leaves(drafter.state_dict()["train"]), jax.tree.leaves(state["train"])):
    np.testing.assert_array_equal(a, b)
  fresh = _fresh_like(drafter, seed=5)
  fresh.load_state_dict(state)
  assert fresh.version == drafter.version and len(fresh.buffer) == len(drafter.buffer)
  a, b = drafter.update(tp), fresh.update(tp)
  assert float(a["loss"]) == float(b["loss"])
  for x, y in zip(jax.tree.leaves(drafter.params), jax.tree.leaves(fresh.params)):
    np.testing.assert_array_equal(x, y)


def test_update_compiles_once_per_layout_and_counts_its_seconds(online):
  """The first update on a layout compiles (its seconds in `compile_seconds`, which the
  trainer leaves out of step times); later ones on the same layout compile nothing. A
  buffer may hold hidden states narrower than its token rows (the engine copies only as
  wide as the rows reach): the rest is zero."""
  drafter, tp, tokens, hidden = online
  fresh = _fresh_like(drafter, seed=2)
  fresh.buffer.add(tokens, hidden[:, :20], np.full((8,), 4), np.full((8,), 20), step=0)
  assert not fresh.buffer.features[:8, 20:].any()
  assert fresh.compile_seconds == 0.0
  fresh.update(tp)
  first = fresh.compile_seconds
  assert first > 0
  fresh.update(tp)
  fresh.dry_run(tp)
  assert fresh.compile_seconds == first and fresh.version == 2


class _FakeDrafter:
  """Counts updates; each one advances the fake clock by its cost (`cost`: seconds, or a
  list cycled through, update by update). A dry run costs as much and changes nothing."""

  def __init__(self, clock, cost):
    self.clock, self.costs = clock, cost if isinstance(cost, list) else [cost]
    self.version, self.params, self.last_metrics = 0, {"w": jnp.zeros(())}, {}
    self.buffer = [0]
    self.calls = 0
    self.sample_seconds = 0.0  # host seconds building batches: 0.01 an update here
    self.on_update = lambda: None

  def ready(self):
    return True

  def target_reads(self, target):
    return target

  def _spend(self):
    self.clock.t += self.costs[self.calls % len(self.costs)]
    self.calls += 1
    self.sample_seconds += 0.01

  def dry_run(self, target, mesh=None):
    self._spend()
    return {"loss": jnp.zeros(())}

  def update(self, target, mesh=None):
    self.on_update()
    self._spend()
    self.version += 1
    self.params = {"w": jnp.full((), float(self.version))}
    return {"loss": jnp.zeros(())}


class _Clock:
  t = 0.0

  def __call__(self):
    return self.t


def test_scheduler_charges_measured_costs_within_its_budget():
  """Fake clock: long-tail updates cost 0.3-0.9 s (the estimate lags behind), each push
  forces a 0.1 s drafter-cache rebuild in the engine, reported at the next boundary.
  What is charged is what was measured, an update runs only when its estimate (update +
  rebuild running means) fits the budget left, and the charges exceed the budget by at
  most one update's and one rebuild's measured cost."""
  clock, budget, rebuild = _Clock(), 0.1, 0.1
  drafter = _FakeDrafter(clock, cost=[0.5, 0.5, 0.3, 0.9, 0.6])
  sched = SliceScheduler(drafter, SchedulerConfig(rollout_budget=budget, long_tail_batch=4), clock)
  sched.begin_rollout(target_params={})  # compiles + times the update before the rollout
  assert drafter.version == 0 and drafter.calls == 2  # dry runs: the drafter is unchanged
  assert sched.update_seconds == 0.5
  primed = clock.t
  decisions = []  # (estimate, budget left) when a long-tail update starts
  drafter.on_update = lambda: decisions.append(
    (sched.update_seconds + sched.rebuild_seconds, sched._budget_left())
  )
  measured, rebuilds, owed, pushes, last, peak = [], 0.0, 0.0, 0, 0.0, 0.0
  for i in range(200):  # chunks of 0.25 s; the long tail starts at chunk 40
    clock.t += 0.25
    before, t_before = drafter.version, clock.t
    got = sched.on_chunk(16 if i < 40 else 2, owed)
    rebuilds, owed = rebuilds + owed, 0.0
    if drafter.version > before:
      measured.append(clock.t - t_before)
    elif i >= 40:  # no update: its estimate did not fit what was left
      assert sched.update_seconds + sched.rebuild_seconds > sched._budget_left()
    if i < 40:
      assert drafter.version == 0 and got is None
    if got is not None:
      pushes += 1
      assert last < got["w"] == drafter.version  # the update just made, pushed at once
      last = got["w"]
      clock.t += rebuild  # the engine rebuilds the drafter cache for the new version
      owed = rebuild
    peak = max(peak, sched._charged - budget * (clock.t - primed))
    # Over budget by at most one update's and one rebuild's measured cost, ever.
    assert sched._charged <= budget * (clock.t - primed) + max(measured, default=0) + rebuild
  sched.on_chunk(0, owed)  # the engine's last report: the final rebuild
  rebuilds += owed
  sched.end_rollout()
  rec = sched.step_records()
  assert len(decisions) == len(measured) == drafter.version > 5
  assert all(est <= left for est, left in decisions)
  assert rec["drafter/long_tail_updates"] == drafter.version
  assert rec["drafter/pushes"] == pushes == drafter.version
  assert rec["drafter/rollout_charged_update_s"] == pytest.approx(sum(measured))
  assert rec["drafter/rollout_charged_rebuild_s"] == pytest.approx(rebuilds)
  assert rec["drafter/rollout_charged_host_s"] == 0  # the fake clock moves in updates only
  assert rec["drafter/rollout_charged_s"] == pytest.approx(sum(measured) + rebuilds)
  assert rec["drafter/rollout_budget_s"] == pytest.approx(budget * (clock.t - primed))
  assert rec["drafter/rollout_overrun_s"] == pytest.approx(peak)
  assert 0 < peak <= max(measured) + rebuild  # the lagging estimate did overrun, boundedly
  assert rec["drafter/prime_s"] == pytest.approx(1.0)
  assert sched.rebuild_seconds == pytest.approx(rebuild)


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
  assert rec["drafter/sample_s"] == pytest.approx(0.03)  # the updates' batch building
  again = sched.step_records()
  assert again["drafter/updates"] == 0 and again["drafter/sample_s"] == 0  # reset per step
  with pytest.raises(ValueError, match="rollout_budget"):
    SchedulerConfig(rollout_budget=1.0)


def test_every_step_gets_its_minimum_of_updates():
  """Fake clock, updates of 0.2 s: `finish_step` runs what the step's slices left short of
  `min_step_updates` (nothing once they reached it); `between_calls` runs the owed ones
  early, then one more per call while the last rollout's unspent budget covers the
  update's estimate; an empty buffer and min_step_updates=0 run nothing."""
  clock = _Clock()
  drafter = _FakeDrafter(clock, cost=0.2)
  sched = SliceScheduler(drafter, SchedulerConfig(min_step_updates=2), clock)
  assert sched.initial_params["w"] == 0  # the starting params, kept for drafter evaluations
  assert sched.finish_step({}) == pytest.approx(0.4) and drafter.version == 2
  rec = sched.step_records()
  assert rec["drafter/updates"] == rec["drafter/step_min_updates"] == 2
  assert rec["drafter/step_min_s"] == rec["drafter/update_s"] == pytest.approx(0.4)
  # The reward window already ran three: the minimum is met.
  sched.fill("reward", lambda: drafter.version < 5, {})
  assert sched.finish_step({}) == 0.0
  rec = sched.step_records()
  assert (rec["drafter/updates"], rec["drafter/step_min_updates"]) == (3, 0)
  # Between two engine calls: a rollout of 10 s with nothing charged leaves 0.5 s of its
  # 5% budget; the primed estimate is 0.2 s.
  sched.begin_rollout({})  # two dry runs: the estimate
  clock.t += 10.0
  sched.on_chunk(0)
  sched.end_rollout()
  before = drafter.version
  assert sched.between_calls({}) == pytest.approx(0.6)  # two owed, one budgeted
  assert sched.between_calls({}) == pytest.approx(0.2)  # one budgeted (0.3 s was left)
  assert sched.between_calls({}) == 0.0  # 0.1 s left: no update fits
  assert drafter.version == before + 4
  assert sched.finish_step({}) == 0.0  # the minimum ran early
  rec = sched.step_records()
  assert rec["drafter/step_min_updates"] == 2 and rec["drafter/between_calls_updates"] == 2
  assert rec["drafter/between_calls_s"] == pytest.approx(0.4)
  assert rec["drafter/rollout_charged_s"] == 0  # not the engine's to pay
  drafter.ready = lambda: False  # an empty buffer: nothing to train on
  assert sched.finish_step({}) == 0.0 and sched.step_records()["drafter/updates"] == 0
  off = SliceScheduler(_FakeDrafter(clock, cost=0.2), SchedulerConfig(min_step_updates=0), clock)
  assert off.finish_step({}) == 0.0 and off.drafter.version == 0
  with pytest.raises(ValueError, match="min_step_updates"):
    SchedulerConfig(min_step_updates=-1)


def test_drafter_export_round_trip(online, tmp_path):
  """The standalone artifact (safetensors + config) loads back to the same drafter and
  refuses a target of another shape."""

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


def test_offline_fit_uses_the_configs_logit_weight_and_decay(online):
  """`warmstart.drafter.fit_drafter` (the default job's and train_drafter.py's loop) on
  one buffer: the soft cross-entropy's weight changes the first loss, a cosine decay
  changes where the params end."""
  from tlt_jax.warmstart.drafter import fit_drafter

  _, tp, tokens, hidden = online

  def fit(**kw):
    dg, dp = nnx.split(init_drafter(MODEL, seed=1))
    cfg = DrafterTrainConfig(learning_rate=1e-2, warmup_steps=0, batch_rows=2, row_len=24, **kw)
    drafter = OnlineDrafter(dg, dp, cfg, slots=24, feature_dim=MODEL.d_model)
    drafter.buffer.add(tokens, hidden, np.full((8,), 4), np.full((8,), 24), step=0)
    history = fit_drafter(drafter, tp, 4, log_every=1, progress=False)
    assert [h["step"] for h in history] == [0, 1, 2, 3] and drafter.version == 4
    return history, jax.tree.leaves(drafter.params)

  base, base_params = fit()
  soft, _ = fit(logit_weight=1.0)
  decayed, decayed_params = fit(decay_steps=4)
  assert soft[0]["loss"] != pytest.approx(base[0]["loss"])
  assert decayed[0]["loss"] == pytest.approx(base[0]["loss"])  # before any update
  assert any(not np.allclose(a, b) for a, b in zip(base_params, decayed_params))
  with pytest.raises(ValueError, match="decay_steps"):
    DrafterTrainConfig(warmup_steps=5, decay_steps=5)
  with pytest.raises(ValueError, match="logit_weight"):
    DrafterTrainConfig(logit_weight=-1.0)

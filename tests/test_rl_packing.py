"""Packed policy batches: the layout is lossless and a packed update equals the padded one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tiny_models import TINY_ONE_LAYER

from tlt_jax.models.attention import causal_block
from tlt_jax.models.transformer import init_model
from tlt_jax.rl import PolicyLossConfig, make_policy_update, token_logprobs
from tlt_jax.rl.loss import AGGREGATIONS
from tlt_jax.rl.packing import pack_policy_batch, plan_packing, token_weights

MODEL = TINY_ONE_LAYER
N, T, WIDTH = 8, 24, 32


@pytest.fixture(scope="module")
def model():
  return nnx.split(init_model(MODEL, seed=3))


def _samples(seed=0):
  """N long-tailed samples: prompt 2-4 tokens, total length 3..T, padded to T."""
  rng = np.random.default_rng(seed)
  length = np.minimum(3 + rng.geometric(0.15, N), T).astype(np.int32)
  length[0] = T  # one straggler fills most of a row
  prompt = rng.integers(2, 5, N)
  tokens = rng.integers(1, MODEL.vocab_size, (N, T)).astype(np.int32)
  cols = np.arange(T)[None]
  tokens[cols >= length[:, None]] = 0
  mask = ((cols >= prompt[:, None]) & (cols < length[:, None])).astype(np.float32)
  old = (-2.0 + 0.3 * rng.standard_normal((N, T))).astype(np.float32) * mask
  adv = rng.standard_normal(N).astype(np.float32)
  return dict(tokens=tokens, length=length, mask=mask, old_logp=old, advantages=adv)


def test_plan_packs_without_overlap_and_round_trips():
  s = _samples()
  plan = plan_packing(s["length"], WIDTH, row_multiple=4)
  assert plan.num_rows % 4 == 0 and plan.num_rows < N
  occupied = np.zeros((plan.num_rows, WIDTH), int)
  for r, c, n in zip(plan.row, plan.col, plan.length, strict=True):
    assert c + n <= WIDTH
    occupied[r, c : c + n] += 1
  assert occupied.max() == 1 and occupied.sum() == s["length"].sum()
  packed = plan.pack(s["tokens"])
  back = plan.unpack(packed, T)
  np.testing.assert_array_equal(back, s["tokens"])  # tails are 0 in both
  # Deterministic: the same lengths give the same plan.
  again = plan_packing(s["length"], WIDTH, row_multiple=4)
  np.testing.assert_array_equal(again.row, plan.row)
  np.testing.assert_array_equal(again.col, plan.col)


def test_pow2_rows_pad_to_the_multiple_times_a_power_of_two():
  # Ten samples of 8 columns fill 10 rows of 8: multiples of 4 -> 12, powers -> 4 x 4 = 16.
  lengths = np.full(10, 8)
  assert plan_packing(lengths, 8, row_multiple=4).num_rows == 12
  plan = plan_packing(lengths, 8, row_multiple=4, pow2_rows=True)
  assert plan.num_rows == 16
  np.testing.assert_array_equal(plan.row, plan_packing(lengths, 8, row_multiple=4).row)
  rows = {n: plan_packing(np.full(n, 8), 8, 3, pow2_rows=True).num_rows for n in (1, 3, 4, 7, 13)}
  assert rows == {1: 3, 3: 3, 4: 6, 7: 12, 13: 24}


def test_min_rows_floors_the_row_count_so_batches_share_one_program():
  """Rows padded to at least min_rows (rounded to the multiple, then to a power of two):
  batches of 1..min_rows rows all get min_rows; a larger one grows as without the floor."""
  rows = {
    n: plan_packing(np.full(n, 8), 8, 4, pow2_rows=True, min_rows=16).num_rows
    for n in (1, 5, 16, 17)
  }
  assert rows == {1: 16, 5: 16, 16: 16, 17: 32}
  assert plan_packing(np.full(3, 8), 8, 4, min_rows=6).num_rows == 8
  plan = plan_packing(np.full(3, 8), 8, 4, min_rows=16)
  np.testing.assert_array_equal(plan.row, plan_packing(np.full(3, 8), 8, 4).row)


def test_per_token_advantages_are_packed_as_given():
  s = _samples(5)
  per_sample = s["advantages"]
  s["advantages"] = np.random.default_rng(5).standard_normal((N, T)).astype(np.float32)
  batch, plan = pack_policy_batch(**s, aggregation="token-mean", width=WIDTH)
  np.testing.assert_array_equal(
    plan.unpack(batch["advantages"], T) * s["mask"], s["advantages"] * s["mask"]
  )
  s["advantages"] = per_sample  # one per sample: broadcast over its tokens
  batch, plan = pack_policy_batch(**s, aggregation="token-mean", width=WIDTH)
  np.testing.assert_array_equal(
    plan.unpack(batch["advantages"], T) * s["mask"], per_sample[:, None] * s["mask"]
  )


def test_plan_rejects_bad_input():
  with pytest.raises(ValueError, match="columns"):
    plan_packing(np.array([3, 40]), WIDTH)
  with pytest.raises(ValueError, match="columns"):
    plan_packing(np.array([0, 3]), WIDTH)
  with pytest.raises(ValueError, match="non-empty"):
    plan_packing(np.array([], int), WIDTH)
  with pytest.raises(ValueError, match="aggregation"):
    token_weights(np.ones((2, 3)), "sum")


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_token_weights_reproduce_the_aggregation(aggregation):
  s = _samples(1)
  x = np.random.default_rng(0).standard_normal((N, T)).astype(np.float32)
  m = s["mask"]
  expect = {
    "token-mean": (x * m).sum() / m.sum(),
    "seq-mean-token-mean": np.mean((x * m).sum(1) / np.maximum(m.sum(1), 1)),
    "seq-mean-token-sum": np.mean((x * m).sum(1)),
  }[aggregation]
  np.testing.assert_allclose((token_weights(m, aggregation) * x).sum(), expect, rtol=1e-5)


def test_packed_logprobs_equal_each_sample_alone(model):
  graphdef, params = model
  s = _samples(2)
  batch, plan = pack_policy_batch(**s, aggregation="token-mean", width=WIDTH)
  logp = jax.jit(
    lambda p, t, pos=None, seg=None: token_logprobs(
      graphdef, p, t, 1.0, positions=pos, segment_ids=seg
    )[0]
  )
  packed = logp(params, batch["tokens"], batch["positions"], batch["segment_ids"])
  alone = np.asarray(logp(params, s["tokens"]))
  got = plan.unpack(np.asarray(packed), T)
  for n in range(N):
    k = int(s["length"][n])
    # Token 0 of a packed sample is predicted by its neighbour: never a counted token.
    np.testing.assert_allclose(got[n, 1:k], alone[n, 1:k], atol=2e-5)
  # Without segment ids the samples would see each other: the check can fail.
  leaky = logp(params, batch["tokens"], batch["positions"])
  assert np.max(np.abs(plan.unpack(np.asarray(leaky), T) - got)) > 1e-3


def _tree_close(a, b, atol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_packed_update_equals_padded_update(model, aggregation):
  graphdef, params = model
  s = _samples(3)
  # Plain SGD at lr 1: the parameter change IS the gradient. A KL term and an
  # entropy bonus exercise every per-token input of the loss.
  sgd = optax.sgd(1.0)
  cfg = PolicyLossConfig(aggregation=aggregation, clip_high=0.28, kl_coef=0.05, entropy_coef=0.01)
  ref = jax.tree.map(lambda x: x + 0.01, params)
  padded = {k: s[k] for k in ("tokens", "mask", "old_logp", "advantages")}
  fn = make_policy_update(graphdef, sgd, cfg, N)
  copy = lambda t: jax.tree.map(jnp.copy, t)
  want, _, m_want = fn(copy(params), sgd.init(params), padded, ref)
  batch, plan = pack_policy_batch(**s, aggregation=aggregation, width=WIDTH, row_multiple=2)
  assert plan.num_rows > 2
  fn = make_policy_update(graphdef, sgd, cfg, 2)  # micro-batches of 2 packed rows
  got, _, m_got = fn(copy(params), sgd.init(params), batch, ref)
  _tree_close(got, want, atol=2e-5)
  for k in ("loss", "grad_norm", "ratio_mean", "clip_fraction_low", "kl", "entropy"):
    np.testing.assert_allclose(m_got[k], m_want[k], rtol=1e-4, atol=1e-6, err_msg=k)
  moved = max(
    float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(params))
  )
  assert moved > 1e-3


def test_key_windows_leave_the_packed_update_unchanged(model):
  graphdef, params = model
  s = _samples(5)
  sgd = optax.sgd(1.0)
  cfg = PolicyLossConfig(clip_high=0.28, entropy_coef=0.01)
  batch, _ = pack_policy_batch(**s, aggregation="token-mean", width=WIDTH, row_multiple=2)
  copy = lambda t: jax.tree.map(jnp.copy, t)
  out = {}
  for windows in ((), (8, 16)):
    fn = make_policy_update(graphdef, sgd, cfg, 2, key_windows=windows)
    with causal_block(8):  # query blocks of 8 over rows of 32: windows of 8 and 16 apply
      out[windows] = fn(copy(params), sgd.init(params), batch, None)
  (want, _, m_want), (got, _, m_got) = out[()], out[(8, 16)]
  _tree_close(got, want, atol=2e-5)
  np.testing.assert_allclose(m_got["loss"], m_want["loss"], rtol=1e-5)
  with pytest.raises(ValueError, match="key_windows"):
    make_policy_update(graphdef, sgd, cfg, 2, key_windows=(0,))


def test_partial_packed_batch_is_an_error(model):
  graphdef, params = model
  s = _samples(4)
  batch, _ = pack_policy_batch(**s, aggregation="token-mean", width=WIDTH)
  del batch["weights"]
  fn = make_policy_update(graphdef, optax.sgd(1.0), PolicyLossConfig(), 1)
  with pytest.raises(ValueError, match="packed batch needs"):
    fn(params, optax.sgd(1.0).init(params), batch, None)

"""Speculative decoding program: greedy exactness against plain decoding, cache, stops."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tlt_jax.decode.drafting import Draft, prefill_drafter_cache
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.transformer import init_model
from tlt_jax.rollout import programs
from tlt_jax.rollout.profile import round_cut_after
from tlt_jax.rollout.speculative import RoundStages, SpecStrategy, run_rounds, spec_decode_chunk

CFG = ModelConfig(
  vocab_size=40, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64
)
S = 40  # target cache slots = view_len
DS = S + 8  # drafter cache slots: room for drafts past the last committed position
PROMPTS = np.array([[3, 7, 1, 9, 4, 0, 0], [5, 2, 8, 0, 0, 0, 0], [1, 6, 2, 3, 11, 12, 13]])
PROMPT_LEN = np.array([5, 3, 7])
MAX_NEW = np.array([20, 13, 25])
CHAIN = SpecStrategy("chain", depth=3)
TREE = SpecStrategy("tree", depth=3, topk=2, num_nodes=6)
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def models():
  tg, tp = nnx.split(init_model(CFG, seed=1))
  dg, dp = nnx.split(init_drafter(CFG, seed=2))
  return tg, tp, dg, dp


def _static(stop_tokens=()):
  return programs.DecodeStatic(sampling=GREEDY, stop_tokens=stop_tokens, capture_hidden=True)


@functools.cache
def _prefill_fn(tg, static, slots=S, cache_slots=None, max_new=tuple(MAX_NEW)):
  return jax.jit(
    lambda tp, key: programs.prefill(
      tg,
      tp,
      jnp.asarray(PROMPTS),
      jnp.asarray(PROMPT_LEN),
      jnp.arange(3),
      jnp.arange(3),
      jnp.asarray(max_new),
      key,
      static=static,
      slots=slots,
      cache_slots=cache_slots,
    )
  )


@functools.cache
def _decode_fn(tg, static):
  return jax.jit(
    lambda tp, st, key: programs.decode_chunk(
      tg, tp, st, key, jnp.int32(100), static=static, view_len=S
    )[0]
  )


@functools.cache
def _drafter_prefill_fn(tg, dg):
  return jax.jit(
    lambda tp, dp, st: prefill_drafter_cache(
      dg, dp, tg, tp, st.tokens, st.hidden, st.length, slots=DS
    )
  )


def _oracle(tg, tp, strategy):
  """A test drafter that proposes the target's own greedy continuation.

  Chains corrupt one token in some rows (partial acceptance); trees differ per
  row and put the greedy path on non-consecutive nodes (the K/V gather).
  """
  depth = strategy.depth

  def fn(st, dcache, dlen):
    model = nnx.merge(tg, tp)
    base = st.length - 1
    tok = st.tokens[jnp.arange(st.batch), base]
    cache, greedy = st.cache, [tok]
    for i in range(depth):
      h, cache, _ = model(tok[:, None], (base + i)[:, None], cache=cache, cache_len=base + i)
      tok = jnp.argmax(model.logits(h[:, 0]), axis=-1).astype(jnp.int32)
      greedy.append(tok)
    g = jnp.stack(greedy, axis=1)  # [B, depth + 1]: root, g1 .. g_depth
    wrong = (g + 1) % CFG.vocab_size
    b = st.batch
    if strategy.kind == "chain":
      cut = 1 + st.length % (depth + 2)  # > depth: no corruption
      idx = jnp.arange(depth + 1)[None]
      tokens = jnp.where(idx == cut[:, None], wrong, g)
      parents = jnp.broadcast_to(jnp.arange(-1, depth), (b, depth + 1))
      dep = jnp.broadcast_to(jnp.arange(depth + 1), (b, depth + 1))
    else:
      assert depth == 3 and strategy.nodes == 6
      r, g1, g2, g3 = (g[:, i] for i in range(4))
      # Layout A: path 0, 2, 4, 5 behind higher-ranked wrong siblings.
      tok_a = jnp.stack([r, wrong[:, 1], g1, wrong[:, 2], g2, g3], axis=1)
      par_a, dep_a = jnp.array([-1, 0, 0, 2, 2, 4]), jnp.array([0, 1, 1, 2, 2, 3])
      # Layout B: path 0, 1, 2, 5.
      tok_b = jnp.stack([r, g1, g2, wrong[:, 1], wrong[:, 3], g3], axis=1)
      par_b, dep_b = jnp.array([-1, 0, 1, 0, 2, 2]), jnp.array([0, 1, 2, 1, 3, 3])
      odd = (st.seq_id % 2 == 1)[:, None]
      tokens = jnp.where(odd, tok_b, tok_a)
      parents = jnp.where(odd, par_b[None], par_a[None])
      dep = jnp.where(odd, dep_b[None], dep_a[None])
    ones = jnp.ones(tokens.shape, jnp.float32)
    draft = Draft(
      tokens=tokens.astype(jnp.int32),
      parents=parents.astype(jnp.int32),
      valid=jnp.ones(tokens.shape, bool),
      depth=dep.astype(jnp.int32),
      probs=ones,
      scores=ones,
    )
    return draft, dcache

  return fn


@functools.cache
def _spec_fn(tg, dg, static, strategy, oracle, view_len=S):
  def run(tp, dp, st, dcache, dlen, key, rounds):
    draft_fn = _oracle(tg, tp, strategy) if oracle else None
    return spec_decode_chunk(
      tg,
      tp,
      dg,
      dp,
      st,
      dcache,
      dlen,
      key,
      rounds,
      static=static,
      strategy=strategy,
      view_len=view_len,
      draft_fn=draft_fn,
    )

  return jax.jit(run)


def _run_both(models, strategy, oracle, stop_tokens=()):
  tg, tp, dg, dp = models
  static = _static(stop_tokens)
  key = jax.random.key(0)
  st0 = _prefill_fn(tg, static)(tp, key)
  ref = _decode_fn(tg, static)(tp, st0, key)
  dcache, dlen = _drafter_prefill_fn(tg, dg)(tp, dp, st0)
  st, total = st0, None
  spec = _spec_fn(tg, dg, static, strategy, oracle)
  for _ in range(30):  # several chunks of a few rounds: state carries across calls
    st, dcache, dlen, stats = spec(tp, dp, st, dcache, dlen, key, jnp.int32(4))
    acc = np.asarray(stats.accepted)
    total = acc if total is None else total + acc
    if bool(np.all(st.done)):
      break
  return st0, ref, st, dcache, dlen, total


def _assert_same(ref, st):
  np.testing.assert_array_equal(st.length, ref.length)
  assert bool(np.all(st.done))
  for b in range(ref.batch):
    n = int(ref.length[b])
    np.testing.assert_array_equal(st.tokens[b, :n], ref.tokens[b, :n])
    np.testing.assert_allclose(st.logprobs[b, :n], ref.logprobs[b, :n], atol=1e-4)
    np.testing.assert_allclose(st.hidden[b, : n - 1], ref.hidden[b, : n - 1], atol=1e-5)
    # The committed cache slots equal those plain decoding builds.
    for layer in range(CFG.num_layers):
      np.testing.assert_allclose(
        st.cache.k[layer][b, :, : n - 1], ref.cache.k[layer][b, :, : n - 1], atol=1e-5
      )
      np.testing.assert_allclose(
        st.cache.v[layer][b, :, : n - 1], ref.cache.v[layer][b, :, : n - 1], atol=1e-5
      )
    # Nothing is written past the row's length.
    assert not np.any(np.asarray(st.tokens[b, n:]))


@pytest.mark.parametrize(
  "strategy,oracle",
  [(CHAIN, False), (CHAIN, True), (TREE, False), (TREE, True)],
  ids=["chain-drafter", "chain-oracle", "tree-drafter", "tree-oracle"],
)
def test_greedy_matches_plain_decoding(models, strategy, oracle):
  st0, ref, st, dcache, dlen, accepted = _run_both(models, strategy, oracle)
  np.testing.assert_array_equal(ref.length, np.asarray(st0.prompt_len) + MAX_NEW)
  _assert_same(ref, st)
  if oracle:  # multi-token acceptance went through the K/V commit path
    assert accepted.min() > 0 and accepted.sum() > 10
  # The drafter cache's committed slots equal a fresh prefill from the final state.
  tg, tp, dg, dp = models
  fresh, fresh_len = _drafter_prefill_fn(tg, dg)(tp, dp, st)
  np.testing.assert_array_equal(dlen, fresh_len)
  for b in range(st.batch):
    n = int(dlen[b])
    np.testing.assert_allclose(dcache.k[0][b, :, :n], fresh.k[0][b, :, :n], atol=1e-5)
    np.testing.assert_allclose(dcache.v[0][b, :, :n], fresh.v[0][b, :, :n], atol=1e-5)


def test_stop_tokens_and_max_len(models):
  tg, tp, _, _ = models
  # Pick stop tokens from the unstopped greedy text, so some rows stop mid-round.
  _, ref, _, _, _, _ = _run_both(models, CHAIN, True)
  stop = (int(ref.tokens[0, PROMPT_LEN[0] + 6]), int(ref.tokens[2, PROMPT_LEN[2] + 9]))
  _, ref_s, st, _, _, _ = _run_both(models, CHAIN, True, stop_tokens=stop)
  _assert_same(ref_s, st)
  for b in range(st.batch):
    n = int(st.length[b])
    gen = np.asarray(st.tokens[b, PROMPT_LEN[b] : n])
    assert n <= PROMPT_LEN[b] + MAX_NEW[b]
    hits = np.flatnonzero(np.isin(gen, stop))
    if hits.size:  # a row ends exactly at its first stop token
      assert hits[0] == gen.size - 1
    else:
      assert n == PROMPT_LEN[b] + MAX_NEW[b]
  assert np.any(np.asarray(st.length) < PROMPT_LEN + MAX_NEW)


def test_sampling_runs_within_limits(models):
  tg, tp, dg, dp = models
  static = programs.DecodeStatic(
    sampling=SamplingConfig(temperature=1.0), stop_tokens=(), capture_hidden=True
  )
  key = jax.random.key(3)
  st = _prefill_fn(tg, static)(tp, key)
  dcache, dlen = _drafter_prefill_fn(tg, dg)(tp, dp, st)
  spec = _spec_fn(tg, dg, static, CHAIN, True)
  st, dcache, dlen, stats = spec(tp, dp, st, dcache, dlen, key, jnp.int32(100))
  assert bool(np.all(st.done))
  np.testing.assert_array_equal(st.length, PROMPT_LEN + MAX_NEW)
  np.testing.assert_array_equal(stats.emitted, MAX_NEW - 1)  # prefill sampled the first
  for b in range(st.batch):
    gen = slice(PROMPT_LEN[b], int(st.length[b]))
    assert np.all((np.asarray(st.tokens[b, gen]) >= 0) & (st.tokens[b, gen] < CFG.vocab_size))
    lp = np.asarray(st.logprobs[b, gen])
    assert np.all(np.isfinite(lp)) and np.all(lp <= 0)


SE = 16  # token slots of the buffer-end test: every row runs to the last slot


@pytest.mark.parametrize(
  "strategy,oracle",
  [
    (SpecStrategy("chain", depth=6), False),
    (SpecStrategy("chain", depth=6), True),
    (SpecStrategy("tree", depth=4, topk=2, num_nodes=8), False),
  ],
  ids=["chain6-drafter", "chain6-oracle", "tree4x2x8-drafter"],
)
def test_drafter_cache_at_buffer_end(models, strategy, oracle):
  """Rows that run to the last token slot: the drafter pairs committed in the last
  rounds (whose max_emit-wide token/feature windows reach past the buffer end) sit
  at their own positions, so the drafter cache equals a fresh prefill."""
  tg, tp, dg, dp = models
  static = _static()
  key = jax.random.key(0)
  max_new = SE - PROMPT_LEN
  ds = SE + strategy.drafter_slots  # as EngineConfig.drafter_slots
  # Cache and drafter slots as EngineConfig.cache_slots / drafter_slots give them.
  prefill = _prefill_fn(tg, static, SE, SE + strategy.nodes - 1, tuple(int(m) for m in max_new))
  st = prefill(tp, key)
  prefill_d = jax.jit(
    lambda st: prefill_drafter_cache(dg, dp, tg, tp, st.tokens, st.hidden, st.length, slots=ds)
  )
  dcache, dlen = prefill_d(st)

  spec = _spec_fn(tg, dg, static, strategy, oracle, SE + strategy.nodes - 1)
  st, dcache, dlen, stats = spec(tp, dp, st, dcache, dlen, key, jnp.int32(100))
  assert bool(np.all(st.done))
  np.testing.assert_array_equal(st.length, SE)
  if oracle:  # multi-token rounds: some windows started within max_emit of the end
    assert int(np.asarray(stats.accepted).min()) > 0
  fresh, fresh_len = prefill_d(st)
  np.testing.assert_array_equal(dlen, fresh_len)
  for b in range(st.batch):
    n = int(dlen[b])
    np.testing.assert_allclose(dcache.k[0][b, :, :n], fresh.k[0][b, :, :n], atol=1e-5)
    np.testing.assert_allclose(dcache.v[0][b, :, :n], fresh.v[0][b, :, :n], atol=1e-5)


def test_rounds_cut_after_a_stage_keep_what_they_claim(models):
  """The cost profile's cut rounds (`profile.round_cut_after`): rounds cut before the commit
  leave the tokens alone; rounds cut before the drafter-cache extension still commit
  exactly (verification keeps the output the target's whatever the drafts); the whole
  round is `spec_decode_chunk`'s; an unknown stage is refused."""
  tg, tp, dg, dp = models
  static, key = _static(), jax.random.key(0)
  st0 = _prefill_fn(tg, static)(tp, key)
  dcache, dlen = _drafter_prefill_fn(tg, dg)(tp, dp, st0)

  def run(stop, rounds=6):
    def fn(tp, dp, st, dc, dl, k):
      stages = RoundStages.build(
        tg, tp, dg, dp, dc, k, static=static, strategy=CHAIN, view_len=S, cache_slots=st.cache.slots
      )
      return run_rounds(round_cut_after(stages, stop), st, dc, dl, jnp.int32(rounds))

    return jax.jit(fn)(tp, dp, st0, dcache, dlen, key)

  full, commit = run("extend"), run("commit")
  reference = _spec_fn(tg, dg, static, CHAIN, None, S)(tp, dp, st0, dcache, dlen, key, jnp.int32(6))
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(reference), strict=True):
    np.testing.assert_array_equal(a, b)
  assert (np.asarray(commit[0].length) > np.asarray(st0.length)).all()
  for b in range(3):
    n = int(min(commit[0].length[b], full[0].length[b]))
    np.testing.assert_array_equal(commit[0].tokens[b, :n], full[0].tokens[b, :n])
  for stop in ("draft", "forward", "verify"):
    st, _, _, stats = run(stop)
    np.testing.assert_array_equal(st.length, st0.length)
    np.testing.assert_array_equal(st.tokens, st0.tokens)
    assert int(stats.rounds) == 6
  with pytest.raises(ValueError, match="stop must be one of"):
    run("bogus")

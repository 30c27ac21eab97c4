"""EAGLE drafter: cached forward, cache prefill, chain / tree drafting, training."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tlt_jax.decode import drafting
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.decode.verify import verify_chain, verify_sampling
from tlt_jax.drafter import (
  batch_targets,
  drafter_loss,
  drafter_optimizer,
  make_drafter_update,
  make_training_batch,
)
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.drafter import (
  Drafter,
  check_drafter_matches,
  draft_logits,
  drafter_forward,
  init_drafter,
  init_drafter_cache,
)
from tlt_jax.models.precision import head_precision
from tlt_jax.models.transformer import Transformer, init_model

CFG = ModelConfig(
  vocab_size=40, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64
)
GREEDY = SamplingConfig(temperature=0.0)
B, W = 3, 12  # context rows and buffer width
LENGTHS = np.array([12, 7, 9])
PAD = 24  # width of single-row reference forwards: one compiled program for all


@dataclasses.dataclass
class Setup:
  tg: nnx.GraphDef
  tp: nnx.State
  dg: nnx.GraphDef
  dp: nnx.State
  tokens: np.ndarray  # [B, W]
  hidden: np.ndarray  # [B, W, D] target features f_t
  fwd: object  # uncached drafter forward, jitted
  head: object  # draft logits, jitted


@pytest.fixture(scope="module")
def s() -> Setup:
  target = init_model(CFG, seed=3)
  # A wider embedding spreads the (tied) logits: no near-ties in argmax / top-k.
  target.embed.embedding[...] = target.embed.embedding[...] * 40.0
  tg, tp = nnx.split(target)
  dg, dp = nnx.split(init_drafter(CFG, seed=4))
  tokens = jax.random.randint(jax.random.key(0), (B, W), 0, CFG.vocab_size)
  hidden, _, _ = jax.jit(
    lambda p, t: nnx.merge(tg, p)(t, jnp.broadcast_to(jnp.arange(W), t.shape))
  )(tp, tokens)
  fwd = jax.jit(functools.partial(drafter_forward, dg, dp, tg, tp))
  head = jax.jit(functools.partial(draft_logits, tg, tp))
  return Setup(tg, tp, dg, dp, np.asarray(tokens), np.asarray(hidden), fwd, head)


def _positions(b, t, start=0):
  return jnp.broadcast_to(jnp.arange(start, start + t, dtype=jnp.int32), (b, t))


def test_cached_forward_matches_uncached(s):
  toks = jnp.asarray(s.tokens[:, 1:])  # [B, 11]
  feats = jnp.asarray(s.hidden[:, :-1])
  t = toks.shape[1]
  full, _ = s.fwd(toks, feats, _positions(B, t))
  fwd_c = jax.jit(
    functools.partial(drafter_forward, s.dg, s.dp, s.tg, s.tp), static_argnames="view_len"
  )
  cache = init_drafter_cache(CFG, B, 16)
  h, cache = fwd_c(
    toks[:, :4], feats[:, :4], _positions(B, 4), cache=cache, cache_len=jnp.zeros(B, jnp.int32)
  )
  np.testing.assert_allclose(h, full[:, :4], atol=1e-5)
  for i in range(4, 8):  # step by step, reading a 12-slot view
    h, cache = fwd_c(
      toks[:, i : i + 1],
      feats[:, i : i + 1],
      _positions(B, 1, i),
      cache=cache,
      cache_len=jnp.full((B,), i, jnp.int32),
      view_len=12,
    )
    np.testing.assert_allclose(h[:, 0], full[:, i], atol=1e-5)
  h, _ = fwd_c(
    toks[:, 8:],
    feats[:, 8:],
    _positions(B, 3, 8),
    cache=cache,
    cache_len=jnp.full((B,), 8, jnp.int32),
  )
  np.testing.assert_allclose(h, full[:, 8:], atol=1e-5)


@functools.lru_cache
def _jitted_drafting(dg, tg):
  prefill = jax.jit(
    functools.partial(drafting.prefill_drafter_cache, dg), static_argnums=1, static_argnames="slots"
  )
  extend = jax.jit(functools.partial(drafting.extend_drafter_cache, dg), static_argnums=1)
  chain = jax.jit(
    functools.partial(drafting.draft_chain, dg), static_argnums=1, static_argnames="depth"
  )
  tree = jax.jit(
    functools.partial(drafting.draft_tree, dg),
    static_argnums=1,
    static_argnames=("depth", "topk", "num_nodes"),
  )
  return prefill, extend, chain, tree


def _prefilled(s, slots=32):
  prefill, extend, chain, tree = _jitted_drafting(s.dg, s.tg)
  cache, dlen = prefill(s.dp, s.tg, s.tp, s.tokens, s.hidden, LENGTHS, slots=slots)
  root_tok, root_feat = drafting.draft_roots(
    jnp.asarray(s.tokens), jnp.asarray(s.hidden), jnp.asarray(LENGTHS)
  )
  return cache, dlen, root_tok, root_feat


def test_prefill_from_captured_features_matches_stepping(s):
  prefill, extend, _, _ = _jitted_drafting(s.dg, s.tg)
  cache, dlen, root_tok, root_feat = _prefilled(s)
  np.testing.assert_array_equal(dlen, LENGTHS - 2)
  # Reference 1: the drafter run one pair at a time (x_{t+1}, f_t) into its cache.
  step_cache = init_drafter_cache(CFG, B, 32)
  for t in range(W - 1):
    _, step_cache = extend(
      s.dp,
      s.tg,
      s.tp,
      s.tokens[:, t + 1 : t + 2],
      s.hidden[:, t : t + 1],
      step_cache,
      jnp.full((B,), t, jnp.int32),
    )
  for b in range(B):
    n = LENGTHS[b] - 2
    np.testing.assert_allclose(cache.k[0][b, :n], step_cache.k[0][b, :n], atol=1e-5)
    np.testing.assert_allclose(cache.v[0][b, :n], step_cache.v[0][b, :n], atol=1e-5)
  # Reference 2: the root step (x_n, f_{n-1}) on the prefilled cache equals the
  # uncached drafter over all pairs up to the root (causal, so padding is harmless).
  h_root, _ = extend(s.dp, s.tg, s.tp, root_tok[:, None], root_feat[:, None], cache, dlen)
  full, _ = s.fwd(s.tokens[:, 1:], s.hidden[:, :-1], _positions(B, W - 1))
  for b in range(B):
    np.testing.assert_allclose(h_root[b, 0], full[b, LENGTHS[b] - 2], atol=1e-5)


def _reference_expand(s, toks, feats, topk):
  """Uncached drafter over the pair list; returns (h_last, top-k tokens, their log-probs)."""
  t = len(toks)
  tk = np.zeros((1, PAD), np.int32)
  ft = np.zeros((1, PAD, CFG.d_model), np.float32)
  tk[0, :t] = toks
  ft[0, :t] = np.stack(feats)
  h, _ = s.fwd(tk, ft, _positions(1, PAD))
  h = np.asarray(h[0, t - 1])
  logp = np.asarray(jax.nn.log_softmax(s.head(h)))
  top = np.argsort(-logp, kind="stable")[:topk]
  return h, top, logp[top]


def _context(s, b):
  n = LENGTHS[b] - 1  # root index
  return list(s.tokens[b, 1 : n + 1]), list(s.hidden[b, :n])


def test_draft_chain_is_the_greedy_chain(s):
  _, _, chain, _ = _jitted_drafting(s.dg, s.tg)
  cache, dlen, root_tok, root_feat = _prefilled(s)
  depth = 4
  draft, _ = chain(s.dp, s.tg, s.tp, root_tok, root_feat, cache, dlen, depth=depth)
  n = depth + 1
  np.testing.assert_array_equal(draft.parents, np.tile(np.arange(n) - 1, (B, 1)))
  np.testing.assert_array_equal(draft.depth, np.tile(np.arange(n), (B, 1)))
  assert bool(draft.valid.all())
  np.testing.assert_array_equal(draft.tokens[:, 0], s.tokens[np.arange(B), LENGTHS - 1])
  for b in range(B):
    toks, feats = _context(s, b)
    want, probs = [], []
    for _ in range(depth):
      h, top, lp = _reference_expand(s, toks, feats, 1)
      want.append(top[0])
      probs.append(np.exp(lp[0]))
      toks, feats = [*toks, top[0]], [*feats, h]
    np.testing.assert_array_equal(draft.tokens[b, 1:], want)
    np.testing.assert_allclose(draft.probs[b, 1:], probs, rtol=1e-4)
    np.testing.assert_allclose(draft.scores[b, 1:], np.cumprod(probs), rtol=1e-4)


# Flat enough (the fixture's logits are spread) that the coupled draw is often not the argmax.
FLAT = SamplingConfig(temperature=25.0)


def test_coupled_chain_is_what_the_verifier_draws_from_the_drafters_logits(s):
  """A coupled chain verified against the drafter's OWN logits is accepted whole: its
  proposals use the verifier's noise at the verifier's positions. An argmax chain is not."""
  _, _, chain, tree = _jitted_drafting(s.dg, s.tg)
  cache, dlen, root_tok, root_feat = _prefilled(s)
  depth, key = 4, jax.random.key(11)
  seq_ids, root_pos = jnp.arange(B, dtype=jnp.int32) + 5, jnp.asarray(LENGTHS - 1)
  coupling = drafting.Coupling(key, seq_ids, root_pos, FLAT)
  args = (s.dp, s.tg, s.tp, root_tok, root_feat, cache, dlen)
  accepted = {}
  for name, c in (("coupled", coupling), ("argmax", None)):
    draft, _ = chain(*args, depth=depth, coupling=c)
    logits = np.zeros((B, depth + 1, CFG.vocab_size), np.float32)
    for b in range(B):  # the drafter's logits after each node, from the uncached drafter
      toks, feats = _context(s, b)
      for i in range(depth):
        h, _, _ = _reference_expand(s, toks, feats, 1)
        logits[b, i] = np.asarray(s.head(h))
        toks, feats = [*toks, int(draft.tokens[b, i + 1])], [*feats, h]
    vr = verify_sampling(
      draft.tokens, draft.parents, jnp.asarray(logits), FLAT, key, seq_ids, root_pos
    )
    accepted[name] = np.asarray(vr.num_accepted)
  np.testing.assert_array_equal(accepted["coupled"], depth)
  assert (accepted["argmax"] < depth).any()  # the fixture is flat enough to tell them apart
  # A coupled tree of one child per node is the coupled chain: the same noise per depth.
  t1, _ = tree(*args, depth=depth, topk=1, num_nodes=depth + 1, coupling=coupling)
  c1, _ = chain(*args, depth=depth, coupling=coupling)
  np.testing.assert_array_equal(t1.tokens, c1.tokens)
  np.testing.assert_allclose(t1.probs, c1.probs, rtol=1e-5)
  # Greedy coupling is the argmax chain.
  g, _ = chain(*args, depth=depth, coupling=drafting.Coupling(key, seq_ids, root_pos, GREEDY))
  np.testing.assert_array_equal(g.tokens, chain(*args, depth=depth)[0].tokens)


def _reference_tree(s, b, depth, topk, num_nodes):
  """EAGLE-2 expand + rerank with the uncached drafter: {path tokens: log score}."""
  toks, feats = _context(s, b)
  h, top, lp = _reference_expand(s, toks, feats, topk)
  front = [((int(t),), float(x), [*toks, t], [*feats, h]) for t, x in zip(top, lp)]
  pool = [(p, sc) for p, sc, _, _ in front]
  for _ in range(1, depth):
    cands = []
    for path, sc, tk, ft in front:
      h, top, lp = _reference_expand(s, tk, ft, topk)
      cands += [((*path, int(t)), sc + float(x), [*tk, t], [*ft, h]) for t, x in zip(top, lp)]
    pool += [(p, sc) for p, sc, _, _ in cands]
    front = sorted(cands, key=lambda c: -c[1])[:topk]
  kept = sorted(pool, key=lambda c: -c[1])[: num_nodes - 1]
  return dict(kept)


def test_draft_tree_format_and_reference(s):
  _, _, chain, tree = _jitted_drafting(s.dg, s.tg)
  cache, dlen, root_tok, root_feat = _prefilled(s)
  depth, topk, num_nodes = 3, 2, 8
  draft, _ = tree(
    s.dp, s.tg, s.tp, root_tok, root_feat, cache, dlen, depth=depth, topk=topk, num_nodes=num_nodes
  )
  d = jax.tree.map(np.asarray, draft)
  assert d.tokens.shape == (B, num_nodes)
  np.testing.assert_array_equal(d.tokens[:, 0], s.tokens[np.arange(B), LENGTHS - 1])
  assert (d.parents[:, 0] == -1).all() and d.valid.all() and (d.depth[:, 0] == 0).all()
  for b in range(B):
    paths = {}
    for i in range(1, num_nodes):
      p = d.parents[b, i]
      assert 0 <= p < i
      assert d.depth[b, i] == d.depth[b, p] + 1
      np.testing.assert_allclose(d.scores[b, i], d.scores[b, p] * d.probs[b, i], rtol=1e-5)
      paths[i] = (*paths.get(p, ()), int(d.tokens[b, i]))
    for p in range(num_nodes):  # siblings: lower index = higher score, distinct tokens
      kids = np.nonzero(d.parents[b] == p)[0]
      assert (np.diff(d.scores[b, kids]) <= 0).all()
      assert len(set(d.tokens[b, kids])) == len(kids)
    want = _reference_tree(s, b, depth, topk, num_nodes)
    assert set(paths.values()) == set(want)
    for i, path in paths.items():
      np.testing.assert_allclose(np.log(d.scores[b, i]), want[path], atol=1e-4)

  # topk = 1: the tree is the greedy chain.
  t1, _ = tree(s.dp, s.tg, s.tp, root_tok, root_feat, cache, dlen, depth=4, topk=1, num_nodes=5)
  c, _ = chain(s.dp, s.tg, s.tp, root_tok, root_feat, cache, dlen, depth=4)
  np.testing.assert_array_equal(t1.tokens, c.tokens)
  np.testing.assert_array_equal(t1.parents, c.parents)
  np.testing.assert_allclose(t1.probs, c.probs, rtol=1e-5)
  with pytest.raises(ValueError, match="num_nodes"):
    drafting.draft_tree(
      s.dg, s.dp, s.tg, s.tp, root_tok, root_feat, cache, dlen, depth=2, topk=2, num_nodes=8
    )


def test_training_batch_alignment_and_packing():
  # Sample 0: 5 tokens, prompt 2 -> pairs t = 0, 1, 2: (x_{t+1}, f_t) -> f_{t+1}.
  tokens = np.array([[5, 6, 7, 8, 9, 0], [11, 12, 13, 14, 0, 0]])
  hidden = (100 + np.arange(6, dtype=np.float32))[None, :, None] + np.array([0, 50.0])[
    :, None, None
  ]
  # A sample takes its features f_0..f_{length-2}: one column more than its pairs.
  batch = make_training_batch(tokens, hidden, np.array([2, 1]), np.array([5, 4]), row_len=8)
  assert batch["tokens"].shape == (1, 8) and set(batch) == {
    "tokens",
    "positions",
    "segment_ids",
    "loss_mask",
    "features",
  }  # both samples packed in one row; every feature carried once
  np.testing.assert_array_equal(batch["tokens"][0], [6, 7, 8, 9, 12, 13, 14, 0])
  np.testing.assert_array_equal(batch["features"][0, :, 0], [100, 101, 102, 103, 150, 151, 152, 0])
  targets = np.asarray(batch_targets(jnp.asarray(batch["features"])))
  np.testing.assert_array_equal(targets[0, :, 0], [101, 102, 103, 150, 151, 152, 0, 0])
  np.testing.assert_array_equal(batch["positions"][0], [0, 1, 2, 3, 0, 1, 2, 0])
  np.testing.assert_array_equal(batch["segment_ids"][0], [1, 1, 1, 1, 2, 2, 2, 0])
  # Loss on pairs whose target feature follows a response token (t + 1 >= prompt_len), and
  # never on a segment's last column (its target column is the next sample's).
  np.testing.assert_array_equal(batch["loss_mask"][0], [0, 1, 1, 0, 1, 1, 0, 0])
  mask = batch["loss_mask"][0] > 0
  np.testing.assert_array_equal(targets[0, mask, 0], [102, 103, 151, 152])  # f_{t+1}, own
  np.testing.assert_array_equal(batch["features"][0, mask, 0] + 1, targets[0, mask, 0])
  with pytest.raises(ValueError, match="row_len"):
    make_training_batch(tokens, hidden, np.array([2, 1]), np.array([5, 4]), row_len=3)
  with pytest.raises(ValueError, match="num_rows"):
    make_training_batch(tokens, hidden, np.array([2, 1]), np.array([5, 4]), row_len=4, num_rows=1)
  # Per-row features (a packed buffer's rows), each only f_0 .. f_{length - 2}: the same batch.
  rows = [hidden[0, :4], hidden[1, :3]]
  got = make_training_batch(tokens, rows, np.array([2, 1]), np.array([5, 4]), row_len=8)
  for k in batch:
    np.testing.assert_array_equal(got[k], batch[k])
  with pytest.raises(ValueError, match="length - 1"):
    make_training_batch(tokens, [hidden[0, :3], hidden[1, :3]], np.array([2, 1]), np.array([5, 4]))


def test_packed_samples_do_not_attend_to_each_other(s):
  plen, lens = np.array([3, 2, 4]), np.array([9, 6, 12])
  packed = make_training_batch(s.tokens, s.hidden, plen, lens, row_len=PAD)
  assert packed["tokens"].shape[0] == 1
  h_packed, _ = s.fwd(
    packed["tokens"], packed["features"], packed["positions"], segment_ids=packed["segment_ids"]
  )
  seg = packed["segment_ids"][0]
  for i, n in enumerate(np.argsort(-lens, kind="stable")):  # first-fit decreasing order
    m = lens[n] - 1  # columns: f_0 .. f_{length - 2}
    # Alone, right-padded to the same width (causal: padding changes nothing before it).
    tk = np.zeros((1, PAD), np.int32)
    ft = np.zeros((1, PAD, CFG.d_model), np.float32)
    tk[0, :m], ft[0, :m] = s.tokens[n, 1 : m + 1], s.hidden[n, :m]
    h_alone, _ = s.fwd(tk, ft, _positions(1, PAD))
    np.testing.assert_allclose(h_packed[0, seg == i + 1], h_alone[0, :m], atol=1e-5)


def _leaf_names(params):
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]


@pytest.mark.parametrize("tie", [True, False])
def test_drafter_params_hold_no_embedding_or_head(tie):
  cfg = dataclasses.replace(CFG, tie_embeddings=tie)
  # Abstract init: the structure and shapes without compiling anything.
  _, dp = nnx.split(nnx.eval_shape(lambda: Drafter(cfg, rngs=nnx.Rngs(0))))
  names = _leaf_names(dp)
  assert not any("embed" in n or "lm_head" in n for n in names), names
  assert all(CFG.vocab_size not in x.shape for x in jax.tree.leaves(dp))
  check_drafter_matches(dp, cfg)


def test_training_reduces_loss_and_never_touches_the_target(s):
  tokens = jax.random.randint(jax.random.key(7), (8, 24), 0, CFG.vocab_size)
  target = nnx.merge(s.tg, s.tp)
  hidden, _, _ = target(tokens, _positions(8, 24))
  lengths = np.array([24, 20, 17, 24, 12, 22, 15, 24])
  batch = make_training_batch(np.asarray(tokens), np.asarray(hidden), np.full(8, 4), lengths)
  batch = jax.tree.map(jnp.asarray, batch)

  # The loss has no gradient path into the target's params.
  g = jax.jit(jax.grad(lambda tp: drafter_loss(s.dg, s.dp, s.tg, tp, batch)[0]))(s.tp)
  assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(g))

  target_before = jax.tree.map(np.array, s.tp)
  steps = 50
  opt = drafter_optimizer(3e-3, 5, steps)
  update = make_drafter_update(s.dg, s.tg, opt)
  dp = jax.tree.map(jnp.copy, s.dp)  # the fixture's params stay alive (dp is donated)
  opt_state = opt.init(dp)
  losses = []
  for _ in range(steps):
    dp, opt_state, m = update(dp, opt_state, s.tp, batch)
    losses.append(float(m["loss"]))
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.6 * losses[0], losses[::10]
  jax.tree.map(np.testing.assert_array_equal, target_before, jax.tree.map(np.asarray, s.tp))
  check_drafter_matches(dp, CFG)


def test_shape_mismatch_errors_are_clear(s):
  big = dataclasses.replace(CFG, d_model=64)
  with pytest.raises(ValueError, match="drafter d_model 32 != target d_model 64"):
    check_drafter_matches(CFG, big)
  with pytest.raises(ValueError, match="drafter d_model 32 != target d_model 64"):
    check_drafter_matches(s.dp, big)
  with pytest.raises(ValueError, match="drafter mlp_dim 64 != target mlp_dim 96"):
    check_drafter_matches(s.dp, dataclasses.replace(CFG, mlp_dim=96))
  with pytest.raises(ValueError, match="num_kv_heads"):
    check_drafter_matches(s.dp, dataclasses.replace(CFG, num_kv_heads=4))
  with pytest.raises(ValueError, match="vocab_size"):
    check_drafter_matches(CFG, dataclasses.replace(CFG, vocab_size=41))
  with pytest.raises(ValueError, match="embedding"):
    check_drafter_matches(s.tp, CFG)
  # A Qwen3 target (q/k norms): its drafter layer has them too, and a plain one does not fit.
  qwen3 = dataclasses.replace(CFG, qk_norm=True)
  q3_params = nnx.split(nnx.eval_shape(lambda: Drafter(qwen3, rngs=nnx.Rngs(0))))[1]
  check_drafter_matches(q3_params, qwen3)
  with pytest.raises(ValueError, match="drafter qk_norm False != target qk_norm True"):
    check_drafter_matches(s.dp, qwen3)
  # The functional entry checks the pair at trace time (abstract target: nothing runs).
  bg, bp = nnx.split(nnx.eval_shape(lambda: Transformer(big, rngs=nnx.Rngs(0))))
  fwd = lambda tp: drafter_forward(
    s.dg, s.dp, bg, tp, s.tokens[:, :2], s.hidden[:, :2], _positions(B, 2)
  )
  with pytest.raises(ValueError, match="drafter d_model 32 != target d_model 64"):
    jax.eval_shape(fwd, bp)


def test_teacher_temperature_sets_the_logit_targets(s):
  """teacher_temperature 1 is the policy's distribution, 0 its argmax one-hot, and other
  values its tempered softmax: the logit loss is that cross-entropy, checked by hand."""
  tokens = jax.random.randint(jax.random.key(8), (2, 16), 0, CFG.vocab_size)
  target = nnx.merge(s.tg, s.tp)
  hidden, _, _ = target(tokens, _positions(2, 16))
  batch = make_training_batch(np.asarray(tokens), np.asarray(hidden), np.full(2, 3), np.full(2, 16))
  batch = jax.tree.map(jnp.asarray, batch)
  h, _ = drafter_forward(
    s.dg,
    s.dp,
    s.tg,
    s.tp,
    batch["tokens"],
    batch["features"],
    batch["positions"],
    segment_ids=batch["segment_ids"],
  )
  log_q = jax.nn.log_softmax(draft_logits(s.tg, s.tp, h), -1)
  teacher = draft_logits(s.tg, s.tp, batch_targets(batch["features"]))
  mask = np.asarray(batch["loss_mask"], bool)
  for t in (1.0, 0.5, 0.0):
    _, m = drafter_loss(s.dg, s.dp, s.tg, s.tp, batch, teacher_temperature=t)
    if t == 0:
      want = -np.take_along_axis(np.asarray(log_q), np.asarray(teacher.argmax(-1))[..., None], -1)[
        ..., 0
      ]
    else:
      p = np.asarray(jax.nn.softmax(teacher / t, -1))
      want = -(p * np.asarray(log_q)).sum(-1)
    np.testing.assert_allclose(float(m["logit_loss"]), want[mask].mean(), rtol=1e-5)


def test_a_shallower_chain_accepts_the_prefix_of_a_deeper_ones_acceptance(s):
  """What the simulator's one acceptance for all chains (`sim.replay.chain_acceptance`)
  rests on: from one state, a depth-d chain
  (greedy or coupled) is the first d tokens of a deeper one, and the verifier accepts
  min(a, d) of it where the deeper chain got a (whatever the target's logits are)."""
  _, _, chain, _ = _jitted_drafting(s.dg, s.tg)
  cache, dlen, root_tok, root_feat = _prefilled(s)
  key = jax.random.key(5)
  seq_ids, root_pos = jnp.arange(B, dtype=jnp.int32) + 3, jnp.asarray(LENGTHS - 1)
  args = (s.dp, s.tg, s.tp, root_tok, root_feat, cache, dlen)
  rng = np.random.default_rng(0)
  for sampling in (GREEDY, FLAT):
    coupling = drafting.Coupling(key, seq_ids, root_pos, sampling)
    deep, _ = chain(*args, depth=6, coupling=coupling)
    for depth in (1, 3, 5):
      short, _ = chain(*args, depth=depth, coupling=coupling)
      np.testing.assert_array_equal(short.tokens, deep.tokens[:, : depth + 1])
    # Target logits that mostly agree with the deep draft, so acceptance varies by row.
    logits = rng.normal(size=(B, 7, CFG.vocab_size)).astype(np.float32)
    nxt = np.asarray(deep.tokens)[:, 1:]
    boost = 30.0 * max(sampling.temperature, 1.0)  # beats the Gumbel noise when sampling
    for b in range(B):
      logits[b, np.arange(6), nxt[b]] += rng.choice([0.0, boost], size=6, p=[0.25, 0.75])
    accepted = {}
    for n in (2, 4, 6, 7):  # nodes: depth + 1
      t, z = deep.tokens[:, :n], jnp.asarray(logits[:, :n])
      vr = verify_chain(t, z, sampling, key, seq_ids, root_pos)
      accepted[n - 1] = np.asarray(vr.num_accepted)
    assert len(set(accepted[6].tolist())) > 1, accepted  # the check sees different acceptance
    for depth in (1, 3, 5):
      np.testing.assert_array_equal(accepted[depth], np.minimum(accepted[6], depth))


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_logit_chunks_give_the_whole_batch_loss_and_gradient(s, temperature):
  """`logit_chunk` computes the logit term a few positions at a time (a chunk that does not
  divide the batch included): the loss, its metrics and the gradient are the whole batch's."""
  tokens = jax.random.randint(jax.random.key(3), (3, 16), 0, CFG.vocab_size)
  hidden, _, _ = nnx.merge(s.tg, s.tp)(tokens, _positions(3, 16))
  lengths = np.array([16, 11, 14])
  batch = make_training_batch(np.asarray(tokens), np.asarray(hidden), np.full(3, 3), lengths)
  batch = jax.tree.map(jnp.asarray, batch)

  def loss(dp, chunk):
    return drafter_loss(
      s.dg, dp, s.tg, s.tp, batch, teacher_temperature=temperature, logit_chunk=chunk
    )

  grad = jax.jit(jax.grad(lambda dp, c: loss(dp, c)[0]), static_argnums=1)
  (_, want), want_g = jax.jit(loss, static_argnums=1)(s.dp, 0), grad(s.dp, 0)
  for chunk in (7, 16, 1000):
    _, got = jax.jit(loss, static_argnums=1)(s.dp, chunk)
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=1e-5, err_msg=f"{k} at chunk {chunk}")
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grad(s.dp, chunk), want_g
    )


def test_logit_chunks_under_a_bfloat16_head_as_accelerators_run_it():
  """A bfloat16 target and drafter with the head's product in bfloat16 (what "auto" takes
  on accelerators: `models.precision.head_precision`): the chunks' gradient taken inside
  their forward (a `jax.vjp` through the head's own custom gradient) gives the whole batch's
  loss and, up to bfloat16's rounding (the float32 head's chunks part by as much), its
  gradient."""
  cfg = dataclasses.replace(CFG, dtype="bfloat16")
  target = init_model(cfg, seed=3)
  target.embed.embedding[...] = target.embed.embedding[...] * 40.0
  (tg, tp), (dg, dp) = nnx.split(target), nnx.split(init_drafter(cfg, seed=4))
  tokens = jax.random.randint(jax.random.key(3), (3, 16), 0, cfg.vocab_size)
  with head_precision("compute"):
    hidden, _, _ = nnx.merge(tg, tp)(tokens, _positions(3, 16))
    lengths = np.array([16, 11, 14])
    feats = np.asarray(hidden.astype(jnp.float32))
    batch = jax.tree.map(
      jnp.asarray, make_training_batch(np.asarray(tokens), feats, np.full(3, 3), lengths)
    )

    def loss(dp, chunk):
      return drafter_loss(dg, dp, tg, tp, batch, teacher_temperature=1.0, logit_chunk=chunk)

    grad = jax.jit(jax.grad(lambda dp, c: loss(dp, c)[0]), static_argnums=1)
    (_, want), want_g = jax.jit(loss, static_argnums=1)(dp, 0), grad(dp, 0)
    _, got = jax.jit(loss, static_argnums=1)(dp, 7)
    got_g = grad(dp, 7)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-4, err_msg=k)
  for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g), strict=True):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.max(np.abs(a - b)) <= 0.02 * np.max(np.abs(b)), np.max(np.abs(a - b))


def test_logit_chunks_bound_the_updates_memory():
  """The compiled update's temporaries at a large vocabulary: chunks of 64 positions need a
  fraction of what the whole batch's logits take (XLA's memory analysis, nothing run)."""
  cfg = dataclasses.replace(CFG, vocab_size=16384)
  tg, tp = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  dg, dp = nnx.split(nnx.eval_shape(lambda: Drafter(cfg, rngs=nnx.Rngs(0))))
  opt = drafter_optimizer(1e-3, 10)
  spec = jax.ShapeDtypeStruct
  batch = {k: spec((2, 256), jnp.int32) for k in ("tokens", "positions", "segment_ids")}
  batch |= {"loss_mask": spec((2, 256), jnp.float32)}
  batch |= {"features": spec((2, 256, cfg.d_model), jnp.float32)}
  temp = {}
  for chunk in (0, 64):
    fn = make_drafter_update(dg, tg, opt, donate=False, logit_chunk=chunk)
    compiled = fn.lower(dp, jax.eval_shape(opt.init, dp), tp, batch).compile()
    temp[chunk] = compiled.memory_analysis().temp_size_in_bytes
  logits = 2 * 256 * cfg.vocab_size * 4  # one whole-batch float32 logits array: 32 MiB
  assert temp[0] > 2 * logits and temp[64] < temp[0] / 4, temp

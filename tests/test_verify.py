"""Speculative-decoding verification is lossless: token-identical to plain decoding (greedy,
and sampling with the same key: coupled sampling), and in distribution for sampling.

The toy target is a table: its logits for the token after a node depend only on the node's
position and token. Sampling tests compare the joint law of the first three new tokens
(V^3 cells) with the exact one computed in numpy, and show that plausible-looking wrong
verifiers fail the same test; a direct test replays plain sampling with the same keys.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tlt_jax.decode import tree as tree_lib
from tlt_jax.decode import verify as verify_lib
from tlt_jax.decode.sampling import (
  SamplingConfig,
  gumbel_argmax,
  sample_tokens,
  sampling_logits,
  sequence_keys,
)

# ----------------------------------------------------------------------------------------------
# Tree helpers (tree.py)
# ----------------------------------------------------------------------------------------------

# 0 -> {1, 2}; 1 -> {3, 4}; 3 -> {5}; node 6 hangs under 2.
BUSHY = np.array([-1, 0, 0, 1, 1, 3, 2], np.int32)


def test_depths_and_ancestor_mask_on_hand_written_trees():
  parents = jnp.asarray(np.stack([BUSHY, tree_lib.chain_parents(6)]))
  np.testing.assert_array_equal(
    tree_lib.tree_depths(parents), [[0, 1, 1, 2, 2, 3, 2], [0, 1, 2, 3, 4, 5, 6]]
  )
  mask = np.asarray(tree_lib.ancestor_mask(parents))
  expected_bushy = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 4], 5: [0, 1, 3, 5]}
  expected_bushy[6] = [0, 2, 6]
  for i, ancestors in expected_bushy.items():
    np.testing.assert_array_equal(np.flatnonzero(mask[0, i]), ancestors)
  np.testing.assert_array_equal(mask[1], np.tril(np.ones((7, 7), bool)))
  positions = tree_lib.node_positions(parents, jnp.array([10, 3]))
  np.testing.assert_array_equal(positions[0], [10, 11, 11, 12, 12, 13, 12])
  np.testing.assert_array_equal(tree_lib.chain_parents(0), [-1])


def test_validate_parents():
  np.testing.assert_array_equal(tree_lib.validate_parents(BUSHY), BUSHY[None])
  valid = np.array([True, True, False, True, True, True, False])
  tree_lib.validate_parents(BUSHY, valid)
  cases = {
    "root's parent must be -1": [0, 0],
    r"parent must be in \[0, 2\)": [-1, 0, 2],
    r"node 1: parent must be in \[0, 1\)": [-1, -1],
    "integers": [-1.0, 0.0],
    "at least the root": np.zeros((1, 0), np.int32),
    r"\[N\] or \[B, N\]": np.zeros((1, 1, 1), np.int32),
  }
  for match, parents in cases.items():
    with pytest.raises(ValueError, match=match):
      tree_lib.validate_parents(np.asarray(parents))
  with pytest.raises(ValueError, match="root must be valid"):
    tree_lib.validate_parents(BUSHY, ~np.eye(1, 7, dtype=bool)[0])
  with pytest.raises(ValueError, match="node 5: valid node under invalid parent 3"):
    tree_lib.validate_parents(BUSHY, np.array([1, 1, 1, 0, 1, 1, 1], bool))
  with pytest.raises(ValueError, match="bool array"):
    tree_lib.validate_parents(BUSHY, np.ones(7, np.int32))
  with pytest.raises(ValueError, match="depth"):
    tree_lib.chain_parents(-1)


# ----------------------------------------------------------------------------------------------
# Greedy: equal to plain greedy decoding, token for token
# ----------------------------------------------------------------------------------------------


def _host_depths(parents):
  depths = np.zeros_like(parents)
  for i in range(1, parents.shape[-1]):
    depths[..., i] = np.take_along_axis(depths, parents[..., i : i + 1], axis=-1)[..., 0] + 1
  return depths


def _reference_greedy_walk(tokens, parents, valid, table):
  """The greedy rule written as a plain loop: (accepted path, emitted tokens)."""
  depths = _host_depths(parents)
  node, path, emitted = 0, [0], []
  while True:
    choice = int(np.argmax(table[depths[node], tokens[node]]))
    emitted.append(choice)
    kids = [
      j for j in range(len(tokens)) if parents[j] == node and valid[j] and tokens[j] == choice
    ]
    if not kids:
      return path, emitted
    node = kids[0]
    path.append(node)


def _random_greedy_trees(rng, table, batch, n):
  """Random trees in which about half the nodes carry the target's choice after their parent.

  Matches therefore appear at any sibling rank and at any depth; about 30% of the rows get a
  root whose children all miss.
  """
  vocab = table.shape[-1]
  parents = np.full((batch, n), -1, np.int32)
  tokens = rng.integers(0, vocab, (batch, n)).astype(np.int32)
  for i in range(1, n):
    parents[:, i] = rng.integers(0, i, batch)
  depths = _host_depths(parents)
  for i in range(1, n):
    p = parents[:, i]
    choice = table[depths[np.arange(batch), p], tokens[np.arange(batch), p]].argmax(-1)
    tokens[:, i] = np.where(rng.random(batch) < 0.5, choice, tokens[:, i])
  no_match = rng.random(batch) < 0.3
  root_choice = table[0, tokens[:, 0]].argmax(-1)
  for i in range(1, n):
    miss = no_match & (parents[:, i] == 0) & (tokens[:, i] == root_choice)
    tokens[miss, i] = (root_choice[miss] + 1) % vocab
  valid = rng.random((batch, n)) < 0.85
  valid[:, 0] = True
  valid[rng.random(batch) < 0.5] = True
  return tokens, parents, valid


def test_greedy_equals_plain_greedy_decoding():
  rng = np.random.default_rng(0)
  batch, n, vocab = 256, 12, 6
  table = rng.normal(size=(n, vocab, vocab)).astype(np.float32)
  tokens, parents, valid = _random_greedy_trees(rng, table, batch, n)
  # Hand-made rows: the right path at non-first siblings at every level, and a chain that misses.
  g = [3]
  for t in range(3):
    g.append(int(table[t, g[-1]].argmax()))
  wrong = [(x + 1) % vocab for x in g]
  tokens[0, :7] = [g[0], wrong[1], g[1], wrong[2], wrong[2], g[2], g[3]]
  parents[0, :7] = [-1, 0, 0, 2, 2, 2, 5]
  tokens[1, :4] = [g[0], wrong[1], g[2], g[3]]
  parents[1, :4] = tree_lib.chain_parents(3)
  tokens[0, 7:], parents[0, 7:] = wrong[1], 0
  tokens[1, 4:], parents[1, 4:] = wrong[1], 0
  valid[:2] = True

  target_logits = table[_host_depths(parents), tokens]
  out = jax.jit(verify_lib.verify_greedy)(tokens, parents, target_logits, valid)
  via_sampling = jax.jit(
    lambda *a: verify_lib.verify_sampling(*a[:3], SamplingConfig(temperature=0.0), *a[3:])
  )(tokens, parents, target_logits, jax.random.key(0), jnp.arange(batch), jnp.zeros(batch), valid)
  jax.tree.map(np.testing.assert_array_equal, out, via_sampling)
  out = jax.tree.map(np.asarray, out)

  assert out.num_accepted[0] == 3 and out.num_accepted[1] == 0
  np.testing.assert_array_equal(out.path[0, :4], [0, 2, 5, 6])
  for b in range(batch):
    path, emitted = _reference_greedy_walk(tokens[b], parents[b], valid[b], table)
    m = len(emitted)
    assert out.num_emitted[b] == m and out.num_accepted[b] == m - 1
    np.testing.assert_array_equal(out.path[b, :m], path)
    np.testing.assert_array_equal(out.emitted[b, :m], emitted)
    assert np.all(out.path[b, m:] == -1) and np.all(out.emitted[b, m:] == -1)
    # Plain greedy decoding from the root.
    prev = tokens[b, 0]
    for k in range(m):
      prev = table[k, prev].argmax()
      assert out.emitted[b, k] == prev
    x = target_logits[b, path, :].astype(np.float64)
    logp = x - x.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    np.testing.assert_allclose(out.logprobs[b, :m], logp[np.arange(m), emitted], rtol=1e-5)
  # The random trees exercise deep acceptance and immediate misses alike.
  assert out.num_accepted.max() >= 3 and np.mean(out.num_accepted == 0) > 0.2


# ----------------------------------------------------------------------------------------------
# Sampling: coupled, so every emitted token is the one plain sampling draws
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "cfg",
  [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.6, top_k=3),
    SamplingConfig(temperature=1.4, top_p=0.7),
  ],
  ids=["t1", "t0.6_k3", "t1.4_p0.7"],
)
def test_sampled_verification_emits_the_plain_samplers_tokens(cfg):
  """Replays plain sampling (`sample_tokens`, same key, sequence ids and positions) along each
  row's emitted tokens: verification must emit exactly those tokens, accepted drafts and the
  final correction or bonus alike, with the same log-probs. A rule that is only
  distribution-exact (e.g. SpecInfer's sequential-sibling rule) fails this."""
  rng = np.random.default_rng(5)
  batch, n, vocab = 512, 10, 6
  table = (1.5 * rng.normal(size=(n + 12, vocab, vocab))).astype(np.float32)
  tokens, parents, valid = _random_greedy_trees(rng, table, batch, n)
  base_pos = rng.integers(0, 12, batch).astype(np.int32)
  seq_ids = rng.permutation(10_000)[:batch].astype(np.int32)
  depth = _host_depths(parents)
  target_logits = table[base_pos[:, None] + depth, tokens]
  key = jax.random.key(11)
  out = jax.jit(lambda t, p, x, s, b, v: verify_lib.verify_sampling(t, p, x, cfg, key, s, b, v))(
    tokens, parents, target_logits, seq_ids, base_pos, valid
  )
  out = jax.tree.map(np.asarray, out)
  plain = jax.jit(lambda x, s, pos: sample_tokens(x, cfg, key, s, pos))
  prev = tokens[:, 0]
  for k in range(n):
    live = out.num_emitted > k
    if not live.any():
      break
    want, want_lp = plain(table[base_pos + k, prev], seq_ids, base_pos + k + 1)
    np.testing.assert_array_equal(out.emitted[live, k], np.asarray(want)[live])
    np.testing.assert_allclose(out.logprobs[live, k], np.asarray(want_lp)[live], atol=1e-5)
    prev = np.where(live, out.emitted[:, k], prev)
  # Deep acceptances and immediate corrections both occur.
  assert out.num_accepted.max() >= 3 and np.mean(out.num_accepted == 0) > 0.1


def test_coupled_choice_is_the_gumbel_max_of_the_sampling_logits():
  """The token the rule decides on is `gumbel_argmax` at the emitted position, and truncated
  tokens never win."""
  cfg = SamplingConfig(temperature=1.0, top_k=2)
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(256, 1, 7)), jnp.float32)
  seq = jnp.arange(256, dtype=jnp.int32)
  out = verify_lib.verify_sampling(
    jnp.zeros((256, 1), jnp.int32),
    jnp.full((256, 1), -1, jnp.int32),
    logits,
    cfg,
    jax.random.key(3),
    seq,
    jnp.full((256,), 4, jnp.int32),
  )
  z = sampling_logits(logits[:, 0], cfg)
  want = gumbel_argmax(sequence_keys(jax.random.key(3), seq, jnp.full((256,), 5)), z)
  np.testing.assert_array_equal(out.emitted[:, 0], want)
  assert bool(jnp.all(jnp.take_along_axis(z, want[:, None], 1) > -1e29))


# ----------------------------------------------------------------------------------------------
# Sampling: the joint law of the first three tokens is the target's
# ----------------------------------------------------------------------------------------------

V = 5
ROOT = 2
NUM_DRAWS = 100_000
# Every draft batch is padded to this many nodes, so one program per config serves all of them.
NUM_NODES = 19
_RNG = np.random.default_rng(1234)
# Target logits at position t given the token there; the drafter is a noisy copy, so drafts are
# often, but not always, right.
TARGET = (1.3 * _RNG.normal(size=(NUM_NODES, V, V))).astype(np.float32)
DRAFTER = TARGET[:3] + _RNG.normal(size=(3, V, V)).astype(np.float32)
CONFIGS = {
  "t1": SamplingConfig(temperature=1.0),
  "t0.7_k3": SamplingConfig(temperature=0.7, top_k=3),
  "p0.8": SamplingConfig(temperature=1.0, top_p=0.8),
}


def _reference_probs(logits, cfg):
  """The sampling distribution written independently of `sampling_logits`."""
  z = np.asarray(logits, np.float64) / cfg.temperature
  order = np.argsort(-z, kind="stable")
  keep = np.zeros(z.shape, bool)
  keep[order[: cfg.top_k or z.size]] = True
  p = np.exp(z - z.max()) * keep
  p /= p.sum()
  if cfg.top_p < 1.0:
    kept, mass = np.zeros_like(keep), 0.0
    for i in order:
      if keep[i] and mass < cfg.top_p:
        kept[i], mass = True, mass + p[i]
    p = p * kept / (p * kept).sum()
  return p


def _target_probs(cfg):
  """[4, V, V]: the target's next-token distribution at position t after token v."""
  return np.array([[_reference_probs(TARGET[t, v], cfg) for v in range(V)] for t in range(4)])


def _exact_joint(probs):
  return np.einsum("a,ab,bc->abc", probs[0, ROOT], probs[1], probs[2]).reshape(-1)


def _draft_tree(level_ranks, order="bfs"):
  """A deterministic draft from the toy drafter: node at depth d gets children whose tokens are
  the drafter's level_ranks[d]-th choices (repeats allowed), numbered breadth or depth first."""
  tokens, parents = [ROOT], [-1]

  def children(node, depth):
    if depth == len(level_ranks):
      return []
    choice = np.argsort(-DRAFTER[depth, tokens[node]], kind="stable")
    return [int(choice[r]) for r in level_ranks[depth]]

  if order == "bfs":
    frontier = [(0, 0)]
    while frontier:
      node, depth = frontier.pop(0)
      for tok in children(node, depth):
        tokens.append(tok)
        parents.append(node)
        frontier.append((len(tokens) - 1, depth + 1))
  else:

    def grow(node, depth):
      for tok in children(node, depth):
        tokens.append(tok)
        parents.append(node)
        grow(len(tokens) - 1, depth + 1)

    grow(0, 0)
  return np.array(tokens, np.int32), np.array(parents, np.int32)


def _padded(tree, n, rng):
  """Pads a tree to n nodes with invalid nodes that carry tempting tokens."""
  tokens, parents = tree
  k = tokens.size
  pad_parents = np.array([rng.integers(0, i) for i in range(k, n)], np.int32)
  pad_tokens = DRAFTER[0, tokens[np.minimum(pad_parents, k - 1)]].argmax(-1).astype(np.int32)
  valid = np.arange(n) < k
  return np.concatenate([tokens, pad_tokens]), np.concatenate([parents, pad_parents]), valid


def _draft_batch(kind, batch):
  """Rows cycle through a few trees (each row's tree may differ); all start at ROOT."""
  rng = np.random.default_rng(7)
  if kind == "chain":
    trees = [_draft_tree([(0,), (0,), (0,)])]
  else:
    top = [(0, 1, 2), (0, 1), (0,)]
    trees = [
      _draft_tree(top),
      _draft_tree(top, order="dfs"),
      _draft_tree([(0, 0, 1), (0, 0), (0,)]),  # repeated sibling tokens
      _draft_tree([(2, 1, 0), (1, 0), (0,)]),  # the drafter's best tried last
    ]
  rows = [_padded(t, NUM_NODES, rng) for t in trees]
  for _, parents, valid in rows:
    tree_lib.validate_parents(parents, valid)
  pick = np.arange(batch) % len(rows)
  tokens, parents, valid = (np.stack([r[i] for r in rows])[pick] for i in range(3))
  target_logits = TARGET[_host_depths(parents), tokens]
  return tokens, parents, valid, target_logits


FLAWS = ("no_renormalise", "correction_from_p", "lenient", "repeat_not_rejected")


def _flawed_rule(cfg, key, seq_ids, flaw):
  """Wrong verification rules, each a small change to the correct one.

  `flaw` indexes FLAWS and is traced, so all of them share one compiled program.
  """
  correct = verify_lib._sampling_rule(cfg, key, seq_ids)

  def rule(logits, is_child, tokens, pos):
    child, correction = correct(logits, is_child, tokens, pos)
    z = sampling_logits(logits, cfg)
    tok = jnp.where(is_child, tokens, 0)
    p = jnp.take_along_axis(jax.nn.softmax(z), tok, axis=1)
    keys = jax.vmap(lambda k: jax.random.fold_in(k, 99))(sequence_keys(key, seq_ids, pos))
    u = jax.vmap(lambda k: jax.random.uniform(k, tokens.shape[1:]))(keys)
    first = lambda accept: jnp.where(accept.any(1), jnp.argmax(accept, 1), -1).astype(jnp.int32)

    # Renormalises over the earlier siblings' tokens, but forgets that a repeated token was
    # itself rejected already.
    same = tok[:, :, None] == tok[:, None, :]
    earlier = jnp.tril(jnp.ones(same.shape[1:], bool), k=-1) & is_child[:, None, :]
    first_seen = is_child & ~(same & earlier).any(2)
    others_rejected = earlier & first_seen[:, None, :] & ~same
    forgetful = p / (1 - (others_rejected * p[:, None, :]).sum(2))

    children = jnp.stack(
      [
        first(is_child & (u < p)),  # p(c) instead of p'(c): no renormalising after rejections
        child,
        first(is_child & (p > 0.3)),  # accepts any likely-enough draft
        first(is_child & (u < forgetful)),
      ]
    )
    # Right acceptances, but the correction ignores which tokens were just rejected.
    from_p = jax.vmap(jax.random.categorical)(keys, z).astype(jnp.int32)
    corrections = jnp.stack([correction, from_p, correction, correction])
    return children[flaw], corrections[flaw]

  return rule


@functools.partial(jax.jit, static_argnames="cfg")
def _verify(tokens, parents, target_logits, valid, key, cfg, flaw=None):
  """The public verifier, or with `flaw` (an index into FLAWS) a wrong one."""
  seq_ids = jnp.arange(tokens.shape[0], dtype=jnp.int32)
  base_pos = jnp.zeros_like(seq_ids)
  if flaw is None:
    return verify_lib.verify_sampling(
      tokens, parents, target_logits, cfg, key, seq_ids, base_pos, valid
    )
  rule = _flawed_rule(cfg, key, seq_ids, flaw)
  return verify_lib._walk(tokens, parents, target_logits, valid, rule, base_pos, cfg)


def _first_three(result, probs, seed):
  """The first three tokens of each row; rows that emitted fewer continue by plain sampling."""
  n = result.emitted.shape[0]
  out = np.asarray(result.emitted[:, :3]).copy()
  num = np.asarray(result.num_emitted)
  rng = np.random.default_rng(seed)
  for t in range(1, 3):
    short = num <= t
    cdf = np.cumsum(probs[t, out[short, t - 1]], axis=-1)
    u = rng.random((short.sum(), 1))
    out[short, t] = np.minimum((u > cdf).sum(-1), V - 1)
  assert out.min() >= 0 and out.shape == (n, 3)
  return out


def _chi2_critical(dof, z=4.0):
  # Wilson-Hilferty: the chi-square quantile at a normal z-score (~3e-5 tail for z=4).
  return dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3


def _chi2(counts, expected):
  """Pearson statistic over the support, pooling cells with fewer than 5 expected draws."""
  e = expected * counts.sum()
  big, small = e >= 5, (e > 0) & (e < 5)
  obs = np.append(counts[big], counts[small].sum())
  exp = np.append(e[big], e[small].sum())
  if not small.any():
    obs, exp = obs[:-1], exp[:-1]
  return float(((obs - exp) ** 2 / exp).sum()), obs.size - 1


def _joint_test(kind, cfg, seed, flaw=None):
  tokens, parents, valid, target_logits = _draft_batch(kind, NUM_DRAWS)
  result = _verify(tokens, parents, target_logits, valid, jax.random.key(seed), cfg, flaw)
  probs = _target_probs(cfg)
  draws = _first_three(result, probs, seed)
  counts = np.bincount(draws @ np.array([V * V, V, 1]), minlength=V**3)
  expected = _exact_joint(probs)
  chi2, dof = _chi2(counts, expected)
  return chi2, _chi2_critical(dof), counts, expected, np.asarray(result.num_accepted)


@pytest.mark.parametrize("kind", ["tree", "chain"])
@pytest.mark.parametrize("cfg_name", list(CONFIGS))
def test_sampling_verification_is_lossless(kind, cfg_name):
  seed = 17 + list(CONFIGS).index(cfg_name)
  chi2, critical, counts, expected, accepted = _joint_test(kind, CONFIGS[cfg_name], seed)
  print(f"{kind} {cfg_name}: chi2 {chi2:.1f} critical {critical:.1f}")
  assert counts[expected == 0].sum() == 0, "emitted a token outside the target's support"
  assert chi2 < critical, (chi2, critical)
  # Expected total variation of an exact sampler is below sum(sqrt(p (1 - p) / n)) / 2.
  tv = 0.5 * np.abs(counts / NUM_DRAWS - expected).sum()
  tv_bound = 0.5 * np.sqrt(expected * (1 - expected) / NUM_DRAWS).sum()
  assert tv < 1.2 * tv_bound, (tv, tv_bound)
  # Some rows take the bonus after a full-depth path, others a correction after rejections.
  assert np.sum(accepted == 3) > 100 and np.sum(accepted < 3) > 100, np.bincount(accepted)


@pytest.mark.parametrize("flaw", FLAWS)
def test_wrong_verifiers_fail_the_same_test(flaw):
  chi2, critical, *_ = _joint_test("tree", CONFIGS["t1"], 5, jnp.int32(FLAWS.index(flaw)))
  print(f"{flaw}: chi2 {chi2:.1f} critical {critical:.1f}")
  assert chi2 > critical, (chi2, critical)


def test_repeated_and_truncated_siblings():
  # p is almost a point mass on token 1; token 4 is outside top-3.
  logits = jnp.array([0.0, 30.0, 0.0, -1.0, -5.0])
  tokens = jnp.array([[ROOT, 1, 1, 0], [ROOT, 4, 4, 4], [ROOT, 3, 3, 1]])
  parents = jnp.array([[-1, 0, 0, 0]] * 3)
  target_logits = jnp.broadcast_to(logits, (3, 4, V))
  cfg = SamplingConfig(temperature=1.0, top_k=3)
  for seed in range(20):
    out = _verify(tokens, parents, target_logits, jnp.ones((3, 4), bool), jax.random.key(seed), cfg)
    np.testing.assert_array_equal(out.path[:, :2], [[0, 1], [0, -1], [0, 3]])
    np.testing.assert_array_equal(out.emitted[:, 0], [1, 1, 1])


# ----------------------------------------------------------------------------------------------
# Layout invariance
# ----------------------------------------------------------------------------------------------


def test_batch_permutation_permutes_results():
  rng = np.random.default_rng(3)
  batch, n, vocab = 64, 10, 7
  table = rng.normal(size=(n + 8, vocab, vocab)).astype(np.float32)
  tokens, parents, valid = _random_greedy_trees(rng, table, batch, n)
  base_pos = rng.integers(0, 8, batch).astype(np.int32)
  target_logits = table[base_pos[:, None] + _host_depths(parents), tokens]
  seq_ids = rng.permutation(1000)[:batch].astype(np.int32)
  cfg = SamplingConfig(temperature=1.3, top_k=5)
  run = jax.jit(
    lambda t, p, x, s, b, v: verify_lib.verify_sampling(t, p, x, cfg, jax.random.key(9), s, b, v)
  )
  args = (tokens, parents, target_logits, seq_ids, base_pos, valid)
  out = run(*args)
  perm = rng.permutation(batch)
  permuted = run(*(a[perm] for a in args))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a)[perm], b), out, permuted)
  # Nor on what the other rows hold.
  others = np.arange(batch) >= 8
  mixed = [np.where(others.reshape((-1,) + (1,) * (a.ndim - 1)), a[::-1], a) for a in args]
  alone = run(*mixed)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a)[:8], b[:8]), out, alone)
  assert np.asarray(out.num_accepted).max() >= 2


@pytest.mark.parametrize(
  "cfg",
  [
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=3, top_p=0.9),
  ],
  ids=["greedy", "t1", "t0.7_k3_p0.9"],
)
def test_vectorised_chain_verification_is_the_walk(cfg):
  """`verify_chain` (every choice at once, leading matches accepted) returns what the walk
  returns on the same chains: paths, counts, tokens and log-probs, from immediate
  corrections to fully accepted chains."""
  rng = np.random.default_rng(2)
  batch, n, vocab = 384, 7, 5
  logits = jnp.asarray(2.0 * rng.normal(size=(batch, n, vocab)), jnp.float32)
  seq_ids = jnp.asarray(rng.permutation(5000)[:batch], jnp.int32)
  base_pos = jnp.asarray(rng.integers(0, 30, batch), jnp.int32)
  key = jax.random.key(4)
  # Drafts that follow the target's own choices for a random number of steps, then guess.
  parents = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32) - 1, (batch, n))
  guess = rng.integers(0, vocab, (batch, n)).astype(np.int32)
  z = np.asarray(verify_lib.sampling_logits(logits, cfg))
  follow = rng.integers(0, n, batch)
  tokens = guess.copy()
  for b in range(batch):  # the target's choice at node i is emitted at depth i + 1
    for i in range(follow[b]):
      if cfg.greedy:
        tokens[b, i + 1] = z[b, i].argmax()
      else:
        k = verify_lib.sequence_keys(key, seq_ids[b : b + 1], base_pos[b : b + 1] + i + 1)
        tokens[b, i + 1] = int(verify_lib.gumbel_argmax(k, jnp.asarray(z[b, i : i + 1]))[0])
  fast = verify_lib.verify_chain(jnp.asarray(tokens), logits, cfg, key, seq_ids, base_pos)
  walk = verify_lib.verify_sampling(
    jnp.asarray(tokens), parents, logits, cfg, key, seq_ids, base_pos
  )
  for name in ("path", "num_accepted", "emitted"):
    np.testing.assert_array_equal(getattr(fast, name), getattr(walk, name), err_msg=name)
  np.testing.assert_allclose(fast.logprobs, walk.logprobs, atol=1e-6)
  acc = np.asarray(fast.num_accepted)
  assert (acc == 0).any() and (acc == n - 1).any() and len(np.unique(acc)) == n

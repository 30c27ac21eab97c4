"""Draft proposals from the EAGLE drafter: its KV cache, chains and EAGLE-2 trees.

Alignment (see `tlt_jax.models.drafter`): drafter position t consumes the pair
(x_{t+1}, f_t), where f_t is the target's last-layer feature after token t, and
predicts f_{t+1}. With a committed sequence x_0..x_n whose last token x_n (the
ROOT) has been sampled but not yet run through the target, the target features
f_0..f_{n-1} exist, so the drafter's committed cache holds positions
0..n-2 (`drafter_len = n - 1 = length - 2`) and the first draft step runs the
root pair (x_n, f_{n-1}) at position n - 1 = drafter_len. Its output h predicts
f_n, whose logits propose x_{n+1}; deeper steps feed the drafter's own h.

The first draft step uses only true inputs, so its cache entry (slot
drafter_len) is exact and a caller may commit it (drafter_len + 1). The later
steps write speculative entries beyond that; they are simply not committed.

Coupled drafts (sampling): the verifier draws the token at position t as the
Gumbel-max argmax(z_t + g_t) of the target's sampling logits with noise g_t keyed
by (sequence, t) (`tlt_jax.decode.sampling`). Given a `Coupling`, the drafter
ranks its proposals for position t by its own sampling logits plus the SAME g_t,
so its top proposal is the Gumbel-max of the drafter's distribution under the
target's noise: it matches the target's draw with probability near 1 - TV(p, q)
(p target, q drafter) instead of p(argmax q) for an argmax draft, which collapses
on flat distributions. Verification is unchanged, so output stays token-identical
to plain decoding; only acceptance changes. Greedy: ranking by the raw logits.

Draft format (shared with the verifier), per batch row, N static nodes:
  tokens[b, 0] is the root; parents[b, 0] = -1 and 0 <= parents[b, i] < i;
  siblings are ordered by index, lower index = higher draft score;
  valid[b, i] is False for padding nodes.

Shape letters: B batch, N draft nodes, S cache slots, D model width, V vocabulary.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from tlt_jax.decode.sampling import SamplingConfig, gumbel_noise, sampling_logits, sequence_keys
from tlt_jax.models.attention import tree_cache_mask
from tlt_jax.models.drafter import (
  Drafter,
  draft_logits,
  drafter_forward,
  init_drafter_cache,
)
from tlt_jax.models.transformer import KVCache


@flax.struct.dataclass
class Draft:
  """A batch of draft trees (a chain is a tree with parents[i] = i - 1).

  Attributes:
    tokens: [B, N] int32; node 0 is the root (last committed token).
    parents: [B, N] int32; -1 for the root, else an earlier node index.
    valid: [B, N] bool; False marks padding nodes.
    depth: [B, N] int32; 0 for the root. The target position of node i is
      (position of the root) + depth[b, i].
    probs: [B, N] float32; draft probability of the node's token given its
      path (softmax of the draft logits at its parent); 1 for the root.
    scores: [B, N] float32; product of `probs` along the path from the root.
  """

  tokens: jax.Array
  parents: jax.Array
  valid: jax.Array
  depth: jax.Array
  probs: jax.Array
  scores: jax.Array

  @property
  def num_nodes(self) -> int:
    return self.tokens.shape[1]


@flax.struct.dataclass
class Coupling:
  """The verifier's sampling noise, shared with the drafter (see the module docstring).

  Attributes:
    key: the base PRNG key the rollout samples with.
    seq_ids: [B] global sequence id of each row.
    root_pos: [B] absolute position of each row's root token; a node at draft depth
      d proposes the token of position root_pos + d.
    sampling: the static sampling configuration of the rollout.
  """

  key: jax.Array
  seq_ids: jax.Array
  root_pos: jax.Array
  sampling: SamplingConfig = flax.struct.field(pytree_node=False)

  def rank_logits(self, logits: Float[Array, "B ... V"], depth: int) -> Float[Array, "B ... V"]:
    """Values whose order ranks the proposals for depth `depth` (root's children: 1).

    Sampling: the drafter's sampling logits plus the verifier's Gumbel noise of that
    position (shared by every node of the depth); greedy: the logits as they are.
    """
    z = sampling_logits(logits, self.sampling)
    if self.sampling.greedy:
      return z
    keys = sequence_keys(self.key, self.seq_ids, self.root_pos + depth)
    noise = gumbel_noise(keys, z.shape[-1], z.dtype)
    return z + noise.reshape(noise.shape[:1] + (1,) * (z.ndim - 2) + noise.shape[1:])


def _proposal_log_probs(logits, coupling: Coupling | None, depth: int):
  """Log-scores of proposals: the drafter's log-probs (argmax drafts), or the log-softmax
  of the coupled ranking values, whose top entry is the coupled proposal."""
  if coupling is None:
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jax.nn.log_softmax(coupling.rank_logits(logits, depth), axis=-1)


def _config(drafter_graphdef: nnx.GraphDef, drafter_params: nnx.State):
  drafter: Drafter = nnx.merge(drafter_graphdef, drafter_params)
  return drafter.config


def draft_roots(
  tokens: Int[Array, "B S"], hidden: Float[Array, "B S D"], length: Int[Array, " B"]
) -> tuple[Int[Array, " B"], Float[Array, "B D"]]:
  """The root token x_n = tokens[length - 1] and feature f_{n-1} = hidden[length - 2]."""
  rows = jnp.arange(tokens.shape[0])
  return tokens[rows, length - 1], hidden[rows, jnp.maximum(length - 2, 0)]


def prefill_drafter_cache(
  drafter_graphdef: nnx.GraphDef,
  drafter_params: nnx.State,
  target_graphdef: nnx.GraphDef,
  target_params: nnx.State,
  tokens: Int[Array, "B W"],
  hidden: Float[Array, "B W D"],
  length: Int[Array, " B"],
  *,
  slots: int,
) -> tuple[KVCache, Int[Array, " B"]]:
  """Builds the drafter's cache from captured target features; the target is not run.

  Args:
    tokens: [B, W] committed tokens, tokens[b, :length[b]] valid (W may be any
      prefix of the rollout buffer that covers every row's length).
    hidden: [B, W, D] captured target features, hidden[b, t] = f_t for
      t <= length[b] - 2.
    length: [B] committed tokens per row (the last one is the root).
    slots: drafter cache size (static), >= W - 1 and room for the drafts.

  Returns:
    cache: one-layer cache whose slot t holds the pair (x_{t+1}, f_t).
    drafter_len: [B] = length - 2, committed drafter positions per row. Slots
      beyond it hold entries of padding pairs; they are never read.
  """
  b, w = tokens.shape
  if w < 2:
    raise ValueError(f"need at least 2 token columns to prefill the drafter, got {w}")
  if slots < w - 1:
    raise ValueError(f"drafter cache slots {slots} < {w - 1} pairs to prefill")
  cache = init_drafter_cache(_config(drafter_graphdef, drafter_params), b, slots)
  t = w - 1
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  _, cache = drafter_forward(
    drafter_graphdef,
    drafter_params,
    target_graphdef,
    target_params,
    tokens[:, 1:],
    hidden[:, :-1],
    positions,
    cache=cache,
    cache_len=jnp.zeros((b,), jnp.int32),
    view_len=t,
  )
  return cache, jnp.maximum(length - 2, 0).astype(jnp.int32)


def extend_drafter_cache(
  drafter_graphdef: nnx.GraphDef,
  drafter_params: nnx.State,
  target_graphdef: nnx.GraphDef,
  target_params: nnx.State,
  tokens: Int[Array, "B T"],
  features: Float[Array, "B T D"],
  cache: KVCache,
  cache_len: Int[Array, " B"],
  *,
  view_len: int | None = None,
) -> tuple[Float[Array, "B T D"], KVCache]:
  """Writes T true pairs (x_{t+1}, f_t) at positions cache_len .. cache_len + T - 1.

  Used after verification to commit accepted tokens with the target's own
  features. Rows that accepted fewer than T tokens pad the rest; the caller
  advances each row's drafter length by its own count only.
  """
  t = tokens.shape[1]
  positions = cache_len[:, None] + jnp.arange(t, dtype=jnp.int32)
  h, cache = drafter_forward(
    drafter_graphdef,
    drafter_params,
    target_graphdef,
    target_params,
    tokens,
    features,
    positions,
    cache=cache,
    cache_len=cache_len,
    view_len=view_len,
  )
  return h, cache


def draft_chain(
  drafter_graphdef: nnx.GraphDef,
  drafter_params: nnx.State,
  target_graphdef: nnx.GraphDef,
  target_params: nnx.State,
  root_token: Int[Array, " B"],
  root_feature: Float[Array, "B D"],
  cache: KVCache,
  cache_len: Int[Array, " B"],
  *,
  depth: int,
  view_len: int | None = None,
  coupling: Coupling | None = None,
) -> tuple[Draft, KVCache]:
  """A top-1 chain of `depth` draft tokens after the root: N = depth + 1.

  Step i runs the pair (token i, feature) at drafter position cache_len + i,
  where the feature is root_feature for i = 0 and the previous step's h after.
  Without `coupling` each token is the drafter's argmax; with it, the coupled
  proposal (module docstring), and probs are of the coupled ranking.
  Needs slots and view_len >= cache_len + depth for every row.
  """
  if depth < 1:
    raise ValueError(f"depth must be >= 1, got {depth}")

  def step(carry, i):
    cache, tok, feat = carry
    pos = cache_len + i
    h, cache = drafter_forward(
      drafter_graphdef,
      drafter_params,
      target_graphdef,
      target_params,
      tok[:, None],
      feat[:, None],
      pos[:, None],
      cache=cache,
      cache_len=pos,
      view_len=view_len,
    )
    h = h[:, 0]
    logp = _proposal_log_probs(draft_logits(target_graphdef, target_params, h), coupling, i + 1)
    nxt = jnp.argmax(logp, axis=-1).astype(jnp.int32)
    lp = jnp.take_along_axis(logp, nxt[:, None], axis=-1)[:, 0]
    return (cache, nxt, h), (nxt, lp)

  init = (cache, root_token.astype(jnp.int32), root_feature)
  (cache, _, _), (toks, lps) = jax.lax.scan(step, init, jnp.arange(depth, dtype=jnp.int32))
  b, n = root_token.shape[0], depth + 1
  lps = jnp.concatenate([jnp.zeros((b, 1), jnp.float32), jnp.minimum(lps.T, 0.0)], axis=1)
  node = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  draft = Draft(
    tokens=jnp.concatenate([root_token[:, None].astype(jnp.int32), toks.T], axis=1),
    parents=node - 1,
    valid=jnp.ones((b, n), bool),
    depth=node,
    probs=jnp.exp(lps),
    scores=jnp.exp(jnp.cumsum(lps, axis=1)),
  )
  return draft, cache


def tree_slots(depth: int, topk: int) -> int:
  """Drafter cache slots a `draft_tree` uses beyond cache_len: the root and each
  expanded frontier (the deepest level is proposed, never run)."""
  return 1 + (depth - 1) * topk


def draft_tree(
  drafter_graphdef: nnx.GraphDef,
  drafter_params: nnx.State,
  target_graphdef: nnx.GraphDef,
  target_params: nnx.State,
  root_token: Int[Array, " B"],
  root_feature: Float[Array, "B D"],
  cache: KVCache,
  cache_len: Int[Array, " B"],
  *,
  depth: int,
  topk: int,
  num_nodes: int,
  view_len: int | None = None,
  coupling: Coupling | None = None,
) -> tuple[Draft, KVCache]:
  """An EAGLE-2 dynamic draft tree of `num_nodes` nodes (root included).

  With `coupling`, children are ranked and scored by the coupled ranking values
  (module docstring): each expanded node's first child is its coupled proposal.

  Expansion (EAGLE-2): the root proposes its top-`topk` children; at each
  further depth the `topk` best nodes of the previous depth by score (product
  of draft probabilities along the path) are run through the drafter together,
  each proposing its top-`topk` children. Reranking: of all proposed nodes the
  best `num_nodes - 1` by score are kept. A child never outscores its parent
  and ties go to the earlier-proposed node, so the kept set contains every
  kept node's ancestors; ordering the kept nodes by descending score therefore
  puts parents before children and siblings in score order.

  The frontier at depth d runs at drafter position cache_len + d and sees the
  committed cache, the root and its own ancestors only. Needs slots and
  view_len >= cache_len + tree_slots(depth, topk) for every row.
  """
  _check_tree(_config(drafter_graphdef, drafter_params).vocab_size, depth, topk, num_nodes)
  view_len = cache.slots if view_len is None else view_len
  b = root_token.shape[0]
  r = tree_slots(depth, topk)
  fwd = lambda *a, **k: drafter_forward(
    drafter_graphdef, drafter_params, target_graphdef, target_params, *a, **k
  )

  def propose(h, depth):
    # log p <= 0 keeps child scores <= parent scores despite rounding.
    logp = _proposal_log_probs(draft_logits(target_graphdef, target_params, h), coupling, depth)
    lp, tok = jax.lax.top_k(logp, topk)
    return jnp.minimum(lp, 0.0), tok.astype(jnp.int32)

  h, cache = fwd(
    root_token[:, None].astype(jnp.int32),
    root_feature[:, None],
    cache_len[:, None],
    cache=cache,
    cache_len=cache_len,
    view_len=view_len,
  )
  lp, tok = propose(h[:, 0], 1)  # [B, K]
  pool_tok, pool_lp, pool_score = [tok], [lp], [lp]
  pool_parent = [jnp.full((b, topk), -1, jnp.int32)]
  pool_depth = [jnp.ones((b, topk), jnp.int32)]

  # The frontier: nodes to run next, with their tree-region visibility.
  k_idx = jnp.arange(topk)
  front_tok, front_score = tok, lp
  front_feat = jnp.broadcast_to(h, (b, topk, h.shape[-1]))
  front_pool = jnp.broadcast_to(k_idx, (b, topk)).astype(jnp.int32)
  own = jax.nn.one_hot(1 + k_idx, r, dtype=bool)  # [K, R]
  front_vis = jnp.broadcast_to((own | (jnp.arange(r) == 0))[None], (b, topk, r))

  for d in range(1, depth):
    base = cache_len + 1 + (d - 1) * topk
    h, cache = fwd(
      front_tok,
      front_feat,
      jnp.broadcast_to((cache_len + d)[:, None], (b, topk)),
      cache=cache,
      cache_len=base,
      view_len=view_len,
      mask=tree_cache_mask(cache_len, front_vis, view_len),
    )
    lp, tok = propose(h, d + 1)  # [B, K, K]: children of frontier node j
    score = (front_score[:, :, None] + lp).reshape(b, topk * topk)
    tok = tok.reshape(b, topk * topk)
    offset = topk + (d - 1) * topk * topk
    pool_tok.append(tok)
    pool_lp.append(lp.reshape(b, topk * topk))
    pool_score.append(score)
    pool_parent.append(jnp.repeat(front_pool, topk, axis=1))
    pool_depth.append(jnp.full((b, topk * topk), d + 1, jnp.int32))
    if d + 1 < depth:
      own = jax.nn.one_hot(1 + d * topk + k_idx, r, dtype=bool)
      front_tok, front_score, front_feat, front_pool, front_vis = _next_frontier(
        tok, score, h, front_vis, own, offset, topk
      )

  pool = [jnp.concatenate(x, axis=1) for x in (pool_tok, pool_lp, pool_score, pool_parent)]
  return _keep_best(root_token, *pool, jnp.concatenate(pool_depth, axis=1), num_nodes), cache


def _check_tree(vocab_size: int, depth: int, topk: int, num_nodes: int) -> None:
  pool_size = topk + (depth - 1) * topk * topk
  if depth < 1 or topk < 1:
    raise ValueError(f"depth and topk must be >= 1, got depth={depth}, topk={topk}")
  if topk > vocab_size:
    raise ValueError(f"topk {topk} exceeds the vocabulary size {vocab_size}")
  if not 2 <= num_nodes <= pool_size + 1:
    raise ValueError(
      f"num_nodes must be in [2, {pool_size + 1}] for depth={depth}, topk={topk}, got {num_nodes}"
    )


def _next_frontier(tok, score, h, front_vis, own, offset, topk):
  """The next depth's frontier: the `topk` best of the children just proposed (by score,
  ties to the earlier), with their parents' features and tree-region visibility plus their
  own slots (`own`), and their indices in the pool (children start at `offset`)."""
  pick = jnp.argsort(-score, axis=1, stable=True)[:, :topk]  # [B, K]
  parent = pick // topk
  front_vis = jnp.take_along_axis(front_vis, parent[:, :, None], axis=1) | own[None]
  return (
    jnp.take_along_axis(tok, pick, axis=1),
    jnp.take_along_axis(score, pick, axis=1),
    jnp.take_along_axis(h, parent[:, :, None], axis=1),
    (offset + pick).astype(jnp.int32),
    front_vis,
  )


def _keep_best(root_token, pool_tok, pool_lp, pool_score, pool_parent, pool_depth, num_nodes):
  """EAGLE-2's reranking: the `num_nodes - 1` best proposed nodes by score, in descending
  order (parents before children), their parents re-indexed into the kept set, after the
  root."""
  b, pool_size = pool_tok.shape
  cat = lambda xs: jnp.concatenate(xs, axis=1)
  keep = jnp.argsort(-pool_score, axis=1, stable=True)[:, : num_nodes - 1]  # [B, N-1]
  rows = jnp.arange(b)[:, None]
  out_index = (
    jnp.zeros((b, pool_size), jnp.int32)
    .at[rows, keep]
    .set(jnp.arange(1, num_nodes, dtype=jnp.int32))
  )
  sel = lambda x: jnp.take_along_axis(x, keep, axis=1)
  par = sel(pool_parent)
  parents = jnp.where(par < 0, 0, jnp.take_along_axis(out_index, jnp.maximum(par, 0), axis=1))
  score = sel(pool_score)
  ones = jnp.ones((b, 1), jnp.float32)
  return Draft(
    tokens=cat([root_token[:, None].astype(jnp.int32), sel(pool_tok)]),
    parents=cat([jnp.full((b, 1), -1, jnp.int32), parents]),
    valid=cat([jnp.ones((b, 1), bool), jnp.isfinite(score)]),
    depth=cat([jnp.zeros((b, 1), jnp.int32), sel(pool_depth)]),
    probs=cat([ones, jnp.exp(sel(pool_lp))]),
    scores=cat([ones, jnp.exp(score)]),
  )

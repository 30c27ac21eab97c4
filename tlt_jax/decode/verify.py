"""Lossless verification of a draft tree against the target's logits.

The target has scored every node of a draft tree (format in `tlt_jax.decode.tree`) in one
forward pass. Verification walks from the root, depth by depth, deciding at the current node u
which child (if any) to accept, and ends by emitting one token the target chose itself: the
correction token after a rejection, or the bonus token at a leaf. Each round therefore emits
between 1 and depth + 1 tokens.

* Greedy: accept the first child whose token is the target's argmax at u. The output equals
  plain greedy decoding token for token.
* Sampling (coupled): plain decoding draws the token at position t as the Gumbel-max
  y_t = argmax(z_t + g_t) of the sampling logits z_t, with noise g_t from the (sequence, t)
  key (`tlt_jax.decode.sampling.gumbel_argmax`). Verification computes the same y_t from the
  target's logits at u, accepts the child whose token is y_t (children carry distinct tokens
  in practice; the first match wins) and otherwise emits y_t itself and stops.
  Lossless: P(y_t = x) = p(x), so a child is accepted with probability p(token), and given
  that no child matched, y_t is p restricted to the other tokens and renormalised: the
  acceptance probabilities and residual distribution of SpecInfer's multi-draft rule for a
  deterministic draft. Beyond distribution-equality, every emitted token IS the token plain
  decoding draws at that position from the same key: speculative output is token-identical
  to plain output at any temperature, top-k or top-p, whatever the draft (up to floating-
  point differences between the one-token and the multi-token forward, which can flip a
  near-tie; never observed in the tests).

Randomness is keyed per (sequence id, absolute position of the emitted token) by `fold_in`,
never split over the batch, so verification is independent of the batch layout.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from tlt_jax.decode.sampling import (
  SamplingConfig,
  gumbel_argmax,
  sampling_log_probs,
  sampling_logits,
  sequence_keys,
)

_GREEDY = SamplingConfig(temperature=0.0)

# rule(logits at u [B, V], children of u [B, N], tokens [B, N], emitted position [B])
#   -> (accepted child [B] or -1, token to emit if none is accepted [B]).
_NodeRule = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


@flax.struct.dataclass
class VerifyResult:
  """Outcome of verifying one draft tree per row. D = N - 1 is the largest possible depth.

  Attributes:
    path: [B, D + 1] int32, the accepted nodes from the root (`path[:, 0] == 0`), -1 after.
    num_accepted: [B] int32, accepted draft tokens (not counting the root or the final token).
    emitted: [B, D + 1] int32, the new tokens in order: the accepted drafts, then the
      correction or bonus token; -1 after `num_emitted`.
    logprobs: [B, D + 1] float32, the log-prob of each emitted token, as `sample_tokens`
      records it (`sampling_log_probs`: tempered and truncated; untempered when greedy);
      0 after.
  """

  path: jax.Array
  num_accepted: jax.Array
  emitted: jax.Array
  logprobs: jax.Array

  @property
  def num_emitted(self) -> jax.Array:
    """[B] int32: accepted drafts plus the correction or bonus token."""
    return self.num_accepted + 1


def verify_greedy(
  tokens: Int[Array, "B N"],
  parents: Int[Array, "B N"],
  target_logits: Float[Array, "B N V"],
  valid: Bool[Array, "B N"] | None = None,
) -> VerifyResult:
  """Greedy verification: follows the target's argmax through the tree.

  Among u's children the first (highest-ranked) one whose token is the argmax of
  `target_logits[:, u]` is accepted; the walk stops at the first node without such a child and
  emits that node's argmax.
  """
  tokens, parents, valid = _check_inputs(tokens, parents, target_logits, valid)
  base_pos = jnp.zeros(tokens.shape[:1], jnp.int32)
  return _walk(tokens, parents, target_logits, valid, _greedy_rule, base_pos, _GREEDY)


def verify_sampling(
  tokens: Int[Array, "B N"],
  parents: Int[Array, "B N"],
  target_logits: Float[Array, "B N V"],
  cfg: SamplingConfig,
  key: jax.Array,
  seq_ids: Int[Array, " B"],
  base_pos: Int[Array, " B"],
  valid: Bool[Array, "B N"] | None = None,
) -> VerifyResult:
  """Coupled verification for the sampling distribution of `cfg` (greedy if temperature 0):
  every emitted token is the one plain decoding draws with the same key.

  Args:
    tokens: the draft tokens; node 0 is the root (the last committed token).
    parents: the tree; see `tlt_jax.decode.tree`.
    target_logits: the target's logits for the token following each node.
    cfg: static sampling configuration; temperature 0 routes to `verify_greedy`.
    key: base PRNG key, the one plain sampling uses (the same key gives the same tokens).
    seq_ids: global sequence id of each row.
    base_pos: absolute position of each row's root token. The token emitted at depth k + 1
      lies at `base_pos + k + 1`; since the next round's root is this round's last emitted
      token, no (sequence, position) is ever keyed twice.
    valid: False marks padding nodes (never accepted); all True if None.
  """
  if cfg.greedy:
    return verify_greedy(tokens, parents, target_logits, valid)
  tokens, parents, valid = _check_inputs(tokens, parents, target_logits, valid)
  rule = _sampling_rule(cfg, key, jnp.asarray(seq_ids, jnp.int32))
  base_pos = jnp.asarray(base_pos, jnp.int32)
  return _walk(tokens, parents, target_logits, valid, rule, base_pos, cfg)


def verify_chain(
  tokens: Int[Array, "B N"],
  target_logits: Float[Array, "B N V"],
  cfg: SamplingConfig,
  key: jax.Array,
  seq_ids: Int[Array, " B"],
  base_pos: Int[Array, " B"],
  valid: Bool[Array, "B N"] | None = None,
) -> VerifyResult:
  """`verify_sampling` for a chain (parents[i] = i - 1), vectorised; `valid` marks the
  drafted nodes (default all): no node at or past an invalid one is accepted.

  On a chain the walk's decision at node i only compares the draft token i + 1 with the
  target's choice at node i (the argmax, or the coupled draw at position base + i + 1),
  so every choice is computed at once and the accepted count is the run of leading
  matches: the same result as the walk, without its sequential loop.
  """
  tokens = jnp.asarray(tokens, jnp.int32)
  n = tokens.shape[1]
  z = sampling_logits(target_logits, cfg)  # [B, N, V]
  if cfg.greedy:
    choice = jnp.argmax(z, axis=-1).astype(jnp.int32)
  else:
    pos = jnp.asarray(base_pos, jnp.int32)[:, None] + 1 + jnp.arange(n)  # [B, N]
    seq = jnp.broadcast_to(jnp.asarray(seq_ids, jnp.int32)[:, None], pos.shape)
    keys = sequence_keys(key, seq.reshape(-1), pos.reshape(-1))
    choice = gumbel_argmax(keys, z.reshape(-1, z.shape[-1])).reshape(pos.shape)
  match = tokens[:, 1:] == choice[:, :-1]  # [B, N - 1]: draft i + 1 is the choice at node i
  if valid is not None:
    match = match & jnp.asarray(valid, bool)[:, 1:]
  num_accepted = jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  cols = jnp.arange(n)[None]
  kept = cols <= num_accepted[:, None]
  logp = jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), choice[..., None], axis=-1)[..., 0]
  return VerifyResult(
    path=jnp.where(kept, cols, -1).astype(jnp.int32),
    num_accepted=num_accepted,
    emitted=jnp.where(kept, choice, -1),
    logprobs=jnp.where(kept, logp, 0.0),
  )


def _check_inputs(tokens, parents, target_logits, valid):
  tokens = jnp.asarray(tokens, jnp.int32)
  parents = jnp.asarray(parents, jnp.int32)
  if tokens.ndim != 2 or parents.shape != tokens.shape:
    raise ValueError(f"tokens and parents must both be [B, N], got {tokens.shape}, {parents.shape}")
  if target_logits.ndim != 3 or target_logits.shape[:2] != tokens.shape:
    raise ValueError(f"target_logits must be [B, N, V] with [B, N] = {tokens.shape}")
  if valid is None:
    valid = jnp.ones(tokens.shape, bool)
  elif valid.shape != tokens.shape:
    raise ValueError(f"valid must be [B, N] = {tokens.shape}, got {valid.shape}")
  return tokens, parents, jnp.asarray(valid, bool)


def _accept(choice, is_child, tokens):
  """The child whose token is the target's `choice` (-1: none), and `choice` to emit
  otherwise: the one decision both rules make, greedy and coupled alike."""
  match = is_child & (tokens == choice[:, None])
  # argmax of a bool row is its first True: the highest-ranked matching sibling.
  child = jnp.where(match.any(axis=1), jnp.argmax(match, axis=1), -1)
  return child.astype(jnp.int32), choice


def _greedy_rule(logits, is_child, tokens, pos):
  del pos  # Greedy needs no randomness.
  return _accept(jnp.argmax(logits, axis=-1).astype(jnp.int32), is_child, tokens)


def _sampling_rule(cfg: SamplingConfig, key: jax.Array, seq_ids: jax.Array) -> _NodeRule:
  """The coupled rule of the module docstring, for the distribution of `cfg`."""

  def rule(logits, is_child, tokens, pos):
    # The token plain decoding draws at `pos`: same key, same sampling logits.
    choice = gumbel_argmax(sequence_keys(key, seq_ids, pos), sampling_logits(logits, cfg))
    return _accept(choice, is_child, tokens)

  return rule


def _walk(
  tokens: Int[Array, "B N"],
  parents: Int[Array, "B N"],
  target_logits: Float[Array, "B N V"],
  valid: Bool[Array, "B N"],
  rule: _NodeRule,
  base_pos: Int[Array, " B"],
  cfg: SamplingConfig,
) -> VerifyResult:
  """Walks every row's tree from the root, letting `rule` decide at each node.

  `rule(logits, is_child, tokens, pos)` sees the target's logits at the current node u, the
  mask of u's valid children (all False for finished rows) and the absolute position of the
  token being decided; it returns the accepted child (-1 for none) and the token to emit if
  none is accepted. Tests plug deliberately wrong rules in here. Log-probs are recorded
  under `cfg`'s sampling distribution.
  """
  batch, n = tokens.shape
  cols = jnp.arange(n)[None]

  def not_finished(state):
    depth, _, done, *_ = state
    return (depth < n) & ~done.all()

  def step(state):
    depth, node, done, path, emitted, logprobs, num_accepted = state
    logits = jnp.take_along_axis(target_logits, node[:, None, None], axis=1)[:, 0]
    is_child = valid & (parents == node[:, None]) & ~done[:, None]
    child, fallback = rule(logits, is_child, tokens, base_pos + depth + 1)
    accepted = child >= 0
    child_token = jnp.take_along_axis(tokens, jnp.maximum(child, 0)[:, None], axis=1)[:, 0]
    token = jnp.where(accepted, child_token, fallback)
    logp_all = sampling_log_probs(logits, cfg)
    logp = jnp.take_along_axis(logp_all, token[:, None], axis=1)[:, 0]

    live = ~done
    # Column writes by mask: a dynamic slice index would be clamped at the last column.
    write = (cols == depth) & live[:, None]
    emitted = jnp.where(write, token[:, None], emitted)
    logprobs = jnp.where(write, logp[:, None], logprobs)
    advance = live & accepted
    path = jnp.where((cols == depth + 1) & advance[:, None], child[:, None], path)
    return (
      depth + 1,
      jnp.where(advance, child, node),
      done | ~accepted,
      path,
      emitted,
      logprobs,
      num_accepted + advance.astype(jnp.int32),
    )

  minus_ones = jnp.full((batch, n), -1, jnp.int32)
  init = (
    jnp.int32(0),
    jnp.zeros((batch,), jnp.int32),
    jnp.zeros((batch,), bool),
    minus_ones.at[:, 0].set(0),
    minus_ones,
    jnp.zeros((batch, n), jnp.float32),
    jnp.zeros((batch,), jnp.int32),
  )
  # Stops once every row has emitted its final token: usually well before depth N - 1.
  _, _, _, path, emitted, logprobs, num_accepted = lax.while_loop(not_finished, step, init)
  return VerifyResult(path=path, num_accepted=num_accepted, emitted=emitted, logprobs=logprobs)

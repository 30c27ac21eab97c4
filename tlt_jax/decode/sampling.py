"""Token sampling: greedy, temperature, top-k, top-p, keyed per sequence.

Randomness is keyed by (base key, sequence id, position), never by batch slot,
so compaction, bucketing or sharding of a batch cannot change what a sequence
samples (layout invariance).

Coupled sampling: a sampled token is the Gumbel-max of the sampling logits,
argmax(z + g) with g Gumbel noise drawn from the (sequence, position) key
(`gumbel_argmax`). The noise of a position is a pure function of its key, so any
other procedure that reads the same noise at the same position, such as
speculative verification (`tlt_jax.decode.verify`), draws the same token as
plain decoding does: not merely one with the same distribution.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

_NEG_INF = -1e30


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How the next token is drawn. Static for a compiled program.

  temperature == 0 means greedy (argmax). top_k == 0 and top_p == 1 disable
  the respective truncations.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not isinstance(self.temperature, int | float) or not 0.0 <= self.temperature <= 100.0:
      raise ValueError(f"temperature must be a number in [0, 100], got {self.temperature!r}")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
    if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p!r}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


def sampling_logits(logits: Float[Array, "... V"], cfg: SamplingConfig) -> Float[Array, "... V"]:
  """Logits of the distribution actually sampled from: tempered, truncated.

  Truncated entries are -1e30. Ties at the top-k threshold are all kept. For
  greedy the result is the raw float32 logits (argmax is what matters).
  """
  x = logits.astype(jnp.float32)
  if cfg.greedy:
    return x
  x = x / cfg.temperature
  vocab = x.shape[-1]
  # The kept set is piecewise constant in the logits: no gradient flows through its choice
  # (a trainer differentiating these log-probs differentiates only the kept logits).
  sg = jax.lax.stop_gradient
  if 0 < cfg.top_k < vocab:
    kth = jax.lax.top_k(sg(x), cfg.top_k)[0][..., -1:]
    x = jnp.where(sg(x) >= kth, x, _NEG_INF)
  if cfg.top_p < 1.0:
    # Keep the smallest prefix of tokens (by probability) whose mass reaches
    # top_p: a token is kept if the mass strictly before it is < top_p.
    order = jnp.argsort(-sg(x), axis=-1)
    sorted_x = jnp.take_along_axis(sg(x), order, axis=-1)
    probs = jax.nn.softmax(sorted_x, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < cfg.top_p
    keep = (
      jnp.zeros_like(keep_sorted)
      .at[tuple(jnp.indices(order.shape)[:-1]) + (order,)]
      .set(keep_sorted)
    )
    x = jnp.where(keep, x, _NEG_INF)
  return x


def sampling_log_probs(logits: Float[Array, "... V"], cfg: SamplingConfig) -> Float[Array, "... V"]:
  """Log-probabilities of the distribution tokens are actually drawn from.

  log_softmax of `sampling_logits`: tempered and truncated (top-k / top-p), so a token
  outside the kept set scores about -1e30 and the kept ones sum to probability 1. This is
  what the rollout records and what an on-policy trainer must recompute: scoring the
  untruncated policy instead makes the importance ratio refer to a policy that did not
  generate the data. Greedy: the untempered log_softmax (a point mass has no useful log-prob).
  """
  return jax.nn.log_softmax(sampling_logits(logits, cfg), axis=-1)


def sequence_keys(
  base_key: jax.Array, seq_ids: Int[Array, " B"], positions: Int[Array, " B"]
) -> jax.Array:
  """One key per row from (sequence id, position): independent of the row's slot."""
  fold = lambda s, p: jax.random.fold_in(jax.random.fold_in(base_key, s), p)
  return jax.vmap(fold)(seq_ids, positions)


def gumbel_argmax(keys: jax.Array, z: Float[Array, "B V"]) -> Int[Array, " B"]:
  """argmax(z + Gumbel noise) per row, the noise drawn from that row's key.

  A draw from softmax(z) (the Gumbel-max trick), and a deterministic function of
  (key, z): plain decoding and speculative verification call it with the same
  (sequence, position) key and so agree token for token. Truncated entries (-1e30)
  can never win. Same arithmetic as `jax.random.categorical` on one row.
  """
  return jnp.argmax(z + gumbel_noise(keys, z.shape[-1], z.dtype), axis=-1).astype(jnp.int32)


def gumbel_noise(keys: jax.Array, vocab: int, dtype=jnp.float32) -> Float[Array, "B V"]:
  """The Gumbel noise `gumbel_argmax` adds, one [V] vector per key: a drafter that adds
  the same noise to its own sampling logits proposes the token the target will draw
  whenever its distribution is close enough (coupled drafting, `tlt_jax.decode.drafting`)."""
  return jax.vmap(lambda k: jax.random.gumbel(k, (vocab,), dtype))(keys)


def sample_tokens(
  logits: Float[Array, "B V"],
  cfg: SamplingConfig,
  base_key: jax.Array,
  seq_ids: Int[Array, " B"],
  positions: Int[Array, " B"],
) -> tuple[Int[Array, " B"], Float[Array, " B"]]:
  """Samples one token per row; returns (tokens, log-probs of them).

  Tokens: `gumbel_argmax` of the sampling logits with the (sequence, position) key;
  greedy: the argmax. Log-probs: `sampling_log_probs`, i.e. under the distribution the
  token was drawn from (tempered and truncated), the quantity an on-policy trainer
  recomputes as the "old" log-prob.
  """
  z = sampling_logits(logits, cfg)
  if cfg.greedy:
    tokens = jnp.argmax(z, axis=-1).astype(jnp.int32)
  else:
    tokens = gumbel_argmax(sequence_keys(base_key, seq_ids, positions), z)
  logp_all = jax.nn.log_softmax(z, axis=-1)
  logp = jnp.take_along_axis(logp_all, tokens[:, None], axis=-1)[:, 0]
  return tokens, logp

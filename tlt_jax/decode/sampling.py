"""Token sampling: greedy, temperature, top-k, top-p, keyed per sequence.

Randomness is keyed by (base key, sequence id, position), never by batch slot,
so compaction, bucketing or sharding of a batch cannot change what a sequence
samples (DESIGN.md: layout invariance).
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
  if 0 < cfg.top_k < vocab:
    kth = jax.lax.top_k(x, cfg.top_k)[0][..., -1:]
    x = jnp.where(x >= kth, x, _NEG_INF)
  if cfg.top_p < 1.0:
    # Keep the smallest prefix of tokens (by probability) whose mass reaches
    # top_p: a token is kept if the mass strictly before it is < top_p.
    order = jnp.argsort(-x, axis=-1)
    sorted_x = jnp.take_along_axis(x, order, axis=-1)
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


def sequence_keys(
  base_key: jax.Array, seq_ids: Int[Array, " B"], positions: Int[Array, " B"]
) -> jax.Array:
  """One key per row from (sequence id, position): independent of the row's slot."""
  fold = lambda s, p: jax.random.fold_in(jax.random.fold_in(base_key, s), p)
  return jax.vmap(fold)(seq_ids, positions)


def sample_tokens(
  logits: Float[Array, "B V"],
  cfg: SamplingConfig,
  base_key: jax.Array,
  seq_ids: Int[Array, " B"],
  positions: Int[Array, " B"],
) -> tuple[Int[Array, " B"], Float[Array, " B"]]:
  """Samples one token per row; returns (tokens, policy log-probs of them).

  The log-prob is that of the tempered, untruncated policy (log_softmax of
  logits / temperature; temperature 1 for greedy), the quantity an RL trainer
  recomputes as the "old" log-prob.
  """
  logits = logits.astype(jnp.float32)
  if cfg.greedy:
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logp_all = jax.nn.log_softmax(logits, axis=-1)
  else:
    keys = sequence_keys(base_key, seq_ids, positions)
    z = sampling_logits(logits, cfg)
    tokens = jax.vmap(jax.random.categorical)(keys, z).astype(jnp.int32)
    logp_all = jax.nn.log_softmax(logits / cfg.temperature, axis=-1)
  logp = jnp.take_along_axis(logp_all, tokens[:, None], axis=-1)[:, 0]
  return tokens, logp

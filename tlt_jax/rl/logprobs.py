"""Token log-probs over the vocabulary in chunks: no [tokens, vocabulary] float32 array.

For a 150k vocabulary a packed micro-batch of 8 x 4096 tokens would need 20 GB of float32
logits (and as much again for their gradient). `chunked_logprobs` streams the head over
vocabulary chunks with a running log-sum-exp (the max rescaled as chunks arrive, as in
online softmax), picking each token's logit out of the chunk that holds it; the chunk body
is rematerialised in the backward pass, so memory is [tokens, chunk] either way.

Only the untruncated distribution streams: a top-k / top-p kept set is a property of a
row's whole vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def chunked_logprobs(
  model,
  hidden: Float[Array, "N D"],
  targets: Int[Array, " N"],
  temperature: float | Float[Array, ""],
  chunk: int,
  with_entropy: bool = False,
) -> tuple[Float[Array, " N"], Float[Array, " N"] | None]:
  """log softmax(head(hidden) / temperature)[target] and, optionally, the entropy.

  Args:
    model: a `Transformer` (its `head_logits(hidden, start, size)` gives a vocabulary slice).
    hidden: [N, D] final hidden states (any float dtype; the head runs in float32).
    targets: [N] token ids.
    temperature: > 0 (may be traced).
    chunk: vocabulary entries per chunk (capped at the vocabulary size). The last chunk is
      the vocabulary's last `chunk` entries (a dynamic slice cannot run past the end);
      entries an earlier chunk already covered are masked out of it.
    with_entropy: also return each distribution's entropy.

  Returns:
    (logp [N], entropy [N] or None), float32.
  """
  vocab = model.config.vocab_size
  chunk = min(int(chunk), vocab)
  if chunk <= 0:
    raise ValueError(f"chunk must be a positive int, got {chunk!r}")
  n_chunks = -(-vocab // chunk)
  h = hidden.astype(jnp.float32)
  n = h.shape[0]
  offsets = jnp.arange(chunk)

  @jax.checkpoint
  def body(carry, i):
    m, s, tgt, ez = carry
    first = i * chunk  # first entry this chunk owns
    start = jnp.minimum(first, vocab - chunk)  # where the slice really starts
    z = model.head_logits(h, start, chunk) / temperature  # [N, chunk]
    owned = start + offsets >= first
    z = jnp.where(owned[None], z, -jnp.inf)
    # The running max carries no gradient: the log-sum-exp does not depend on it.
    m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(z, axis=-1)))
    rescale = jnp.exp(m - m_new)
    e = jnp.exp(z - m_new[:, None])  # 0 where not owned
    s = s * rescale + jnp.sum(e, axis=-1)
    if with_entropy:
      ez = ez * rescale + jnp.sum(e * jnp.where(owned[None], z, 0.0), axis=-1)
    local = targets - start
    here = (targets >= first) & (targets < first + chunk)
    picked = jnp.take_along_axis(z, jnp.clip(local, 0, chunk - 1)[:, None], axis=-1)[:, 0]
    tgt = tgt + jnp.where(here, picked, 0.0)
    return (m_new, s, tgt, ez), None

  zeros = jnp.zeros((n,), jnp.float32)
  init = (jnp.full((n,), -jnp.inf, jnp.float32), zeros, zeros, zeros)
  (m, s, tgt, ez), _ = jax.lax.scan(body, init, jnp.arange(n_chunks))
  lse = m + jnp.log(s)
  logp = tgt - lse
  entropy = lse - ez / s if with_entropy else None
  return logp, entropy

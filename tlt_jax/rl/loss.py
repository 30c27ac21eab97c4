"""PPO-style clipped policy loss for GRPO-family training (GRPO, DAPO, Dr. GRPO).

All per-token quantities are [B, T] arrays aligned with the token they score
(logp[b, t] = log p(tokens[b, t] | tokens[b, :t])); `mask` marks the response
tokens that count. Masked-out positions never reach the loss or its gradient,
even when they hold garbage (inf / NaN) log-probs.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from tlt_jax.decode.sampling import SamplingConfig

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_TYPES = ("k1", "k3")


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Static description of the policy loss (hashable: a static jit argument).

  Attributes:
    clip_low: ratio clipped below at 1 - clip_low.
    clip_high: ratio clipped above at 1 + clip_high (DAPO's clip-higher: 0.28).
    aggregation: how token losses become one scalar:
      "token-mean": mean over all masked tokens of the batch (DAPO);
      "seq-mean-token-mean": per-row mean over its tokens, then mean over rows (GRPO);
      "seq-mean-token-sum": per-row sum, then mean over rows.
      Row means are over all B rows (a row with no masked token contributes 0),
      so equal-sized micro-batches average to the full-batch value.
    kl_coef: weight of the KL penalty to a reference policy (0: none).
    kl_type: "k1" (logp - ref_logp) or "k3" (Schulman's non-negative estimator).
    entropy_coef: weight of the entropy bonus (subtracted from the loss).
    entropy_metric: compute the policy's entropy for the metrics even when entropy_coef is 0
      (a diagnostic of entropy collapse; it costs a pass over [tokens, vocabulary], real for
      150k vocabularies).
    vocab_chunk: > 0: log-probs (and entropy) computed over vocabulary chunks of this size,
      so no [tokens, vocabulary] float32 array is built (large vocabularies; untruncated
      sampling only: top_k 0, top_p 1). 0: one pass over the vocabulary.
    temperature: the rollout temperature.
    top_k, top_p: the rollout's truncation (0 and 1: none), as in decode.SamplingConfig.
      Every log-prob the loss sees (old, new) is of the distribution the rollout samples
      from: tempered, then truncated and renormalised (`sampling`).
  """

  clip_low: float = 0.2
  clip_high: float = 0.2
  aggregation: str = "token-mean"
  kl_coef: float = 0.0
  kl_type: str = "k3"
  entropy_coef: float = 0.0
  entropy_metric: bool = True
  vocab_chunk: int = 0
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not 0.0 <= self.clip_low < 1.0:
      raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low!r}")
    if not (self.clip_high >= 0.0 and math.isfinite(self.clip_high)):
      raise ValueError(f"clip_high must be a finite number >= 0, got {self.clip_high!r}")
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
    if self.kl_type not in KL_TYPES:
      raise ValueError(f"kl_type must be one of {KL_TYPES}, got {self.kl_type!r}")
    for name in ("kl_coef", "entropy_coef"):
      v = getattr(self, name)
      if not (v >= 0.0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    # Greedy rollouts have no policy distribution to take ratios against.
    if not (self.temperature > 0.0 and math.isfinite(self.temperature)):
      raise ValueError(
        f"temperature must be > 0 (the rollout temperature), got {self.temperature!r}"
      )
    SamplingConfig(self.temperature, self.top_k, self.top_p)  # top_k, top_p: as the sampler
    if not isinstance(self.vocab_chunk, int) or self.vocab_chunk < 0:
      raise ValueError(f"vocab_chunk must be an int >= 0, got {self.vocab_chunk!r}")
    if self.vocab_chunk and (self.top_k > 0 or self.top_p < 1.0):
      raise ValueError(
        f"vocab_chunk={self.vocab_chunk} needs untruncated sampling (top_k=0, top_p=1): a "
        "top-k / top-p kept set depends on a row's whole vocabulary"
      )

  @property
  def sampling(self) -> SamplingConfig:
    """The sampled distribution the log-probs are of: tempered, truncated."""
    return SamplingConfig(self.temperature, self.top_k, self.top_p)


def kl_penalty(
  logp: Float[Array, "B T"], ref_logp: Float[Array, "B T"], kl_type: str
) -> Float[Array, "B T"]:
  """Per-token estimate of KL(policy || reference) from samples of the policy.

  k1 = logp - ref_logp (unbiased, either sign); k3 = exp(ref - logp) - (ref - logp) - 1
  (unbiased, low variance, always >= 0).
  """
  if kl_type == "k1":
    return logp - ref_logp
  if kl_type == "k3":
    d = ref_logp - logp
    return jnp.expm1(d) - d  # expm1: exact 0 at d = 0, accurate near it
  raise ValueError(f"kl_type must be one of {KL_TYPES}, got {kl_type!r}")


def _aggregate(x: Float[Array, "B T"], m: Float[Array, "B T"], aggregation: str) -> Array:
  if aggregation == "token-mean":
    return jnp.sum(x * m) / jnp.maximum(jnp.sum(m), 1.0)
  row_sum = jnp.sum(x * m, axis=-1)
  if aggregation == "seq-mean-token-mean":
    return jnp.mean(row_sum / jnp.maximum(jnp.sum(m, axis=-1), 1.0))
  if aggregation == "seq-mean-token-sum":
    return jnp.mean(row_sum)
  raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def policy_loss(
  logp: Float[Array, "B T"],
  old_logp: Float[Array, "B T"],
  advantages: Float[Array, " B"] | Float[Array, "B T"],
  mask: Float[Array, "B T"],
  cfg: PolicyLossConfig,
  *,
  ref_logp: Float[Array, "B T"] | None = None,
  entropy: Float[Array, "B T"] | None = None,
  token_weights: Float[Array, "B T"] | None = None,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
  """Clipped surrogate + optional KL penalty - optional entropy bonus.

  Args:
    logp: current policy log-probs (the differentiated input).
    old_logp: behaviour-policy log-probs from the rollout (constant).
    advantages: one per row, broadcast over its tokens, or one per token [B, T]
      (packed rows hold several samples) (constant).
    mask: 1 on tokens that count, 0 elsewhere.
    cfg: the loss configuration.
    ref_logp: reference-policy log-probs; required when cfg.kl_coef > 0.
    entropy: per-token policy entropy; required when cfg.entropy_coef > 0.
    token_weights: the aggregation folded into per-token weights (packed rows,
      see rl/packing.py): the loss is sum(weights * token loss) and
      cfg.aggregation is not used.

  Returns:
    (loss, metrics). Metrics are token means over the masked tokens whatever the
    aggregation: clip_fraction_low / clip_fraction_high (fraction of tokens whose
    clip binds, i.e. that get no policy gradient), approx_kl (k3 estimate of
    KL(old || new)), ratio_mean, ratio_max, and kl / entropy when given.
  """
  if cfg.kl_coef > 0 and ref_logp is None:
    raise ValueError("cfg.kl_coef > 0 needs ref_logp")
  if cfg.entropy_coef > 0 and entropy is None:
    raise ValueError("cfg.entropy_coef > 0 needs entropy")
  m = mask.astype(jnp.float32)
  on = m > 0
  count = jnp.maximum(jnp.sum(m), 1.0)
  mean = lambda x: jnp.sum(x * m) / count
  # Zero every input off the mask first: a where after exp / log would still
  # send 0 * inf = NaN back through the gradient from padding positions.
  zero_off = lambda x: jnp.where(on, x.astype(jnp.float32), 0.0)
  logp = zero_off(logp)
  old_logp = jax.lax.stop_gradient(zero_off(old_logp))
  adv = jax.lax.stop_gradient(advantages.astype(jnp.float32))
  adv = adv[:, None] if adv.ndim == 1 else zero_off(adv)

  log_ratio = logp - old_logp
  ratio = jnp.exp(log_ratio)
  lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
  # Pessimistic (max) of unclipped and clipped losses: PPO's trust region.
  per_token = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, lo, hi))
  metrics = {
    # The clip binds (zero gradient) only in the direction the advantage pushes.
    "clip_fraction_low": mean(((ratio < lo) & (adv < 0)).astype(jnp.float32)),
    "clip_fraction_high": mean(((ratio > hi) & (adv > 0)).astype(jnp.float32)),
    "approx_kl": mean(jax.lax.stop_gradient(jnp.expm1(log_ratio) - log_ratio)),
    "ratio_mean": mean(jax.lax.stop_gradient(ratio)),
    "ratio_max": jnp.max(jnp.where(on, jax.lax.stop_gradient(ratio), 0.0)),
  }
  if ref_logp is not None:
    kl = kl_penalty(logp, jax.lax.stop_gradient(zero_off(ref_logp)), cfg.kl_type)
    per_token = per_token + cfg.kl_coef * kl
    metrics["kl"] = mean(jax.lax.stop_gradient(kl))
  if entropy is not None:
    ent = zero_off(entropy)
    per_token = per_token - cfg.entropy_coef * ent
    metrics["entropy"] = mean(jax.lax.stop_gradient(ent))
  # where, not multiply: a NaN advantage on a row must still poison the loss
  # (and so skip the update) only through that row's counted tokens.
  per_token = jnp.where(on, per_token, 0.0)
  if token_weights is None:
    loss = _aggregate(per_token, m, cfg.aggregation)
  else:
    loss = jnp.sum(per_token * zero_off(token_weights))
  return loss, metrics

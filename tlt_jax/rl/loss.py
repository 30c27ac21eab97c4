"""Policy losses for GRPO-family training: PPO's clipped surrogate (GRPO, DAPO, Dr. GRPO),
with dual clipping, sequence-level ratios (GSPO), clipped-IS-weight REINFORCE (CISPO) and
truncated importance weights for the rollout-vs-trainer gap (TIS) as options.

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
KL_TYPES = ("k1", "k2", "k3")
LOSS_KINDS = ("ppo", "cispo")
RATIO_LEVELS = ("token", "sequence")


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
    kl_type: "k1" (logp - ref_logp), "k2" (0.5 (logp - ref_logp)^2, veRL's "mse") or "k3"
      (Schulman's non-negative estimator); see `kl_penalty`.
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
    kind: the surrogate. "ppo": PPO's clipped objective max(-A r, -A clip(r)). "cispo":
      REINFORCE with clipped importance weights (MiniMax-M1's CISPO):
      -stop_gradient(clip(r, 1 - clip_low, 1 + clip_high)) A log p, so a clipped token keeps
      its gradient, only its weight is bounded.
    ratio_level: "token": r per token. "sequence" (GSPO, Zheng et al. 2025): every token of
      a sample takes the sample's length-normalised ratio s = exp(mean_t log r_t), clipped
      per sample; its gradient is s times each token's log-prob gradient. GSPO pairs it
      with aggregation "seq-mean-token-mean" and much narrower clips (3e-4 / 4e-4).
    clip_ratio_c: dual-clip PPO (Ye et al. 2020; veRL's clip_ratio_c, 3.0 there): for a
      negative advantage the token loss is at most c |A|, so a token whose ratio ran far
      above 1 cannot dominate the batch. 0: off (the default: plain PPO; it only binds at
      r > c, never on the trainer's one-step on-policy path where r = 1). Must be > 1.
    log_ratio_clamp: > 0: log r is clamped to [-this, +this] before exp (veRL clamps at
      20); 0: no clamp (the default; the out-of-set floor of `token_logprobs` already keeps
      log r within +-30).
    tis_cap: truncated importance sampling for the rollout-vs-trainer mismatch (e.g.
      bfloat16 rollouts): each token's policy loss is weighted by
      min(exp(old_logp - rollout_logp), tis_cap), a constant, where old_logp is the trainer's
      log-prob of the sampling policy and rollout_logp the engine's recorded one. 0: off
      (the default). Must be >= 1 (a cap below 1 would scale down every token, agreeing
      ones too).
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
  kind: str = "ppo"
  ratio_level: str = "token"
  clip_ratio_c: float = 0.0
  log_ratio_clamp: float = 0.0
  tis_cap: float = 0.0

  def __post_init__(self):
    if not 0.0 <= self.clip_low < 1.0:
      raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low!r}")
    if not (self.clip_high >= 0.0 and math.isfinite(self.clip_high)):
      raise ValueError(f"clip_high must be a finite number >= 0, got {self.clip_high!r}")
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
    if self.kl_type not in KL_TYPES:
      raise ValueError(f"kl_type must be one of {KL_TYPES}, got {self.kl_type!r}")
    for name in ("kl_coef", "entropy_coef", "log_ratio_clamp"):
      v = getattr(self, name)
      if not (v >= 0.0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if self.kind not in LOSS_KINDS:
      raise ValueError(f"kind must be one of {LOSS_KINDS}, got {self.kind!r}")
    if self.ratio_level not in RATIO_LEVELS:
      raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {self.ratio_level!r}")
    if self.kind == "cispo" and self.ratio_level == "sequence":
      raise ValueError(
        "kind='cispo' weighs each token by its own clipped ratio; ratio_level='sequence' is "
        "GSPO's clipped surrogate (kind='ppo')"
      )
    if self.clip_ratio_c != 0.0 and not 1.0 < self.clip_ratio_c < math.inf:
      raise ValueError(
        f"clip_ratio_c must be 0 (off) or a finite number > 1, got {self.clip_ratio_c!r}"
      )
    if self.clip_ratio_c and self.kind != "ppo":
      raise ValueError("clip_ratio_c (dual clip) bounds PPO's surrogate: it needs kind='ppo'")
    if self.tis_cap != 0.0 and not 1.0 <= self.tis_cap < math.inf:
      raise ValueError(f"tis_cap must be 0 (off) or a finite number >= 1, got {self.tis_cap!r}")
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

  k1 = logp - ref_logp (unbiased, either sign); k2 = 0.5 (logp - ref_logp)^2 (biased, >= 0,
  low variance; its gradient is that of the reverse KL: veRL's "mse"); k3 = exp(ref - logp)
  - (ref - logp) - 1 (unbiased, low variance, always >= 0).
  """
  if kl_type == "k1":
    return logp - ref_logp
  if kl_type == "k2":
    return 0.5 * jnp.square(logp - ref_logp)
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


def sequence_mean(
  x: Float[Array, "B T"], mask: Float[Array, "B T"], segment_ids: Array | None = None
) -> Float[Array, "B T"]:
  """Per token, the mean of `x` over the masked tokens of its sample.

  A sample is a row, or (packed rows, rl/packing.py) a run of equal `segment_ids` within a
  row. A sample without masked tokens gets 0.
  """
  b, t = x.shape
  m = mask.astype(jnp.float32)
  if segment_ids is None:
    row = jnp.sum(x * m, axis=-1, keepdims=True) / jnp.maximum(jnp.sum(m, -1, keepdims=True), 1.0)
    return jnp.broadcast_to(row, (b, t))
  # Packed samples are contiguous runs: number the runs, then sum per run.
  starts = jnp.concatenate(
    [jnp.ones((b, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
  )
  run = jnp.cumsum(starts, axis=1) - 1 + t * jnp.arange(b)[:, None]
  ids = run.reshape(-1)
  sums = jax.ops.segment_sum((x * m).reshape(-1), ids, num_segments=b * t)
  counts = jax.ops.segment_sum(m.reshape(-1), ids, num_segments=b * t)
  return (sums / jnp.maximum(counts, 1.0))[ids].reshape(b, t)


def _ratios(logp, old_logp, m, cfg: PolicyLossConfig, segment_ids) -> tuple[Array, Array]:
  """(per-token log-ratio new / old, optionally clamped; the ratio the surrogate uses: the
  token's own, or with ratio_level "sequence" its sample's mean)."""
  sg = jax.lax.stop_gradient
  token_log_ratio = logp - old_logp
  if cfg.log_ratio_clamp:
    bound = cfg.log_ratio_clamp
    token_log_ratio = jnp.clip(token_log_ratio, -bound, bound)
  log_ratio = token_log_ratio
  if cfg.ratio_level == "sequence":
    # GSPO: the value is the sample's mean log-ratio, the gradient each token's own
    # (d s / d theta = s * d log p_t / d theta per token, as GSPO-token at equal advantages).
    log_ratio = sg(sequence_mean(token_log_ratio, m, segment_ids)) + logp - sg(logp)
  return token_log_ratio, jnp.exp(log_ratio)


def _surrogate(logp, ratio, adv, cfg: PolicyLossConfig, mean):
  """The clipped surrogate per token (cfg.kind), with where its clip binds low and high,
  and the dual clip's metric when set."""
  sg = jax.lax.stop_gradient
  lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
  clipped = jnp.clip(ratio, lo, hi)
  metrics = {}
  if cfg.kind == "cispo":
    # REINFORCE with the clipped ratio as a constant weight: clipped tokens keep a gradient.
    per_token = -adv * sg(clipped) * logp
    low, high = ratio < lo, ratio > hi
  else:
    # Pessimistic (max) of unclipped and clipped losses: PPO's trust region.
    per_token = jnp.maximum(-adv * ratio, -adv * clipped)
    # The clip binds (zero gradient) only in the direction the advantage pushes.
    low, high = (ratio < lo) & (adv < 0), (ratio > hi) & (adv > 0)
    if cfg.clip_ratio_c:
      # Dual clip: a negative advantage's loss stops growing at c |A| (ratio above c).
      per_token = jnp.where(adv < 0, jnp.minimum(per_token, -adv * cfg.clip_ratio_c), per_token)
      metrics["clip_fraction_dual"] = mean(((ratio > cfg.clip_ratio_c) & (adv < 0)) * 1.0)
  return per_token, low, high, metrics


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
  rollout_logp: Float[Array, "B T"] | None = None,
  segment_ids: Array | None = None,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
  """Policy surrogate (cfg.kind) + optional KL penalty - optional entropy bonus.

  Args:
    logp: current policy log-probs (the differentiated input).
    old_logp: the trainer's log-probs of the policy that sampled the batch (constant).
    advantages: one per row, broadcast over its tokens, or one per token [B, T]
      (packed rows hold several samples) (constant).
    mask: 1 on tokens that count, 0 elsewhere.
    cfg: the loss configuration.
    ref_logp: reference-policy log-probs; required when cfg.kl_coef > 0.
    entropy: per-token policy entropy; required when cfg.entropy_coef > 0.
    token_weights: the aggregation folded into per-token weights (packed rows,
      see rl/packing.py): the loss is sum(weights * token loss) and
      cfg.aggregation is not used.
    rollout_logp: the rollout engine's recorded log-probs; required when cfg.tis_cap > 0.
    segment_ids: packed rows' sample ids (rl/packing.py), for cfg.ratio_level
      "sequence"; None: one sample per row.

  Returns:
    (loss, metrics). Metrics are token means over the masked tokens whatever the
    aggregation: clip_fraction_low / clip_fraction_high (fraction of tokens whose
    clip binds: for "ppo" those that get no policy gradient, for "cispo" those whose
    weight is clipped), approx_kl (k3 estimate of KL(old || new), per token),
    ratio_mean, ratio_max (of the ratio the surrogate uses: per sample with
    ratio_level "sequence"), and kl / entropy when given; clip_fraction_dual with
    clip_ratio_c; tis_weight_mean and tis_capped_fraction with tis_cap.
  """
  if cfg.kl_coef > 0 and ref_logp is None:
    raise ValueError("cfg.kl_coef > 0 needs ref_logp")
  if cfg.entropy_coef > 0 and entropy is None:
    raise ValueError("cfg.entropy_coef > 0 needs entropy")
  if cfg.tis_cap > 0 and rollout_logp is None:
    raise ValueError("cfg.tis_cap > 0 needs rollout_logp (the engine's log-probs)")
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
  sg = jax.lax.stop_gradient
  token_log_ratio, ratio = _ratios(logp, old_logp, m, cfg, segment_ids)
  per_token, low, high, metrics = _surrogate(logp, ratio, adv, cfg, mean)
  if cfg.tis_cap:
    # Truncated IS: the trainer's sampling-policy log-prob against the engine's.
    gap = old_logp - sg(zero_off(rollout_logp))
    tis = jnp.minimum(jnp.exp(gap), cfg.tis_cap)
    per_token = per_token * tis
    metrics["tis_weight_mean"] = mean(tis)
    metrics["tis_capped_fraction"] = mean((gap > math.log(cfg.tis_cap)) * 1.0)
  metrics.update(
    clip_fraction_low=mean(low.astype(jnp.float32)),
    clip_fraction_high=mean(high.astype(jnp.float32)),
    approx_kl=mean(sg(jnp.expm1(token_log_ratio) - token_log_ratio)),
    ratio_mean=mean(sg(ratio)),
    ratio_max=jnp.max(jnp.where(on, sg(ratio), 0.0)),
  )
  if ref_logp is not None:
    kl = kl_penalty(logp, sg(zero_off(ref_logp)), cfg.kl_type)
    per_token = per_token + cfg.kl_coef * kl
    metrics["kl"] = mean(sg(kl))
  if entropy is not None:
    ent = zero_off(entropy)
    per_token = per_token - cfg.entropy_coef * ent
    metrics["entropy"] = mean(sg(ent))
  # where, not multiply: a NaN advantage on a row must still poison the loss
  # (and so skip the update) only through that row's counted tokens.
  per_token = jnp.where(on, per_token, 0.0)
  if token_weights is None:
    loss = _aggregate(per_token, m, cfg.aggregation)
  else:
    loss = jnp.sum(per_token * zero_off(token_weights))
  return loss, metrics

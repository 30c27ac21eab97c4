"""Host-side reward shaping for GRPO-family training: group advantages, dynamic
sampling and DAPO's soft overlong punishment.

Rows are laid out as the rollout engine returns them: G consecutive samples per
prompt (row n samples prompt n // G). Everything here is plain numpy: rewards
come from host-side checkers, and the results enter the device batch once.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Float, Int


def _grouped(rewards, group_size: int) -> np.ndarray:
  """Rewards as a float64 [P, G] array, validated."""
  if not isinstance(group_size, int | np.integer) or group_size <= 0:
    raise ValueError(f"group_size must be a positive int, got {group_size!r}")
  r = np.asarray(rewards, dtype=np.float64)
  if r.ndim != 1:
    raise ValueError(f"rewards must be 1-D [num_prompts * group_size], got shape {r.shape}")
  if r.size == 0 or r.size % group_size:
    raise ValueError(
      f"rewards length {r.size} must be a positive multiple of group_size {group_size}"
    )
  if not np.all(np.isfinite(r)):
    raise ValueError("rewards must be finite")
  return r.reshape(-1, group_size)


def group_advantages(
  rewards: Float[np.ndarray, " N"],
  group_size: int,
  *,
  normalize_std: bool = True,
  negative_weight: float = 1.0,
  eps: float = 1e-6,
) -> Float[np.ndarray, " N"]:
  """Per-sample GRPO advantage: reward minus its group's mean, optionally over the group's std.

  Args:
    rewards: one scalar per row, [P * G], groups of G consecutive rows.
    group_size: G.
    normalize_std: divide by (std + eps) (GRPO); False keeps the centred reward
      (Dr. GRPO: the std division over-weights near-uniform groups).
    negative_weight: scales the negative advantages (samples worse than their group's
      mean): 1 is GRPO; 0 keeps only the push towards better-than-average samples
      (rejection-sampling fine-tuning within the group, cf. RAFT, Dong et al. 2023;
      Xiong et al. 2025, arXiv:2504.11343), less noisy and safer at a high learning rate.
    eps: added to the std; keeps all-equal groups at exactly 0.

  Returns:
    float32 [P * G]. The std is the population std (ddof=0) of the group.
  """
  if not eps > 0:
    raise ValueError(f"eps must be positive, got {eps!r}")
  if not 0.0 <= negative_weight <= 1.0:
    raise ValueError(f"negative_weight must be in [0, 1], got {negative_weight!r}")
  r = _grouped(rewards, group_size)
  adv = r - r.mean(axis=1, keepdims=True)
  if normalize_std:
    adv = adv / (r.std(axis=1, keepdims=True) + eps)
  if negative_weight != 1.0:
    adv = np.where(adv < 0, negative_weight * adv, adv)
  return adv.reshape(-1).astype(np.float32)


def informative_groups(rewards: Float[np.ndarray, " N"], group_size: int) -> Bool[np.ndarray, " P"]:
  """Per group: False when every reward is equal (zero advantage, zero gradient).

  DAPO's dynamic sampling drops such groups and refills the batch with new prompts.
  """
  r = _grouped(rewards, group_size)
  return np.any(r != r[:, :1], axis=1)


def overlong_penalty(
  lengths: Int[np.ndarray, " N"], max_len: int, buffer: int
) -> Float[np.ndarray, " N"]:
  """DAPO soft overlong punishment (Yu et al., 2025), added to the task reward.

  With L the response length: 0 for L <= max_len - buffer; a linear ramp
  ((max_len - buffer) - L) / buffer down to -1 at L = max_len; -1 beyond.

  Args:
    lengths: response (generated) token counts, >= 0.
    max_len: the generation limit L_max.
    buffer: the punishment interval L_cache, in (0, max_len].

  Returns:
    float32 penalties in [-1, 0].
  """
  if not isinstance(max_len, int | np.integer) or max_len <= 0:
    raise ValueError(f"max_len must be a positive int, got {max_len!r}")
  if not isinstance(buffer, int | np.integer) or not 0 < buffer <= max_len:
    raise ValueError(f"buffer must be an int in (0, max_len={max_len}], got {buffer!r}")
  lens = np.asarray(lengths)
  if not np.issubdtype(lens.dtype, np.integer):
    raise ValueError(f"lengths must be integers, got dtype {lens.dtype}")
  if np.any(lens < 0):
    raise ValueError("lengths must be >= 0")
  soft_start = max_len - buffer
  ramp = (soft_start - lens.astype(np.float64)) / buffer
  out = np.where(lens <= soft_start, 0.0, np.where(lens <= max_len, ramp, -1.0))
  return out.astype(np.float32)

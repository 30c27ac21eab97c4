"""Host-side reward shaping for GRPO-family training: group advantages, dynamic
sampling and DAPO's soft overlong punishment.

Rows are laid out as the rollout engine returns them: G consecutive samples per
prompt (row n samples prompt n // G). Everything here is plain numpy: rewards
come from host-side checkers, and the results enter the device batch once.
"""

from __future__ import annotations

from collections.abc import Sequence

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
  std_ddof: int = 0,
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
    std_ddof: the std's delta degrees of freedom: 0 the population std (the default,
      as before), 1 the sample std with Bessel's correction (sqrt(G / (G - 1)) larger, so
      advantages that much smaller; some GRPO implementations use it, e.g. torch.std's
      default).

  Returns:
    float32 [P * G].
  """
  if not eps > 0:
    raise ValueError(f"eps must be positive, got {eps!r}")
  _check_ddof(std_ddof, group_size)
  if not 0.0 <= negative_weight <= 1.0:
    raise ValueError(f"negative_weight must be in [0, 1], got {negative_weight!r}")
  r = _grouped(rewards, group_size)
  adv = r - r.mean(axis=1, keepdims=True)
  if normalize_std:
    adv = adv / (r.std(axis=1, keepdims=True, ddof=std_ddof) + eps)
  if negative_weight != 1.0:
    adv = np.where(adv < 0, negative_weight * adv, adv)
  return adv.reshape(-1).astype(np.float32)


PROCESS_CREDITS = ("step", "return")
STD_DDOFS = (0, 1)


def _check_ddof(std_ddof, group_size) -> None:
  if isinstance(std_ddof, bool) or std_ddof not in STD_DDOFS:
    raise ValueError(f"std_ddof must be 0 (population std) or 1 (Bessel's), got {std_ddof!r}")
  if std_ddof == 1 and isinstance(group_size, int | np.integer) and group_size < 2:
    raise ValueError("std_ddof=1 needs group_size >= 2 (one sample has no sample std)")


def process_advantages(
  step_rewards: Sequence[Sequence[float]],
  group_size: int,
  *,
  normalize_std: bool = True,
  eps: float = 1e-6,
  std_ddof: int = 0,
) -> list[np.ndarray]:
  """GRPO with process supervision (Shao et al. 2024, DeepSeekMath, sec. 4.1.3): every step
  reward normalised by the mean (and std) of all step rewards of its group's G samples.

  Args:
    step_rewards: per sample (G consecutive samples per prompt), its steps' rewards; a
      sample may have no step.
    group_size: G.
    normalize_std: divide by the std (+ eps) of the group's step rewards.
    eps: added to the std.
    std_ddof: 0 (population std) or 1 (Bessel's correction; a group with a single step
      reward has all-zero advantages either way).

  Returns:
    Per sample, float32 [its steps] normalised step rewards (all 0 in a group whose step
    rewards are all equal).
  """
  if not isinstance(group_size, int | np.integer) or group_size <= 0:
    raise ValueError(f"group_size must be a positive int, got {group_size!r}")
  _check_ddof(std_ddof, 2)
  if not step_rewards or len(step_rewards) % group_size:
    raise ValueError(
      f"{len(step_rewards)} samples' step rewards: need a positive multiple of {group_size}"
    )
  out = []
  for g in range(0, len(step_rewards), group_size):
    rows = [np.asarray(r, np.float64).reshape(-1) for r in step_rewards[g : g + group_size]]
    flat = np.concatenate(rows)
    if flat.size and not np.all(np.isfinite(flat)):
      raise ValueError("step rewards must be finite")
    mean = flat.mean() if flat.size else 0.0
    # One step reward: centred to 0, any scale will do (ddof 1 would divide by 0).
    scale = flat.std(ddof=std_ddof) + eps if normalize_std and flat.size > std_ddof else 1.0
    out += [((r - mean) / scale).astype(np.float32) for r in rows]
  return out


def token_process_advantages(
  step_ends: Sequence[int],
  step_advantages: np.ndarray,
  token_ends: Sequence[int],
  credit: str,
) -> Float[np.ndarray, " T"]:
  """Per-token advantages of one response from its steps' normalised rewards.

  Token t covers the response text up to `token_ends[t]`; it belongs to the first step
  whose end is at or after that. "step": a token gets its own step's advantage (a line
  judged on its own); "return": the sum over its step and every later one (DeepSeekMath's
  process-supervised GRPO). Tokens past the last step get 0.

  Returns:
    float32 [len(token_ends)].
  """
  if credit not in PROCESS_CREDITS:
    raise ValueError(f"credit must be one of {PROCESS_CREDITS}, got {credit!r}")
  ends = np.asarray(step_ends, np.int64)
  adv = np.asarray(step_advantages, np.float32)
  if ends.shape != adv.shape or np.any(np.diff(ends) <= 0):
    raise ValueError("step_ends must be increasing, one per step advantage")
  if credit == "return":
    adv = np.cumsum(adv[::-1])[::-1]
  step = np.searchsorted(ends, np.asarray(token_ends, np.int64), side="left")
  padded = np.append(adv, np.float32(0.0))
  return padded[np.minimum(step, adv.size)].astype(np.float32)


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

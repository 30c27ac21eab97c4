"""Replays the rollout engine's policy on response lengths with a cost model: a predicted
rollout, RL step and end-to-end speedup per mode, without running a model.

The replay follows `rollout.engine.RolloutEngine.generate`: rows start in the smallest batch
bucket that holds them (powers of two from `min_batch_bucket` to `max_batch`); between
chunks the unfinished rows move to a smaller bucket when they fit (`compact`); a chunk is
`chunk_steps` plain decode steps, or `spec_rounds` speculative rounds when the bucket is at
or below `spec_threshold`, with the arm a converged bandit picks (the one of highest
predicted speed in that bucket, plain decode included). Every step or round is charged at
the bucket's batch (padding rows cost like real ones) and the active rows' mean context.

Rows progress by their arm's mean accept length per round (`stochastic=False`), or by draws
of a chain's i.i.d. per-token acceptance (`stochastic=True`: the rows spread apart as they
do, and the slowest decides when a bucket ends).

A step: rollout + update (seconds per token, measured) + fixed other time (rewards, old
log-probs); mode "tlt" adds the drafter training that does not fit in idle time. Speedup
of a mode = baseline step / mode step (the paper's end-to-end figure), with the rollout
share r and rollout speedup s that bound it: 1 / ((1 - r) + r / s).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from tlt_jax.rollout.state import power_of_two_buckets, round_up
from tlt_jax.sim.costs import ArmModel, DecodeCost

__all__ = [
  "EnginePolicy",
  "RolloutPrediction",
  "StepPrediction",
  "replay_rollout",
  "replay_step",
  "speedup_bound",
]

PLAIN = "plain"


@dataclasses.dataclass(frozen=True)
class EnginePolicy:
  """The engine settings the replay follows (names as in `rollout.engine.EngineConfig`)."""

  max_batch: int
  min_batch_bucket: int = 1
  chunk_steps: int = 16
  compact: bool = True
  spec_threshold: int = 0
  spec_rounds: int = 8
  prompt_len: int = 0

  @property
  def batch_buckets(self) -> tuple[int, ...]:
    return power_of_two_buckets(min(self.min_batch_bucket, self.max_batch), self.max_batch)


@dataclasses.dataclass
class RolloutPrediction:
  seconds: float
  tokens: int
  chunks_by_arm: dict[str, int]
  seconds_by_bucket: dict[int, float]

  @property
  def tokens_per_second(self) -> float:
    return self.tokens / self.seconds if self.seconds else 0.0


def _best_arm(arms, cost, batch, context) -> tuple[str, ArmModel | None]:
  """The arm of highest predicted tokens/s per row in this bucket (plain decode included)."""
  best, best_speed = (PLAIN, None), 1.0 / cost.seconds(batch, 1, context)
  for arm in arms:
    speed = arm.accept_length / arm.round_seconds(cost, batch, context)
    if speed > best_speed:
      best, best_speed = (arm.name, arm), speed
  return best


def _per_token_acceptance(arm: ArmModel) -> float:
  """The i.i.d. per-token acceptance a whose chain of depth nodes - 1 emits accept_length
  per round (bisection on (1 - a^n) / (1 - a))."""
  n = arm.nodes
  if arm.accept_length >= n:
    return 1.0
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    value = n if mid == 1.0 else (1 - mid**n) / (1 - mid)
    lo, hi = (mid, hi) if value < arm.accept_length else (lo, mid)
  return (lo + hi) / 2


def replay_rollout(
  lengths: Sequence[int],
  cost: DecodeCost,
  policy: EnginePolicy,
  arms: Sequence[ArmModel] = (),
  *,
  stochastic: bool = False,
  seed: int = 0,
) -> RolloutPrediction:
  """The predicted rollout of rows generating `lengths` tokens each (see the module doc)."""
  remaining = np.asarray(lengths, dtype=float)
  if remaining.ndim != 1 or not remaining.size or np.any(remaining < 1):
    raise ValueError("lengths must be a non-empty list of positive token counts")
  if remaining.size > policy.max_batch:
    raise ValueError(f"{remaining.size} rows exceed max_batch={policy.max_batch}")
  rng = np.random.default_rng(seed)
  accept_p = {a.name: _per_token_acceptance(a) for a in arms}
  generated = np.zeros_like(remaining)
  batch = round_up(remaining.size, policy.batch_buckets)
  seconds, chunks, by_bucket = 0.0, {}, {}
  while np.any(remaining > 0):
    active = remaining > 0
    if policy.compact:
      batch = min(batch, round_up(int(active.sum()), policy.batch_buckets))
    context = policy.prompt_len + float(generated[active].mean())
    name, arm = (PLAIN, None)
    if arms and batch <= policy.spec_threshold:
      name, arm = _best_arm(arms, cost, batch, context)
    chunks[name] = chunks.get(name, 0) + 1
    start = seconds
    for _ in range(policy.chunk_steps if arm is None else policy.spec_rounds):
      active = remaining > 0
      if not active.any():
        break
      context = policy.prompt_len + float(generated[active].mean())
      if arm is None:
        seconds += cost.seconds(batch, 1, context)
        gain = np.ones(active.sum())
      else:
        seconds += arm.round_seconds(cost, batch, context)
        if stochastic:
          # Leading accepted draft tokens of a chain of nodes - 1, plus the bonus token.
          draws = rng.random((int(active.sum()), arm.nodes - 1)) < accept_p[name]
          gain = np.cumprod(draws, axis=1).sum(axis=1) + 1.0
        else:
          gain = np.full(active.sum(), arm.accept_length)
      step = np.minimum(gain, remaining[active])
      remaining[active] -= step
      generated[active] += step
    by_bucket[batch] = by_bucket.get(batch, 0.0) + seconds - start
  return RolloutPrediction(seconds, int(np.sum(lengths)), chunks, by_bucket)


@dataclasses.dataclass
class StepPrediction:
  mode: str
  rollout_s: float
  update_s: float
  other_s: float
  drafter_s: float
  rollout: RolloutPrediction

  @property
  def step_s(self) -> float:
    return self.rollout_s + self.update_s + self.other_s + self.drafter_s


def replay_step(
  mode: str,
  lengths: Sequence[int],
  cost: DecodeCost,
  policy: EnginePolicy,
  arms: Sequence[ArmModel] = (),
  *,
  update_s_per_token: float,
  other_s: float = 0.0,
  drafter_s: float = 0.0,
  drafter_idle_fraction: float = 1.0,
  stochastic: bool = False,
  seed: int = 0,
) -> StepPrediction:
  """One RL step of `mode` ("baseline": plain decode; "sd" / "tlt": the arms, which carry
  the frozen or the online drafter's accept lengths). In "tlt" the drafter's `drafter_s` of
  training per step runs in idle device time; the part beyond `drafter_idle_fraction` of
  the rollout is added to the step."""
  if mode not in ("baseline", "sd", "tlt"):
    raise ValueError(f"mode must be baseline, sd or tlt, got {mode!r}")
  if mode == "baseline":
    policy, arms = dataclasses.replace(policy, spec_threshold=0), ()
  rollout = replay_rollout(lengths, cost, policy, arms, stochastic=stochastic, seed=seed)
  update = update_s_per_token * float(np.sum(lengths))
  extra = 0.0
  if mode == "tlt":
    extra = max(0.0, drafter_s - drafter_idle_fraction * rollout.seconds)
  return StepPrediction(mode, rollout.seconds, update, other_s, extra, rollout)


def speedup_bound(rollout_share: float, rollout_speedup: float) -> float:
  """End-to-end speedup from the rollout's share r of the step and its speedup s."""
  if not 0.0 <= rollout_share <= 1.0 or rollout_speedup <= 0 or math.isnan(rollout_speedup):
    raise ValueError("need 0 <= rollout_share <= 1 and rollout_speedup > 0")
  return 1.0 / ((1.0 - rollout_share) + rollout_share / rollout_speedup)

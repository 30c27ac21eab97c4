"""Per-batch-bucket bandit that picks a speculative-decoding draft strategy per decode chunk.

Why a bandit, and why one per batch bucket:

* The best draft shape depends on the batch size. Verifying a draft costs roughly
  batch x draft nodes of target-model compute, while drafting costs a fixed number of drafter
  rounds per chunk whatever the batch. At batch 1 the target is memory bound, so deep chains or
  wide trees are nearly free to verify and every accepted token is a win; at batch 64 the target
  is compute bound, extra nodes cost real time, and plain decoding (or a short chain) can win.
  So each batch-size bucket keeps its own statistics per arm and learns its own best arm.
* The reward is measured speed: tokens per second of one chunk, wall clock, of the mean
  active row (`rollout.decisions.chunk_reward`). That counts everything (drafting,
  verification, acceptance, host overhead), so no cost model has to be right.
  Scales differ a lot between buckets, so rewards
  are normalised within a bucket (by the best current discounted mean) before the exploration
  bonus is added; one `exploration` value then means the same thing in every bucket.
* The problem is non-stationary: the drafter is trained alongside the policy, its acceptance rate
  rises, and deeper drafts become worth more over time. Discounted UCB handles that: every update
  of a bucket multiplies that bucket's statistics by `discount`, so old observations fade (an
  effective window of about 1 / (1 - discount) chunks) and the bonus of an arm that has not been
  tried for a while grows until it is tried again.
* The bonus is a plain UCB's, on the normalised rewards: `exploration` is its weight in
  units of the best arm's mean, about twice the relative spread of chunk timings on the
  host it was tuned on (0.05-0.16 per bucket, median ~0.11: experiments/RESULTS.md,
  2026-11-28, host H).

Selection in a bucket: first every arm is pulled `min_pulls` times, round-robin in arm order;
then the arm maximising

  mean_a / M + exploration * sqrt(log(sum_b n_b) / n_a),   M = max_b mean_b

is chosen, where mean_a is the discounted mean and n_a the discounted count.
Exact ties are broken by a seeded numpy Generator, so a bandit is deterministic given its seed
and its history; `state_dict` includes the generator's state so that a restored bandit
continues exactly as the original would.

Mechanisms tried on top of this and removed when an A/B in one run, against a control arm
for the noise floor, did not show them paying beyond it (experiments/RESULTS.md,
2026-11-28): a neighbours' prior, a cut-short reward, per-arm acceptance curves, comparing
arms at equal phase of the answers (a reward ~ arm x phase fit), scoring the drafter's
chains from one shared acceptance curve, a bonus scaled by the rewards' measured spread,
and rewarding the advance of the rows' lower octile or of the least-advanced row instead of
the mean row.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

PLAIN = "plain"  # the bandit arm that runs plain decode
# The layout `state_dict` writes (6: per-arm counts and sums). Older layouts are refused:
# version 5 held squared sums for the spread-scaled bonus, 4 per-phase cells and acceptance
# curves (both removed 2026-11-28).
_STATE_VERSION = 6


def _is_real(x: Any) -> bool:
  return isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool)


def _bucket_key(bucket: int) -> int:
  try:
    return operator.index(bucket)
  except TypeError:
    raise ValueError(f"bucket must be an int, got {bucket!r}") from None


@dataclasses.dataclass(frozen=True)
class BanditSettings:
  """Every setting of a `StrategyBandit`, with the defaults the engine builds it with.

  The engine (`rollout.config.bandit_settings`: the config's exploration on these
  defaults), the simulator (`sim.validate.engine_bandit`) and experiments/bench_bandit.py
  all build their bandit from one of these.

  The defaults: a ~100-chunk memory (discount 0.99), long enough to settle on a steady best
  arm, short enough to follow a drafter that improves over RL steps; one pull per arm
  first (min_pulls 1), so each bucket's warm-up costs one chunk per arm, then UCB. (Three
  pulls per arm made the RL runs of experiments/e2e_modes.py spend most of their
  speculative chunks warming up.)

  Attributes:
    exploration: Weight of the UCB bonus, in units of the bucket's best mean reward.
    discount: Factor applied to a bucket's statistics on each of its updates, in (0, 1]; 1
      means stationary (plain UCB on normalised rewards).
    min_pulls: Pulls of every arm in a bucket before UCB takes over.
    seed: Seed of the generator that breaks exact ties.
  """

  exploration: float = 0.2
  discount: float = 0.99
  min_pulls: int = 1
  seed: int = 0

  def __post_init__(self):
    def bad(name: str, want: str) -> ValueError:
      return ValueError(f"BanditSettings.{name} must be {want}, got {getattr(self, name)!r}")

    x = self.exploration
    if not (_is_real(x) and math.isfinite(x) and x >= 0):
      raise bad("exploration", "a finite number >= 0")
    if not (_is_real(self.discount) and 0 < self.discount <= 1):
      raise bad("discount", "in (0, 1]")
    n = self.min_pulls
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
      raise bad("min_pulls", "an int >= 1")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
      raise bad("seed", "an int")
    # Stored as plain floats and ints, so that equal settings compare equal.
    for name in ("exploration", "discount"):
      object.__setattr__(self, name, float(getattr(self, name)))
    for name in ("min_pulls", "seed"):
      object.__setattr__(self, name, int(getattr(self, name)))

  def to_state(self) -> dict[str, Any]:
    """The settings as `StrategyBandit.state_dict` records them (JSON types)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  @classmethod
  def from_state(cls, state: Mapping[str, Any]) -> BanditSettings:
    """The settings a `state_dict` records (a setting it lacks: the default)."""
    return cls(**{f.name: state[f.name] for f in dataclasses.fields(cls) if f.name in state})


class _BucketStats:
  """Discounted statistics of every arm in one bucket."""

  def __init__(self, num_arms: int):
    # Discounted count and reward sum per arm: the discounted mean
    # is sum / count.
    self.count = np.zeros(num_arms, dtype=np.float64)
    self.reward_sum = np.zeros(num_arms, dtype=np.float64)
    # Undiscounted pulls: drive the warm-up and are reported in `summary`.
    self.pulls = np.zeros(num_arms, dtype=np.int64)
    self.last: list[float | None] = [None] * num_arms

  def record(self, arm: int, value: float, discount: float) -> None:
    """One chunk's reward. Every arm of the bucket decays, pulled or not: "how long ago" is
    counted in this bucket's chunks, so an arm that is not being tried loses confidence and
    its bonus grows."""
    self.count *= discount
    self.reward_sum *= discount
    self.count[arm] += 1.0
    self.reward_sum[arm] += value
    self.pulls[arm] += 1
    self.last[arm] = value

  def means(self) -> np.ndarray:
    """Discounted mean reward per arm, NaN for arms without data."""
    n = self.count
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.where(n > 0, self.reward_sum / np.where(n > 0, n, 1.0), np.nan)

  def to_state(self, bucket: int) -> dict[str, Any]:
    return {
      "bucket": bucket,
      "count": [float(x) for x in self.count],
      "reward_sum": [float(x) for x in self.reward_sum],
      "pulls": [int(x) for x in self.pulls],
      "last": [None if x is None else float(x) for x in self.last],
    }

  @classmethod
  def from_state(cls, state: Mapping[str, Any], num_arms: int) -> _BucketStats:
    stats = cls(num_arms)
    for key in ("count", "reward_sum", "pulls", "last"):
      values = state[key]
      if len(values) != num_arms or any(isinstance(v, list) for v in values):
        raise ValueError(
          f"bucket {state['bucket']}: {key!r} must hold one value per arm ({num_arms}), "
          f"got {values!r}"
        )
    stats.count[:] = np.asarray(state["count"], dtype=np.float64)
    stats.reward_sum[:] = np.asarray(state["reward_sum"], dtype=np.float64)
    stats.pulls[:] = np.asarray(state["pulls"], dtype=np.int64)
    stats.last = [None if x is None else float(x) for x in state["last"]]
    return stats


class StrategyBandit:
  """Discounted-UCB bandit over draft strategies, with separate statistics per batch bucket.

  Args:
    arms: Strategy names, e.g. ``("plain", "chain4", "tree5x4x16")``. Order matters: warm-up
      goes through the arms in this order, and the first arm is the default of `best` when a
      bucket has no data.
    settings: Everything else (`BanditSettings`; default: the engine's settings).
  """

  def __init__(self, arms: Sequence[str], settings: BanditSettings | None = None):
    if isinstance(arms, str):
      raise ValueError(f"arms must be a sequence of strategy names, got the string {arms!r}")
    arms = tuple(arms)
    if not arms:
      raise ValueError("arms must not be empty")
    bad = [a for a in arms if not isinstance(a, str)]
    if bad:
      raise ValueError(f"arms must be strings, got {bad!r}")
    dups = sorted({a for a in arms if arms.count(a) > 1})
    if dups:
      raise ValueError(f"arms must be unique, got duplicates {dups!r} in {list(arms)!r}")
    settings = BanditSettings() if settings is None else settings
    if not isinstance(settings, BanditSettings):
      raise ValueError(f"settings must be a BanditSettings, got {settings!r}")
    self._arms = arms
    self._index = {a: i for i, a in enumerate(arms)}
    self._settings = settings
    self._rng = np.random.Generator(np.random.PCG64(settings.seed))
    self._buckets: dict[int, _BucketStats] = {}

  @property
  def arms(self) -> tuple[str, ...]:
    return self._arms

  @property
  def settings(self) -> BanditSettings:
    return self._settings

  @property
  def buckets(self) -> list[int]:
    return sorted(self._buckets)

  # ------------------------------------------------------------------ choice

  def select(self, bucket: int) -> str:
    """Returns the strategy to run for the next chunk of `bucket`: the warm-up's next arm,
    else the discounted UCB's (module docstring)."""
    s, stats = self._settings, self._bucket(bucket)
    # Warm-up, round-robin: the arm with the fewest pulls below min_pulls, first in order on
    # ties.
    fewest = int(np.argmin(stats.pulls))
    if stats.pulls[fewest] < s.min_pulls:
      return self._arms[fewest]
    count = stats.count
    if not (count > 0).all():
      # Data decayed to nothing (or state edited by hand): such an arm's bonus is infinite.
      return self._arms[int(np.argmin(count > 0))]
    # Rewards are normalised by the bucket's best mean, so that one `exploration` means the
    # same in every bucket, whose speeds differ a lot.
    means = np.nan_to_num(stats.means())
    best = float(np.max(means))
    normalised = means / best if best > 0 else means
    log_total = max(math.log(float(count.sum())), 0.0)
    index = normalised + s.exploration * np.sqrt(log_total / count)
    return self._arms[self._argmax(index)]

  def _argmax(self, index: np.ndarray) -> int:
    """The arm of highest index; exact ties go to the seeded generator (so a bandit is
    deterministic given its seed and history, and `state_dict` keeps the generator)."""
    top = np.flatnonzero(index >= index.max() - 1e-12 * max(1.0, abs(float(index.max()))))
    return int(top[0]) if top.size == 1 else int(self._rng.choice(top))

  # ------------------------------------------------------------------ learning

  def update(self, bucket: int, arm: str, reward: float) -> None:
    """Records the measured speed of one chunk of `bucket` run with `arm`."""
    i = self._arm_index(arm)
    try:
      value = float(reward)
    except (TypeError, ValueError):
      raise ValueError(f"reward must be a number, got {reward!r}") from None
    if not math.isfinite(value) or value < 0:
      raise ValueError(f"reward must be finite and >= 0, got {reward!r}")
    self._bucket(bucket).record(i, value, self._settings.discount)

  def _bucket(self, bucket: int) -> _BucketStats:
    key = _bucket_key(bucket)
    stats = self._buckets.get(key)
    if stats is None:
      stats = self._buckets[key] = _BucketStats(len(self._arms))
    return stats

  def _arm_index(self, arm: str) -> int:
    try:
      return self._index[arm]
    except (KeyError, TypeError):
      raise ValueError(f"unknown arm {arm!r}; known arms: {list(self._arms)!r}") from None

  # ------------------------------------------------------------------ reports

  def warmed_up(self, bucket: int) -> bool:
    """True once every arm of `bucket` has had its `min_pulls` warm-up pulls."""
    stats = self._buckets.get(_bucket_key(bucket))
    return stats is not None and int(stats.pulls.min()) >= self._settings.min_pulls

  def best(self, bucket: int) -> str:
    """Returns the arm with the highest discounted mean (the first arm if there is no data)."""
    stats = self._buckets.get(_bucket_key(bucket))
    if stats is None or not (stats.count > 0).any():
      return self._arms[0]
    means = np.nan_to_num(stats.means(), nan=-np.inf)
    return self._arms[int(np.argmax(means))]  # argmax takes the first arm on ties.

  def likely(self, bucket: int) -> str:
    """The arm `select` will most likely return next for `bucket`, drawing nothing: the
    warm-up's next arm, else the best by discounted mean (`best`)."""
    stats = self._buckets.get(_bucket_key(bucket))
    if stats is None:
      return self._arms[0]
    fewest = int(np.argmin(stats.pulls))
    if stats.pulls[fewest] < self._settings.min_pulls:
      return self._arms[fewest]
    return self.best(bucket)

  def ranked(self, bucket: int) -> list[str]:
    """The arms of `bucket` by discounted mean reward, highest first; arms without data
    last, in arm order."""
    stats = self._buckets.get(_bucket_key(bucket))
    if stats is None:
      return list(self._arms)
    means = np.nan_to_num(stats.means(), nan=-np.inf)
    return [self._arms[i] for i in np.argsort(-means, kind="stable")]

  def summary(self) -> dict[int, dict[str, dict[str, Any]]]:
    """Per bucket, per arm: pulls (undiscounted), discounted mean reward, last reward."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for bucket in sorted(self._buckets):
      stats = self._buckets[bucket]
      means = stats.means()
      out[bucket] = {
        arm: {
          "pulls": int(stats.pulls[i]),
          "mean": None if np.isnan(means[i]) else float(means[i]),
          "last": stats.last[i],
        }
        for i, arm in enumerate(self._arms)
      }
    return out

  def __repr__(self) -> str:
    return (
      f"StrategyBandit(arms={list(self._arms)!r}, settings={self._settings!r}, "
      f"buckets={self.buckets})"
    )

  # ------------------------------------------------------------------ state

  def state_dict(self) -> dict[str, Any]:
    """JSON-serialisable state: arms, settings, per-bucket statistics, generator state."""
    rng_state = self._rng.bit_generator.state
    return {
      "version": _STATE_VERSION,
      "arms": list(self._arms),
      **self._settings.to_state(),
      "buckets": [self._buckets[b].to_state(b) for b in sorted(self._buckets)],
      # PCG64 state is a dict of str and (big) ints; JSON keeps big ints exact.
      "rng": {
        "bit_generator": rng_state["bit_generator"],
        "state": {k: int(v) for k, v in rng_state["state"].items()},
        "has_uint32": int(rng_state["has_uint32"]),
        "uinteger": int(rng_state["uinteger"]),
      },
    }

  @classmethod
  def from_state_dict(cls, state: Mapping[str, Any]) -> StrategyBandit:
    """Builds a bandit that continues exactly where the one that wrote `state` stopped."""
    _check_version(state)
    bandit = cls(state["arms"], BanditSettings.from_state(state))
    bandit.load_state_dict(state)
    return bandit

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores statistics, settings and generator state; the arms must match self's."""
    _check_version(state)
    arms = tuple(state["arms"])
    if arms != self._arms:
      raise ValueError(f"state has arms {list(arms)!r}, this bandit has {list(self._arms)!r}")
    # Validate everything on a fresh bandit before touching self.
    fresh = type(self)(arms, BanditSettings.from_state(state))
    for entry in state["buckets"]:
      bucket = _bucket_key(entry["bucket"])
      if bucket in fresh._buckets:
        raise ValueError(f"bucket {bucket} appears twice in the state")
      fresh._buckets[bucket] = _BucketStats.from_state(entry, len(arms))
    rng_state = state["rng"]
    if rng_state.get("bit_generator") != "PCG64":
      raise ValueError(f"expected a PCG64 generator state, got {rng_state.get('bit_generator')!r}")
    fresh._rng.bit_generator.state = {
      "bit_generator": "PCG64",
      "state": {k: int(v) for k, v in rng_state["state"].items()},
      "has_uint32": int(rng_state["has_uint32"]),
      "uinteger": int(rng_state["uinteger"]),
    }
    self.__dict__.update(fresh.__dict__)


def _check_version(state: Mapping[str, Any]) -> None:
  """Refuses a state of another layout in one line (a checkpoint of an older bandit)."""
  version = state.get("version")
  if version != _STATE_VERSION:
    raise ValueError(
      f"bandit state version {version!r} is not supported: this bandit reads version "
      f"{_STATE_VERSION} only (earlier versions predate 2026-11-28 and have no reader)"
    )

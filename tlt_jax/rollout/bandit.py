"""Per-batch-bucket bandit that picks a speculative-decoding draft strategy per decode chunk.

Why a bandit, and why one per batch bucket:

* The best draft shape depends on the batch size. Verifying a draft costs roughly
  batch x draft nodes of target-model compute, while drafting costs a fixed number of drafter
  rounds per chunk whatever the batch. At batch 1 the target is memory bound, so deep chains or
  wide trees are nearly free to verify and every accepted token is a win; at batch 64 the target
  is compute bound, extra nodes cost real time, and plain decoding (or a short chain) can win.
  So each batch-size bucket keeps its own statistics per arm and learns its own best arm.
* The reward is measured speed: tokens per second of one chunk, wall clock, of a row (the
  engine's choice, `EngineConfig.bandit_reward`: by default the rows' lower octile among those
  that ran the whole chunk, `frontier_advance`, since a bucket's rows end together with the
  slowest; or the least-advanced row; or the mean active row). That counts everything
  (drafting, verification, acceptance, host overhead), so no cost model has to be right.
  Scales differ a lot between buckets, so rewards
  are normalised within a bucket (by the best current discounted mean) before the exploration
  bonus is added; one `exploration` value then means the same thing in every bucket.
* The problem is non-stationary: the drafter is trained alongside the policy, its acceptance rate
  rises, and deeper drafts become worth more over time. Discounted UCB handles that: every update
  of a bucket multiplies that bucket's statistics by `discount`, so old observations fade (an
  effective window of about 1 / (1 - discount) chunks) and the bonus of an arm that has not been
  tried for a while grows until it is tried again.

* Arms must be compared at equal phase of the answers. Every arm slows down along an answer
  (acceptance falls, the cache grows), and the arms' chunks fall at different places: a deep
  chain emits a short rollout's tokens in one or two chunks, so its rewards come mostly from
  answers' starts, where everything is fast (a deep chain's first chunk can outrun a
  shallower one's while the shallower wins over the rollout). Each chunk's
  reward is therefore filed under a phase bin (`answer_phase`: log2 bins of the tokens
  generated per active row), and an arm's mean is its speed at the bucket's average phase, from
  a fit of reward ~ arm speed x phase factor (`_BucketStats.fit`).

* Exploration should stop once the arms are told apart. The bonus is therefore scaled by the
  measured spread of the rewards: the pooled standard deviation of the bucket's chunk rewards
  around the fit, relative to the fitted value (at least `min_spread`). Arms whose timings
  barely vary separate after a few pulls and are then rarely retried; noisy ones keep being
  compared.

* Neighbouring buckets inform each other (`prior_weight` > 0). A rollout's long tail passes
  through every small bucket for only a few chunks each, so a bucket learning from scratch
  pays its warm-up and its re-exploration of clearly slow arms in every one of them. The
  arms' relative speeds change smoothly with the batch size, so the nearest bucket below
  and above with data each lend every arm `prior_weight` pseudo-pulls (fewer while the arm
  has less than a pull there) at their relative mean (the arm's speed over that bucket's
  best). An arm so covered skips its warm-up, and the bonus of a slow arm no longer
  explodes when its own pulls decay. The pseudo-pulls fade by `discount` per chunk of the
  bucket's own, so its own data takes over (a prior needs discount < 1).

* Chains of one drafter can share what they accept (`accept_families`). A chain's draft of
  depth d is the first d tokens of a deeper chain's from the same state (greedy drafts are
  the drafter's argmax chain; coupled ones its Gumbel-max under the verifier's noise,
  position by position), so a round that accepted a < d tokens says every chain would have
  accepted min(a, d') there, and one that accepted all d says each shallower chain would
  have accepted all of its own. For such arms the bandit does not compare chunk speeds,
  which vary with the text far more than between close arms (at batch 1 each chunk is one
  answer's stretch), but predicts them: the arm's pace (rounds per second, measured per
  bucket and phase like any reward; nearly the same from chunk to chunk) times the tokens
  a round emits, 1 + E[min(L, d)], where L is the number of draft tokens the target would
  accept from an unbounded chain. L's distribution is one per family (`_AcceptCurve`:
  discounted Kaplan-Meier counts over every bucket's rounds, since acceptance depends on
  the drafter and the text, not on the batch): each chunk of any chain in the family
  refines every chain's prediction, and all are compared on the same rounds. Chunks cut
  short by their rows finishing feed the curve too (`observe_acceptance`), though not the
  pace: a deep chain finishes the well-accepted answers inside one chunk, so its full
  chunks alone would be its slower-accepting ones. Any other
  speculative arm (a tree, group drafts) can be a family of one: scored by its pace times
  its own rounds' curve, pooled over the buckets, rather than by chunk rewards whose text
  noise also widens the bucket's spread and so everyone's exploration.

Selection in a bucket: first every arm is pulled `min_pulls` times, round-robin in arm order;
then the arm maximising

  mean_a / M + exploration * spread * sqrt(log(sum_b n_b) / n_a),   M = max_b mean_b

is chosen, where mean_a is the phase-adjusted discounted mean, n_a the discounted count and
spread (at least min_spread) the pooled relative standard deviation of the rewards around the
fit (a Gaussian UCB with the bucket's noise). With a prior, mean_a / M and n_a are the
count-weighted blend of the bucket's own relative means and the neighbours' (pulls in the
warm-up count the pseudo-pulls too).
Exact ties are broken by a seeded numpy Generator, so a bandit is deterministic given its seed
and its history; `state_dict` includes the generator's state so that a restored bandit
continues exactly as the original would.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

PLAIN = "plain"  # the bandit arm that runs plain decode
# EngineConfig.bandit_reward -> the rows' quantile whose advance is the reward (None: the mean).
BANDIT_REWARDS = {"frontier": 0.0, "octile": 0.125, "row": None}

_MAX_PHASE = 15  # answer_phase's last bin (> 500k tokens at 16)
_STATE_VERSION = 4  # 2: squared rewards (spread-scaled exploration); 3: per-phase cells;
# 4: acceptance curves of chain families


def answer_phase(generated: float, phase_tokens: int) -> int:
  """The phase bin of a chunk that starts `generated` tokens into the answers (mean over the
  active rows): 0 below `phase_tokens`, then one bin per doubling (16: 0-15, 16-47, 48-111,
  112-239, ...), so long answers get few bins. `phase_tokens` 0: a single phase."""
  if phase_tokens <= 0 or generated < phase_tokens:
    return 0
  return min(int(math.log2(1.0 + generated / phase_tokens)), _MAX_PHASE)


def frontier_advance(before: np.ndarray, after: np.ndarray, quantile: float = 0.0) -> int:
  """How far a chunk moved the rollout's frontier: the fewest tokens generated by any row
  (`quantile` 0; else the rows' lower `quantile`, e.g. 1/8: the 8th fewest of 64), after the
  chunk less before it, over the rows that ran the whole chunk (`before` and `after` are
  their generated tokens). A rollout whose rows run to the same budget ends when its
  least-advanced row does, and the advances of successive chunks add up to that row's
  progress, so this, per second, is the speed that bounds the rollout. It is not the slowest
  row's own gain: a row that fell behind earlier and catches up moves the frontier by more.
  The minimum of many rows is a noisy statistic; a low quantile of them is a steadier one
  that still weighs the rows falling behind."""
  before, after = np.asarray(before), np.asarray(after)
  if before.shape != after.shape or before.ndim != 1 or not before.size:
    raise ValueError(
      f"frontier_advance needs two equal non-empty 1-D arrays, got {before.shape} and {after.shape}"
    )
  if np.any(after < before):
    raise ValueError("frontier_advance: a row lost tokens")
  if not 0.0 <= quantile < 1.0:
    raise ValueError(f"frontier_advance: quantile must be in [0, 1), got {quantile!r}")
  k = int(quantile * (before.size - 1))  # the k-th fewest (0: the minimum)
  return int(np.partition(after, k)[k] - np.partition(before, k)[k])


def _is_real(x: Any) -> bool:
  return isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool)


def _bucket_key(bucket: int) -> int:
  try:
    return operator.index(bucket)
  except TypeError:
    raise ValueError(f"bucket must be an int, got {bucket!r}") from None


class _BucketStats:
  """Statistics of every arm in one bucket, per answer phase (arms x phases cells)."""

  def __init__(self, num_arms: int, num_phases: int = 1):
    # Discounted count, reward sum and sum of squared rewards per (arm, phase) cell: the
    # discounted cell mean is sum / count.
    self.count = np.zeros((num_arms, num_phases), dtype=np.float64)
    self.reward_sum = np.zeros((num_arms, num_phases), dtype=np.float64)
    self.square_sum = np.zeros((num_arms, num_phases), dtype=np.float64)
    # Undiscounted pulls: drive the warm-up and are reported in `summary`.
    self.pulls = np.zeros(num_arms, dtype=np.int64)
    self.last: list[float | None] = [None] * num_arms
    self._fitted: tuple[np.ndarray, np.ndarray] | None = None  # fit() until the next change

  def changed(self) -> None:
    self._fitted = None

  def ensure_phase(self, phase: int) -> None:
    grow = phase + 1 - self.count.shape[1]
    if grow > 0:
      pad = ((0, 0), (0, grow))
      self.count = np.pad(self.count, pad)
      self.reward_sum = np.pad(self.reward_sum, pad)
      self.square_sum = np.pad(self.square_sum, pad)
      self.changed()

  def fit(self) -> tuple[np.ndarray, np.ndarray]:
    """Per-arm speed `alpha` and per-phase factor `beta` with cell mean ~ alpha_a * beta_p.

    Weighted least squares over the cells (weights: discounted counts), by alternating
    updates; beta is normalised to a count-weighted mean of 1, so alpha is an arm's speed at
    the bucket's average phase. Arms are thereby compared at equal phase: an arm measured
    mostly where every arm is fast (answers' starts) no longer looks better than one measured
    throughout. With a single phase alpha is the plain discounted mean. NaN: no data.
    """
    if self._fitted is None:
      self._fitted = self._fit()
    return self._fitted

  def _fit(self) -> tuple[np.ndarray, np.ndarray]:
    n = self.count
    with np.errstate(invalid="ignore", divide="ignore"):
      m = np.where(n > 0, self.reward_sum / np.where(n > 0, n, 1.0), 0.0)
    arm_n = n.sum(axis=1)
    alpha = np.where(arm_n > 0, (n * m).sum(axis=1) / np.where(arm_n > 0, arm_n, 1.0), np.nan)
    used = n.sum(axis=0) > 0
    beta = np.ones(n.shape[1])
    if int(used.sum()) > 1:
      # Runs before every chunk the bandit picks: on an accelerator a chunk takes ~20 ms, so
      # the loop is kept to matrix-vector products on loop-invariant arrays.
      a = np.nan_to_num(alpha)
      nm, phase_n, total = n * m, n.sum(axis=0), n.sum()
      for _ in range(100):
        den = (a * a) @ n
        beta = np.where(den > 0, (a @ nm) / np.where(den > 0, den, 1), 1)
        den = n @ (beta * beta)
        new = np.where(den > 0, (nm @ beta) / np.where(den > 0, den, 1), 0.0)
        scale = float(phase_n @ beta / total)
        if scale > 0:
          beta, new = beta / scale, new * scale
        done = bool(np.all(np.abs(new - a) <= 1e-12 * np.abs(a)))
        a = new
        if done:
          break
      alpha = np.where(arm_n > 0, a, np.nan)
    return alpha, beta

  def means(self) -> np.ndarray:
    """Phase-adjusted discounted mean per arm (`fit`'s alpha), NaN for arms without data."""
    return self.fit()[0]

  def relative_spread(self) -> float:
    """Pooled standard deviation of the rewards around the phase-adjusted fit, relative to
    the fitted value (0 without data)."""
    known = self.count > 0
    if not known.any():
      return 0.0
    alpha, beta = self.fit()
    fitted = (np.nan_to_num(alpha)[:, None] * beta[None, :])[known]
    n = self.count[known]
    means = self.reward_sum[known] / n
    var = np.maximum(self.square_sum[known] / n - means**2, 0.0) + (means - fitted) ** 2
    ok = fitted > 0
    if not ok.any():
      return 0.0
    pooled = float(np.sum(n[ok] * var[ok] / fitted[ok] ** 2) / np.sum(n[ok]))
    return math.sqrt(pooled)

  def to_state(self, bucket: int) -> dict[str, Any]:
    cells = lambda a: [[float(x) for x in row] for row in a]
    return {
      "bucket": bucket,
      "count": cells(self.count),
      "reward_sum": cells(self.reward_sum),
      "square_sum": cells(self.square_sum),
      "pulls": [int(x) for x in self.pulls],
      "last": [None if x is None else float(x) for x in self.last],
    }

  @classmethod
  def from_state(cls, state: Mapping[str, Any], num_arms: int) -> _BucketStats:
    keys = ("count", "reward_sum", "square_sum", "pulls", "last")
    for key in keys:
      if key in state and len(state[key]) != num_arms:
        raise ValueError(
          f"bucket {state['bucket']}: {key!r} has {len(state[key])} entries, expected {num_arms}"
        )
    cells: dict[str, np.ndarray] = {}
    for key in keys[:3]:
      if key not in state:  # "square_sum", version 1: no spread recorded, read as none
        r, c = cells["reward_sum"], cells["count"]
        cells[key] = np.where(c > 0, r * r / np.where(c > 0, c, 1.0), 0.0)
        continue
      rows = [r if isinstance(r, list | tuple) else [r] for r in state[key]]  # v1-2: one phase
      if len({len(r) for r in rows}) != 1 or not rows[0]:
        raise ValueError(f"bucket {state['bucket']}: {key!r} rows must have one equal length")
      cells[key] = np.asarray(rows, dtype=np.float64)
    phases = {c.shape[1] for c in cells.values()}
    if len(phases) != 1:
      raise ValueError(f"bucket {state['bucket']}: cell arrays have different phase counts")
    stats = cls(num_arms, phases.pop())
    stats.count[:] = cells["count"]
    stats.reward_sum[:] = cells["reward_sum"]
    stats.square_sum[:] = cells["square_sum"]
    stats.pulls[:] = np.asarray(state["pulls"], dtype=np.int64)
    stats.last = [None if x is None else float(x) for x in state["last"]]
    return stats


class _AcceptCurve:
  """Discounted Kaplan-Meier counts of how many draft tokens a chain family's rounds accept.

  at_risk[k]: row-rounds in which draft token k + 1 was checked (the first k accepted and
  the chain at least k + 1 deep); rejected[k]: those that rejected it. A chain of depth d
  accepting a tokens adds to at_risk[0 .. min(a, d - 1)] and, when a < d, to rejected[a].
  """

  def __init__(self, at_risk=(), rejected=()):
    self.at_risk = np.asarray(at_risk, dtype=np.float64)
    self.rejected = np.asarray(rejected, dtype=np.float64)
    if self.at_risk.shape != self.rejected.shape or self.at_risk.ndim != 1:
      raise ValueError("acceptance curve: at_risk and rejected must be equal 1-D lists")

  def observe(self, accepted: np.ndarray, depth: int, discount: float) -> None:
    """`accepted[a]`: row-rounds of a depth-`depth` chain that accepted a draft tokens."""
    hist = np.asarray(accepted, dtype=np.float64)
    grow = depth - self.at_risk.size
    if grow > 0:
      self.at_risk = np.pad(self.at_risk, (0, grow))
      self.rejected = np.pad(self.rejected, (0, grow))
    self.at_risk *= discount
    self.rejected *= discount
    # Rounds that reached token k + 1: those that accepted k or more (k < depth).
    self.at_risk[:depth] += np.cumsum(hist[::-1])[::-1][:depth]
    self.rejected[:depth] += hist[:depth]

  def tokens_per_round(self, depth: int) -> float:
    """Predicted tokens a depth-`depth` round emits: 1 + E[min(L, depth)]. Depths past the
    data extrapolate its deepest hazard (NaN without data)."""
    if not (self.at_risk > 0).any():  # a prefix: a round checking token k + 1 checked k
      return math.nan
    return 1.0 + float(self._survival(depth).sum())  # sum of P(L >= k), k = 1..depth

  def tokens_sd(self, depth: int) -> float:
    """Standard deviation of the tokens a depth-`depth` round emits (NaN without data):
    E[min(L, d)^2] = sum over k of (2k - 1) P(L >= k)."""
    if not (self.at_risk > 0).any():
      return math.nan
    survival = self._survival(depth)
    second = float(((2 * np.arange(1, depth + 1) - 1) * survival).sum())
    return math.sqrt(max(second - float(survival.sum()) ** 2, 0.0))

  def _survival(self, depth: int) -> np.ndarray:
    """P(L >= k) for k = 1..depth (past the data, its deepest hazard continues)."""
    seen = self.at_risk > 0
    known = self.rejected[seen] / self.at_risk[seen]
    hazard = np.full(depth, known[-1])
    hazard[: min(depth, known.size)] = known[:depth]
    return np.cumprod(1.0 - hazard)


class StrategyBandit:
  """Discounted-UCB bandit over draft strategies, with separate statistics per batch bucket.

  Args:
    arms: Strategy names, e.g. ``("plain", "chain4", "tree5x4x16")``. Order matters: warm-up
      goes through the arms in this order, and the first arm is the default of `best` when a
      bucket has no data.
    exploration: Weight of the UCB bonus, in units of the bucket's measured reward spread.
    discount: Factor applied to a bucket's statistics on each of its updates, in (0, 1]; 1 means
      stationary (plain UCB on normalised rewards).
    min_pulls: Pulls of every arm in a bucket before UCB takes over.
    min_spread: Floor of the relative spread (a few equal timings do not end exploration).
    prior_weight: Pseudo-pulls each neighbouring bucket (nearest below and above with data)
      lends every arm, at its relative speed there; 0: buckets learn alone.
    accept_families: arm -> (family, depth) for chain arms of one drafter whose drafts are
      prefixes of each other (module docstring): their `update`s give the chunk's pace and
      acceptance, and their means are predicted from the family's acceptance curve.
    frontier: (quantile, rounds per chunk) of the reward the other arms are measured by
      (`frontier_advance`; quantile None: the mean row). A family arm's prediction is then
      for that quantile of a bucket's rows over a chunk (normal approximation: rows spread
      apart by the per-round spread over sqrt(rounds)), not for the mean row.
    seed: Seed of the generator that breaks exact ties.
  """

  def __init__(
    self,
    arms: Sequence[str],
    *,
    exploration: float = 2.0,
    discount: float = 0.97,
    min_pulls: int = 2,
    min_spread: float = 0.02,
    prior_weight: float = 0.0,
    accept_families: Mapping[str, tuple[str, int]] | None = None,
    frontier: tuple[float | None, int] | None = None,
    seed: int = 0,
  ):
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
    if not (_is_real(exploration) and math.isfinite(exploration) and exploration >= 0):
      raise ValueError(f"exploration must be a finite number >= 0, got {exploration!r}")
    if not (_is_real(discount) and 0 < discount <= 1):
      raise ValueError(f"discount must be in (0, 1], got {discount!r}")
    if isinstance(min_pulls, bool) or not isinstance(min_pulls, int) or min_pulls < 1:
      raise ValueError(f"min_pulls must be an int >= 1, got {min_pulls!r}")
    if not (_is_real(min_spread) and 0 <= min_spread < 1):
      raise ValueError(f"min_spread must be in [0, 1), got {min_spread!r}")
    if not (_is_real(prior_weight) and math.isfinite(prior_weight) and prior_weight >= 0):
      raise ValueError(f"prior_weight must be a finite number >= 0, got {prior_weight!r}")
    if prior_weight > 0 and discount == 1:
      raise ValueError("prior_weight > 0 needs discount < 1 (the prior fades with the discount)")
    families = dict(accept_families or {})
    for arm, spec in families.items():
      ok = isinstance(spec, tuple | list) and len(spec) == 2 and isinstance(spec[0], str)
      if not (arm in arms and ok and isinstance(spec[1], int) and spec[1] >= 1):
        raise ValueError(
          f"accept_families: {arm!r} -> {spec!r} must map an arm to (family, depth >= 1)"
        )
    self._families = {a: (str(f), int(d)) for a, (f, d) in families.items()}
    if frontier is not None:
      q, rounds = frontier
      q_ok = q is None or (_is_real(q) and 0 <= q < 1)
      if not (q_ok and isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"frontier must be (quantile in [0, 1) or None, rounds >= 1): {frontier}")
      frontier = (None if q is None else float(q), int(rounds))
    self._frontier = frontier
    self._curves = {f: _AcceptCurve() for f, _ in self._families.values()}
    self._arms = arms
    self._prior_weight = float(prior_weight)
    self._index = {a: i for i, a in enumerate(arms)}
    self._exploration = float(exploration)
    self._discount = float(discount)
    self._min_pulls = min_pulls
    self._min_spread = float(min_spread)
    self._seed = int(seed)
    self._rng = np.random.Generator(np.random.PCG64(self._seed))
    self._buckets: dict[int, _BucketStats] = {}

  # ------------------------------------------------------------------ properties

  @property
  def arms(self) -> tuple[str, ...]:
    return self._arms

  @property
  def exploration(self) -> float:
    return self._exploration

  @property
  def discount(self) -> float:
    return self._discount

  @property
  def min_pulls(self) -> int:
    return self._min_pulls

  @property
  def min_spread(self) -> float:
    return self._min_spread

  @property
  def prior_weight(self) -> float:
    return self._prior_weight

  @property
  def buckets(self) -> list[int]:
    return sorted(self._buckets)

  @property
  def accept_families(self) -> dict[str, tuple[str, int]]:
    return dict(self._families)

  @property
  def frontier(self) -> tuple[float | None, int] | None:
    return self._frontier

  def tokens_per_round(self, arm: str) -> float:
    """An `accept_families` arm's predicted tokens per row-round (NaN without data)."""
    family, depth = self._families[arm]
    return self._curves[family].tokens_per_round(depth)

  def _means(self, stats: _BucketStats, bucket: int) -> np.ndarray:
    """Per-arm speed: the phase-adjusted mean reward, times the predicted tokens per round
    for family arms (whose reward is their pace), at the frontier's quantile of the
    bucket's rows when one is set."""
    means = stats.means().copy()
    z = 0.0
    if self._frontier is not None and self._frontier[0] is not None and bucket > 1:
      # The expected k-th smallest of `bucket` standard normals (Blom's approximation),
      # k as `frontier_advance` picks it.
      k = int(self._frontier[0] * (bucket - 1))
      z = NormalDist().inv_cdf((k + 1 - 0.375) / (bucket + 0.25))
    for arm, (family, depth) in self._families.items():
      curve = self._curves[family]
      tokens = curve.tokens_per_round(depth)
      if z:
        spread = curve.tokens_sd(depth) / math.sqrt(self._frontier[1])
        tokens = max(tokens + z * spread, 1.0)
      means[self._index[arm]] *= tokens
    return means

  # ------------------------------------------------------------------ core

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

  def prior(self, bucket: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(pseudo-pulls, relative means, relative spread) per arm that the nearest buckets
    below and above with data lend `bucket` (zeros, NaNs and 0 without a prior)."""
    key = _bucket_key(bucket)
    pseudo = np.zeros(len(self._arms))
    weighted = np.zeros(len(self._arms))
    spreads = []
    if self._prior_weight > 0:
      below = [k for k in self._buckets if k < key and (self._buckets[k].count > 0).any()]
      above = [k for k in self._buckets if k > key and (self._buckets[k].count > 0).any()]
      for k in ([max(below)] if below else []) + ([min(above)] if above else []):
        stats = self._buckets[k]
        count, means = stats.count.sum(axis=1), self._means(stats, k)
        known = (count > 0) & np.isfinite(means)
        scale = float(np.max(means[known]))
        if scale <= 0:
          continue
        w = self._prior_weight * np.minimum(count, 1.0) * known
        pseudo += w
        weighted += w * np.where(known, means / scale, 0.0)
        spreads.append(stats.relative_spread())
    with np.errstate(invalid="ignore", divide="ignore"):
      relative = np.where(pseudo > 0, weighted / pseudo, np.nan)
    return pseudo, relative, float(np.mean(spreads)) if spreads else 0.0

  def select(self, bucket: int) -> str:
    """Returns the strategy to run for the next chunk of `bucket`."""
    stats = self._bucket(bucket)
    pseudo, prior_means, prior_spread = self.prior(bucket)
    # The prior fades as the bucket's own chunks accumulate (as old data does): a prior that
    # is wrong about an arm the bucket never tries must not hold it back for ever.
    pseudo = pseudo * self._discount ** float(stats.pulls.sum())
    # Warm-up, round-robin: the arm with the fewest pulls below min_pulls, first in order on
    # ties (a neighbour's pseudo-pulls count).
    warm = stats.pulls + pseudo
    fewest = int(np.argmin(warm))
    if warm[fewest] < self._min_pulls:
      return self._arms[fewest]
    own_count = stats.count.sum(axis=1)
    arm_count = own_count + pseudo
    known = arm_count > 0
    if not known.all():
      # Data decayed to nothing (or state edited by hand): such an arm's bonus is infinite.
      return self._arms[int(np.argmin(known))]
    means = self._means(stats, _bucket_key(bucket))
    own = (own_count > 0) & np.isfinite(means)
    scale = float(np.max(means[own])) if own.any() else 0.0
    both = own & (pseudo > 0) & (np.nan_to_num(prior_means) > 0)
    if both.any():
      # The bucket's best speed as the prior sees it (an arm at 0.7 of the neighbours' best
      # running 70 tokens/s says the best runs 100): the own means on the prior's scale,
      # also while the bucket has data for its slow arms only.
      w = own_count[both]
      scale = float(np.sum(w * means[both] / prior_means[both]) / np.sum(w))
    # Normalise so that the bonus is relative to this bucket's throughput scale.
    normalised = np.where(own, means / scale if scale > 0 else means, 0.0)
    if pseudo.any():
      blend = own_count * normalised + pseudo * np.nan_to_num(prior_means)
      normalised = blend / arm_count
    log_total = max(math.log(float(arm_count.sum())), 0.0)
    own_spread = stats.relative_spread() if own.any() else prior_spread
    spread = max(own_spread, self._min_spread)
    index = normalised + self._exploration * spread * np.sqrt(log_total / arm_count)
    top = np.flatnonzero(index >= index.max() - 1e-12 * max(1.0, abs(float(index.max()))))
    choice = int(top[0]) if top.size == 1 else int(self._rng.choice(top))
    return self._arms[choice]

  def update(
    self,
    bucket: int,
    arm: str,
    reward: float,
    phase: int = 0,
    accepted: Sequence[float] | None = None,
  ) -> None:
    """Records the measured speed of one chunk run with `arm`.

    `phase` (an int >= 0, see `answer_phase`) says where in the answers the chunk ran: arms
    are compared at equal phase (`_BucketStats.fit`), since every arm slows down along an
    answer and the arms' chunks do not fall at the same places.
    For an `accept_families` arm, `reward` is the chunk's pace (rounds per second) and
    `accepted[a]` (required) the row-rounds that accepted a draft tokens, a = 0..depth.
    """
    i = self._arm_index(arm)
    if (accepted is not None) != (arm in self._families):
      raise ValueError(
        f"update({arm!r}): `accepted` is required for accept_families arms and only for them"
      )
    if accepted is not None:
      hist = self._histogram(arm, accepted)
    if isinstance(phase, bool) or not isinstance(phase, int | np.integer) or phase < 0:
      raise ValueError(f"phase must be an int >= 0, got {phase!r}")
    try:
      value = float(reward)
    except (TypeError, ValueError):
      raise ValueError(f"reward must be a number, got {reward!r}") from None
    if not math.isfinite(value) or value < 0:
      raise ValueError(f"reward must be finite and >= 0, got {reward!r}")
    stats = self._bucket(bucket)
    stats.ensure_phase(int(phase))
    # Decay every arm of this bucket, pulled or not: "how long ago" is counted in this bucket's
    # chunks, so an arm that is not being tried loses confidence and its bonus grows.
    stats.count *= self._discount
    stats.reward_sum *= self._discount
    stats.square_sum *= self._discount
    stats.count[i, phase] += 1.0
    stats.reward_sum[i, phase] += value
    stats.square_sum[i, phase] += value * value
    stats.changed()
    stats.pulls[i] += 1
    stats.last[i] = value
    if accepted is not None:
      family, depth = self._families[arm]
      self._curves[family].observe(hist, depth, self._discount)

  def observe_acceptance(self, arm: str, accepted: Sequence[float]) -> None:
    """Feeds an `accept_families` arm's rounds into its family's acceptance curve without
    a reward: a chunk cut short by its rows finishing has no comparable pace, but its
    rounds belong in the curve. Left out, a deep chain that ends answers inside one chunk
    would be judged on the chunks that did not, its slower-accepting ones."""
    if arm not in self._families:
      raise ValueError(f"observe_acceptance({arm!r}): not an accept_families arm")
    family, depth = self._families[arm]
    self._curves[family].observe(self._histogram(arm, accepted), depth, self._discount)

  def _histogram(self, arm: str, accepted: Sequence[float]) -> np.ndarray:
    hist = np.asarray(accepted, dtype=np.float64)
    depth = self._families[arm][1]
    if hist.ndim != 1 or hist.size != depth + 1 or not np.all(np.isfinite(hist) & (hist >= 0)):
      raise ValueError(
        f"{arm!r}: accepted must be {depth + 1} finite counts >= 0, got {accepted!r}"
      )
    return hist

  def warmed_up(self, bucket: int) -> bool:
    """True once every arm of `bucket` has had its `min_pulls` warm-up pulls."""
    stats = self._buckets.get(_bucket_key(bucket))
    return stats is not None and int(stats.pulls.min()) >= self._min_pulls

  def best(self, bucket: int) -> str:
    """Returns the arm with the highest discounted mean (the first arm if there is no data)."""
    stats = self._buckets.get(_bucket_key(bucket))
    if stats is None or not (stats.count > 0).any():
      return self._arms[0]
    means = np.nan_to_num(self._means(stats, _bucket_key(bucket)), nan=-np.inf)
    means = np.where(stats.count.sum(axis=1) > 0, means, -np.inf)
    return self._arms[int(np.argmax(means))]  # argmax takes the first arm on ties.

  def summary(self) -> dict[int, dict[str, dict[str, Any]]]:
    """Per bucket, per arm: pulls (undiscounted), phase-adjusted discounted mean reward, last
    reward."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for bucket in sorted(self._buckets):
      stats = self._buckets[bucket]
      means = self._means(stats, bucket)
      out[bucket] = {
        arm: {
          "pulls": int(stats.pulls[i]),
          "mean": None if np.isnan(means[i]) else float(means[i]),
          "last": stats.last[i],
        }
        for i, arm in enumerate(self._arms)
      }
    return out

  # ------------------------------------------------------------------ state

  def state_dict(self) -> dict[str, Any]:
    """JSON-serialisable state: arms, hyperparameters, per-bucket statistics, generator state."""
    rng_state = self._rng.bit_generator.state
    return {
      "version": _STATE_VERSION,
      "arms": list(self._arms),
      "exploration": self._exploration,
      "discount": self._discount,
      "min_pulls": self._min_pulls,
      "min_spread": self._min_spread,
      "prior_weight": self._prior_weight,
      "accept_families": {a: list(v) for a, v in self._families.items()},
      "frontier": None if self._frontier is None else list(self._frontier),
      "accept_curves": {
        f: {"at_risk": c.at_risk.tolist(), "rejected": c.rejected.tolist()}
        for f, c in self._curves.items()
      },
      "seed": self._seed,
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
    bandit = cls(state["arms"], **_settings_of(state))
    bandit.load_state_dict(state)
    return bandit

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores statistics, hyperparameters and generator state; the arms must match self's."""
    version = state.get("version")
    if version not in (1, 2, 3, _STATE_VERSION):
      raise ValueError(f"unsupported bandit state version {version!r}, expected {_STATE_VERSION}")
    arms = tuple(state["arms"])
    if arms != self._arms:
      raise ValueError(f"state has arms {list(arms)!r}, this bandit has {list(self._arms)!r}")
    # Validate everything through the constructor before touching self.
    fresh = type(self)(arms, **_settings_of(state))
    if fresh._families != self._families:
      raise ValueError(
        f"state has accept_families {fresh._families!r}, this bandit has {self._families!r}"
      )
    for family, curve in state.get("accept_curves", {}).items():
      if family not in fresh._curves:
        raise ValueError(f"state has an acceptance curve for unknown family {family!r}")
      fresh._curves[family] = _AcceptCurve(curve["at_risk"], curve["rejected"])
    buckets: dict[int, _BucketStats] = {}
    for entry in state["buckets"]:
      bucket = _bucket_key(entry["bucket"])
      if bucket in buckets:
        raise ValueError(f"bucket {bucket} appears twice in the state")
      buckets[bucket] = _BucketStats.from_state(entry, len(arms))
    rng_state = state["rng"]
    if rng_state.get("bit_generator") != "PCG64":
      raise ValueError(f"expected a PCG64 generator state, got {rng_state.get('bit_generator')!r}")
    fresh._rng.bit_generator.state = {
      "bit_generator": "PCG64",
      "state": {k: int(v) for k, v in rng_state["state"].items()},
      "has_uint32": int(rng_state["has_uint32"]),
      "uinteger": int(rng_state["uinteger"]),
    }
    self._exploration = fresh._exploration
    self._discount = fresh._discount
    self._min_pulls = fresh._min_pulls
    self._min_spread = fresh._min_spread
    self._prior_weight = fresh._prior_weight
    self._curves = fresh._curves
    self._frontier = fresh._frontier
    self._seed = fresh._seed
    self._rng = fresh._rng
    self._buckets = buckets

  def __repr__(self) -> str:
    return (
      f"StrategyBandit(arms={list(self._arms)!r}, exploration={self._exploration}, "
      f"discount={self._discount}, min_pulls={self._min_pulls}, min_spread={self._min_spread}, "
      f"prior_weight={self._prior_weight}, accept_families={self._families}, seed={self._seed}, "
      f"buckets={self.buckets})"
    )


def _settings_of(state: Mapping[str, Any]) -> dict[str, Any]:
  """The constructor's keyword arguments a `state_dict` records (older versions' defaults)."""
  frontier = state.get("frontier")
  return {
    "exploration": state["exploration"],
    "discount": state["discount"],
    "min_pulls": state["min_pulls"],
    "min_spread": state.get("min_spread", 0.02),
    "prior_weight": state.get("prior_weight", 0.0),
    "accept_families": {a: (f, d) for a, (f, d) in state.get("accept_families", {}).items()},
    "frontier": None if frontier is None else (frontier[0], frontier[1]),
    "seed": state.get("seed", 0),
  }

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
  accept from an unbounded chain. L's distribution is one per family (`acceptance.AcceptCurve`:
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
fit (a Gaussian UCB with the bucket's noise).
Exact ties are broken by a seeded numpy Generator, so a bandit is deterministic given its seed
and its history; `state_dict` includes the generator's state so that a restored bandit
continues exactly as the original would.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tlt_jax.rollout.acceptance import AcceptCurve, frontier_z

PLAIN = "plain"  # the bandit arm that runs plain decode
# EngineConfig.bandit_reward -> the rows' quantile whose advance is the reward (None: the mean).
BANDIT_REWARDS = {"frontier": 0.0, "octile": 0.125, "row": None}

_MAX_PHASE = 15  # answer_phase's last bin (> 500k tokens at 16)
# The layout `state_dict` writes (4: per-phase cells, squared rewards, acceptance curves).
# Older layouts are refused: their checkpoints predate the shared-acceptance bandit.
_STATE_VERSION = 4


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


@dataclasses.dataclass(frozen=True)
class BanditSettings:
  """Every setting of a `StrategyBandit`, with the defaults the engine builds it with.

  The engine (`rollout.config.bandit_settings`: the config's exploration, families and
  frontier on these defaults), the simulator (`sim.validate.engine_bandit`) and
  experiments/bench_bandit.py all build their bandit from one of these.

  The defaults: a ~100-chunk memory (discount 0.99), long enough to settle on a steady best
  arm, short enough to follow a drafter that improves over RL steps; one pull per arm
  first (min_pulls 1), then UCB with a bonus in units of the measured spread of chunk
  rewards: a noisy first timing is re-tried, arms that are clearly apart are left alone,
  and each bucket's warm-up costs one chunk per arm. (Three pulls per arm made the RL runs
  of experiments/e2e_modes.py spend most of their speculative chunks warming up.)

  Attributes:
    exploration: Weight of the UCB bonus, in units of the bucket's measured reward spread.
    discount: Factor applied to a bucket's statistics on each of its updates, in (0, 1]; 1
      means stationary (plain UCB on normalised rewards).
    min_pulls: Pulls of every arm in a bucket before UCB takes over.
    min_spread: Floor of the relative spread (a few equal timings do not end exploration).
    accept_families: (arm, (family, depth)) pairs (a mapping is accepted) for chain arms of
      one drafter whose drafts are prefixes of each other (module docstring): their
      `update`s give the chunk's pace and acceptance, and their means are predicted from the
      family's acceptance curve.
    frontier: (quantile, rounds per chunk) of the reward the other arms are measured by
      (`frontier_advance`; quantile None: the mean row). A family arm's prediction is then
      for that quantile of a bucket's rows over a chunk (`AcceptCurve.frontier_tokens`),
      not for the mean row.
    seed: Seed of the generator that breaks exact ties.
  """

  exploration: float = 2.0
  discount: float = 0.99
  min_pulls: int = 1
  min_spread: float = 0.02
  accept_families: tuple[tuple[str, tuple[str, int]], ...] = ()
  frontier: tuple[float | None, int] | None = None
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
    if not (_is_real(self.min_spread) and 0 <= self.min_spread < 1):
      raise bad("min_spread", "in [0, 1)")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
      raise bad("seed", "an int")
    # Stored normalised (plain floats and ints, tuples), so that equal settings compare equal.
    normal = {
      "accept_families": _families(self.accept_families),
      "frontier": _frontier(self.frontier),
    }
    for name in ("exploration", "discount", "min_spread"):
      normal[name] = float(getattr(self, name))
    normal["min_pulls"], normal["seed"] = int(self.min_pulls), int(self.seed)
    for name, value in normal.items():
      object.__setattr__(self, name, value)

  def to_state(self) -> dict[str, Any]:
    """The settings as `StrategyBandit.state_dict` records them (JSON types)."""
    state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    state["accept_families"] = {a: list(spec) for a, spec in self.accept_families}
    state["frontier"] = None if self.frontier is None else list(self.frontier)
    return state

  @classmethod
  def from_state(cls, state: Mapping[str, Any]) -> BanditSettings:
    """The settings a `state_dict` records (a setting it lacks: the default)."""
    return cls(**{f.name: state[f.name] for f in dataclasses.fields(cls) if f.name in state})


def _families(spec: Any) -> tuple[tuple[str, tuple[str, int]], ...]:
  """`BanditSettings.accept_families` as (arm, (family, depth)) pairs, checked."""
  try:
    pairs = dict(spec or {})
  except (TypeError, ValueError):
    raise ValueError(
      f"BanditSettings.accept_families must map arms to (family, depth), got {spec!r}"
    ) from None
  for arm, fd in pairs.items():
    ok = isinstance(fd, tuple | list) and len(fd) == 2 and isinstance(fd[0], str)
    if not (isinstance(arm, str) and ok and isinstance(fd[1], int) and fd[1] >= 1):
      raise ValueError(
        f"BanditSettings.accept_families: {arm!r} -> {fd!r} must map an arm to (family, depth >= 1)"
      )
  return tuple((a, (str(f), int(d))) for a, (f, d) in pairs.items())


def _frontier(spec: Any) -> tuple[float | None, int] | None:
  """`BanditSettings.frontier` as (quantile or None, rounds), checked."""
  if spec is None:
    return None
  ok = isinstance(spec, tuple | list) and len(spec) == 2
  q, rounds = spec if ok else (None, 0)
  q_ok = q is None or (_is_real(q) and 0 <= q < 1)
  if not (ok and q_ok and isinstance(rounds, int) and rounds >= 1):
    raise ValueError(
      f"BanditSettings.frontier must be (quantile in [0, 1) or None, rounds >= 1), got {spec!r}"
    )
  return (None if q is None else float(q), int(rounds))


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

  def record(self, arm: int, phase: int, value: float, discount: float) -> None:
    """One chunk's reward. Every arm of the bucket decays, pulled or not: "how long ago" is
    counted in this bucket's chunks, so an arm that is not being tried loses confidence and
    its bonus grows."""
    grow = phase + 1 - self.count.shape[1]
    if grow > 0:
      pad = ((0, 0), (0, grow))
      self.count = np.pad(self.count, pad)
      self.reward_sum = np.pad(self.reward_sum, pad)
      self.square_sum = np.pad(self.square_sum, pad)
    self.count *= discount
    self.reward_sum *= discount
    self.square_sum *= discount
    self.count[arm, phase] += 1.0
    self.reward_sum[arm, phase] += value
    self.square_sum[arm, phase] += value * value
    self._fitted = None
    self.pulls[arm] += 1
    self.last[arm] = value

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
    the fitted value (0 without data): the unit of the exploration bonus, so that arms
    whose timings barely vary separate after a few pulls and noisy ones keep being
    compared."""
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
      if len(state[key]) != num_arms:
        raise ValueError(
          f"bucket {state['bucket']}: {key!r} has {len(state[key])} entries, expected {num_arms}"
        )
    cells = {key: state[key] for key in keys[:3]}
    widths = {len(row) for rows in cells.values() for row in rows}
    if len(widths) != 1 or not min(widths):
      raise ValueError(f"bucket {state['bucket']}: cell rows must have one equal length")
    stats = cls(num_arms, widths.pop())
    stats.count[:] = np.asarray(cells["count"], dtype=np.float64)
    stats.reward_sum[:] = np.asarray(cells["reward_sum"], dtype=np.float64)
    stats.square_sum[:] = np.asarray(cells["square_sum"], dtype=np.float64)
    stats.pulls[:] = np.asarray(state["pulls"], dtype=np.int64)
    stats.last = [None if x is None else float(x) for x in state["last"]]
    return stats


class StrategyBandit:
  """Discounted-UCB bandit over draft strategies, with separate statistics per batch bucket.

  Args:
    arms: Strategy names, e.g. ``("plain", "chain4", "tree5x4x16")``. Order matters: warm-up
      goes through the arms in this order, and the first arm is the default of `best` when a
      bucket has no data.
    settings: Everything else (`BanditSettings`; default: the engine's settings without
      acceptance families).
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
    families = dict(settings.accept_families)
    stray = [a for a in families if a not in arms]
    if stray:
      raise ValueError(f"accept_families: arms {stray!r} are not among {list(arms)!r}")
    self._arms = arms
    self._index = {a: i for i, a in enumerate(arms)}
    self._settings = settings
    self._families = families
    self._curves = {f: AcceptCurve() for f, _ in families.values()}
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

  @property
  def accept_families(self) -> dict[str, tuple[str, int]]:
    """arm -> (family, depth) of the arms scored from an acceptance curve."""
    return dict(self._families)

  def tokens_per_round(self, arm: str) -> float:
    """An `accept_families` arm's predicted tokens per row-round (NaN without data)."""
    family, depth = self._families[arm]
    return self._curves[family].tokens_per_round(depth)

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
    count = stats.count.sum(axis=1)
    if not (count > 0).all():
      # Data decayed to nothing (or state edited by hand): such an arm's bonus is infinite.
      return self._arms[int(np.argmin(count > 0))]
    # Rewards are normalised by the bucket's best mean, so that one `exploration` means the
    # same in every bucket, whose speeds differ a lot.
    means = np.nan_to_num(self._means(stats, _bucket_key(bucket)))
    best = float(np.max(means))
    normalised = means / best if best > 0 else means
    log_total = max(math.log(float(count.sum())), 0.0)
    spread = max(stats.relative_spread(), s.min_spread)
    index = normalised + s.exploration * spread * np.sqrt(log_total / count)
    return self._arms[self._argmax(index)]

  def _argmax(self, index: np.ndarray) -> int:
    """The arm of highest index; exact ties go to the seeded generator (so a bandit is
    deterministic given its seed and history, and `state_dict` keeps the generator)."""
    top = np.flatnonzero(index >= index.max() - 1e-12 * max(1.0, abs(float(index.max()))))
    return int(top[0]) if top.size == 1 else int(self._rng.choice(top))

  def _means(self, stats: _BucketStats, bucket: int) -> np.ndarray:
    """Per-arm speed: the phase-adjusted mean reward, times the predicted tokens per round
    for family arms (whose reward is their pace), at the frontier's quantile of the
    bucket's rows when one is set."""
    means = stats.means().copy()
    frontier = self._settings.frontier
    z = frontier_z(frontier[0], bucket) if frontier is not None else 0.0
    for arm, (family, depth) in self._families.items():
      rounds = frontier[1] if frontier is not None else 1
      means[self._index[arm]] *= self._curves[family].frontier_tokens(depth, z, rounds)
    return means

  # ------------------------------------------------------------------ learning

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
    self._bucket(bucket).record(i, int(phase), value, self._settings.discount)
    if accepted is not None:
      family, depth = self._families[arm]
      self._curves[family].observe(hist, depth, self._settings.discount)

  def observe_acceptance(self, arm: str, accepted: Sequence[float]) -> None:
    """Feeds an `accept_families` arm's rounds into its family's acceptance curve without
    a reward: a chunk cut short by its rows finishing has no comparable pace, but its
    rounds belong in the curve. Left out, a deep chain that ends answers inside one chunk
    would be judged on the chunks that did not, its slower-accepting ones."""
    if arm not in self._families:
      raise ValueError(f"observe_acceptance({arm!r}): not an accept_families arm")
    family, depth = self._families[arm]
    self._curves[family].observe(self._histogram(arm, accepted), depth, self._settings.discount)

  def _histogram(self, arm: str, accepted: Sequence[float]) -> np.ndarray:
    hist = np.asarray(accepted, dtype=np.float64)
    depth = self._families[arm][1]
    if hist.ndim != 1 or hist.size != depth + 1 or not np.all(np.isfinite(hist) & (hist >= 0)):
      raise ValueError(
        f"{arm!r}: accepted must be {depth + 1} finite counts >= 0, got {accepted!r}"
      )
    return hist

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
      "accept_curves": {f: c.to_state() for f, c in self._curves.items()},
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
    if fresh._families != self._families:
      raise ValueError(
        f"state has accept_families {fresh._families!r}, this bandit has {self._families!r}"
      )
    for family, curve in state.get("accept_curves", {}).items():
      if family not in fresh._curves:
        raise ValueError(f"state has an acceptance curve for unknown family {family!r}")
      fresh._curves[family] = AcceptCurve(curve["at_risk"], curve["rejected"])
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
      f"{_STATE_VERSION} only (versions 1-3 predate 2026-11-25 and have no reader)"
    )

"""Replays the rollout engine's policy on response lengths with a cost model: a predicted
rollout, RL step and end-to-end speedup per mode, without running a model.

The replay follows `rollout.engine.RolloutEngine.generate`: rows start in the smallest batch
bucket that holds them (powers of two from `min_batch_bucket` to `max_batch`); between
chunks the unfinished rows move to a smaller bucket when they fit (`compact`); a chunk is
`chunk_steps` plain decode steps (in the last bucket: to the end of its cache view), or
`spec_rounds` speculative rounds when the bucket is at or below `spec_threshold`, with the
arm a converged bandit picks (the one of highest predicted speed in that bucket, plain
decode included), or, given a `StrategyBandit`, the arm that bandit picks, learning from the
replayed chunks as the engine's does (its exploration included). Every step or round is
charged at the bucket's batch (padding rows cost like real ones) and at the chunk's cache
view (the engine's bucket covering the rows' furthest reach; without views, the active rows'
mean context). With an `EngineCost` (the engine's own calls, measured) it also charges the
prefill, drafter-cache rebuilds and the host time between calls.

Rows progress by their arm's mean accept length per round (`stochastic=False`), or by draws
(`stochastic=True`: the rows spread apart as they do, and the slowest decides when a bucket
ends). The drafter's chains then draw from one per-token acceptance, since a shallower
chain's draft is a prefix of a deeper one's (`chain_acceptance`: fitted to every chain arm's
accept length), and are chosen by the accept length it implies; other arms draw from an
i.i.d. per-token acceptance of their own. Given accept lengths by batch bucket (a run's
`spec/bucket/*` figures), each bucket's arms draw from their own.

A step: rollout + update (seconds per token, measured) + fixed other time (rewards, old
log-probs); mode "tlt" adds the drafter training that does not fit in idle time. Speedup
of a mode = baseline step / mode step (the paper's end-to-end figure), with the rollout
share r and rollout speedup s that bound it: 1 / ((1 - r) + r / s).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tlt_jax.rollout import decisions
from tlt_jax.rollout.bandit import StrategyBandit
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.state import plain_reach, power_of_two_buckets, round_up, spec_reach
from tlt_jax.sim.costs import (
  ArmModel,
  DecodeCost,
  EngineCost,
  chain_accept_length,
  per_token_acceptance,
)

__all__ = [
  "ChunkPlan",
  "EnginePolicy",
  "RecordedChunk",
  "ReplayRun",
  "RolloutPrediction",
  "StepPrediction",
  "replay_rollout",
  "replay_step",
  "speedup_bound",
]

PLAIN = "plain"


@dataclasses.dataclass(frozen=True)
class EnginePolicy:
  """The engine settings the replay follows (names as in `rollout.config.EngineConfig`).

  Attributes beyond the engine's own names:
    prompt_len: prompt tokens of every row when a replay is not given the rows' own.
    views: the engine's cache-view buckets (`EngineConfig.view_buckets`): a chunk is
      charged at the view covering its rows' furthest reach, as the engine runs it; ()
      charges the active rows' mean context instead (an engine that reads only the cache
      it holds, e.g. paged attention on a GPU).
    prompt_buckets: the engine's prompt buckets (the prefill's shape; () = exact).
    samples: rows per prompt (G); the prefill runs once per prompt.
    slots: the engine's `slots` (a drafter-cache rebuild is at most this wide).
  """

  max_batch: int
  min_batch_bucket: int = 1
  chunk_steps: int = 16
  compact: bool = True
  spec_threshold: int = 0
  spec_rounds: int = 8
  prompt_len: int = 0
  views: tuple[int, ...] = ()
  prompt_buckets: tuple[int, ...] = ()
  samples: int = 1
  slots: int = 0

  @property
  def batch_buckets(self) -> tuple[int, ...]:
    return power_of_two_buckets(min(self.min_batch_bucket, self.max_batch), self.max_batch)

  @classmethod
  def from_engine(cls, engine: Mapping[str, Any], samples: int = 1) -> EnginePolicy:
    """The policy of an engine config (a run's config.json "engine" entry), with its
    cache views and prompt buckets."""
    cfg = engine_config(engine)
    return cls(
      max_batch=cfg.max_batch,
      min_batch_bucket=cfg.min_batch_bucket,
      chunk_steps=cfg.chunk_steps,
      compact=cfg.compact,
      spec_threshold=cfg.spec_threshold,
      spec_rounds=cfg.spec_rounds,
      views=cfg.view_buckets,
      prompt_buckets=cfg.prompt_buckets,
      samples=samples,
      slots=cfg.slots,
    )


@dataclasses.dataclass
class RolloutPrediction:
  seconds: float
  tokens: int
  chunks_by_arm: dict[str, int]
  seconds_by_bucket: dict[int, float]
  # As a run records them (`rl.metrics.rollout_part_metrics`): "prefill", "plain", draft
  # arms, "drafter_prefill" (cache rebuilds); "host" is the time between calls.
  seconds_by_part: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def tokens_per_second(self) -> float:
    return self.tokens / self.seconds if self.seconds else 0.0


def _best_arm(arms, cost, batch, context, view=None) -> tuple[str, ArmModel | None]:
  """The arm of highest predicted tokens/s per row in this bucket (plain decode included);
  `view(arm)`: the cache view each would run at (None: plain's), else `context` for all."""
  at = (lambda arm: context) if view is None else view
  best, best_speed = (PLAIN, None), 1.0 / cost.seconds(batch, 1, at(None))
  for arm in arms:
    speed = arm.accept_length / arm.round_seconds(cost, batch, at(arm))
    if speed > best_speed:
      best, best_speed = (arm.name, arm), speed
  return best


def chain_acceptance(arms: Sequence[ArmModel]) -> float | None:
  """The per-token acceptance a of the drafter's chains (None without chain arms): one value
  for all of them, since a shallower chain's draft is a prefix of a deeper one's, fitted by
  least squares to the chain arms' accept lengths (1 + a + ... + a^depth), each weighted by
  the row-rounds that measured it (equal weights where none are known). Each arm's own
  accept length is biased by where it ran (a bandit runs a deep chain where acceptance is
  high), and one measured on a few rounds is noise: one curve for all."""
  chains = [a for a in arms if a.name.startswith("chain")]
  if not chains:
    return None
  weights = np.array([a.rounds for a in chains], dtype=float)
  if weights.sum() <= 0:
    weights = np.ones(len(chains))
  grid = np.linspace(0.0, 1.0, 2001)[:, None]
  depths = np.array([a.nodes - 1 for a in chains])[None, :]
  with np.errstate(invalid="ignore", divide="ignore"):
    means = np.where(grid < 1.0, (1.0 - grid ** (depths + 1)) / (1.0 - grid), depths + 1.0)
  target = np.array([a.accept_length for a in chains])[None, :]
  error = ((means - target) ** 2 * weights[None, :]).sum(axis=1)
  return float(grid[int(np.argmin(error)), 0])


def engine_config(engine: Mapping[str, Any], **changes: Any) -> EngineConfig:
  """The EngineConfig of a run's config.json "engine" entry (lists read as tuples; keys the
  engine no longer has are left out), with `changes` applied."""
  names = {f.name for f in dataclasses.fields(EngineConfig)}
  kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in engine.items() if k in names}
  return EngineConfig(**{**kwargs, **changes})


def replay_rollout(
  lengths: Sequence[int],
  cost: DecodeCost,
  policy: EnginePolicy,
  arms: Sequence[ArmModel] = (),
  *,
  prompt_lens: Sequence[int] | None = None,
  arm_mix: Mapping[str, float] | None = None,
  bandit: StrategyBandit | None = None,
  reward_noise: float = 0.0,
  stochastic: bool = False,
  seed: int = 0,
  bucket_arms: Mapping[int, Sequence[ArmModel]] | None = None,
) -> RolloutPrediction:
  """The predicted rollout of rows generating `lengths` tokens each after prompts of
  `prompt_lens` tokens (default: `policy.prompt_len`); see the module doc. With an
  `EngineCost` the replay also charges what the engine does around its decode calls: the
  prefill, drafter-cache rebuilds (a drafter arm's first chunk, and its first after a plain
  one), host time between calls, moves to smaller buckets and the final harvest, and lets
  the prefill emit each row's first token, as the engine does. `arm_mix` (chunks per arm,
  "plain" included, e.g. a run's measured counts) replaces the converged bandit: each
  speculative-eligible chunk runs the arm furthest below its share so far.

  `bandit` (its arms: plain and some of `arms`; `stochastic` replays only) replaces the
  converged bandit with the engine's own: it picks each eligible chunk's arm and is updated
  with the chunk's reward as `rollout.run.RolloutRun` does (`rollout.decisions`). The
  bandit keeps what it learnt, so one bandit replayed over a run's rollouts in order learns
  as the run's did. Each reward's seconds carry a log-normal measurement noise of relative
  spread `reward_noise` (the replay's times do not).

  The loop is the engine's (`rollout.run`): compact, choose an arm, run a chunk.
  """
  run = ReplayRun(
    lengths,
    cost,
    policy,
    arms,
    prompt_lens=prompt_lens,
    arm_mix=arm_mix,
    bandit=bandit,
    reward_noise=reward_noise,
    stochastic=stochastic,
    seed=seed,
    bucket_arms=bucket_arms,
  )
  while run.active().any():
    run.compact()
    run.run_chunk(run.choose_arm())
  return run.finish()


@dataclasses.dataclass(frozen=True)
class RecordedChunk:
  """What one engine chunk did (its timeline entry and the rows' lengths after it).

  Attributes:
    generated: tokens generated per request row after the chunk.
    seconds: the seconds the engine's bandit reward divided by (`run_s`; any value for a
      chunk it did not reward).
    steps: the steps or rounds it ran.
    row_rounds: rows x rounds it ran, summed over its rounds (speculative chunks; 0 for
      plain ones).
  """

  generated: np.ndarray
  seconds: float
  steps: int
  row_rounds: int = 0


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
  """What the replay decided for its next chunk: the arm (`ArmModel` None for plain), whether
  the bandit chose it (`learn`), and the program's cache view and steps (rounds).
  `teaches`: False where a chunk the bandit chose teaches it nothing (in the engine, a
  program's first run, or a charged drafter-cache rebuild's: `decision_mismatch`)."""

  name: str
  arm: ArmModel | None
  learn: bool
  view: int
  steps: int
  teaches: bool = True


class ReplayRun:
  """One replayed rollout, in the engine's steps (`rollout.run.RolloutRun`): `compact`,
  `choose_arm`, `run_chunk`, `finish`. The rows are held in request order: `generated`
  tokens so far and `remaining` ones of their `lengths`.

  `max_new_tokens` (> 0: the engine's budget, one for all rows or one per row) caps a
  row's reach as the engine's cache views do; 0 leaves it unbounded (a chunk's view is
  then capped at the largest).

  `bucket_arms`: the same arms with the accept lengths measured in some batch buckets (a
  tail's rows accept fewer tokens than a full bucket's); chunks in those buckets use them
  as given, without the chains' fitted curve (which corrects an arm's mean for the buckets
  it ran in), chunks elsewhere use `arms`.
  """

  def __init__(
    self,
    lengths: Sequence[int],
    cost: DecodeCost,
    policy: EnginePolicy,
    arms: Sequence[ArmModel] = (),
    *,
    prompt_lens: Sequence[int] | None = None,
    arm_mix: Mapping[str, float] | None = None,
    bandit: StrategyBandit | None = None,
    reward_noise: float = 0.0,
    stochastic: bool = False,
    seed: int = 0,
    max_new_tokens: int | Sequence[int] = 0,
    bucket_arms: Mapping[int, Sequence[ArmModel]] | None = None,
  ):
    self.lengths = np.asarray(lengths, dtype=float)
    remaining = self.lengths.copy()
    if remaining.ndim != 1 or not remaining.size or np.any(remaining < 1):
      raise ValueError("lengths must be a non-empty list of positive token counts")
    if remaining.size > policy.max_batch:
      raise ValueError(f"{remaining.size} rows exceed max_batch={policy.max_batch}")
    prompts = np.full(remaining.shape, float(policy.prompt_len))
    if prompt_lens is not None:
      prompts = np.asarray(prompt_lens, dtype=float)
      if prompts.shape != remaining.shape:
        raise ValueError(f"{prompts.size} prompt lengths for {remaining.size} rows")
    if bandit is not None:
      if arm_mix is not None:
        raise ValueError("replay_rollout takes a bandit or an arm_mix, not both")
      if not stochastic:
        raise ValueError("a replayed bandit needs stochastic=True (per-row acceptance draws)")
      names = sorted(a.name for a in arms)
      unknown = sorted(set(bandit.arms) - set(names) - {PLAIN})
      if unknown:
        raise ValueError(f"bandit arms {unknown} have no ArmModel among {names}")
    if not 0.0 <= reward_noise < 1.0:
      raise ValueError(f"reward_noise must be in [0, 1), got {reward_noise!r}")
    self.cost, self.policy, self.bandit = cost, policy, bandit
    self.stochastic, self.reward_noise = stochastic, reward_noise
    self.engine = isinstance(cost, EngineCost)
    self.rng = np.random.default_rng(seed)
    names = sorted(a.name for a in arms)
    for bucket, models in (bucket_arms or {}).items():
      if sorted(a.name for a in models) != names:
        got = sorted(a.name for a in models)
        raise ValueError(f"bucket {bucket}'s arms {got} are not the arms {names}")
    # A bucket's own accept lengths are where its arms ran: no fitted curve to correct them.
    self._arm_sets = {b: _ArmSet.of(m, False) for b, m in (bucket_arms or {}).items()}
    self._default_arms = _ArmSet.of(arms, stochastic)
    self.prompts = prompts
    budget = np.broadcast_to(np.asarray(max_new_tokens, dtype=float), prompts.shape)
    self.max_len = np.where(budget > 0, prompts + budget, np.inf)
    self.generated = np.zeros_like(remaining)
    self.batch = round_up(remaining.size, policy.batch_buckets)
    self.seconds, self.chunks, self.by_bucket, self.by_part = 0.0, {}, {}, {}
    if self.engine:
      n_prompts = round_up(-(-remaining.size // policy.samples), policy.batch_buckets)
      longest = int(prompts.max())
      if policy.prompt_buckets:
        longest = round_up(longest, policy.prompt_buckets)
      self._charge("prefill", cost.prefill_seconds(n_prompts, longest))
      # The prefill samples every row's first token.
      remaining -= 1.0
      self.generated += 1.0
    self.remaining = remaining
    self.drafter_cache = False  # the drafter's cache is in step with the rows
    self.switched_away = False  # a chunk left the drafter's cache behind (its rebuild is charged)
    mix = {k: float(v) for k, v in (arm_mix or {}).items() if k == PLAIN or k in self.by_name}
    if arm_mix is not None and (not mix or sum(mix.values()) <= 0):
      raise ValueError(
        f"arm_mix {dict(arm_mix)} names none of the arms {sorted(self.by_name)} or plain"
      )
    self.mix, self.mixed = mix, {}  # the mix, and eligible chunks run per arm under it

  # The arms as the current batch bucket has them.
  @property
  def arms(self) -> list[ArmModel]:
    return self._arm_sets.get(self.batch, self._default_arms).arms

  @property
  def by_name(self) -> dict[str, ArmModel]:
    return self._arm_sets.get(self.batch, self._default_arms).by_name

  @property
  def accept_p(self) -> dict[str, float]:
    return self._arm_sets.get(self.batch, self._default_arms).accept_p

  # ------------------------------------------------------------------ the steps
  def active(self) -> np.ndarray:
    return self.remaining > 0

  def compact(self) -> None:
    """Between chunks: the rows move to a smaller bucket when they fit (charging the move,
    or the host gap between calls, with an `EngineCost`)."""
    policy, cost = self.policy, self.cost
    if policy.compact:
      smaller = decisions.bucket_after_compaction(
        int(self.active().sum()), self.batch, policy.batch_buckets
      )
      if self.engine:
        self._charge("host", cost.compact_s if smaller < self.batch else cost.gap_s)
      self.batch = smaller
    elif self.engine:
      self._charge("host", cost.gap_s)

  def _reach(self) -> np.ndarray:
    return (self.prompts + self.generated)[self.active()]

  def view(self, arm: ArmModel | None) -> int:
    """The cache view the engine compiles the next chunk of `arm` (None: plain) for."""
    policy, active = self.policy, self.active()
    length, max_len = (self.prompts + self.generated)[active], self.max_len[active]
    if arm is None:
      reach = plain_reach(length, max_len, policy.chunk_steps)
    else:  # a chain emits at most its nodes a round
      reach = spec_reach(length, max_len, policy.spec_rounds, arm.nodes, arm.nodes)
    return decisions.chunk_view(min(float(reach.max()), policy.views[-1]), policy.views)

  def choose_arm(self) -> ChunkPlan:
    """The next chunk's arm (an `arm_mix`'s, the replayed bandit's, or the converged
    bandit's best predicted), whether the bandit learns from it, its view and steps."""
    policy, batch = self.policy, self.batch
    name, arm, learn = PLAIN, None, False
    if self.arms and batch <= policy.spec_threshold:
      if self.mix:
        done, total = sum(self.mixed.values()) + 1, sum(self.mix.values())
        name = max(self.mix, key=lambda k: self.mix[k] / total - self.mixed.get(k, 0) / done)
        self.mixed[name] = self.mixed.get(name, 0) + 1
      elif self.bandit is not None:
        name, learn = decisions.choose_arm(self.bandit, batch, speculate=True, default=PLAIN)
      else:
        context = float(self._reach().mean())
        views = self.view if policy.views else None
        name, _ = _best_arm(self.arms, self.cost, batch, context, views)
      arm = self.by_name.get(name)
    steps = policy.chunk_steps if arm is None else policy.spec_rounds
    view = self.view(arm) if policy.views else 0
    if policy.views and arm is None:
      last = batch == policy.batch_buckets[0]
      run_to_end = decisions.runs_to_end(self.bandit, batch, learn=learn, last_bucket=last)
      steps = decisions.plain_steps(policy.chunk_steps, view, self._reach().max(), run_to_end)
    return ChunkPlan(name, arm, learn, view, steps)

  def run_chunk(self, plan: ChunkPlan, recorded: RecordedChunk | None = None) -> None:
    """Runs `plan`: each step or round charged at the bucket's batch and the chunk's view
    (without views, the active rows' mean context), rows advancing by their arm's accept
    length or draws; then the bandit's lesson when it learns.

    A `recorded` chunk (a real engine's) gives what the chunk did: the replay takes it
    instead of its own model's, and only decides and learns (`decision_mismatch`)."""
    policy, cost, name, arm = self.policy, self.cost, plan.name, plan.arm
    active = self.active()
    self.chunks[name] = self.chunks.get(name, 0) + 1
    start = self.seconds
    before, started = self.generated.copy(), active
    charged = 0.0  # a rebuild after a switch away, charged to the chunk's reward
    if self.engine and arm is not None and arm.draft_steps and not self.drafter_cache:
      width = min(plan.view, policy.slots) if policy.slots else plan.view
      rebuild = cost.rebuild_seconds(self.batch, width)
      self._charge("drafter_prefill", rebuild)
      charged = rebuild if self.switched_away else 0.0
      self.switched_away = False
    if arm is None or not arm.draft_steps:
      self.switched_away = self.switched_away or self.drafter_cache
    self.drafter_cache = arm is not None and arm.draft_steps > 0
    depth = 0 if arm is None else arm.nodes - 1
    if recorded is None:
      ran, row_rounds = self._advance(plan, depth)
      run_s = self.seconds - start + charged
    else:
      self.generated = np.asarray(recorded.generated, dtype=float)
      self.remaining = self.lengths - self.generated
      ran, run_s, row_rounds = recorded.steps, recorded.seconds, recorded.row_rounds
      self._charge(name, run_s)
    if plan.learn and plan.teaches:
      measured = decisions.measured(name, ran, plan.steps, policy.chunk_steps)
      chunk = _Chunk(name, measured, run_s, ran, row_rounds)
      tokens = float((self.generated[started] - before[started]).sum())
      _teach(self.bandit, self.batch, chunk, tokens, self.reward_noise, self.rng)
    self.by_bucket[self.batch] = self.by_bucket.get(self.batch, 0.0) + self.seconds - start

  def _advance(self, plan: ChunkPlan, depth: int) -> tuple[int, int]:
    """The chunk's steps on the cost model: returns the steps (rounds) run and the
    row-rounds."""
    cost, arm = self.cost, plan.arm
    ran = row_rounds = 0
    for _ in range(plan.steps):
      active = self.active()
      rows = int(np.count_nonzero(active))
      if not rows:
        break
      ran += 1
      row_rounds += rows
      context = plan.view or float(self._reach().mean())
      if arm is None:
        self._charge(plan.name, cost.seconds(self.batch, 1, context))
        gain = np.ones(rows)
      else:
        self._charge(plan.name, arm.round_seconds(cost, self.batch, context))
        if self.stochastic:
          # Leading accepted draft tokens of a chain of nodes - 1, plus the bonus token.
          draws = self.rng.random((rows, depth)) < self.accept_p[plan.name]
          taken = np.cumprod(draws, axis=1).sum(axis=1)
          gain = taken + 1.0
        else:
          gain = np.full(rows, arm.accept_length)
      step = np.minimum(gain, self.remaining[active])
      self.remaining[active] -= step
      self.generated[active] += step
    return ran, row_rounds

  def _charge(self, part: str, seconds: float) -> None:
    self.seconds += seconds
    self.by_part[part] = self.by_part.get(part, 0.0) + seconds

  def finish(self) -> RolloutPrediction:
    if self.engine:
      self._charge("host", self.cost.finish_s)
    tokens = int(np.sum(self.lengths))
    return RolloutPrediction(self.seconds, tokens, self.chunks, self.by_bucket, self.by_part)


@dataclasses.dataclass(frozen=True)
class _ArmSet:
  """Arms as one batch bucket prices them: the models, by name, and the per-token acceptance
  their rows draw from."""

  arms: list[ArmModel]
  by_name: dict[str, ArmModel]
  accept_p: dict[str, float]

  @classmethod
  def of(cls, arms: Sequence[ArmModel], fit_chains: bool) -> _ArmSet:
    """`fit_chains`: the chains' accept lengths as their one fitted curve has them
    (`chain_acceptance`)."""
    shared = chain_acceptance(arms) if fit_chains else None
    if shared is not None:
      arms = [
        dataclasses.replace(a, accept_length=chain_accept_length(shared, a.nodes - 1))
        if a.name.startswith("chain")
        else a
        for a in arms
      ]
    accept_p = {a.name: per_token_acceptance(a.accept_length, a.nodes) for a in arms}
    return cls(list(arms), {a.name: a for a in arms}, accept_p)


@dataclasses.dataclass(frozen=True)
class _Chunk:
  """One replayed chunk as the bandit is told of it."""

  arm: str
  measured: bool  # it measured its arm (`decisions.measured`)
  seconds: float  # its time, with a rebuild after a switch away
  steps: int  # decode steps or speculative rounds run
  row_rounds: int  # rows x rounds of a speculative chunk


def _teach(bandit, batch, chunk, tokens, noise, rng) -> None:
  """The engine's bandit update for one replayed chunk (`decisions.teach_bandit`, as
  `rollout.run.RolloutRun` calls it): `tokens` generated by the rows active at its start;
  the chunk's seconds carry a log-normal measurement noise of relative spread `noise`."""
  row_steps = tokens if chunk.arm == PLAIN else float(chunk.row_rounds)
  run_s = chunk.seconds * (math.exp(noise * rng.standard_normal()) if noise else 1.0)
  decisions.teach_bandit(
    bandit,
    batch,
    chunk.arm,
    run_s=run_s,
    measured=chunk.measured,
    tokens=tokens,
    mean_rows=row_steps / max(chunk.steps, 1),
  )


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
  prompt_lens: Sequence[int] | None = None,
  arm_mix: Mapping[str, float] | None = None,
  stochastic: bool = False,
  seed: int = 0,
  bucket_arms: Mapping[int, Sequence[ArmModel]] | None = None,
) -> StepPrediction:
  """One RL step of `mode` ("baseline": plain decode; "sd" / "tlt": the arms, which carry
  the frozen or the online drafter's accept lengths). In "tlt" the drafter's `drafter_s` of
  training per step runs in idle device time; the part beyond `drafter_idle_fraction` of
  the rollout is added to the step. `bucket_arms`: as `ReplayRun`'s (not in "baseline")."""
  if mode not in ("baseline", "sd", "tlt"):
    raise ValueError(f"mode must be baseline, sd or tlt, got {mode!r}")
  if mode == "baseline":
    policy, arms, bucket_arms = dataclasses.replace(policy, spec_threshold=0), (), None
  rollout = replay_rollout(
    lengths,
    cost,
    policy,
    arms,
    prompt_lens=prompt_lens,
    arm_mix=arm_mix,
    stochastic=stochastic,
    seed=seed,
    bucket_arms=bucket_arms,
  )
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

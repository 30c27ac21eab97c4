"""The simulator against a measured run: each RL step of each mode replayed on the step's
own response lengths, and the predicted rollout and step times set beside the measured.

Only the decode cost model (a host's `TableCost`) and the engine's policy are being tested:
the run supplies what the simulator takes as inputs anyway (response lengths, each draft
arm's accept length in that step), and the baseline run calibrates the non-rollout part of
a step (update seconds per token and the rest) for every mode. Priced by the run's own
calls (`run_costs`, from the timelines the run wrote), only the engine's policy and the
replay's model of acceptance are: a host that ran slower than its probe no longer counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tlt_jax.rollout.bandit import StrategyBandit
from tlt_jax.rollout.config import bandit_settings
from tlt_jax.sim.costs import ArmModel, DecodeCost, EngineCost, arms_from_accept
from tlt_jax.sim.replay import (
  EnginePolicy,
  RecordedChunk,
  ReplayRun,
  engine_config,
  replay_rollout,
)

# A calibrated prediction should be within 15% of the measured time.
TOLERANCE = 0.15
# Draft arms the simulator models from an accept length (`costs.arms_from_accept`).
_MODELLED = ("chain", "group", "hybrid")


@dataclasses.dataclass(frozen=True)
class StepRecord:
  """What a run measured in one RL step.

  Attributes:
    rollouts: response lengths of each rollout of the step (refills are rollouts too).
    rollout_s: rollout wall time without lazy compiles.
    step_s: step wall time without compiles and held-out evaluation.
    update_s: the policy update's time without its lazy compiles.
    accept: the step's accept length per draft arm (empty: no speculative round).
    prompts: prompt lengths of each rollout's rows (empty: not recorded, runs before
      2026-11-26).
    drafter_s: rollout seconds the online drafter's scheduler took at chunk boundaries
      (its updates, host work and push-forced cache rebuilds; mode tlt).
    chunks: the step's chunks per arm as its bandit chose them ("plain" included).
    rounds: the step's speculative row-rounds per draft arm (what measured `accept`).
    parts: the rollout's device-call seconds by part, compiles left out
      (`rl.metrics.rollout_part_metrics`; empty: not recorded, runs before 2026-12-07).
    bucket_accept, bucket_rounds: `accept` and `rounds` by batch bucket (empty: not
      recorded, runs before 2026-12-07).
    step: the run's step number.
  """

  rollouts: tuple[tuple[int, ...], ...]
  rollout_s: float
  step_s: float
  update_s: float
  accept: Mapping[str, float]
  prompts: tuple[tuple[int, ...], ...] = ()
  drafter_s: float = 0.0
  chunks: Mapping[str, int] = dataclasses.field(default_factory=dict)
  rounds: Mapping[str, float] = dataclasses.field(default_factory=dict)
  parts: Mapping[str, float] = dataclasses.field(default_factory=dict)
  bucket_accept: Mapping[int, Mapping[str, float]] = dataclasses.field(default_factory=dict)
  bucket_rounds: Mapping[int, Mapping[str, float]] = dataclasses.field(default_factory=dict)
  step: int = 0

  @property
  def tokens(self) -> int:
    return int(sum(sum(r) for r in self.rollouts))

  def seconds_by_part(self) -> dict[str, float]:
    """`parts` and "host": the rest of the rollout outside the drafter's scheduler (the
    time between device calls, harvests included), as the replay charges them."""
    host = self.rollout_s - self.drafter_s - sum(self.parts.values())
    return {**self.parts, "host": host}


def step_record(metrics: Mapping[str, Any], lengths: Mapping[str, Any]) -> StepRecord:
  """A StepRecord from one line of a run's metrics.jsonl and of its rollout_lengths.jsonl."""
  if metrics["step"] != lengths["step"]:
    raise ValueError(f"metrics step {metrics['step']} != lengths step {lengths['step']}")
  rollout_compile = metrics.get("time/rollout_compile", 0.0)
  compile_s = rollout_compile + metrics.get("time/train_compile", 0.0)
  accept = {
    k.split("/")[2]: float(v)
    for k, v in metrics.items()
    if k.startswith("spec/arm/") and k.endswith("/accept_length")
  }
  by_bucket: dict[str, dict[int, dict[str, float]]] = {"accept_length": {}, "row_rounds": {}}
  for k, v in metrics.items():
    if k.startswith("spec/bucket/"):
      _, _, bucket, arm, figure = k.split("/")
      if figure in by_bucket:
        by_bucket[figure].setdefault(int(bucket), {})[arm] = float(v)
  return StepRecord(
    rollouts=tuple(tuple(max(1, int(n)) for n in r) for r in lengths["rollouts"]),
    rollout_s=metrics["time/rollout"] - rollout_compile,
    step_s=metrics["time/step"] - compile_s - metrics.get("time/eval", 0.0),
    # The update's programs compile lazily inside it; step_s leaves compiles out, so must
    # the update (else the calibrated rest of a step goes negative).
    update_s=max(metrics["time/update"] - metrics.get("time/train_compile", 0.0), 0.0),
    accept=accept,
    prompts=tuple(tuple(int(n) for n in r) for r in lengths.get("prompts", ())),
    drafter_s=float(metrics.get("drafter/rollout_charged_s", 0.0)),
    chunks={
      k.split("/")[2]: int(v)
      for k, v in metrics.items()
      if k.startswith("spec/arm/") and k.endswith("/chunks")
    },
    rounds={
      k.split("/")[2]: float(v)
      for k, v in metrics.items()
      if k.startswith("spec/arm/") and k.endswith("/row_rounds")
    },
    parts={
      k.split("/", 2)[2]: float(v) for k, v in metrics.items() if k.startswith("time/rollout_part/")
    },
    bucket_accept=by_bucket["accept_length"],
    bucket_rounds=by_bucket["row_rounds"],
    step=int(metrics["step"]),
  )


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The non-rollout part of a step, from a baseline run: seconds of update per rollout
  token, and the remaining seconds per step (rewards, old log-probs, host work)."""

  update_s_per_token: float
  other_s: float

  @classmethod
  def from_baseline(cls, records: Sequence[StepRecord]) -> Calibration:
    tokens = sum(r.tokens for r in records)
    update = sum(r.update_s for r in records)
    other = float(np.mean([r.step_s - r.rollout_s - r.update_s for r in records]))
    return cls(update / max(tokens, 1), max(other, 0.0))


def modelled(arms: Sequence[str]) -> tuple[str, ...]:
  """The draft arms among `arms` the simulator can model from an accept length."""
  return tuple(a for a in arms if a.rstrip("0123456789") in _MODELLED)


def engine_bandit(engine: Mapping[str, Any], arms: Sequence[str], seed: int = 0) -> StrategyBandit:
  """A fresh bandit as the engine of `engine` (a run's config.json "engine" entry) builds
  it (`rollout.config.bandit_settings`), over plain and those of its strategies in `arms`
  (the ones a replay can model; a tree, say, is left out)."""
  pool = tuple(engine.get("spec_strategies", ()))
  kept = tuple(s for s in pool if s in arms)
  if not kept:
    raise ValueError(f"none of the engine's strategies {pool} in {arms}")
  arm_names, settings = bandit_settings(engine_config(engine, spec_strategies=kept))
  return StrategyBandit(arm_names, dataclasses.replace(settings, seed=seed))


def bucket_accept_lengths(
  records: Sequence[StepRecord],
) -> list[dict[int, dict[str, tuple[float, float]]]]:
  """Per step, each draft arm's (accept length, row-rounds) in every batch bucket the run
  recorded figures for (empty for a run that recorded none).

  A step's own figure in one bucket rests on a few row-rounds, and the drafter changes from
  step to step, so two factors, each from many rounds: the arm's accept length in the bucket
  pooled over the run (a tail's rows accept fewer tokens than a full bucket's), scaled by
  the step's accept length over what that pooled curve expects of the buckets the step ran
  the arm in (1 where it did not run). Row-rounds: the step's in the bucket, else the run's.
  """
  total: dict[tuple[int, str], np.ndarray] = {}  # (bucket, arm): [accept x rounds, rounds]
  for r in records:
    for b, lengths in r.bucket_accept.items():
      for arm, length in lengths.items():
        n = r.bucket_rounds.get(b, {}).get(arm, 0.0)
        total[(b, arm)] = total.get((b, arm), np.zeros(2)) + (length * n, n)
  total = {k: v for k, v in total.items() if v[1] > 0}
  buckets = sorted({b for b, _ in total})
  out = []
  for r in records:
    step: dict[int, dict[str, tuple[float, float]]] = {b: {} for b in buckets}
    for arm in sorted({a for _, a in total}):
      cells = [v for (_, a), v in total.items() if a == arm]
      overall = sum(v[0] for v in cells) / sum(v[1] for v in cells)
      curve = {
        b: total[(b, arm)][0] / total[(b, arm)][1] if (b, arm) in total else overall
        for b in buckets
      }
      ran = {b: r.bucket_rounds.get(b, {}).get(arm, 0.0) for b in buckets}
      factor = 1.0
      if sum(ran.values()) > 0 and arm in r.accept:
        factor = r.accept[arm] * sum(ran.values()) / sum(curve[b] * n for b, n in ran.items())
      for b in buckets:
        rounds = ran[b] or (total[(b, arm)][1] if (b, arm) in total else 0.0)
        step[b][arm] = (float(curve[b] * factor), float(rounds))
    out.append(step)
  return out


def compare(
  records: Sequence[StepRecord],
  cost: DecodeCost,
  policy: EnginePolicy,
  calibration: Calibration,
  *,
  speculative: bool,
  draft_cost: float = 0.1,
  measured_arms: bool = False,
  bandit: StrategyBandit | None = None,
  reward_noise: float = 0.0,
  stochastic: bool = True,
  seed: int = 0,
  by_bucket: bool = True,
  step_costs: Sequence[DecodeCost] | None = None,
) -> dict[str, Any]:
  """Mean measured and predicted rollout and step seconds over `records`, their ratios
  (predicted / measured; the rollout's also per step, "rollout_ratios") and whether both
  are within TOLERANCE. With `speculative`, each step's draft arms carry that step's accept
  lengths (the run's mean where an arm did not run in that step); arms the simulator cannot
  model (trees) are left out. The rows' prompt lengths and the drafter scheduler's measured
  seconds in the rollout are inputs too (the scheduler is not what is being tested).
  `measured_arms`: each step runs the arm mix its bandit chose (exploration included)
  instead of the converged bandit's.
  `bandit` (`engine_bandit`): the engine's bandit replayed over the run's rollouts in order,
  learning as it goes (`replay.replay_rollout`; rewards with `reward_noise`); the chunks it
  chose per arm are returned as "chunks".
  `by_bucket`: where the run recorded accept lengths by batch bucket, each bucket's arms
  carry their own (`bucket_accept_lengths`), not the step's mean over buckets.
  `step_costs`: one cost per record, in place of `cost` (`run_costs`' drift per step)."""
  if step_costs is not None and len(step_costs) != len(records):
    raise ValueError(f"{len(step_costs)} step costs for {len(records)} steps")
  if bandit is not None and measured_arms:
    raise ValueError("compare takes measured_arms or a bandit, not both")
  if not records:
    raise ValueError("no steps to compare")
  steps_arms = [((), {})] * len(records)
  if speculative:
    steps_arms = _step_arms(records, draft_cost, by_bucket)
  else:
    policy = dataclasses.replace(policy, spec_threshold=0)
  predicted_rollout, predicted_step, chunks, parts = [], [], {}, []
  for i, (r, (arms, bucket_arms)) in enumerate(zip(records, steps_arms, strict=True)):
    prompts = r.prompts or (None,) * len(r.rollouts)
    seconds, by_part = r.drafter_s, {}
    for j, (lengths, plens) in enumerate(zip(r.rollouts, prompts, strict=True)):
      replayed = replay_rollout(
        lengths,
        cost if step_costs is None else step_costs[i],
        policy,
        arms,
        prompt_lens=plens,
        arm_mix=(r.chunks or None) if measured_arms and arms else None,
        bandit=bandit if arms else None,
        reward_noise=reward_noise,
        stochastic=stochastic,
        seed=seed + 97 * i + j,
        bucket_arms=bucket_arms or None,
      )
      seconds += replayed.seconds
      for arm, n in replayed.chunks_by_arm.items():
        chunks[arm] = chunks.get(arm, 0) + n
      for part, s in replayed.seconds_by_part.items():
        by_part[part] = by_part.get(part, 0.0) + s
    predicted_rollout.append(seconds)
    if r.parts:
      parts.append({"step": r.step, "measured": r.seconds_by_part(), "predicted": by_part})
    update = calibration.update_s_per_token * r.tokens
    predicted_step.append(seconds + update + calibration.other_s)
  out = {
    "steps": len(records),
    "measured_rollout_s": float(np.mean([r.rollout_s for r in records])),
    "predicted_rollout_s": float(np.mean(predicted_rollout)),
    "measured_step_s": float(np.mean([r.step_s for r in records])),
    "predicted_step_s": float(np.mean(predicted_step)),
    "chunks": chunks,
    # Per step, predicted / measured: shows in which steps a run and the model part ways.
    "rollout_ratios": [p / r.rollout_s for p, r in zip(predicted_rollout, records, strict=True)],
    # Per step where the run recorded them (its number, "step"), rollout seconds by part,
    # measured and predicted: shows which part of a rollout the model misses.
    "parts": parts,
  }
  out["rollout_ratio"] = out["predicted_rollout_s"] / out["measured_rollout_s"]
  out["step_ratio"] = out["predicted_step_s"] / out["measured_step_s"]
  out["within_tolerance"] = all(
    abs(out[k] - 1.0) <= TOLERANCE for k in ("rollout_ratio", "step_ratio")
  )
  return out


def run_costs(
  rows: Iterable[Mapping[str, Any]], steps: Collection[int], base: EngineCost | None = None
) -> tuple[EngineCost, dict[int, float]]:
  """A run's own engine costs, from its rollout_timelines.jsonl rows (one per step:
  {"step", "rollouts": [{"wall", "timeline"}]}): the medians of the calls of `steps`
  pooled (`EngineCost.from_timelines`; cells the run never timed from `base`, scaled to the
  run's speed), and per step its calls' drift against them (`EngineCost.drift`; scale the
  pooled cost by it for a step's own speed)."""
  by_step = {
    row["step"]: [(r["timeline"], r["wall"]) for r in row["rollouts"]]
    for row in rows
    if row["step"] in steps
  }
  missing = sorted(set(steps) - set(by_step))
  if missing:
    raise ValueError(f"no rollout timelines of steps {missing}")
  pooled = EngineCost.from_timelines((t for s in sorted(by_step) for t in by_step[s]), base)
  return pooled, {s: pooled.drift(by_step[s]) for s in sorted(by_step)}


def _step_arms(
  records: Sequence[StepRecord], draft_cost: float, by_bucket: bool
) -> list[tuple[tuple[ArmModel, ...], dict[int, tuple[ArmModel, ...]]]]:
  """Per step, the modelled draft arms at the step's accept lengths (the run's mean where an
  arm did not run in it), and with `by_bucket` the same arms at each bucket's
  (`bucket_accept_lengths`, kept within 1 .. nodes)."""
  mean_accept: dict[str, list[float]] = {}
  run_rounds: dict[str, float] = {}
  for r in records:
    for arm, length in r.accept.items():
      mean_accept.setdefault(arm, []).append(length)
    for arm, n in r.rounds.items():
      run_rounds[arm] = run_rounds.get(arm, 0.0) + n
  fallback = {arm: float(np.mean(v)) for arm, v in mean_accept.items()}
  in_buckets = bucket_accept_lengths(records) if by_bucket else [{} for _ in records]
  out = []
  for r, cells_by_bucket in zip(records, in_buckets, strict=True):
    accept = {**fallback, **r.accept}
    # Weights of the chains' shared fit: the step's own rounds, the run's where it has none.
    rounds = r.rounds if any(r.rounds.get(k, 0) for k in modelled(r.rounds)) else run_rounds
    arms = arms_from_accept({k: accept[k] for k in modelled(accept)}, draft_cost, rounds)
    bucket_arms = {
      b: tuple(
        dataclasses.replace(
          a, accept_length=float(np.clip(cells[a.name][0], 1.0, a.nodes)), rounds=cells[a.name][1]
        )
        if a.name in cells
        else a
        for a in arms
      )
      for b, cells in cells_by_bucket.items()
    }
    out.append((arms, bucket_arms))
  return out


# The decisions the replay must take as the engine took them (`decision_mismatch`).
DECISIONS = ("batch", "arm", "learn", "view", "steps")


def decision_mismatch(
  chunks: Sequence[Mapping[str, Any]],
  lengths: Sequence[int],
  policy: EnginePolicy,
  arms: Sequence[ArmModel],
  bandit: StrategyBandit | None,
  *,
  prompt_lens: Sequence[int],
  max_new_tokens: int | Sequence[int],
) -> str | None:
  """Replays a real rollout's recorded chunks through the simulator's `ReplayRun` and
  returns the first decision it takes differently from the engine, or None.

  `chunks`: per engine chunk, in order, its decisions (`DECISIONS`: the batch bucket after
  compaction, the arm, whether the bandit chose it, the cache view, the steps or rounds
  asked for) and what it did: "generated" (tokens per request row after it), "ran" (steps
  or rounds run), "run_s" (when rewarded) and "row_rounds" (speculative), and "first_run"
  where it was its program's first run (the engine's pool, not a decision: a chunk the
  bandit chose then asks for one step or round and teaches nothing,
  `rollout.run.RolloutRun._first_run`), "rebuild_first_run" where the drafter-cache rebuild
  charged to it ran its program for the first time (it teaches nothing either).
  `bandit`: a copy of the engine's bandit as it was before the rollout (the replay teaches
  it the chunks' lessons as the engine taught its own). `lengths`: the rows' final
  completion lengths. The replay charges no cost of its own: only decisions are compared.
  """
  unit = ((1, 1, 1.0),)
  cells = {"plain": unit, "prefill": unit, "drafter_prefill": unit}
  cost = EngineCost({**cells, **{a.name: unit for a in arms}})  # the prefill's first token
  run = ReplayRun(
    lengths,
    cost,
    policy,
    arms,
    prompt_lens=prompt_lens,
    bandit=bandit,
    stochastic=bandit is not None,
    max_new_tokens=max_new_tokens,
  )
  for i, chunk in enumerate(chunks):
    if not run.active().any():
      return f"chunk {i}: every replayed row has finished"
    run.compact()
    plan = run.choose_arm()
    if chunk.get("first_run") and plan.learn:
      plan = dataclasses.replace(plan, steps=1, teaches=False)
    elif chunk.get("rebuild_first_run") and plan.learn:
      plan = dataclasses.replace(plan, teaches=False)
    got = {"batch": run.batch, "arm": plan.name, "learn": plan.learn}
    got |= {"view": plan.view, "steps": plan.steps}
    want = {k: chunk[k] for k in DECISIONS}
    if got != want:
      return f"chunk {i}: the engine took {want}, the replay {got}"
    recorded = RecordedChunk(
      np.asarray(chunk["generated"]),
      float(chunk.get("run_s", 0.0)),
      int(chunk["ran"]),
      int(chunk.get("row_rounds", 0)),
    )
    run.run_chunk(plan, recorded)
  if run.active().any():
    return "rows remain in the replay after the engine's last chunk"
  return None

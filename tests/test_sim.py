"""The RL-step simulator: cost models, and the engine policy replayed on hand-made cases whose
times can be counted by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tlt_jax.parallel.memory import qwen25
from tlt_jax.sim import (
  ArmModel,
  EngineCost,
  EnginePolicy,
  PairedOneRow,
  RooflineCost,
  TableCost,
  arms_from_accept,
  chain_accept_length,
  device_roofline,
  lognormal_lengths,
  project_step,
  replay_rollout,
  replay_step,
  scaled_accept,
  scaled_arms,
  speedup_bound,
)
from tlt_jax.sim.costs import per_token_acceptance
from tlt_jax.sim.replay import ReplayRun, chain_acceptance


@dataclasses.dataclass(frozen=True)
class _Cost:
  """Unit cost per forward: flat (memory bound) or per row and token (compute bound)."""

  per_row: bool = False
  per_token: bool = False

  def seconds(self, batch, tokens, context):
    return float((batch if self.per_row else 1) * (tokens if self.per_token else 1))


def test_plain_rollout_lasts_its_longest_row_and_compaction_counts_rows():
  lengths = [1, 2, 3, 10]
  # Flat cost: the rollout is as long as its longest row, whatever the batch.
  assert replay_rollout(lengths, _Cost(), EnginePolicy(max_batch=4)).seconds == 10.0
  # Cost per row, buckets 1/2/4, compaction after every step: 4 + 4 + 2 + 7 x 1 rows.
  policy = EnginePolicy(max_batch=4, chunk_steps=1)
  pred = replay_rollout(lengths, _Cost(per_row=True), policy)
  assert pred.seconds == 17.0 and pred.seconds_by_bucket == {4: 8.0, 2: 2.0, 1: 7.0}
  no_compact = dataclasses.replace(policy, compact=False)
  assert replay_rollout(lengths, _Cost(per_row=True), no_compact).seconds == 40.0
  # Compaction waits for chunk boundaries: chunks of 4 steps keep batch 4 for the first.
  chunked = dataclasses.replace(policy, chunk_steps=4)
  assert replay_rollout(lengths, _Cost(per_row=True), chunked).seconds == 4 * 4 + 6


def test_speculative_rounds_divide_a_memory_bound_tail_by_the_accept_length():
  arm = ArmModel("chain8", nodes=9, accept_length=4.0, draft_steps=8, draft_cost=0.0)
  policy = EnginePolicy(max_batch=1, spec_threshold=1, spec_rounds=5)
  plain = replay_rollout([100], _Cost(), dataclasses.replace(policy, spec_threshold=0))
  spec = replay_rollout([100], _Cost(), policy, [arm])
  assert plain.seconds == 100.0 and spec.seconds == 25.0
  assert spec.chunks_by_arm == {"chain8": 5}
  # The drafter's forwards cost: 8 x 0.1 of a step per round.
  drafted = dataclasses.replace(arm, draft_cost=0.1)
  assert replay_rollout([100], _Cost(), policy, [drafted]).seconds == pytest.approx(25 * 1.8)


def test_the_replayed_bandit_keeps_plain_decode_where_verification_is_compute_bound():
  arm = ArmModel("chain8", nodes=9, accept_length=4.0, draft_steps=8, draft_cost=0.05)
  policy = EnginePolicy(max_batch=8, spec_threshold=8)
  pred = replay_rollout([20] * 8, _Cost(per_row=True, per_token=True), policy, [arm])
  assert set(pred.chunks_by_arm) == {"plain"}  # 4 tokens for 9 + drafting: a loss
  pred = replay_rollout([20] * 8, _Cost(), policy, [arm])
  assert set(pred.chunks_by_arm) == {"chain8"}


def test_stochastic_acceptance_matches_the_mean_and_the_slowest_row_decides():
  arm = ArmModel("chain8", nodes=9, accept_length=4.0, draft_steps=8)
  a = per_token_acceptance(arm.accept_length, arm.nodes)
  assert chain_accept_length(a, 8) == pytest.approx(4.0, rel=1e-6)
  policy = EnginePolicy(max_batch=64, spec_threshold=64, spec_rounds=4, compact=False)
  one = replay_rollout([4000], _Cost(), policy, [arm], stochastic=True, seed=1)
  assert one.seconds == pytest.approx(1000, rel=0.05)  # ~4 tokens a round on average
  # 64 rows spread apart; at flat cost the bucket lasts as long as its slowest row.
  many = replay_rollout([400] * 64, _Cost(), policy, [arm], stochastic=True, seed=1)
  mean = replay_rollout([400] * 64, _Cost(), policy, [arm])
  assert many.seconds > mean.seconds == 100.0


def test_table_cost_interpolates_in_log2_and_grows_past_the_grid():
  table = TableCost(
    batches=(1, 4, 16),
    tokens=(1, 5),
    ms=((10.0, 12.0, 30.0), (14.0, 20.0, 80.0)),
    context=128,
    ms_per_context_token=(0.001, 0.002, 0.01),
  )
  assert table.seconds(4, 1, 128) == pytest.approx(0.012)
  assert table.seconds(2, 1, 128) == pytest.approx(0.011)  # halfway in log2
  assert table.seconds(4, 5, 128) == pytest.approx(0.020)
  assert table.seconds(1, 1, 1128) == pytest.approx(0.011)  # + 1000 x 0.001 ms
  assert table.seconds(32, 1, 128) >= 2 * table.seconds(16, 1, 128) - 1e-12
  with pytest.raises(ValueError, match="ascending"):
    TableCost(batches=(4, 1), tokens=(1,), ms=((1.0, 1.0),), context=0)
  assert TableCost.from_dict(dataclasses.asdict(table)) == table


def test_a_real_sizes_decode_grid_becomes_a_table():
  """experiments/real_sizes.py's grid ("shape/context/batch/tokens" -> ms): the batches
  measured at every token count at the shortest context, the decode step's growth per
  context token where a longer context was measured too; other shapes left out."""
  grid = {
    "8b/1024/1/1": {"ms": 6.0},
    "8b/1024/1/5": {"ms": 7.0},
    "8b/1024/2/1": {"ms": 6.2},
    "8b/1024/2/5": {"ms": 7.5},
    "8b/1024/4/1": {"ms": 6.5},  # no 5-token forward at batch 4: left out
    "8b/4096/1/1": {"ms": 9.0},
    "1.5b/1024/1/1": {"ms": 2.0},
  }
  table = TableCost.from_decode_grid(grid, "8b")
  assert table.batches == (1, 2) and table.tokens == (1, 5) and table.context == 1024
  assert table.ms == ((6.0, 6.2), (7.0, 7.5))
  assert table.ms_per_context_token == pytest.approx((3.0 / 3072, 0.0))
  assert table.seconds(1, 1, 4096) == pytest.approx(0.009)
  assert TableCost.from_decode_grid(grid, "1.5b").ms_per_context_token == ()
  with pytest.raises(ValueError, match="no decode_grid cell of shape '70b'"):
    TableCost.from_decode_grid(grid, "70b")


def test_roofline_cost_is_flat_while_memory_bound_and_linear_once_compute_bound():
  h100_7b = RooflineCost(
    params=7.6e9,
    bytes_per_param=2,
    kv_bytes_per_token=2 * 28 * 4 * 128 * 2,
    peak_flops=989e12,
    bandwidth=3.35e12,
  )
  one, eight = h100_7b.seconds(1, 1, 1000), h100_7b.seconds(8, 1, 1000)
  assert 4e-3 < one < 8e-3 and eight / one < 1.1  # weights dominate at small batch
  big, bigger = h100_7b.seconds(4096, 1, 0), h100_7b.seconds(8192, 1, 0)
  assert bigger / big == pytest.approx(2.0, rel=0.01)


def test_step_modes_and_the_end_to_end_bound():
  arms = arms_from_accept({"chain4": 3.0, "group8": 2.0}, draft_cost=0.1)
  assert [a.draft_steps for a in arms] == [4, 0]
  policy = EnginePolicy(max_batch=4, spec_threshold=4, spec_rounds=2, chunk_steps=2)
  lengths = [30, 60, 90, 300]
  base = replay_step("baseline", lengths, _Cost(), policy, arms, update_s_per_token=0.1)
  assert base.rollout.chunks_by_arm.keys() == {"plain"} and base.update_s == pytest.approx(48.0)
  tlt = replay_step("tlt", lengths, _Cost(), policy, arms, update_s_per_token=0.1, drafter_s=1e4)
  assert tlt.rollout_s < base.rollout_s and tlt.drafter_s == pytest.approx(1e4 - tlt.rollout_s)
  assert speedup_bound(0.85, 3.0) == pytest.approx(2.307, abs=1e-3)
  with pytest.raises(ValueError, match="mode"):
    replay_step("fast", lengths, _Cost(), policy, update_s_per_token=0.0)
  with pytest.raises(ValueError, match="max_batch"):
    replay_rollout([1] * 5, _Cost(), policy)
  assert np.isfinite(base.step_s)


def test_step_records_read_a_runs_metrics_and_lengths():
  from tlt_jax.sim import step_record

  metrics = {
    "step": 3,
    "time/step": 10.0,
    "time/rollout": 6.0,
    "time/rollout_compile": 1.0,
    "time/train_compile": 0.5,
    "time/eval": 2.0,
    "time/update": 1.5,
    "spec/arm/chain4/accept_length": 3.2,
    "spec/arm/plain/chunks": 4,
    "time/rollout_part/prefill": 0.5,
    "time/rollout_part/chain4": 2.0,
    "drafter/rollout_charged_s": 1.0,
    "spec/bucket/1/chain4/accept_length": 2.5,
    "spec/bucket/1/chain4/row_rounds": 40,
    "spec/bucket/1/chain4/chunks": 3,
    "spec/bucket/8/chain4/accept_length": 3.4,
    "spec/bucket/8/chain4/row_rounds": 120,
    "spec/bucket/8/plain/chunks": 1,
  }
  rec = step_record(metrics, {"step": 3, "rollouts": [[5, 0, 7], [2]]})
  assert rec.step == 3
  assert rec.bucket_accept == {1: {"chain4": 2.5}, 8: {"chain4": 3.4}}
  assert rec.bucket_rounds == {1: {"chain4": 40.0}, 8: {"chain4": 120.0}}
  assert rec.rollouts == ((5, 1, 7), (2,)) and rec.tokens == 15
  # Compiles are left out of the step, the rollout and the update alike.
  assert rec.rollout_s == 5.0 and rec.step_s == 6.5 and rec.update_s == 1.0
  assert rec.accept == {"chain4": 3.2}
  # The rollout by part: the rest outside the drafter's scheduler is the host's.
  assert rec.parts == {"prefill": 0.5, "chain4": 2.0}
  assert rec.seconds_by_part() == {"prefill": 0.5, "chain4": 2.0, "host": 1.5}
  with pytest.raises(ValueError, match="step"):
    step_record(metrics, {"step": 4, "rollouts": [[1]]})


def test_validation_predicts_a_run_made_by_its_own_model_and_flags_one_that_is_not():
  """Steps whose measured times are what the cost model and engine policy imply compare
  at ratio 1; a run 30% slower than the model is outside the 15% tolerance; the baseline
  calibrates the update and the rest of a step for every mode."""
  from tlt_jax.sim import Calibration, StepRecord, compare

  policy = EnginePolicy(max_batch=4, chunk_steps=2, spec_threshold=4, spec_rounds=2)
  cost = _Cost(per_row=True)
  lengths = [(3, 9, 4, 12), (6, 2, 2, 8)]
  plain = [replay_rollout(x, cost, dataclasses.replace(policy, spec_threshold=0)) for x in lengths]
  base = [
    StepRecord((x,), p.seconds, p.seconds + 0.01 * sum(x) + 2.0, 0.01 * sum(x), {})
    for x, p in zip(lengths, plain)
  ]
  cal = Calibration.from_baseline(base)
  assert cal.update_s_per_token == pytest.approx(0.01) and cal.other_s == pytest.approx(2.0)
  got = compare(base, cost, policy, cal, speculative=False, stochastic=False)
  assert got["rollout_ratio"] == pytest.approx(1.0) and got["step_ratio"] == pytest.approx(1.0)
  assert got["within_tolerance"] and got["steps"] == 2
  arms = arms_from_accept({"chain4": 3.0}, 0.0)
  spec = [replay_rollout(x, cost, policy, arms) for x in lengths]
  sd = [
    StepRecord((x,), p.seconds, p.seconds + 0.01 * sum(x) + 2.0, 0.01 * sum(x), {"chain4": 3.0})
    for x, p in zip(lengths, spec)
  ]
  got = compare(sd, cost, policy, cal, speculative=True, draft_cost=0.0, stochastic=False)
  assert got["rollout_ratio"] == pytest.approx(1.0) and got["within_tolerance"]
  assert got["predicted_rollout_s"] < np.mean([p.seconds for p in plain])
  slow = [dataclasses.replace(r, rollout_s=1.3 * r.rollout_s, step_s=1.3 * r.step_s) for r in sd]
  got = compare(slow, cost, policy, cal, speculative=True, draft_cost=0.0, stochastic=False)
  assert got["rollout_ratio"] == pytest.approx(1 / 1.3) and not got["within_tolerance"]
  assert got["rollout_ratios"] == pytest.approx([1 / 1.3, 1 / 1.3])
  one_slow = [slow[0], sd[1]]
  got = compare(one_slow, cost, policy, cal, speculative=True, draft_cost=0.0, stochastic=False)
  assert got["rollout_ratios"] == pytest.approx([1 / 1.3, 1.0])
  assert got["parts"] == []  # runs that did not record their parts
  # Priced with each step's own speed (the first step's calls 1.3x slower), both compare at 1.
  kw = dict(speculative=True, draft_cost=0.0, stochastic=False)
  got = compare(one_slow, cost, policy, cal, **kw, step_costs=[_Scaled(cost, 1.3), cost])
  assert got["rollout_ratios"] == pytest.approx([1.0, 1.0])
  with pytest.raises(ValueError, match="1 step costs for 2 steps"):
    compare(one_slow, cost, policy, cal, **kw, step_costs=[cost])


@dataclasses.dataclass(frozen=True)
class _Scaled:
  cost: _Cost
  factor: float

  def seconds(self, batch, tokens, context):
    return self.factor * self.cost.seconds(batch, tokens, context)


def test_a_run_is_priced_by_its_own_calls_pooled_and_per_step():
  """`run_costs` on a run's rollout_timelines.jsonl rows: the medians of the compared steps'
  calls (a step's calls 1x, another's 3x: 2x), and each step's drift, its calls' seconds
  over what the pooled cells price them at; compiling calls are left out, steps not
  compared ignored, a compared step without timelines refused. `drift` counts only the
  calls a cost can price; `scaled` scales the device calls, not the host time."""
  from tlt_jax.sim import run_costs

  def calls(x):
    return [
      {"t": 0.0, "dt": 0.5 * x, "phase": "prefill", "batch": 8, "prompts": 2, "view": 64},
      {"t": 1.0, "dt": 0.32 * x, "phase": "decode", "batch": 8, "view": 128, "steps": 16},
      {"t": 1.5, "dt": 0.1, "phase": "harvest", "batch": 8, "view": 0},
      {"t": 2.0, "dt": 0.4 * x, "phase": "spec", "strategy": "chain4", "batch": 4, "view": 256,
       "rounds": 8},
      {"t": 3.0, "dt": 50.0, "phase": "decode", "batch": 8, "view": 128, "steps": 16,
       "compile_s": 49.0},
    ]  # fmt: skip

  rows = [{"step": s, "rollouts": [{"wall": 60.0, "timeline": calls(x)}]}
          for s, x in ((0, 10.0), (1, 1.0), (2, 3.0))]  # fmt: skip
  pooled, drift = run_costs(rows, {1, 2})
  assert pooled.cells["plain"] == ((8, 128, pytest.approx(0.04)),)
  assert pooled.cells["chain4"] == ((4, 256, pytest.approx(0.1)),)
  assert pooled.cells["prefill"] == ((2, 64, pytest.approx(1.0)),)
  # Step 1: 0.5 + 0.32 + 0.4 = 1.22 s where the pooled cells price 2.44 s.
  assert drift == {1: pytest.approx(0.5), 2: pytest.approx(1.5)}
  faster = pooled.scaled(0.5)
  assert faster.seconds(8, 1, 128) == pytest.approx(0.02)
  assert faster.round_seconds("chain4", 4, 256) == pytest.approx(0.05)
  assert faster.prefill_seconds(2, 64) == pytest.approx(0.5) and faster.gap_s == pooled.gap_s
  with pytest.raises(ValueError, match=r"steps \[3\]"):
    run_costs(rows, {1, 3})
  # A run that never decoded plain takes its plain cells from a base cost, scaled by the
  # run's drift against the base where both priced a call; so are cells of fewer than
  # `min_calls` calls (here each of the run's cells has two, one a step).
  speculated = [{**r, "rollouts": [{"wall": 9.0, "timeline": [calls(x)[0], calls(x)[3]]}]}
                for r, x in zip(rows, (10.0, 1.0, 3.0))]  # fmt: skip
  with pytest.raises(ValueError, match="no decode chunk"):
    run_costs(speculated, {1, 2})
  base = EngineCost(
    {"plain": ((8, 128, 0.01), (8, 256, 0.02)), "chain4": ((4, 256, 0.04),),
     "prefill": ((2, 64, 0.5),)}
  )  # fmt: skip
  d = (0.5 + 1.5 + 0.4 + 1.2) / (2 * 0.5 + 2 * 8 * 0.04)  # the run's calls over base's price
  pooled, drift = run_costs(speculated, {1, 2}, base)
  assert pooled.cells["plain"] == (
    (8, 128, pytest.approx(0.01 * d)),
    (8, 256, pytest.approx(0.02 * d)),
  )
  assert pooled.cells["chain4"] == ((4, 256, pytest.approx(0.04 * d)),)
  assert pooled.cells["prefill"] == ((2, 64, pytest.approx(0.5 * d)),)
  timed = [(c["timeline"], c["wall"]) for r in speculated[1:] for c in r["rollouts"]]
  own = EngineCost.from_timelines(timed, base, min_calls=2)  # the run's medians stand
  assert own.cells["chain4"] == ((4, 256, pytest.approx(0.1)),)
  assert own.cells["prefill"] == ((2, 64, pytest.approx(1.0)),)
  assert own.cells["plain"] == pooled.cells["plain"]
  assert sorted(drift) == [1, 2] and drift[2] == pytest.approx(3 * drift[1])
  # A cost of decode steps alone prices only those: 0.32 s over 16 x 0.01.
  probe = EngineCost({"plain": ((8, 128, 0.01),)})
  assert probe.drift([(calls(1.0), 60.0)]) == pytest.approx(2.0)
  assert probe.drift([([], None)]) == 1.0


def test_bucket_accept_lengths_pool_each_bucket_over_the_run_and_scale_by_the_step():
  """Per step and bucket: the arm's accept length pooled over the run's steps in that
  bucket (weighted by row-rounds), times the step's accept length over what the pooled curve
  expects where the step ran the arm; a step that did not run an arm gets the pooled curve;
  the row-rounds are the step's, else the run's."""
  from tlt_jax.sim import StepRecord, bucket_accept_lengths

  def record(accept, bucket_accept, bucket_rounds):
    return StepRecord(((4,),), 1.0, 2.0, 0.5, accept, bucket_accept=bucket_accept,
                      bucket_rounds=bucket_rounds)  # fmt: skip

  steps = [
    # chain4 at 1 row: 2 over 10 row-rounds; at 8 rows 4 over 30: a step mean of 3.5.
    record({"chain4": 3.5}, {1: {"chain4": 2.0}, 8: {"chain4": 4.0}},
           {1: {"chain4": 10}, 8: {"chain4": 30}}),
    # Only at 1 row: 3 over 30 row-rounds; chain8 only here.
    record({"chain4": 3.0, "chain8": 5.0}, {1: {"chain4": 3.0, "chain8": 5.0}},
           {1: {"chain4": 30, "chain8": 8}}),
    record({}, {}, {}),  # no speculative round
  ]  # fmt: skip
  got = bucket_accept_lengths(steps)
  pooled1, pooled8 = (2.0 * 10 + 3.0 * 30) / 40, 4.0
  # Step 1 ran chain4 10 + 30 row-rounds where the curve expects (2.75 x 10 + 4 x 30) / 40.
  f1 = 3.5 / ((pooled1 * 10 + pooled8 * 30) / 40)
  assert got[0][1]["chain4"] == pytest.approx((pooled1 * f1, 10.0))
  assert got[0][8]["chain4"] == pytest.approx((pooled8 * f1, 30.0))
  assert got[1][1]["chain4"] == pytest.approx((3.0, 30.0))  # 3.0 over the curve's 2.75
  assert got[1][8]["chain4"] == pytest.approx((pooled8 * 3.0 / pooled1, 30.0))
  # chain8 never ran at 8 rows: its run-wide mean stands there.
  assert got[0][8]["chain8"] == pytest.approx((5.0, 0.0))
  assert got[2][1]["chain4"] == pytest.approx((pooled1, 40.0))
  assert got[2][1]["chain8"] == pytest.approx((5.0, 8.0))
  assert bucket_accept_lengths([record({"chain4": 3.0}, {}, {})]) == [{}]


def test_a_replay_prices_each_bucket_at_its_own_accept_length():
  """Bucket arms replace the arms in their bucket alone: a one-row tail that accepts one
  token a round takes a round per token, the same rollout replayed with the step's mean
  accept length is faster; bucket arms are taken as given (no fitted chain curve); arms
  that differ from the rollout's are refused."""
  policy = EnginePolicy(max_batch=4, chunk_steps=2, spec_threshold=4, spec_rounds=2)
  arms = arms_from_accept({"chain4": 3.0, "chain8": 5.0}, 0.0)
  tail = arms_from_accept({"chain4": 1.5, "chain8": 1.2}, 0.0)
  lengths = [3, 3, 3, 31]
  mean = replay_rollout(lengths, _Cost(), policy, arms)
  by_bucket = replay_rollout(lengths, _Cost(), policy, arms, bucket_arms={1: tail})
  # Four rows: one chunk of two chain8 rounds (5 tokens each) in both; the long row's 21
  # tokens left then take 5 chain8 rounds, or 14 of chain4 (the better arm at 1.5 and 1.2).
  assert mean.seconds_by_bucket == {4: 2.0, 1: 5.0}
  assert by_bucket.seconds_by_bucket == {4: 2.0, 1: 14.0}
  assert by_bucket.chunks_by_arm == {"chain8": 1, "chain4": 7}
  # Stochastic: the default arms follow the chains' one curve, bucket arms their own.
  skewed = arms_from_accept({"chain4": 4.5, "chain8": 4.5}, 0.0)
  run = ReplayRun(lengths, _Cost(), policy, skewed, stochastic=True, bucket_arms={1: skewed})
  assert run.batch == 4 and run.by_name["chain4"].accept_length != pytest.approx(4.5)
  run.batch = 1
  assert [run.by_name[k].accept_length for k in ("chain4", "chain8")] == [4.5, 4.5]
  assert run.accept_p["chain8"] < run.accept_p["chain4"]
  with pytest.raises(ValueError, match="bucket 1's arms"):
    ReplayRun(lengths, _Cost(), policy, arms, bucket_arms={1: tail[:1]})


def test_validation_uses_the_runs_accept_lengths_by_bucket():
  """A run made by the model with each bucket's own accept length compares at ratio 1 when
  the records carry their figures by bucket (`by_bucket`), and not when the replay gives
  every bucket the step's mean."""
  from tlt_jax.sim import Calibration, StepRecord, compare

  policy = EnginePolicy(max_batch=4, chunk_steps=2, spec_threshold=4, spec_rounds=2)
  cost, lengths = _Cost(per_row=True), (3, 9, 4, 31)
  # The step's mean over its rounds: 10 row-rounds at 1 row (1.5), 24 at 4 (3.0), 4 at 2.
  rounds = {1: {"chain4": 10.0}, 2: {"chain4": 4.0}, 4: {"chain4": 24.0}}
  at = {1: {"chain4": 1.5}, 2: {"chain4": 2.0}, 4: {"chain4": 3.0}}
  mean = sum(at[b]["chain4"] * n["chain4"] for b, n in rounds.items()) / 38
  made = replay_rollout(
    lengths, cost, policy, arms_from_accept({"chain4": mean}, 0.0),
    bucket_arms={b: arms_from_accept(a, 0.0) for b, a in at.items()},
  )  # fmt: skip
  record = StepRecord(
    (lengths,), made.seconds, made.seconds, 0.0, {"chain4": mean},
    bucket_accept=at, bucket_rounds=rounds,
  )  # fmt: skip
  cal = Calibration(0.0, 0.0)
  kw = dict(speculative=True, draft_cost=0.0, stochastic=False)
  assert compare([record], cost, policy, cal, **kw)["rollout_ratio"] == pytest.approx(1.0)
  flat = compare([record], cost, policy, cal, by_bucket=False, **kw)["rollout_ratio"]
  assert flat < 0.95


def test_validation_compares_a_runs_rollout_part_by_part():
  """Records that carry their rollout's parts: a run made by the model itself matches it
  part by part, the rest of its rollout the replay's host time; one whose chain4 chunks ran
  1.5x slower differs in that part alone."""
  from tlt_jax.sim import Calibration, StepRecord, compare

  policy = EnginePolicy(
    max_batch=2, chunk_steps=2, views=(4, 8, 16), prompt_buckets=(2, 4), samples=2, slots=16
  )
  policy = dataclasses.replace(policy, spec_threshold=2, spec_rounds=8)
  cost, arms = (
    _engine_cost(gap_s=0.1, compact_s=0.2, finish_s=0.3),
    arms_from_accept({"chain4": 3.0}, 0.0),
  )
  lengths, prompts = ((10,), (13,)), ((2,), (3,))
  preds = [replay_rollout(x, cost, policy, arms, prompt_lens=p) for x, p in zip(lengths, prompts)]
  records = [
    StepRecord(
      (x,), p.seconds + 1.0, p.seconds + 3.0, 0.5, {"chain4": 3.0}, prompts=(pl,), drafter_s=1.0,
      parts={k: v for k, v in p.seconds_by_part.items() if k != "host"},
    )
    for x, pl, p in zip(lengths, prompts, preds)
  ]  # fmt: skip
  cal = Calibration(0.0, 0.0)
  got = compare(records, cost, policy, cal, speculative=True, draft_cost=0.0, stochastic=False)
  assert got["rollout_ratio"] == pytest.approx(1.0) and len(got["parts"]) == 2
  # A run resumed across the change that added the parts: each entry keeps its step.
  later = [dataclasses.replace(records[0], parts={}), dataclasses.replace(records[1], step=5)]
  assert [p["step"] for p in compare(later, cost, policy, cal, speculative=False)["parts"]] == [5]
  for step, pred in zip(got["parts"], preds, strict=True):
    assert step["measured"] == pytest.approx(pred.seconds_by_part)
    assert step["predicted"] == pytest.approx(pred.seconds_by_part)
  slow = []
  for r in records:
    chain4 = r.parts["chain4"]
    parts = {**r.parts, "chain4": 1.5 * chain4}
    slow.append(dataclasses.replace(r, rollout_s=r.rollout_s + 0.5 * chain4, parts=parts))
  got = compare(slow, cost, policy, cal, speculative=True, draft_cost=0.0, stochastic=False)
  assert len(got["parts"]) == 2
  for step in got["parts"]:
    measured, predicted = step["measured"], step["predicted"]
    assert measured["chain4"] == pytest.approx(1.5 * predicted["chain4"])
    assert {k: v for k, v in measured.items() if k != "chain4"} == pytest.approx(
      {k: v for k, v in predicted.items() if k != "chain4"}
    )


def _engine_cost(**host) -> EngineCost:
  """Plain steps of 1 / 2 / 4 s at cache views 4 / 8 / 16 (batch 1), chain4 rounds of 1.5 s,
  a prefill of 0.5 s a prompt bucket, a drafter-cache rebuild of 0.25 s."""
  cells = {
    "plain": ((1, 4, 1.0), (1, 8, 2.0), (1, 16, 4.0)),
    "chain4": ((1, 4, 1.5), (1, 16, 1.5)),
    "prefill": ((1, 2, 0.5), (2, 2, 1.0)),
    "drafter_prefill": ((1, 16, 0.25),),
  }
  return EngineCost(cells, **host)


def test_engine_cost_reads_the_engines_timelines():
  """Per-step and per-round medians by (batch, view), compiles left out, and the host time
  between calls, at a compaction and after the last call, from a hand-written timeline."""
  timeline = [
    {"t": 0.0, "dt": 0.5, "phase": "prefill", "batch": 8, "prompts": 2, "view": 64},
    {
      "t": 0.6,
      "dt": 9.0,
      "phase": "decode",
      "batch": 8,
      "view": 128,
      "steps": 16,
      "compile_s": 8.0,
    },
    {"t": 9.7, "dt": 0.32, "phase": "decode", "batch": 8, "view": 128, "steps": 16},
    {"t": 10.1, "dt": 0.16, "phase": "decode", "batch": 8, "view": 128, "steps": 8},
    # Compaction to 4 rows (0.3 s of host time, its harvest included), a drafter-cache
    # rebuild, a chain4 chunk.
    {"t": 10.3, "dt": 0.2, "phase": "harvest", "batch": 8, "view": 0, "rows": 4},
    {"t": 10.56, "dt": 0.05, "phase": "drafter_prefill", "batch": 4, "view": 256},
    {
      "t": 10.61,
      "dt": 0.4,
      "phase": "spec",
      "strategy": "chain4",
      "batch": 4,
      "view": 256,
      "rounds": 8,
    },
    {"t": 11.11, "dt": 0.01, "phase": "drafter_hook", "batch": 4, "view": 0},
    {
      "t": 11.13,
      "dt": 0.2,
      "phase": "spec",
      "strategy": "chain4",
      "batch": 4,
      "view": 256,
      "rounds": 4,
    },
  ]
  # A second rollout, compiled already: its end is timed (wall - last call's end).
  second = [dict(e, t=e["t"], compile_s=0.0) for e in timeline[2:4]]
  end = second[-1]["t"] + second[-1]["dt"]
  second.append({"t": end + 0.01, "dt": 0.05, "phase": "harvest", "batch": 8, "view": 0})
  cost = EngineCost.from_timelines([(timeline, 11.5), (second, 10.35)])
  assert cost.cells["plain"] == ((8, 128, pytest.approx(0.02)),)
  assert cost.cells["chain4"] == ((4, 256, pytest.approx(0.05)),)
  assert cost.cells["prefill"] == ((2, 64, 0.5),)
  assert cost.cells["drafter_prefill"] == ((4, 256, 0.05),)
  # Gaps 0.08 (between the decode chunks, twice) and 0.11 (the drafter hook's 0.01 left
  # out): median 0.08; the
  # compaction 0.3, its harvest inside; the first rollout compiled, so only the second's end
  # counts (its last harvest inside).
  assert cost.gap_s == pytest.approx(0.08) and cost.compact_s == pytest.approx(0.3)
  assert cost.finish_s == pytest.approx(0.09)
  assert EngineCost.from_dict(cost.to_dict()) == cost
  # Between cells: linear in log2 of the view and of the batch.
  grid = EngineCost({"plain": ((1, 128, 1.0), (1, 512, 3.0), (4, 128, 2.0), (4, 512, 4.0))})
  assert grid.seconds(1, 1, 256) == pytest.approx(2.0)
  assert grid.seconds(2, 1, 256) == pytest.approx(2.5)
  with pytest.raises(ValueError, match="rounds"):
    grid.seconds(1, 5, 256)
  with pytest.raises(ValueError, match="chain8"):
    grid.round_seconds("chain8", 1, 256)
  with pytest.raises(ValueError, match="plain"):
    EngineCost({"chain4": ((1, 4, 1.0),)})


def test_engine_cost_replay_charges_views_prefill_rebuilds_and_host_time():
  """A row of 10 tokens after a 2-token prompt, batch 1, chunks of 2 steps: the prefill
  emits token 1; the last bucket runs plain decode to the end of each cache view: 2 steps
  at view 4 (lengths 3 -> 5), 4 at view 8 (-> 9), the last 3 at view 16."""
  policy = EnginePolicy(
    max_batch=2, chunk_steps=2, views=(4, 8, 16), prompt_buckets=(2, 4), samples=2, slots=16
  )
  cost = _engine_cost(gap_s=0.1, compact_s=0.2, finish_s=0.3)
  pred = replay_rollout([10], cost, policy, prompt_lens=[2])
  assert pred.seconds == pytest.approx(0.5 + 3 * 0.1 + 2 * 1 + 4 * 2 + 3 * 4 + 0.3)
  # Two rows of one prompt, batch 2 (not the last bucket): chunks of 2 steps, then a
  # compaction when the short row is done.
  pred = replay_rollout([3, 7], cost, policy, prompt_lens=[2, 2])
  # Prefill (1 prompt); batch 2: 2 steps at view 4, each 2 x the batch-1 step (past the
  # largest measured batch, cost grows in proportion), lengths 3 -> 5: the short row ends;
  # compaction; batch 1 runs to the end of view 8 (4 steps: the row's last 4 tokens).
  assert pred.seconds == pytest.approx(0.5 + 0.1 + 2 * 2 + 0.2 + 4 * 2 + 0.3)
  # Speculative chunks of chain4 rebuild the drafter's cache once: at 3 accepted tokens a
  # round (deterministic), 9 tokens after the prefill take 3 rounds at 1.5 s.
  spec = dataclasses.replace(policy, spec_threshold=2, spec_rounds=8)
  arm = arms_from_accept({"chain4": 3.0}, 0.0)
  pred = replay_rollout([10], cost, spec, arm, prompt_lens=[2])
  assert pred.chunks_by_arm == {"chain4": 1}
  assert pred.seconds == pytest.approx(0.5 + 0.1 + 0.25 + 3 * 1.5 + 0.3)
  # Every second charged to a part, named as a run records them.
  assert pred.seconds_by_part == pytest.approx(
    {"prefill": 0.5, "host": 0.1 + 0.3, "drafter_prefill": 0.25, "chain4": 3 * 1.5}
  )


def test_a_measured_arm_mix_replaces_the_converged_bandit():
  """Given a run's chunks per arm, the replay runs each eligible chunk on the arm furthest
  below its share so far: with a 3:1 mix of chain4 and plain the plain chunks are the 3rd
  and the 7th, where the converged bandit runs chain4 in all of them."""
  arm = arms_from_accept({"chain4": 2.0}, 0.0)
  policy = EnginePolicy(max_batch=1, chunk_steps=4, spec_threshold=1, spec_rounds=2)
  best = replay_rollout([32], _Cost(), policy, arm)
  assert best.chunks_by_arm == {"chain4": 8}
  mixed = replay_rollout([28], _Cost(), policy, arm, arm_mix={"chain4": 3, "plain": 1})
  # 7 chunks of 4 tokens each (2 rounds of 2, or 4 steps): 5 of chain4, 2 plain.
  assert mixed.chunks_by_arm == {"chain4": 5, "plain": 2}
  assert mixed.seconds == 5 * 2 + 2 * 4
  with pytest.raises(ValueError, match="none of the arms"):
    replay_rollout([8], _Cost(), policy, arm, arm_mix={"tree5x4x16": 2})


def test_chain_arms_draw_from_one_acceptance_fitted_to_their_rounds():
  """A shallower chain's draft is a prefix of a deeper one's: the replay's chains share one
  per-token acceptance, fitted to their accept lengths weighted by the rounds that measured
  each, and draws at it average to the accept length it implies."""
  lengths = {"chain2": chain_accept_length(0.8, 2), "chain8": chain_accept_length(0.8, 8)}
  assert chain_acceptance(arms_from_accept(lengths, 0.0)) == pytest.approx(0.8, abs=1e-3)
  # chain4 measured on 10 row-rounds at an outlying accept length barely moves the fit
  # that chain8's 10,000 rounds make; with equal weights it pulls it down.
  counts = {"chain4": 10, "chain8": 10_000}
  noisy = arms_from_accept({"chain4": 2.0, "chain8": chain_accept_length(0.9, 8)}, 0.0, counts)
  assert chain_acceptance(noisy) == pytest.approx(0.9, abs=2e-3)
  unweighted = arms_from_accept({"chain4": 2.0, "chain8": chain_accept_length(0.9, 8)}, 0.0)
  assert chain_acceptance(unweighted) < 0.88
  assert chain_acceptance(arms_from_accept({"group8": 2.0}, 0.0)) is None
  # Replayed rounds at flat cost: tokens / the shared curve's chain8 accept length.
  policy = EnginePolicy(max_batch=1, spec_threshold=1, spec_rounds=4)
  pred = replay_rollout([6000], _Cost(), policy, noisy, arm_mix={"chain8": 1}, stochastic=True)
  expected = 6000 / chain_accept_length(0.9, 8)
  assert pred.seconds == pytest.approx(expected, rel=0.05) and set(pred.chunks_by_arm) == {"chain8"}


def _bandit(arms, **engine):
  from tlt_jax.sim import engine_bandit

  return engine_bandit(
    {"spec_threshold": 8, "spec_strategies": ["chain2", "chain4"], **engine}, arms
  )


def test_a_replayed_bandit_learns_the_arms_and_pays_for_its_exploration():
  """The engine's bandit, replayed over a run's rollouts in order, learns from the replayed
  chunks: where verification is free (flat cost) it settles on the deeper chain, where it
  costs per token (compute bound) on plain decode, and either way the rollouts take longer
  than the converged bandit's (its warm-up and exploration)."""
  arms = arms_from_accept({"chain2": 2.6, "chain4": 4.0}, 0.05)
  policy = EnginePolicy(max_batch=4, spec_threshold=4, spec_rounds=4, chunk_steps=8)
  rollouts = [[300, 80, 120, 200]] * 12
  for cost, winner in ((_Cost(), "chain4"), (_Cost(per_row=True, per_token=True), "plain")):
    bandit, chunks, replayed, converged = _bandit(("chain2", "chain4")), {}, 0.0, 0.0
    for i, lengths in enumerate(rollouts):
      got = replay_rollout(lengths, cost, policy, arms, bandit=bandit, stochastic=True, seed=i)
      replayed += got.seconds
      converged += replay_rollout(lengths, cost, policy, arms, stochastic=True, seed=i).seconds
      for arm, n in got.chunks_by_arm.items():
        chunks[arm] = chunks.get(arm, 0) + n
    assert max(chunks, key=chunks.get) == winner and len(chunks) == 3, chunks
    assert replayed > converged
    assert bandit.best(4) == winner and set(bandit.buckets) >= {1, 2, 4}
  # The plain chunks teach it too.
  bandit = _bandit(("chain2", "chain4"))
  replay_rollout([300, 80, 120, 200], _Cost(), policy, arms, bandit=bandit, stochastic=True)
  assert bandit.summary()[4]["plain"]["pulls"] >= 1
  # Its settings are the engine's: the exploration weight of the config.
  tuned = _bandit(("chain2", "chain4"), bandit_exploration=0.5)
  assert tuned.settings.exploration == 0.5
  assert _bandit(("chain4",)).arms == ("plain", "chain4")  # arms without a model left out
  with pytest.raises(ValueError, match="none of the engine's strategies"):
    _bandit(("tree5x4x16",))
  with pytest.raises(ValueError, match="stochastic"):
    replay_rollout([8], _Cost(), policy, arms, bandit=_bandit(("chain2", "chain4")))
  with pytest.raises(ValueError, match="not both"):
    replay_rollout(
      [8],
      _Cost(),
      policy,
      arms,
      bandit=_bandit(("chain4",)),
      arm_mix={"chain4": 1},
      stochastic=True,
    )
  with pytest.raises(ValueError, match="no ArmModel"):
    replay_rollout([8], _Cost(), policy, arms[:1], bandit=_bandit(("chain4",)), stochastic=True)


def test_projections_draw_dapo_like_lengths_and_price_the_three_modes_on_a_device():
  """`sim.project`: log-normal lengths through the median and p90, accept lengths scaled
  and capped by a chain's depth, a device's roofline from real_sizes' results, and the
  three modes on it (a higher accept length, a faster tlt; none above Amdahl's bound)."""
  draws = np.array(lognormal_lengths(470, 1000, 32768, 4000, 1, seed=0)[0])
  assert abs(np.median(draws) / 470 - 1) < 0.05 and abs(np.quantile(draws, 0.9) / 1000 - 1) < 0.08
  assert lognormal_lengths(470, 1000, 600, 64, 2, seed=1) == lognormal_lengths(
    470, 1000, 600, 64, 2, seed=1
  )
  assert max(max(t) for t in lognormal_lengths(470, 1000, 600, 64, 2, seed=1)) == 600
  assert scaled_accept({"chain4": 3.0, "chain8": 7.0}, 2.0) == {"chain4": 5.0, "chain8": 9.0}
  cfg = qwen25("7B")
  assert device_roofline({"bandwidth": {"gb_per_s": 2870.0, "spec": None}}, cfg, 5e-4) == (
    None,
    None,
  )
  measured = {"bandwidth": {"gb_per_s": 2870.0, "spec": [4.8, 989.0]}}
  cost, peak = device_roofline(measured, cfg, 5e-4)
  assert peak == 989e12 and cost.bandwidth_efficiency == pytest.approx(2870 / 4800)
  runs = [
    project_step(cost, cfg, peak, {"chain4": 3.0}, {"chain4": a}, rows=8, draft=0.1, steps=2)
    for a in (3.0, 4.5)
  ]
  for pred in runs:
    assert set(pred) == {"baseline", "sd", "tlt"}
    assert all(pred[m]["step_speedup"] <= pred[m]["bound"] + 1e-9 for m in ("sd", "tlt"))
  assert runs[0]["tlt"]["step_speedup"] == pytest.approx(runs[0]["sd"]["step_speedup"], rel=0.05)
  assert runs[1]["tlt"]["step_speedup"] > runs[0]["tlt"]["step_speedup"] > 1.0
  # A one-row tail that accepts fewer draft tokens than the full buckets: the baseline is
  # unchanged, tlt slower.
  tail = project_step(
    cost, cfg, peak, {"chain4": 3.0}, {"chain4": 4.5}, rows=8, draft=0.1, steps=2,
    tail_accept=0.6,
  )  # fmt: skip
  assert tail["baseline"]["step_s"] == pytest.approx(runs[1]["baseline"]["step_s"])
  assert tail["tlt"]["step_speedup"] < runs[1]["tlt"]["step_speedup"]
  arms = scaled_arms(arms_from_accept({"chain4": 3.0, "chain8": 8.5}, 0.0), 2.0)
  assert [a.accept_length for a in arms] == [5.0, 9.0]


def test_a_paired_one_row_step_costs_a_two_token_forward():
  """The engine's one-row step on a GPU (a two-token forward, `EngineConfig.one_row_step`):
  a one-row decode step costs the table's one-row, two-token forward, which here (as on the
  H200) is cheaper than its one-token step; every other forward is the table's, and a
  round's verify is unchanged while its drafter steps follow the cheaper step."""
  table = TableCost(
    batches=(1, 2), tokens=(1, 2, 5), ms=((6.0, 5.0), (5.0, 6.5), (5.5, 7.5)), context=1024
  )
  paired = PairedOneRow(table)
  assert paired.seconds(1, 1, 1024) == table.seconds(1, 2, 1024) == 0.005
  for batch, tokens in ((2, 1), (1, 2), (1, 5), (2, 5)):
    assert paired.seconds(batch, tokens, 1024) == table.seconds(batch, tokens, 1024)
  chain4 = ArmModel("chain4", 5, 3.0, 4, draft_cost=0.1)
  verify = table.seconds(1, 5, 1024)
  assert chain4.round_seconds(paired, 1, 1024) == pytest.approx(4 * 0.1 * 0.005 + verify)

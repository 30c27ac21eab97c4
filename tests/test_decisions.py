"""The rollout's decisions are written once (`rollout.decisions`): the engine's and the
simulator's replay take the same ones. A real engine rollout is recorded chunk by chunk and
its chunks' results fed to the simulator's `ReplayRun`, which must choose every bucket,
arm, view and step count as the engine did and teach its bandit the same lessons."""

import dataclasses
import json

import numpy as np
import pytest
from flax import nnx
from tiny_models import TINY_UNTIED

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.transformer import init_model
from tlt_jax.rollout import RolloutEngine, decisions
from tlt_jax.rollout.bandit import PLAIN, BanditSettings, StrategyBandit
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.rollout.run import RolloutRun
from tlt_jax.sim import ArmModel, EnginePolicy, decision_mismatch

ENGINE = EngineConfig(
  max_prompt_len=8,
  max_new_tokens=40,
  max_batch=16,
  chunk_steps=4,
  min_batch_bucket=2,
  min_cache_bucket=16,
  min_prompt_bucket=8,
  spec_threshold=8,
  spec_strategies=("chain2", "chain4"),
  spec_adaptive=True,
  spec_rounds=2,
  # The replay prices compiled programs: the engine waits for each compile rather than run
  # another arm meanwhile, so both take every decision alike.
  background_compiles=False,
)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15, 16, 17]]
LIMITS = [5, 37, 12, 20]  # per-prompt token budgets: a long tail
SAMPLES = 4


def _generated(run: RolloutRun) -> np.ndarray:
  """Tokens generated so far per request row (harvested rows included)."""
  out = np.zeros(run.n_rows, np.int64)
  for n, row in run.outputs.items():
    out[n] = row["length"] - row["prompt_len"]
  for i, seq in enumerate(run.row_seq):
    if seq >= 0:
      out[seq - run.seq_id_offset] = run.length[i] - run.prompt_len[i]
  return out


def _recorded_rollouts(monkeypatch, cfg, keys, beliefs=()):
  """Sampled rollouts with one adaptive engine (its bandit learning across them, first told
  `beliefs`: (bucket, arm, reward) lessons), each rollout's chunks recorded as they ran,
  and a copy of the bandit from before the first."""
  tg, tp = nnx.split(init_model(TINY_UNTIED, seed=3))
  dg, dp = nnx.split(init_drafter(TINY_UNTIED, seed=4))
  sampling = SamplingConfig(temperature=1.0)
  engine = RolloutEngine(tg, TINY_UNTIED, cfg, sampling, ExecutablePool(), drafter_graphdef=dg)
  for bucket, arm, reward in beliefs:
    engine.bandit.update(bucket, arm, reward)
  before = None
  if engine.bandit is not None:
    before = StrategyBandit.from_state_dict(json.loads(json.dumps(engine.bandit.state_dict())))
  chunks, run_chunk = [], RolloutRun.run_chunk

  def recording(run, arm, learn):
    batch = run.state.batch
    run_chunk(run, arm, learn)
    entry = run.timeline[-1]
    chunks[-1].append(
      {
        "batch": batch,
        "arm": arm,
        "learn": learn,
        "view": entry["view"],
        "steps": entry["requested"],
        "ran": entry["rounds"] if entry["phase"] == "spec" else entry["steps"],
        "run_s": entry.get("run_s", 0.0),
        "row_rounds": entry.get("row_rounds", 0),
        "first_run": entry.get("first_run", False),
        "rebuild_first_run": entry.get("rebuild_first_run", False),
        "generated": _generated(run),
      }
    )

  monkeypatch.setattr(RolloutRun, "run_chunk", recording)
  results = []
  for key in keys:
    chunks.append([])
    results.append(
      engine.generate(tp, PROMPTS, SAMPLES, key=key, max_new_tokens=LIMITS, drafter_params=dp)
    )
  return engine, before, chunks, results


def _policy(cfg: EngineConfig) -> EnginePolicy:
  return EnginePolicy.from_engine(
    {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, samples=SAMPLES
  )


def _mismatch(rollouts, results, policy, bandit):
  """The first decision of `rollouts` (recorded chunks, in order) the replay takes
  differently, one replay per rollout with `bandit` learning across them."""
  rows = len(PROMPTS) * SAMPLES
  arms = [
    ArmModel(s, nodes=int(s[5:]) + 1, accept_length=1.0, draft_steps=int(s[5:]))
    for s in ENGINE.spec_strategies
  ]
  for i, (chunks, result) in enumerate(zip(rollouts, results, strict=True)):
    found = decision_mismatch(
      chunks,
      [len(result.completion(n)) for n in range(rows)],
      policy,
      arms,
      bandit,
      prompt_lens=[len(PROMPTS[n // SAMPLES]) for n in range(rows)],
      max_new_tokens=[LIMITS[n // SAMPLES] for n in range(rows)],
    )
    if found:
      return f"rollout {i}, {found}"
  return None


def test_the_replay_takes_the_engines_decisions_on_its_recorded_chunks(monkeypatch):
  engine, bandit, rollouts, results = _recorded_rollouts(monkeypatch, ENGINE, keys=range(3))
  chunks = [c for r in rollouts for c in r]
  # The rollouts exercised what is decided: moves to smaller buckets, both kinds of chunk,
  # chunks the bandit learnt from and chunks above the threshold it did not.
  assert len({c["batch"] for c in chunks}) >= 3
  assert any(c["arm"] != PLAIN for c in chunks) and any(c["run_s"] for c in chunks)
  assert any(c["learn"] for c in chunks) and any(not c["learn"] for c in chunks)
  # Programs compiled as chunks need them: a first run the bandit chose asks for one step or
  # round and teaches nothing (`RolloutRun._first_run`), which the replay takes as given.
  firsts = [c for c in chunks if c["first_run"] and c["learn"]]
  assert firsts and all(c["steps"] == 1 and not c["run_s"] for c in firsts)
  replayed = StrategyBandit.from_state_dict(bandit.state_dict())
  found = _mismatch(rollouts, results, _policy(ENGINE), replayed)
  assert found is None, found
  # Same lessons, so the same beliefs: the replayed bandit ends where the engine's did.
  assert replayed.state_dict() == engine.bandit.state_dict()
  # The check can fail: a replay whose policy differs from the engine's in one setting. The
  # smallest batch the chunks reached depends on where chunks ended (arms chosen on the
  # host's timings), so the larger floor is set above it rather than fixed.
  floor = 2 * min(c["batch"] for c in chunks)
  for change in (dict(chunk_steps=5), dict(spec_threshold=4), dict(min_batch_bucket=floor)):
    other = _policy(dataclasses.replace(ENGINE, **change))
    fresh = StrategyBandit.from_state_dict(bandit.state_dict())
    assert _mismatch(rollouts, results, other, fresh) is not None, change


def test_the_replay_measures_a_settled_last_bucket_as_the_engine_does(monkeypatch):
  """With plain settled as the last bucket's best, its chunks run to the end of their view
  and still teach the bandit (`decisions.runs_to_end`, `decisions.measured`): the replay
  takes those decisions and lessons as the engine did. Only the last bucket speculates, so
  the rows reach it where their keys take them, whatever the host's timings (its tail: the
  4 rows of the longest budget)."""
  cfg = dataclasses.replace(ENGINE, spec_threshold=4, min_batch_bucket=4)
  last = cfg.min_batch_bucket
  beliefs = [(last, PLAIN, 1e6)] + [(last, arm, 1.0) for arm in cfg.spec_strategies]
  engine, bandit, rollouts, results = _recorded_rollouts(
    monkeypatch, cfg, keys=range(3), beliefs=beliefs
  )
  settled = [
    c
    for r in rollouts
    for c in r
    if c["batch"] == last and c["arm"] == PLAIN and c["steps"] > cfg.chunk_steps
  ]
  assert settled and all(c["learn"] for c in settled)
  # Measured, a reward each, even when cut short by its rows finishing (ran 9 of 20).
  assert all(c["run_s"] > 0 for c in settled) and any(c["ran"] < c["steps"] for c in settled)
  replayed = StrategyBandit.from_state_dict(bandit.state_dict())
  found = _mismatch(rollouts, results, _policy(cfg), replayed)
  assert found is None, found
  assert replayed.state_dict() == engine.bandit.state_dict()


def test_the_replay_runs_the_plain_engines_last_bucket_to_the_end_as_it_does(monkeypatch):
  plain = dataclasses.replace(ENGINE, spec_threshold=0, min_batch_bucket=4)  # its tail: 4 rows
  _, _, rollouts, results = _recorded_rollouts(monkeypatch, plain, keys=[0])
  last = [c for c in rollouts[0] if c["batch"] == plain.min_batch_bucket]
  assert last and max(c["steps"] for c in last) > plain.chunk_steps  # ran to its view's end
  found = _mismatch(rollouts, results, _policy(plain), None)
  assert found is None, found
  longer = _policy(dataclasses.replace(plain, chunk_steps=5))
  assert _mismatch(rollouts, results, longer, None) is not None


def test_decisions():
  buckets = (2, 4, 8, 16)
  assert decisions.bucket_after_compaction(5, 16, buckets) == 8
  assert decisions.bucket_after_compaction(9, 8, buckets) == 8  # never grows
  assert decisions.chunk_view(33, (16, 32, 64)) == 64
  with pytest.raises(ValueError, match="exceeds the largest bucket"):
    decisions.chunk_view(65, (16, 32, 64))
  assert decisions.plain_steps(4, view=32, reach=20, run_to_end=True) == 13
  assert decisions.plain_steps(4, view=32, reach=20, run_to_end=False) == 4
  # Above the threshold plain, learning nothing; without a bandit the default arm.
  assert decisions.choose_arm(None, 8, speculate=False, default="chain4") == (PLAIN, False)
  assert decisions.choose_arm(None, 8, speculate=True, default="chain4") == ("chain4", False)
  # Plain runs to the end in the last bucket when nothing learns from it.
  assert decisions.runs_to_end(None, 2, learn=False, last_bucket=True)
  assert not decisions.runs_to_end(None, 2, learn=False, last_bucket=False)
  # A plain chunk measures plain once it ran a chunk's steps, even when it asked for more;
  # a speculative one only when it ran every round it asked for.
  assert decisions.measured(PLAIN, 4, 4, chunk_steps=4)
  assert decisions.measured(PLAIN, 9, 13, chunk_steps=4)
  assert not decisions.measured(PLAIN, 3, 4, chunk_steps=4)
  assert not decisions.measured(PLAIN, 3, 13, chunk_steps=4)
  assert decisions.measured("chain4", 2, 2, chunk_steps=4)
  assert not decisions.measured("chain4", 1, 2, chunk_steps=4)
  # Rewards: the mean active row's advance per second.
  kw = dict(tokens=30.0, mean_rows=3.0)
  assert decisions.chunk_reward(2.0, **kw) == 5.0
  # A chunk cut short, or one that emitted nothing, teaches nothing.
  bandit = StrategyBandit((PLAIN, "chain4"))
  lesson = dict(run_s=2.0, **kw)
  assert decisions.teach_bandit(bandit, 2, "chain4", measured=False, **lesson) is None
  no_tokens = {**lesson, "tokens": 0}
  assert decisions.teach_bandit(bandit, 2, "chain4", measured=True, **no_tokens) is None
  assert bandit.buckets == []
  assert decisions.teach_bandit(bandit, 2, "chain4", measured=True, **lesson) == 5.0
  assert bandit.summary()[2]["chain4"] == {"pulls": 1, "mean": 5.0, "last": 5.0}


def test_a_settled_bandit_runs_the_last_bucket_plain_to_the_end_and_learns_from_it():
  bandit = StrategyBandit((PLAIN, "chain4"))
  for _ in range(20):
    bandit.update(2, PLAIN, 10.0)
    bandit.update(2, "chain4", 1.0)
  choose = dict(speculate=True, default="chain4")
  assert decisions.choose_arm(bandit, 2, **choose) == (PLAIN, True)
  assert decisions.runs_to_end(bandit, 2, learn=True, last_bucket=True)
  assert not decisions.runs_to_end(bandit, 2, learn=True, last_bucket=False)
  # While the bandit still compares arms in the last bucket, its chunks are chunk-sized.
  fresh = StrategyBandit((PLAIN, "chain4"))
  assert not decisions.runs_to_end(fresh, 2, learn=True, last_bucket=True)
  fresh.update(2, PLAIN, 10.0)
  fresh.update(2, "chain4", 20.0)
  assert fresh.warmed_up(2) and not decisions.runs_to_end(fresh, 2, learn=True, last_bucket=True)


def test_a_last_bucket_settled_on_plain_by_its_warm_up_retries_the_drafter_arms():
  """The lock-in seen in the regime curve (experiments/RESULTS.md, 2026-12-05): one warm-up
  pull each, plain's an outlier (its real speed is a third of it), so plain settled in the
  last bucket. The settled chunks, run to the end, measure plain's real speed, and a
  drafter arm takes over within a few chunks."""
  arms = (PLAIN, "chain2", "chain8", "chain12")
  speed = {PLAIN: 90.0, "chain2": 289.0, "chain8": 400.0, "chain12": 380.0}
  bandit = StrategyBandit(arms, BanditSettings(exploration=0.1))
  for arm, reward in zip(arms, (294.0, 289.0, 292.0, 273.0), strict=True):
    bandit.update(1, arm, reward)
  chosen = []
  for _ in range(10):
    arm, learn = decisions.choose_arm(bandit, 1, speculate=True, default=PLAIN)
    assert learn
    chosen.append(arm)
    to_end = arm == PLAIN and decisions.runs_to_end(bandit, 1, learn=True, last_bucket=True)
    ran = 200 if to_end else 16  # a settled chunk runs (and measures) many steps
    lesson = dict(tokens=float(ran), mean_rows=1.0, run_s=ran / speed[arm])
    decisions.teach_bandit(bandit, 1, arm, measured=True, **lesson)
  assert chosen[0] == PLAIN and chosen[1] != PLAIN, chosen
  assert chosen[-5:] == ["chain8"] * 5, chosen
  assert bandit.summary()[1][PLAIN]["last"] == pytest.approx(90.0)

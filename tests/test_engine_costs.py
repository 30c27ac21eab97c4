"""experiments/engine_costs.py: the engine's own calls timed from its timelines, the costs the
step simulator replays (a tiny policy; the figures themselves go to RESULTS.md)."""

import json
import pathlib
import subprocess
import sys

from tlt_jax.sim import EngineCost, EnginePolicy, replay_rollout
from tlt_jax.sim.costs import arms_from_accept

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from experiments.engine_costs import default_prompt_lens, stage_budgets  # noqa: E402


def test_stage_budgets_end_half_the_rows_at_a_time():
  assert stage_budgets(8, 10) == [10, 10, 10, 10, 20, 20, 30, 40]
  assert stage_budgets(1, 5) == [5]
  assert default_prompt_lens((64, 128, 256), 200) == [8, 65, 129]
  assert default_prompt_lens((64, 128, 256), 100) == [8, 65, 100]


def test_engine_costs_times_every_bucket_view_and_arm_of_a_tiny_engine(tmp_path):
  out = tmp_path / "costs"
  cmd = [
    sys.executable,
    str(ROOT / "experiments" / "engine_costs.py"),
    # The tiny policy (compiles in a fraction of the default's time) in the default
    # engine's buckets.
    "--config=configs/default.py:tiny",
    "--config.engine.min_batch_bucket=1",
    "--config.engine.min_prompt_bucket=32",
    "--config.engine.max_batch=4",
    "--config.engine.spec_threshold=4",
    "--config.engine.max_prompt_len=64",
    "--config.engine.max_new_tokens=96",
    "--config.rl.group_size=2",
    "--arms=chain2",
    "--reps=2",
    "--stage_tokens=32",
    f"--out={out}",
  ]
  run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  got = json.loads((out / "engine_costs.json").read_text())
  cost = EngineCost.from_dict(got)
  # Rows end a half at a time: every batch bucket ran plain chunks after the first
  # repetition compiled them, and prompts of every view started them in every view. (A
  # random tiny drafter is accepted often: its chunks end stages early and vary in view, so
  # only the full batch is sure to have run chain2 without a compile.)
  assert {b for b, _, _ in cost.cells["plain"]} == {1, 2, 4}
  assert {v for _, v, _ in cost.cells["plain"]} == {64, 128, 160}  # views of a 160-slot cache
  assert 4 in {b for b, _, _ in cost.cells["chain2"]}
  assert {b for b, _, _ in cost.cells["prefill"]} == {1, 2}  # prompts per rollout
  assert cost.cells["drafter_prefill"] and cost.gap_s > 0 and cost.finish_s > 0
  assert "plain: ms per step" in run.stdout and "chain2: ms per round" in run.stdout
  # The replay runs on them: a lone long row costs more than a short one.
  policy = EnginePolicy.from_engine(got["config"]["engine"], samples=2)
  arms = arms_from_accept({"chain2": 2.0}, 0.0)
  short = replay_rollout([8, 8], cost, policy, arms, prompt_lens=[10, 10])
  long = replay_rollout([8, 90], cost, policy, arms, prompt_lens=[10, 10])
  assert 0 < short.seconds < long.seconds


def test_engine_costs_from_a_runs_own_timelines(tmp_path):
  """--from_run: a committed run's own calls after its first step (no probe), the cells it
  never timed (plain steps at most batches, in a run that speculated throughout) from --base
  at the run's speed; a run without timelines is refused with the reason."""
  results = ROOT / "experiments" / "results"
  run = results / "simulator_runcosts_hostG_2026-12-07" / "tlt_s0"
  base = results / "simulator_regime_hostG_2026-12-06" / "engine_costs.json"
  script = str(ROOT / "experiments" / "engine_costs.py")
  cmd = [sys.executable, script, f"--from_run={run}", f"--base={base}", f"--out={tmp_path}"]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  got = json.loads((tmp_path / "engine_costs.json").read_text())
  cost = EngineCost.from_dict(got)
  assert sorted(int(s) for s in got["from_run"]["drift"]) == list(range(1, 12))
  probe = EngineCost.from_dict(json.loads(base.read_text()))
  # The run timed one plain chunk: every plain cell is the probe's, at the run's speed.
  ratios = {s / p for (_, _, s), (_, _, p) in zip(cost.cells["plain"], probe.cells["plain"])}
  assert len(cost.cells["plain"]) == len(probe.cells["plain"])
  assert max(ratios) - min(ratios) < 1e-9 and 0.5 < min(ratios) < 2
  assert sorted(cost.cells) == sorted(probe.cells) and cost.gap_s > 0
  assert "chain4: ms per round" in done.stdout
  assert got["config"]["engine"]["spec_strategies"] == ["chain2", "chain4", "chain8", "chain12"]
  cmd = [sys.executable, script, f"--from_run={tmp_path}", f"--out={tmp_path / 'x'}"]
  refused = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert refused.returncode != 0 and "rollout_timelines.jsonl" in refused.stderr

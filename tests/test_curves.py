"""The learning-curve statistics and figure (tlt_jax.curves), and the interleaved modes'
shared evaluation (tlt_jax.compare.SharedEvaluation)."""

import numpy as np
import pytest

from tlt_jax import compare, curves


def test_quarter_rise_is_last_quarter_minus_first_with_an_interval_over_steps():
  rewards = [0.1] * 10 + [0.2] * 20 + [0.5, 0.4] * 5
  out = curves.quarter_rise(rewards, reps=2000)
  assert out["steps_per_quarter"] == 10
  assert out["first_quarter"] == pytest.approx(0.1)
  assert out["last_quarter"] == pytest.approx(0.45)
  assert out["rise"] == pytest.approx(0.35)
  lo, hi = out["interval"]
  assert 0.3 <= lo <= 0.35 <= hi <= 0.4
  # A flat, noisy curve: the interval covers 0.
  flat = np.random.default_rng(0).normal(0.3, 0.05, 40)
  lo, hi = curves.quarter_rise(flat, reps=2000)["interval"]
  assert lo < 0 < hi
  # Too few steps to resample: no interval, still a rise.
  assert curves.quarter_rise([0.0, 1.0])["interval"] is None
  with pytest.raises(ValueError):
    curves.quarter_rise([0.5])


def test_paired_gap_and_ratio_spread():
  gap = curves.paired_gap([0.5, 0.6, 0.7], [0.4, 0.4, 0.4], reps=2000)
  assert gap["pairs"] == 3 and gap["mean"] == pytest.approx(0.2)
  assert 0.1 - 1e-9 <= gap["interval"][0] <= 0.2 <= gap["interval"][1] <= 0.3 + 1e-9
  assert curves.paired_gap([1.0], [0.5])["interval"] is None
  spread = curves.ratio_spread([2.0, 4.0, 6.0], [1.0, 2.0, 2.0])
  assert spread["of_totals"] == pytest.approx(12 / 5)
  assert spread["median"] == 2.0 and spread["range"] == [2.0, 3.0]
  assert curves.amdahl(0.5, 2.0) == pytest.approx(1 / 0.75)
  assert curves.amdahl(1.0, 3.0) == pytest.approx(3.0)


def test_elapsed_and_smooth():
  rows = [{"step_s": s} for s in (1.0, 2.0, 3.0)]
  assert curves.elapsed(rows).tolist() == [1.0, 3.0, 6.0]
  assert curves.smooth([1, 2, 3, 4], 2).tolist() == [1.0, 1.5, 2.5, 3.5]


def test_plot_learning_curves_writes_a_png(tmp_path):
  def rows(scale):
    return [
      {
        "step": i,
        "step_s": scale,
        "reward": 0.1 * i,
        "eval": 0.5 if i == 3 else "",
        "eval_sampled": 0.4 if i == 3 else "",
      }
      for i in range(4)
    ]

  path = tmp_path / "curve.png"
  curves.plot_learning_curves(
    {"baseline_s0": rows(2.0), "tlt_s0": rows(1.0)},
    str(path),
    notes=["tlt: 2.00x"],
    warm_eval={"accuracy": 0.3, "sampled_accuracy": 0.2},
  )
  assert path.stat().st_size > 10_000


class _Trainer:
  def __init__(self, step, params):
    self.step, self.params, self.evaluated = step, params, 0

  def evaluate(self):
    self.evaluated += 1
    return {"accuracy": float(self.params["w"].sum())}


def test_tokens_equal_steps_compares_the_runs_row_digests(tmp_path):
  """compare.tokens_equal_steps: the steps every run recorded token digests for, and those
  whose digests agree in every run (a step recorded without digests is not compared)."""
  import json

  def run(name, digests_by_step):
    folder = tmp_path / name
    folder.mkdir()
    lines = []
    for step, digests in enumerate(digests_by_step):
      row = {"step": step, "rollouts": [[5, 6]]}
      if digests is not None:
        row["digests"] = [digests]
      lines.append(json.dumps(row))
    (folder / "rollout_lengths.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder)

  a = run("a", [[1, 2], [3, 4], [5, 6], None])
  b = run("b", [[1, 2], [3, 9], [5, 6], [7, 8]])
  assert compare.tokens_equal_steps([a, b]) == [2, 3]
  assert compare.tokens_equal_steps([a, a]) == [3, 3]
  assert compare.tokens_equal_steps([run("old", [None, None])]) == [0, 0]


def test_shared_evaluation_evaluates_once_per_step_and_checks_the_digests():
  shared = compare.SharedEvaluation()
  a = _Trainer(10, {"w": np.ones(3)})
  b = _Trainer(10, {"w": np.ones(3)})
  c = _Trainer(10, {"w": np.zeros(3)})
  first = shared("baseline", a)
  second = shared("tlt", b)
  assert a.evaluated == 1 and b.evaluated == 0  # equal parameters: figures shared
  assert second["shared_from"] == "baseline" and second["accuracy"] == first["accuracy"] == 3.0
  assert second["params_digest"] == first["params_digest"]
  # Different parameters at the same step: evaluated on their own and flagged.
  third = shared("sd", c)
  assert c.evaluated == 1 and third["accuracy"] == 0.0
  assert third["params_differ_from"] == "baseline"
  assert shared.mismatches == [{"step": 10, "run": "sd", "against": "baseline"}]
  assert compare.params_digest({"w": np.ones(3)}) != compare.params_digest({"w": np.ones(4)})


def _fake_report(seed: int, steps: int, slower: float) -> dict:
  """A learning_curve.json-shaped report: equal rewards in every mode, baseline's steps
  `slower` times tlt's and sd's."""
  rng = np.random.default_rng(seed)
  rewards = np.linspace(0.3, 0.6, steps) + rng.normal(0, 0.02, steps)
  fast = rng.uniform(10, 20, steps)
  rows = {
    f"{mode}_s{seed}": [
      {"step": i, "reward": float(rewards[i]), "step_s": float(fast[i] * k)} for i in range(steps)
    ]
    for mode, k in (("baseline", slower), ("sd", 1.0), ("tlt", 1.0))
  }
  speed = {
    f"{mode}_s{seed}": {
      "step_speedup": {
        "median": slower,
        "quartiles": [slower - 0.1, slower + 0.1],
        "of_totals": slower,
      },
      "amdahl": slower + 0.05,
    }
    for mode in ("sd", "tlt")
  }
  speed[f"baseline_s{seed}"] = {}
  return {"rows": rows, "speed": speed, "learning": curves.quarter_rise(rewards, reps=200)}


def test_seeds_summary_averages_the_seeds_curves_and_keeps_each_seeds_speedup(tmp_path):
  reports = [_fake_report(0, 12, 1.5), _fake_report(1, 10, 1.3)]
  summary = curves.seeds_summary(reports, window=3)
  assert summary["steps"] == 10  # the steps every seed ran
  base, tlt = summary["curves"]["baseline"], summary["curves"]["tlt"]
  # Equal rewards step by step: the mean curves differ only in their time axis.
  np.testing.assert_allclose(base["reward"], tlt["reward"])
  want = np.mean([curves.elapsed(r["rows"][f"tlt_s{i}"][:10]) for i, r in enumerate(reports)], 0)
  np.testing.assert_allclose(tlt["seconds"], want)
  ratio = base["seconds"][-1] / tlt["seconds"][-1]
  assert 1.3 < ratio < 1.5
  assert [p["median"] for p in summary["speedups"]["tlt"]] == [1.5, 1.3]
  assert "baseline" not in summary["speedups"]
  out = tmp_path / "seeds.png"
  curves.plot_seeds(reports, str(out), labels=["a", "b"])
  assert [curves.seed_label(r) for r in reports] == ["seed 0", "seed 1"]
  assert out.stat().st_size > 10_000
  with pytest.raises(ValueError, match="labels"):
    curves.plot_seeds(reports, str(out), labels=["a"])
  partial = _fake_report(2, 10, 1.2)
  del partial["rows"]["sd_s2"]
  with pytest.raises(ValueError, match="not in every report"):
    curves.seeds_summary(reports + [partial])
  with pytest.raises(ValueError, match="at least one"):
    curves.seeds_summary([])


def test_update_throughput_summarises_the_steps_that_updated_against_the_matmul_rate():
  """The learning curve's item-3 figure: the update's model GFLOP/s per step (`step_row`
  reads it from the trainer's metrics), its median over the host's matmul rate, and the
  padding of the micro-batches it computed; steps that updated nothing are left out."""
  metrics = {
    "step": 1,
    "time/step": 10.0,
    "time/rollout": 6.0,
    "time/rollout_compile": 0.0,
    "reward_mean": 0.5,
    "update/model_tflops": 0.08,
    "update/computed_padding": 0.06,
  }
  row = compare.step_row("baseline", metrics)
  assert row["update_gflops"] == pytest.approx(80.0) and row["update_padding"] == 0.06
  idle = compare.step_row(
    "baseline", {**metrics, "update/model_tflops": 0.0, "update/computed_padding": 0.0}
  )
  assert idle["update_gflops"] == ""
  rows = [{**row, "update_gflops": g, "update_padding": p} for g, p in [(40, 0.1), (60, 0.0)]]
  out = curves.update_throughput([*rows, row, idle], matmul_gflops=200.0)
  assert out["steps"] == 3 and out["median_gflops"] == pytest.approx(60.0)
  assert out["range"] == [40.0, 80.0] and out["of_matmul"] == pytest.approx(0.3)
  assert out["computed_padding"] == pytest.approx(0.06)
  assert curves.update_throughput([idle], 200.0) == {}


def test_report_markdown_says_whether_it_learnt_the_held_out_points_and_the_speed():
  """learning_curve.md: the rise with its interval, the gap over the warm start, held-out
  pass@1 at the warm start and each evaluated step, and every mode's speed line."""
  host = {"time": "t", "cpu": "cpu", "matmul_GFLOPs": 200.0, "read_GBps": 30.0}
  report = {
    "host_start": host,
    "host_end": host,
    "rewards_equal_steps": [40, 40],
    "tokens_equal_steps": [40, 40],
    "params_mismatches": [],
    "learning": curves.quarter_rise([0.1] * 10 + [0.5] * 10, reps=200),
    "warm_start_replay": {"trained_minus_warm_start": curves.paired_gap([0.5, 0.6], [0.4, 0.4])},
    "warm_start_eval": {"accuracy": 0.25, "sampled_accuracy": 0.3},
  }
  rows = [
    {"step": 0, "eval": "", "eval_sampled": ""},
    {"step": 9, "eval": 0.5, "eval_sampled": 0.4},
    {"step": 19, "eval": 0.6, "eval_sampled": ""},
  ]
  text = curves.report_markdown(report, rows, ["baseline_s0: step 1.0 s", "tlt_s0: 1.6x"])
  assert "at 40 of 40 steps, every row's tokens at 40 of 40" in text and "at 0 evaluations" in text
  assert "first quarter 0.100 -> last 0.500: rise +0.400 [+0.400, +0.400]" in text
  assert "Over the warm start on the last quarter's prompts: +0.150 [" in text
  assert "warm start 0.250 / 0.300; step 9: 0.500 / 0.400; step 19: 0.600." in text
  assert "- baseline_s0: step 1.0 s\n- tlt_s0: 1.6x" in text

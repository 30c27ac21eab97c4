"""Helpers the experiment scripts share (experiments/common.py)."""

import os
import shutil
import sys
from types import SimpleNamespace

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import call_phases_ms  # noqa: E402


def test_call_phases_ms_splits_each_call_into_its_phases_and_host_time():
  def call(wall, *phases):
    return SimpleNamespace(wall_seconds=wall, timeline=[{"phase": p, "dt": dt} for p, dt in phases])

  plain = call(1.0, ("prefill", 0.1), ("decode", 0.5), ("decode", 0.38))
  spec = call(0.5, ("prefill", 0.1), ("drafter_prefill", 0.01), ("spec", 0.37))
  got = call_phases_ms([plain, spec])
  # Means over the two calls, in ms; a phase one call lacks counts as 0 there.
  assert got == pytest.approx(
    {"prefill": 100.0, "decode": 440.0, "drafter_prefill": 5.0, "spec": 185.0, "outside": 20.0}
  )
  assert sum(got.values()) == pytest.approx(750.0)  # the calls' mean wall time
  with pytest.raises(ValueError, match="at least one"):
    call_phases_ms([])


def test_update_parts_counts_the_products_and_attention_the_update_runs():
  """experiments/update_parts.py's counts: the dense products are every 2-D weight once (the tied
  embedding as the head's [d, vocab] product), and attention's FLOPs are those of the
  causal query blocks `attend_causal` computes."""
  from flax import nnx

  from experiments.common import attention_flops, dense_shapes
  from tlt_jax.models.attention import causal_block
  from tlt_jax.models.config import ModelConfig
  from tlt_jax.models.transformer import init_model

  cfg = ModelConfig(
    vocab_size=50, num_layers=2, d_model=16, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=24
  )
  _, params = nnx.split(init_model(cfg, seed=0))
  shapes = dense_shapes(params)
  assert (16, 50) in shapes  # the head, not the [vocab, d] lookup table
  matrices = sum(x.size for x in jax.tree.leaves(params) if x.ndim == 2)
  assert sum(i * o for i, o in shapes) == matrices
  # One block covers the row: every query against every key (4 FLOPs a pair, head dim,
  # heads, x3 forward and backward, per layer).
  full = 3 * 4 * 3 * 64 * 64 * cfg.num_heads * cfg.head_dim * cfg.num_layers
  with causal_block(64):
    assert attention_flops(cfg, rows=3, width=64) == full
  with causal_block(32):  # blocks of 32: the first sees 32 keys, the second 64
    assert attention_flops(cfg, rows=3, width=64) == full * (32 * 32 + 32 * 64) / (64 * 64)


def test_attention_flops_of_packed_rows_follow_the_key_windows_the_update_picks():
  """Under key windows, `attention_flops` counts for each query block of a packed row the
  narrowest window holding its first query's sample (all keys up to the block's end where
  none does), and `packed_rows` packs whole samples with padding only at a row's end."""
  from experiments.common import attention_flops, packed_rows
  from tlt_jax.models.attention import causal_block
  from tlt_jax.models.config import ModelConfig

  cfg = ModelConfig(
    vocab_size=50, num_layers=2, d_model=16, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=24
  )
  # Row 0: samples at columns 0-99, 100-139, 140-255; row 1: one sample 0-229, then padding.
  seg = np.zeros((2, 256), np.int32)
  seg[0, :100], seg[0, 100:140], seg[0, 140:] = 1, 2, 3
  seg[1, :230] = 1
  # Blocks of 64 with windows 64 / 128 / 192 (a window is tried only if the block fits in
  # it and it is shorter than the block's end): row 0 reads 64, 128 (sample 1 from 0),
  # 128 (sample 2 from 100) and 128 (sample 3 from 140) keys; row 1 64, 128, 192, 256.
  pairs = 64 * (64 + 128 + 128 + 128) + 64 * (64 + 128 + 192 + 256)
  per_pair = 2 * 2 * cfg.num_heads * cfg.head_dim * 3 * cfg.num_layers
  with causal_block(64):
    assert attention_flops(cfg, 2, 256, seg, (64, 128, 192)) == pairs * per_pair
    assert attention_flops(cfg, 2, 256) == 2 * 64 * (64 + 128 + 192 + 256) * per_pair
  batch = packed_rows(np.random.default_rng(1), 3, 320, cfg.vocab_size, median=40)
  for row in batch["segment_ids"]:  # samples 1, 2, ... in order, then < 30 columns of padding
    pad = int((row == 0).sum())
    assert row[0] == 1 and (np.diff(row[: 320 - pad]) >= 0).all() and pad < 30
    assert (row[320 - pad :] == 0).all()
  assert batch["mask"].sum() > 0 and (batch["mask"] <= (batch["segment_ids"] > 0)).all()


def test_update_parts_runs_at_the_runs_settings(tmp_path):
  """experiments/update_parts.py on the regime's tiny variant: every part timed, compiled
  under the config's library fusions and key windows, written out (the figures are the
  RESULTS entries'; here, that it runs and counts real tokens)."""
  import json
  import subprocess

  out = tmp_path / "parts.json"
  cmd = [
    sys.executable,
    "experiments/update_parts.py",
    "--config=configs/regime.py:tiny",
    "--config.rl_update.key_windows=(128,)",
    "--columns=256",
    "--rows=8",
    "--reps=1",
    f"--out={out}",
  ]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  (width,) = json.loads(out.read_text())["widths"]
  assert width["packed"] and width["key_windows"] == [128]
  assert 0.7 < width["real_fraction"] <= 1.0
  assert set(width["median_s"]) == {
    "products",
    "attention",
    "forward",
    "micro step",
    "update",
    "optimizer",
  }


def test_train_drafter_stacks_rollouts_of_different_hidden_widths():
  """`warmstart.drafter.stack_rollouts` (experiments/train_drafter.py's data): a rollout's
  hidden states are only as wide as its rows reach, so rollouts' arrays are padded to the
  longest row before they are stacked."""
  from tlt_jax.warmstart.drafter import stack_rollouts

  def rollout(lengths, width):
    rows = len(lengths)
    return SimpleNamespace(
      tokens=np.ones((rows, 40), np.int32),
      hidden=np.ones((rows, width, 3), np.float32),
      prompt_len=np.full(rows, 2),
      length=np.asarray(lengths),
    )

  got = stack_rollouts([rollout([5, 9], 16), rollout([20], 32)])
  assert got["tokens"].shape == (3, 20) and got["hidden"].shape == (3, 20, 3)
  assert got["hidden"][:2, 16:].sum() == 0 and got["hidden"][:2, :16].all()
  np.testing.assert_array_equal(got["length"], [5, 9, 20])


def test_simulate_splits_recorded_rollouts_into_engine_calls():
  """experiments/simulate.py --rows_per_call (`common.split_calls`): each recorded rollout's
  rows, with their prompt lengths, in consecutive engine calls (a step's calls run one after
  another)."""
  from experiments.common import split_calls

  traces, prompts = [[5, 6, 7, 8], [1, 2, 3, 4]], [[9, 9, 8, 8], [7, 7, 6, 6]]
  calls, call_prompts, per = split_calls(traces, prompts, 2)
  assert per == 2 and calls == [[5, 6], [7, 8], [1, 2], [3, 4]]
  assert call_prompts == [[9, 9], [8, 8], [7, 7], [6, 6]]
  assert split_calls(traces, None, 4) == (traces, None, 1)
  with pytest.raises(ValueError, match="do not divide"):
    split_calls(traces, None, 3)


def test_effort_mix_tells_a_slip_from_a_wrong_count():
  """experiments/effort_mix.py: a wrong answer whose lines all follow is a counting fault
  (stopped early or late); one with a line that does not follow is a slip."""
  from experiments.common import summarise, why_wrong
  from tlt_jax.data import get_task

  task = get_task("stride")
  q = "90+4x3="  # three steps on a clock of 100: 94, 98, 2
  right = "~1:90+4=94;2:94+4=98;3:98+4=2;#2"
  early = "~1:90+4=94;2:94+4=98;#98"
  slip = "~1:90+4=94;2:94+4=99;3:99+4=3;#3"
  hasty = "!2:90+8=98;4:98+8=6;#6"  # jumps past the odd count
  assert task.check(right, "2") == 1.0
  assert [why_wrong(q, t, task.steps) for t in (early, slip, hasty)] == ["count", "line", "count"]
  got = summarise([right, early, slip, hasty], ["2"] * 4, [3] * 4, task.check, [q] * 4, task.steps)
  assert got["careful"]["share"] == 0.75 and got["careful"]["pass@1"] == pytest.approx(1 / 3)
  assert got["careful"]["wrong_by"] == pytest.approx({"line": 1 / 3, "count": 1 / 3})
  assert got["hasty"]["wrong_by"] == {"line": 0.0, "count": 1.0}


def test_line_fields_names_every_character_of_a_worked_answer():
  """experiments/line_errors.py reads a solution character by character: the marker, then
  per line its counter, start value, stride and new value, then the answer."""
  from experiments.common import line_fields
  from tlt_jax.data import get_task

  solution = "~2:23+7=30;1:30+7=37;#37"
  got = line_fields(solution)
  assert len(got) == len(solution)
  text = lambda line, field: "".join(c for c, lf in zip(solution, got) if lf == (line, field))
  assert got[0] == (0, "marker")
  assert [text(0, f) for f in ("label", "prev", "stride", "result")] == ["2:", "23+", "7=", "30;"]
  assert [text(1, f) for f in ("label", "prev", "stride", "result")] == ["1:", "30+", "7=", "37;"]
  assert text(2, "answer") == "#37"
  # The task's own careful and hasty solutions: one label per line, the answer last.
  for ex in get_task("stride").generate(3, 20, clock=100, countdown=True, hasty_fraction=0.5):
    fields = line_fields(ex["solution"])
    lines = ex["solution"].count(";")
    assert sum(1 for c, (_, f) in zip(ex["solution"], fields) if f == "label" and c == ":") == lines
    assert fields[-1] == (lines, "answer")


def test_relative_change_groups_parameters_by_path():
  """experiments/param_drift.py: per group, the norm of the change over the norm before."""
  from experiments.common import relative_change

  before = {"embed": {"embedding": np.ones((2, 3))}, "layers": {"a": np.ones(4), "b": np.ones(4)}}
  after = {
    "embed": {"embedding": np.ones((2, 3)) * 1.1},
    "layers": {"a": np.ones(4), "b": np.ones(4) * 3.0},
  }
  got = relative_change(before, after)
  assert got["embed"] == pytest.approx(0.1)
  assert got["layers"] == pytest.approx(np.sqrt(16 / 8))
  deep = relative_change(before, after, depth=2)
  assert deep["layers/a"] == 0.0 and deep["layers/b"] == pytest.approx(2.0)
  with pytest.raises(ValueError):
    relative_change(before, {"embed": after["embed"]})


def test_print_report_prints_and_writes_the_same_json(tmp_path, capsys):
  import json

  from experiments.common import print_report

  out = tmp_path / "r.json"
  print_report({"a": 1, "b": [0.5]}, str(out))
  assert json.loads(capsys.readouterr().out) == json.loads(out.read_text()) == {"a": 1, "b": [0.5]}
  print_report({"c": 2})
  assert json.loads(capsys.readouterr().out) == {"c": 2}


def test_random_params_have_the_models_tree_and_a_scale_per_kind():
  """real_sizes.py's random weights (one program per leaf shape): the tree, shapes and
  dtypes of the model's own initialisation; norm scales one, biases zero, every matrix its
  own draw with std 1 / sqrt(fan-in); a forward runs on them."""
  import dataclasses

  import jax.numpy as jnp
  from flax import nnx

  from experiments.common import published_shape, random_params
  from tlt_jax.models.transformer import Transformer

  cfg = dataclasses.replace(published_shape("tiny"), qkv_bias=True, num_layers=3)
  graphdef, params = random_params(cfg)
  _, want = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  got_leaves = jax.tree_util.tree_leaves_with_path(params)
  want_leaves = jax.tree_util.tree_leaves_with_path(want)
  assert [p for p, _ in got_leaves] == [p for p, _ in want_leaves]
  assert [(x.shape, x.dtype) for _, x in got_leaves] == [(x.shape, x.dtype) for _, x in want_leaves]
  kernels = []
  for path, x in got_leaves:
    name = jax.tree_util.keystr(path)
    x = np.asarray(x, np.float32)
    if "scale" in name:
      np.testing.assert_array_equal(x, 1.0)
    elif "bias" in name:
      np.testing.assert_array_equal(x, 0.0)
    elif "kernel" in name:
      assert abs(x.std() * np.sqrt(x.shape[0]) - 1.0) < 0.1, name
      kernels.append(x)
  # Matrices of one shape (one program) are different draws.
  same_shape = [k for k in kernels if k.shape == kernels[0].shape]
  assert len(same_shape) >= 3 and len({k.tobytes() for k in same_shape}) == len(same_shape)
  model = nnx.merge(graphdef, params)
  tokens = jnp.arange(8, dtype=jnp.int32)[None]
  h, _, _ = model(tokens, tokens)
  assert np.isfinite(np.asarray(model.logits(h), np.float32)).all()


def test_compare_drafter_runs_pairs_the_runs_and_flags_a_different_policy(tmp_path):
  """experiments/compare_drafter_runs.py on two made-up runs: the drafter evaluations,
  updates a step and rollout seconds paired after the first step, compiles left out; a
  step whose reward differs is named (those runs did not train the same policy), and so
  are learning-rate schedules over different horizons (one reason why)."""
  import json
  import subprocess

  from configs import default

  def write(name, rollout_s, online, reward_at_3, steps):
    run = tmp_path / name
    run.mkdir()
    config = default.get_config("tiny")
    config.rl.steps = steps
    (run / "config.json").write_text(config.to_json_best_effort())
    rows = []
    for step in range(6):
      row = {
        "step": step,
        "reward_mean": reward_at_3 if step == 3 else 0.5,
        "length_mean": 100.0,
        "time/rollout": rollout_s[step],
        "time/step": rollout_s[step] + 10.0,
        "time/drafter": 1.0,
        "time/rollout_compile": 30.0 if step in (0, 2) else 0.0,
        "time/train_compile": 0.0,
        "time/update": 8.0,
        "drafter/updates": 2,
        "spec/accept_length": 4.0,
      }
      if step == 4:
        row.update({"drafter_eval/accept_online": online, "drafter_eval/accept_frozen": 9.0})
        row["drafter_eval/online_version"] = 10
      rows.append(row)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(run)

  a = write("a", [50, 20, 40, 20, 20, 20], 9.5, 0.5, 6)
  b = write("b", [50, 30, 40, 30, 10, 30], 8.5, 0.25, 20)
  out = tmp_path / "report.json"
  cmd = [sys.executable, "experiments/compare_drafter_runs.py", f"--runs={a},{b}", f"--out={out}"]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  rep = json.loads(out.read_text())
  assert rep["timed_steps"] == [1, 2, 3, 4, 5]
  assert rep["same_policy"] == {"b": {"steps": 6, "differing_steps": [3]}}
  (eval_a,) = rep["runs"]["a"]["drafter_evals"]
  (eval_b,) = rep["runs"]["b"]["drafter_evals"]
  assert (eval_a["online_minus_frozen"], eval_b["online_minus_frozen"]) == (0.5, -0.5)
  ratio = rep["runs"]["b"]["rollout_over_a"]
  # Step 2's 30 s of compiles are left out: 10 s of rollout in both runs.
  assert ratio["of_totals"] == 110 / 90 and ratio["median"] == 1.5 and ratio["range"] == [0.5, 1.5]
  assert rep["runs"]["b"]["update_over_a"]["of_totals"] == 1.0
  assert "| b | 4 | 8.50 | 9.00 | -0.50 | 10 |" in done.stdout
  assert rep["schedule_horizons"] == {"a": 6, "b": 20}
  assert "schedules span different RL steps" in done.stdout


def test_learning_curves_speed_table_runs_without_a_baseline():
  """experiments/learning_curve.py with --modes=sd,tlt (no baseline): per-mode step times
  and r, no ratios, instead of failing after the runs (it did, 2026-12-03)."""
  import subprocess

  code = (
    "from experiments.learning_curve import speed_table\n"
    "row = lambda s: {'step_s': 10.0 + s, 'rollout_s': 6.0, 'compile_s': 0.0, "
    "'update_s': 0.0, 'update_tokens': 0}\n"
    "rows = {m: [row(s) for s in range(3)] for m in ('sd_s0', 'tlt_s0')}\n"
    "t = speed_table(rows, ['sd', 'tlt'], 100.0)\n"
    "assert set(t) == {'sd_s0', 'tlt_s0'} and 'step_speedup' not in t['tlt_s0'], t\n"
    "assert abs(t['tlt_s0']['rollout_share'] - 6.0 / 11.5) < 1e-9, t\n"
    "rows['baseline_s0'] = [row(s) for s in range(3)]\n"
    "assert speed_table(rows, ['baseline', 'sd', 'tlt'], 100.0)['tlt_s0']['step_speedup']\n"
  )
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]


def test_learning_curve_tables_only_reports_a_comparison_cut_short(tmp_path):
  """experiments/learning_curve.py --tables_only on runs that stopped at different steps
  (a comparison killed mid-block): every run's table in full, a line cut short by the kill
  left out, the plot and ratios over the steps every mode reached, all copied to --keep."""
  import csv
  import json
  import subprocess

  def row(step, step_s, rollout_s):
    return {
      "step": step,
      "reward_mean": 0.1 * step,
      "time/step": step_s,
      "time/rollout": rollout_s,
      "time/rollout_compile": 0.0,
    }

  out, kept = tmp_path / "curve", tmp_path / "kept"
  for label, n, step_s in (("baseline_s0", 6, 10.0), ("tlt_s0", 4, 5.0)):
    (out / label).mkdir(parents=True)
    rows = [row(k, step_s, step_s - 2.0) for k in range(n)]
    rows[0]["eval"] = {"accuracy": 0.5, "problems": "abc"}
    lines = [json.dumps(r) for r in rows]
    (out / label / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 9, "rew')
  # The warm start's row is of other problems: left out of the plot, and said so.
  (out / "shared").mkdir()
  summary = {"eval": {"accuracy": 0.3, "problems": "xyz"}}
  (out / "shared" / "summary.json").write_text(json.dumps(summary))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run(
    [
      sys.executable,
      "experiments/learning_curve.py",
      f"--out={out}",
      f"--keep={kept}",
      "--modes=baseline,tlt",
      "--tables_only",
    ],
    cwd=root,
    capture_output=True,
    text=True,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  with open(kept / "steps_baseline_s0.csv") as f:
    assert [int(r["step"]) for r in csv.DictReader(f)] == list(range(6))
  report = json.loads((kept / "learning_curve_partial.json").read_text())
  assert report["steps_reached"] == {"baseline_s0": 6, "tlt_s0": 4}
  assert report["steps_compared"] == 4
  # Steps 1-3 of both (step 0 carries compiles): 10 s against 5 s a step.
  assert report["speed"]["tlt_s0"]["step_speedup"]["of_totals"] == pytest.approx(2.0)
  assert (kept / "learning_curve_partial.png").stat().st_size > 0
  assert "end to end 2.00x" in done.stdout
  assert "held-out row left out: other problems" in done.stdout
  assert report["warm_start_eval"] is None
  summary["eval"]["problems"] = "abc"  # now of the runs' problems: drawn
  (out / "shared" / "summary.json").write_text(json.dumps(summary))
  # Steps rerun from a checkpoint at step 2, against tlt: steps 2-3, step 2 skipped.
  done = subprocess.run(
    [*done.args, "--from_step=2", "--reference=tlt"], cwd=root, capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads((kept / "learning_curve_partial.json").read_text())
  assert report["steps_compared"] == 2 and report["reference"] == "tlt_s0"
  assert report["warm_start_eval"]["accuracy"] == 0.3 and "left out" not in done.stdout
  assert report["speed"]["baseline_s0"]["step_speedup"]["of_totals"] == pytest.approx(0.5)
  assert "tlt_s0" not in report["speed"] or "step_speedup" not in report["speed"]["tlt_s0"]


def test_warm_start_eval_evaluates_a_warm_start_without_a_row_of_the_runs_problems(tmp_path):
  """A warm start copied into shared/ by hand may have no summary.json (a crash after the
  runs, 2026-12-04), or its SFT stage's, evaluated on the held-out problems of other task
  parameters (a wrong warm-start row, 2026-12-04): both are evaluated on the runs' problems
  and written there; a row of the runs' own problems is reused."""
  import subprocess

  path = str(tmp_path / "summary.json")
  code = (
    "import json\n"
    "from types import SimpleNamespace\n"
    "from experiments.learning_curve import warm_start_eval\n"
    "from tlt_jax.evaluation import problems_digest\n"
    "class Fast:\n"
    "  calls = 0\n"
    "  def evaluate(self, trainer, warm):\n"
    "    Fast.calls += 1\n"
    "    return {'accuracy': 0.25}\n"
    "runs = SimpleNamespace(evals=[{'question': '1+1=', 'answer': '2'}])\n"
    f"row = warm_start_eval({path!r}, Fast(), runs, None)\n"
    "assert row['accuracy'] == 0.25 and Fast.calls == 1, row\n"
    f"assert json.load(open({path!r}))['eval']['problems'] == problems_digest(runs.evals)\n"
    f"assert warm_start_eval({path!r}, Fast(), runs, None)['accuracy'] == 0.25\n"
    "assert Fast.calls == 1\n"
    "other = [{'question': '2+2=', 'answer': '4'}]\n"
    "stage = {'eval': {'accuracy': 0.5, 'problems': problems_digest(other)}}\n"
    f"json.dump(stage, open({path!r}, 'w'))\n"
    f"assert warm_start_eval({path!r}, Fast(), runs, None)['accuracy'] == 0.25\n"
    "assert Fast.calls == 2\n"
    f"assert json.load(open({path!r}))['eval_of_other_problems']['accuracy'] == 0.5\n"
  )
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def tiny_tlt_run(tmp_path_factory):
  """A tiny tlt run of 2 steps, checkpointed after each (its folder)."""
  from configs import default
  from tlt_jax import compare

  c = default.get_config("tiny")
  c.rl.update(steps=2, checkpoint_every=1)
  out = str(tmp_path_factory.mktemp("tiny_tlt") / "out")
  compare.run_interleaved(c, out, ["tlt"], 0, 2, progress=False)
  return os.path.join(out, "tlt_s0")


def test_drafter_eval_checkpoints_restores_a_tlt_runs_saved_drafter(tmp_path, tiny_tlt_run):
  """experiments/drafter_eval_checkpoints.py on a tiny tlt run: the policy and online
  drafter it saved at a checkpoint, against the frozen warm start on slices of held-out
  prompts (the same run twice: equal figures, the saved version); a step without a
  checkpoint is named."""
  import json
  import subprocess

  run, rep = tiny_tlt_run, tmp_path / "eval.json"
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cmd = [
    sys.executable,
    "experiments/drafter_eval_checkpoints.py",
    "--config=configs/default.py:tiny",
    f"--runs={run},{run}",
    "--labels=a,b",
    "--prompts=4",
  ]
  step1 = [*cmd, "--step=1", f"--out={rep}"]
  done = subprocess.run(step1, cwd=root, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  got = json.loads(rep.read_text())
  assert got["prompts"] == 4 and len(got["frozen"]) == got["slices"] == 1
  a, b = got["runs"]["a"], got["runs"]["b"]
  with open(os.path.join(run, "metrics.jsonl")) as f:
    row = json.loads(f.readline())  # step 0's, the one checkpoint 1 closed
  assert a["version"] == row["drafter/version"] >= 1  # the saved drafter, not the warm start
  assert a["online"] == b["online"] and a["online_minus_frozen"]["pairs"] == 1
  done = subprocess.run([*cmd, "--step=7"], cwd=root, capture_output=True, text=True)
  assert done.returncode != 0 and "has no step 7" in done.stderr


def test_replay_step_reproduces_a_tlt_runs_rollout_with_plain_decoding(tmp_path, tiny_tlt_run):
  """experiments/replay_step.py: step 1 of a tiny tlt run (speculative rollouts, an online
  drafter) rolled out again with plain decoding under the policy its checkpoint 1 holds
  gives every row's recorded tokens; a recorded token digest changed, or (in a run from
  before digests) a length changed by one, is caught (exit 1); a step without a checkpoint
  is named."""
  import json
  import subprocess

  run = str(tmp_path / "run")
  shutil.copytree(tiny_tlt_run, run)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = tmp_path / "replay.json"
  cmd = [sys.executable, "experiments/replay_step.py", f"--run={run}", f"--out={out}"]
  done = subprocess.run([*cmd, "--step=1"], cwd=root, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  got = json.loads(out.read_text())
  assert got["rows"] == 8 and got["differing_rows"] == 0 and got["compared"] == "tokens"
  with open(os.path.join(run, "metrics.jsonl")) as f:
    row = [json.loads(line) for line in f][1]
  assert row["spec/tokens"] > 0  # step 1 itself decoded speculatively
  lengths = os.path.join(run, "rollout_lengths.jsonl")
  with open(lengths) as f:
    steps = [json.loads(line) for line in f]

  def replay_tampered():
    """The replay of step 1 against the record as `steps` now holds it: (the row it
    names, what it compared)."""
    with open(lengths, "w") as f:
      f.write("".join(json.dumps(s) + "\n" for s in steps))
    done = subprocess.run([*cmd, "--step=1"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 1 and "1 of 8 rows differ" in done.stdout, done.stderr[-3000:]
    got = json.loads(out.read_text())
    (row,) = got["calls"][0]["differing_rows"]
    return row, got["compared"]

  record = steps[1]
  record["digests"][0][3] ^= 1  # one bit of row 3's token digest
  assert replay_tampered() == (3, "tokens")
  record["digests"][0][3] ^= 1
  del record["digests"]  # a run from before digests: lengths only
  record["rollouts"][0][2] += 1
  assert replay_tampered() == (2, "lengths")
  done = subprocess.run([*cmd, "--step=2"], cwd=root, capture_output=True, text=True)
  assert done.returncode != 0 and "has no step 2" in done.stderr


def test_checkpoint_digests_match_a_run_with_itself_and_name_what_differs(tmp_path, tiny_tlt_run):
  """experiments/checkpoint_digests.py: a run against its copy hashes alike at every step;
  against a copy whose saved final norm moved by 1e-3 it differs at every step, most
  there, by that much; the runs' schedule horizons."""
  import json
  import subprocess

  import orbax.checkpoint as ocp

  same, moved = str(tmp_path / "same"), str(tmp_path / "moved")
  shutil.copytree(tiny_tlt_run, same)
  shutil.copytree(tiny_tlt_run, moved)
  manager = ocp.CheckpointManager(os.path.join(moved, "checkpoints"))
  for step in manager.all_steps():
    args = ocp.args.Composite(state=ocp.args.StandardRestore())
    state = manager.restore(step, args=args)["state"]
    state["params"]["final_norm"]["scale"] = state["params"]["final_norm"]["scale"] + 1e-3
    manager.delete(step)
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)), force=True)
  manager.wait_until_finished()
  out = tmp_path / "digests.json"
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  runs = f"--runs={tiny_tlt_run},{same},{moved}"
  cmd = [sys.executable, "experiments/checkpoint_digests.py", runs, f"--out={out}"]
  done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  rep = json.loads(out.read_text())
  assert [row["step"] for row in rep["steps"]] == [1, 2]
  assert set(rep["schedule_horizons"].values()) == {2}
  for row in rep["steps"]:
    d = row["digests"]
    assert d[tiny_tlt_run] == d[same] != d[moved]
    assert list(row["differ"]) == [moved]
    (name, value), (_, second) = row["differ"][moved][:2]
    assert "final_norm" in name and value == pytest.approx(1e-3, rel=1e-3) and second == 0
  assert "differs from" in done.stdout


@pytest.mark.parametrize(
  "run,own_costs",
  [
    ("simulator_regime_hostG_2026-12-06/curve_hostG", ""),
    # Its tlt run records the rollout's parts and accept lengths by batch bucket.
    ("simulator_parts_hostG_2026-12-07/rerun_buckets", ""),
    # Both runs record their rollouts' timelines: each priced by its own calls.
    ("simulator_runcosts_hostG_2026-12-07", "per_step"),
  ],
)
def test_simulate_validates_a_committed_run_step_by_step(run, own_costs):
  """experiments/simulate.py --validate on a committed baseline + tlt run with its host's
  engine costs: a row per run and variant, and per-step ratios that average, weighted by
  each step's measured rollout, to the run's predicted mean; where the run recorded its
  rollout's parts, a table of them per variant whose measured and predicted cells add up,
  with the drafter's scheduler, to each step's measured and predicted rollout. With
  --run_costs, each run says it is priced by its own calls, with a drift per step."""
  import json
  import subprocess

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  results = os.path.join(root, "experiments", "results")
  run = os.path.join(results, run)
  costs = os.path.join(results, "simulator_regime_hostG_2026-12-06", "engine_costs.json")
  cmd = [
    sys.executable,
    "experiments/simulate.py",
    f"--engine_costs={costs}",
    f"--validate={run}",
    "--reward_noise=0.2",
    *([f"--run_costs={own_costs}"] if own_costs else []),
  ]
  done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  priced = [line for line in done.stdout.splitlines() if ": priced by its own calls" in line]
  assert [line.split(":")[0] for line in priced] == (["baseline_s0", "tlt_s0"] if own_costs else [])
  rows = [[c.strip() for c in line.strip("|").split("|")] for line in done.stdout.splitlines()]
  means = {r[0]: r for r in rows if len(r) == 6 and r[1].isdigit()}
  steps = {r[0]: [float(x) for x in r[1].split()] for r in rows if len(r) == 2 and r[0] in means}
  assert sorted(steps) == [
    "baseline_s0",
    "tlt_s0",
    "tlt_s0, bandit replayed",
    "tlt_s0, its arm mix",
  ]
  tables = _part_tables(done.stdout)
  for name, ratios in steps.items():
    with open(os.path.join(run, name.split(",")[0], "metrics.jsonl")) as f:
      metrics = [json.loads(line) for line in f][1:]  # the first step compiles: left out
    measured = [m["time/rollout"] - m["time/rollout_compile"] for m in metrics]
    assert len(ratios) == int(means[name][1]) == len(measured)
    for line in priced:
      if line.startswith(name.split(",")[0] + ":"):
        assert len(line.split("against them: ")[1].split()) == len(ratios)
    got, want = means[name][2].split(" / ")
    assert float(got) == pytest.approx(np.mean(measured), abs=0.01)
    predicted = [r * m for r, m in zip(ratios, measured, strict=True)]
    assert np.mean(predicted) == pytest.approx(float(want), rel=0.01)
    if not any("time/rollout_part/prefill" in m for m in metrics):
      assert name not in tables
      continue
    assert [step for step, _ in tables[name]] == [m["step"] for m in metrics]
    for (_, cells), m, want_m, want_p in zip(
      tables[name], metrics, measured, predicted, strict=True
    ):
      scheduler = m.get("drafter/rollout_charged_s", 0.0)
      assert sum(c[0] for c in cells) + scheduler == pytest.approx(want_m, abs=0.05)
      assert sum(c[1] for c in cells) + scheduler == pytest.approx(want_p, rel=0.01, abs=0.05)
  assert bool(tables) == ("2026-12-07" in run)
  assert bool(priced) == bool(own_costs)


def _part_tables(stdout: str) -> dict[str, list[tuple[int, list[tuple[float, float]]]]]:
  """simulate.py --validate's tables of rollout parts: per run and variant, per step, its
  number and each part's (measured, predicted) seconds."""
  tables, name = {}, None
  for line in stdout.splitlines():
    if line.endswith(": rollout seconds by part, measured / predicted"):
      name = line.split(": rollout seconds by part")[0]
      tables[name] = []
    elif name and line.startswith("| ") and line[2].isdigit():
      step, *cells = [c.strip() for c in line.strip("|").split("|")]
      tables[name].append((int(step), [tuple(map(float, c.split(" / "))) for c in cells]))
  return tables


def test_beside_compile_pace_compares_each_cells_chunks_beside_a_compile_and_alone():
  """experiments/beside_compile_pace.py: per cell, the median pace (seconds a step or round)
  of chunks beside a background compile over that of chunks alone; a cell's first chunk,
  compiling chunks and cells short of chunks on either side are left out."""
  from experiments.beside_compile_pace import pace_table, run_timelines

  def chunk(dt, units=2, spec=True, **extra):
    cell = {"phase": "spec", "strategy": "chain4", "rounds": units} if spec else {}
    cell = cell or {"phase": "decode", "steps": units}
    return {"batch": 8, "view": 128, "dt": dt, **cell, **extra}

  spec = [chunk(9.0)]  # the cell's first chunk: its program's first run
  spec += [chunk(2.0, beside_compile=True), chunk(2.2, beside_compile=True)]
  spec += [chunk(50.0, compile_s=4.0, beside_compile=True), chunk(1.0), chunk(1.1)]
  plain = [chunk(1.0, spec=False), chunk(3.0, spec=False, beside_compile=True)]
  plain.append(chunk(1.0, spec=False))
  table = pace_table([spec, plain], min_chunks=2)
  assert list(table["cells"]) == ["chain4/8/128"]  # plain: one chunk on each side
  cell = table["cells"]["chain4/8/128"]
  assert (cell["beside"], cell["alone"]) == (2, 2)
  assert cell["ratio"] == pytest.approx(1.05 / 0.525)
  assert pace_table([spec, plain], min_chunks=1)["ratios"] == pytest.approx([2.0, 3.0])
  # A committed CPU run: beside a compile the chunks ran slower than alone (2 cores).
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = os.path.join(root, "experiments/results/background_compiles_hostG_2026-12-07/tlt_s0")
  ratios = pace_table(run_timelines(run))["ratios"]
  assert len(ratios) >= 10 and sorted(ratios)[len(ratios) // 2] > 1.2


def test_bench_startup_times_each_variants_imports(tmp_path):
  """experiments/bench_startup.py: each variant's path comes first in the timed processes, so
  two versions of one module are told apart by their import seconds; the slow one's own
  seconds head the list of heaviest modules."""
  import json
  import subprocess

  slow, fast = tmp_path / "slow", tmp_path / "fast"
  for folder, body in ((slow, "import time\ntime.sleep(0.5)\n"), (fast, "X = 1\n")):
    folder.mkdir()
    (folder / "startup_probe.py").write_text(body)
  out = tmp_path / "startup.json"
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cmd = [sys.executable, "experiments/bench_startup.py", "--modules=startup_probe", "--reps=2"]
  cmd += [f"--variants=slow={slow},fast={fast}", f"--out={out}"]
  done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  table = json.loads(out.read_text())["report"]["startup_probe"]
  assert table["slow"]["import_s"]["min"] >= 0.5 > table["fast"]["import_s"]["max"]
  assert table["slow"]["wall_s"]["min"] >= 0.5  # the process's seconds hold its imports'
  assert table["fast"]["first_over_this"] > 2.0 and table["slow"]["first_over_this"] == 1.0
  assert next(iter(table["heaviest_own_s"])) == "startup_probe"
  assert "import startup_probe [fast]:" in done.stdout


def test_bench_gc_traces_every_process_of_a_command_under_each_variant(tmp_path):
  """experiments/bench_gc.py: the command and the process it starts both record their
  collections; under "default" settle_heap changes nothing, under "settled" it freezes the
  start-up heap and young collections become rarer."""
  import json
  import subprocess

  probe = tmp_path / "probe.py"
  probe.write_text(
    "import subprocess, sys\n"
    "from tlt_jax.utils import collector\n"
    "collector.settle_heap()\n"
    "class Node:\n  pass\n"
    "for _ in range(400_000):\n  node = Node()\n  node.me = node\n"
    "if len(sys.argv) == 1:\n"
    "  subprocess.run([sys.executable, __file__, 'child'], check=True)\n"
  )
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = tmp_path / "gc"
  cmd = [sys.executable, "experiments/bench_gc.py", "--reps=1", f"--out={out}", "--"]
  cmd += [sys.executable, str(probe)]
  done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  runs = json.loads((out / "bench_gc.json").read_text())["runs"]
  default, settled = runs["default"][0], runs["settled"][0]
  assert default["processes"] == settled["processes"] == 2
  assert default["frozen"] == 0 < settled["frozen"]
  # 400,000 cycles a process: a young collection every 700 of them, or every 50,000.
  assert default["count"][0] - settled["count"][0] > 2 * (400_000 // 700 - 400_000 // 50_000) - 100
  assert default["full_collected"] + settled["full_collected"] > 0  # the cycles were found
  assert "settled #0: wall" in done.stdout

"""tlt_jax.compare's tables from hand-written step rows."""

import json
import os
import re
import sys

import pytest

from tlt_jax import compare, configuration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from configs import hf_grpo  # noqa: E402


def _row(mode, step, chunks, accept):
  return {
    "mode": mode,
    "step": step,
    "arm_chunks": json.dumps(chunks),
    "arm_accept": json.dumps(accept),
  }


def test_arms_by_epoch_sums_chunks_and_weights_accept_by_chunks():
  rows = [
    _row("tlt", 0, {"plain": 2, "group8": 1}, {"group8": 1.5}),
    _row("tlt", 1, {"group8": 3, "chain4": 1}, {"group8": 2.5, "chain4": 4.0}),
    _row("tlt", 2, {"group8": 2}, {"group8": 3.0}),
    _row("baseline", 0, {"plain": 5}, {}),
  ]
  epochs = compare.arms_by_epoch(rows, steps_per_epoch=2)
  got = {(e["mode"], e["epoch"]): e for e in epochs}
  assert set(got) == {("tlt", 0), ("tlt", 1), ("baseline", 0)}
  first = got[("tlt", 0)]
  assert first["chunks"] == {"plain": 2, "group8": 4, "chain4": 1}
  assert first["accept_length"]["group8"] == pytest.approx((1.5 * 1 + 2.5 * 3) / 4)
  assert first["accept_length"]["chain4"] == 4.0 and "plain" not in first["accept_length"]
  assert got[("tlt", 1)]["accept_length"] == {"group8": 3.0}
  table = compare.arms_markdown(epochs).splitlines()
  assert table[0] == "| run | epoch | chain4 | group8 | plain |"
  assert "| tlt | 0 | 1 (4.00) | 4 (2.25) | 2 |" in table
  with pytest.raises(ValueError, match="steps_per_epoch"):
    compare.arms_by_epoch(rows, 0)


def test_arms_by_epoch_reads_the_trainers_epoch_and_weights_accept_by_row_rounds():
  # A local data file of any size: the trainer records each step's pass over it.
  rows = [
    {**_row("tlt", 0, {"group8": 1}, {"group8": 1.5}), "data_epoch": 0},
    {**_row("tlt", 1, {"group8": 1}, {"group8": 3.0}), "data_epoch": 0},
    {**_row("tlt", 2, {"group8": 2}, {"group8": 2.0}), "data_epoch": 1},
  ]
  rows[0]["arm_row_rounds"] = json.dumps({"group8": 30})  # a chunk of 30 row-rounds
  rows[1]["arm_row_rounds"] = json.dumps({"group8": 10})
  got = {e["epoch"]: e for e in compare.arms_by_epoch(rows, steps_per_epoch=100)}
  assert set(got) == {0, 1}
  assert got[0]["chunks"] == {"group8": 2}
  assert got[0]["accept_length"]["group8"] == pytest.approx((1.5 * 30 + 3.0 * 10) / 40)
  assert got[1]["accept_length"] == {"group8": 2.0}  # no row-rounds recorded: by chunks


def _step(mode, step, step_s, checkpoint_s=0.0, eval_s=0.0, evaluated=""):
  """A `run_modes` row: `step_row`'s fields the tables read, and the checkpoint seconds."""
  return {
    "mode": mode,
    "step": step,
    "step_s": step_s,
    "rollout_s": step_s / 2,
    "checkpoint_s": checkpoint_s,
    "eval_s": eval_s,
    "eval": evaluated,
    "generate_s": "",
    "tail_s": "",
    "reward": 0.25,
    "accept_length": "",
  }


def _results(*modes):
  return {m: {"summary": {"rl": {}}, "mode": m, "seed": 0} for m in modes}


def test_no_speedup_rests_on_steps_that_checkpointed():
  """The reported 0.08x: 3 steps, the first compiling, the last carrying a checkpoint
  window that in tlt holds drafter updates. No clean step is left: no ratio, a sentence."""
  rows = [
    _step("baseline", 0, 9.0),
    _step("baseline", 1, 1.0),
    _step("baseline", 2, 1.2, checkpoint_s=0.2),
    _step("tlt", 0, 9.0),
    _step("tlt", 1, 0.9),
    _step("tlt", 2, 15.0, checkpoint_s=14.0),
  ]
  table = compare.mode_table(_results("baseline", "tlt"), rows)
  assert "step_speedup" not in table["tlt"] and table["tlt"]["ratio_steps"] == 1
  text = compare.side_by_side(table, rows)
  assert "x" not in text.splitlines()[2].split()[3]  # tlt's speedup column: "-"
  assert "no speedup: only 1 step(s) free of the first step's compiles, checkpoints and" in text
  assert "a ratio needs 3" in text and "0.08x" not in text
  assert "no speedup" in compare.markdown(table)


def test_speedup_over_the_clean_steps_says_how_many():
  """Steps that checkpointed or evaluated (and the first) are left out of the ratio."""
  rows = []
  for mode, speed in (("baseline", 1.0), ("tlt", 2.0)):
    rows += [_step(mode, 0, 10.0)]  # compiles
    rows += [_step(mode, s, 4.0 / speed) for s in (1, 2, 4, 5)]
    rows += [_step(mode, 3, 50.0, checkpoint_s=40.0)]  # a checkpoint window
    rows += [_step(mode, 6, 30.0, eval_s=0.0, evaluated=0.5)]  # held-out evaluation
    rows += [_step(mode, 7, 30.0, eval_s=3.0)]  # drafter evaluation (time/eval only)
  table = compare.mode_table(_results("baseline", "tlt"), rows)
  t = table["tlt"]
  assert t["ratio_steps"] == 4 and t["clean_steps"] == 4
  assert t["step_speedup"] == pytest.approx(2.0) and t["step_s"] == pytest.approx(2.0)
  text = compare.side_by_side(table, rows)
  assert re.search(r"^tlt .* 2\.00x ", text, re.M)
  assert "speedups over 4 step(s) in common: the first step (compiles) and those that" in text
  assert "| 2.00x (4) |" in compare.markdown(table)


def _checkpoint(path, seed=0):
  """A tiny Qwen3-layout checkpoint with a ChatML BPE tokenizer (as tests/test_hf_job.py)."""
  from bpe_helpers import write_qwen3_checkpoint

  return write_qwen3_checkpoint(path, seed=seed, rope_theta=10000.0)


def _checkpoint_config(tmp_path, ckpt):
  """A comparison of a few seconds a step: the tiny checkpoint policy on sums."""
  data = tmp_path / "sums.jsonl"
  rows = [
    {"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}={a + b}. #### {a + b}"}
    for a in range(1, 7)
    for b in range(1, 5)
  ]
  data.write_text("".join(json.dumps(r) + "\n" for r in rows))
  c = hf_grpo.get_config()
  c.model.checkpoint, c.task.path, c.task.test_fraction = str(ckpt), str(data), 0.25
  c.model.dtype, c.rl_update.remat = "float32", False  # fewer, faster compiles on a CPU
  c.engine.update(
    max_prompt_len=48, max_new_tokens=16, max_batch=8, spec_threshold=8, min_batch_bucket=4,
    min_cache_bucket=64, min_prompt_bucket=48, chunk_steps=8, spec_strategies=("chain2",),
    spec_rounds=2,
  )  # fmt: skip
  c.eval.num_examples = 2
  c.rl.update(steps=1, prompts_per_step=2, group_size=2, eval_examples=2, dynamic_sampling=False)
  c.rl_update.update(micro_batch=2, warmup_steps=0)
  c.drafter.update(warmup_prompts=4, offline_steps=2, batch_rows=2, buffer_rows=32)
  c.scheduler.long_tail_batch = 4
  return c


def test_compare_on_a_checkpoint_policy_reuses_its_warm_starts(tmp_path, monkeypatch):
  """--compare with --config.model.checkpoint: the policy is the checkpoint (no SFT warm
  start is written, none is copied), the drafter's warm start is built once in
  <out>/shared and reused by a rerun, and another checkpoint's comparison is refused there."""
  ckpt = _checkpoint(tmp_path / "ckpt")
  c = _checkpoint_config(tmp_path, ckpt)
  out = tmp_path / "out"
  # One mode shows it (each mode's folder was given a copy of the missing policy warm start).
  results, _ = compare.run_modes(c, str(out), ["tlt"], [0], progress=False)
  shared = out / "shared"
  assert (shared / "drafter_warm_start").is_dir() and not (shared / "warm_start").exists()
  summary = results["tlt"]["summary"]
  assert summary["warm_start"]["source"] == str(ckpt) and summary["rl"]["steps"] == 1
  assert not (out / "tlt" / "warm_start").exists()
  assert (out / "tlt" / "drafter_warm_start").is_dir()
  assert summary["drafter_warm_start"]["source"].endswith("drafter_warm_start")  # reused

  # A rerun finds the shared warm starts finished: nothing is built or evaluated there again.
  def rebuilt(*args, **kwargs):
    raise AssertionError("the shared warm starts were built again")

  monkeypatch.setattr(compare.train, "train_and_evaluate", rebuilt)
  assert compare.prepare_shared(c.copy_and_resolve_references(), str(out)) == str(shared)
  other = c.copy_and_resolve_references()
  other.model.checkpoint = str(_checkpoint(tmp_path / "other", seed=1))
  with pytest.raises(configuration.ConfigError, match="holds the warm starts of another policy"):
    compare.prepare_shared(other, str(out))


def test_an_interleaved_comparison_cut_short_resumes_from_its_checkpoints(tmp_path):
  """run_interleaved(resume=True) continues each run from its last checkpoint: the steps
  measured before keep their rows (times included), the rest run; without resume the runs
  start afresh."""
  c = _checkpoint_config(tmp_path, _checkpoint(tmp_path / "ckpt"))
  c.rl.update(steps=2, checkpoint_every=1)
  out = str(tmp_path / "out")
  _, first, _ = compare.run_interleaved(c, out, ["baseline"], 0, 1, progress=False)
  c.rl.steps = 3
  _, resumed, _ = compare.run_interleaved(c, out, ["baseline"], 0, 1, progress=False, resume=True)
  rows = resumed["baseline_s0"]
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert rows[:2] == first["baseline_s0"]  # not rerun: the same measured seconds


def test_an_interleaved_comparison_warms_its_engines_up_first(tmp_path):
  """With rl.warmup_engine every run's rollout programs compile before its first step
  (`compare.warm_up`): step 0's rollout compiles nothing, and the row carries the step's
  response-length median and maximum (the long tail's bar)."""
  c = _checkpoint_config(tmp_path, _checkpoint(tmp_path / "ckpt"))
  c.rl.warmup_engine = True
  runs, rows, _ = compare.run_interleaved(
    c, str(tmp_path / "out"), ["baseline"], 0, 1, progress=False
  )
  run = runs["baseline_s0"]
  assert run["warmup_s"] > 0
  with open(run["trainer"].metrics_path) as f:
    (metrics,) = [json.loads(line) for line in f]
  assert metrics["time/rollout_compile"] == 0.0
  (row,) = rows["baseline_s0"]
  assert 1 <= row["length_median"] <= row["length_max"]


def test_a_shared_folder_built_from_another_recipe_is_refused(tmp_path, monkeypatch):
  """prepare_shared reuses finished warm starts only when they were built from the same
  model, task, SFT and drafter settings (shared/config.json): a changed SFT step count or
  demonstrator is named in the error instead of silently starting from the old policy."""
  from configs import default

  c = default.get_config("tiny")
  shared = tmp_path / "shared"
  for piece in ("warm_start", "drafter_warm_start"):
    (shared / piece).mkdir(parents=True)
  built = c.copy_and_resolve_references()
  built.task.data_dir = str(shared / "tfds")
  (shared / "config.json").write_text(built.to_json_best_effort(indent=2))

  def rebuilt(*args, **kwargs):
    raise AssertionError("the shared warm starts were built again")

  monkeypatch.setattr(compare.train, "train_and_evaluate", rebuilt)
  same = c.copy_and_resolve_references()
  same.rl.steps += 5  # RL settings are not part of the warm start
  same.sft.key_windows = (256,)  # nor how fast attention ran (the same result)
  assert compare.prepare_shared(same, str(tmp_path)) == str(shared)
  other = c.copy_and_resolve_references()
  other.sft.steps += 1
  with pytest.raises(configuration.ConfigError, match=r"sft\.steps: \d+ there, \d+ here"):
    compare.prepare_shared(other, str(tmp_path))

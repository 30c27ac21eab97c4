"""The default job end to end on the tiny config, and the CLI's errors."""

import json
import os
import re
import subprocess
import sys

import pytest

from tlt_jax import configuration
from tlt_jax.data import CharTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs import default  # noqa: E402


def _cli(*args, cwd=ROOT):
  return subprocess.run(
    [sys.executable, "-m", "tlt_jax.main", *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=600,
  )


def _read_json(*parts):
  with open(os.path.join(*parts)) as f:
    return json.load(f)


def test_default_job_runs_on_tiny_config(tmp_path):
  workdir = str(tmp_path / "wd")
  out = _cli(
    "--config=configs/default.py:tiny",
    f"--workdir={workdir}",
    "--config.rollout.num_samples=2",
    "--config.rl.eval_samples=2",
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "tokens/s" in out.stdout and "response lengths" in out.stdout
  # A quiet terminal: library INFO / WARNING lines (tfds, orbax) go to the workdir's log.
  assert not re.search(r"^[IW]\d{4} ", out.stderr, re.M), out.stderr[-2000:]
  logs = [f for f in os.listdir(workdir) if f.startswith("tlt_jax.") and ".INFO" in f]
  assert logs and any(os.path.getsize(os.path.join(workdir, f)) > 0 for f in logs)
  summary = _read_json(workdir, "summary.json")
  assert summary["rollout"]["sequences"] == 4
  # Lazy compiles are counted and kept out of the throughput.
  r = summary["rollout"]
  assert r["executables"] > 0
  assert (r["compiled_during_rollout"] > 0) == (r["compile_seconds"] > 0)
  assert r["compile_seconds"] < r["wall_seconds"]
  # The chunks that compiled lazily are marked in the timeline, within the counted seconds.
  timeline = _read_json(workdir, "timeline.json")
  assert sum(e.get("compile_s", 0.0) for e in timeline) <= r["compile_seconds"] + 1e-9
  assert f"{r['compiled_during_rollout']} of them compiled during this rollout" in out.stdout
  assert r["tokens_per_second"] == pytest.approx(
    r["generated_tokens"] / (r["wall_seconds"] - r["compile_seconds"])
  )
  assert os.path.getsize(os.path.join(workdir, "rollout.png")) > 1000
  assert _read_json(workdir, "config.json")["rollout"]["num_samples"] == 2
  assert os.path.isdir(os.path.join(workdir, "warm_start"))
  assert summary["rl"]["steps"] == 2 and "GRPO steps" in out.stdout
  assert os.path.getsize(os.path.join(workdir, "rl.png")) > 1000
  assert 0 < summary["rl"]["rollout_share"] < 1
  # Sampled pass@1 beside greedy, at the warm start and after RL, in the printed summary.
  e, final = summary["eval"], summary["rl"]["final_eval"]
  # The warm start's: 2 samples of each problem, each scored 0 or 1.
  n = 2 * e["num_examples"]
  k = e["sampled_accuracy"] * n
  assert 0 <= e["sampled_accuracy"] <= 1 and k == pytest.approx(round(k))
  assert 0 <= final["sampled_accuracy"] <= 1
  assert (
    f"sampled {final['sampled_accuracy']:.3f} (warm start {e['sampled_accuracy']:.3f})"
    in out.stdout
  )


def test_summary_prints_the_configs_measured_ranges():
  """The default config carries the README's measured ranges and the summary prints them
  beside the run's own figures; the tiny config has none and prints none."""
  from tlt_jax.reporting import format_summary

  ref = default.get_config().reference.to_dict()
  assert not default.get_config("tiny").get("reference")
  summary = {
    "model_params": 8e5,
    "warm_start": {"source": "sft"},
    "eval": {"accuracy": 0.5, "num_examples": 100, "sampled_accuracy": 0.3},
    "rollout": {
      "sequences": 2,
      "generated_tokens": 10,
      "wall_seconds": 1.0,
      "tokens_per_second": 10.0,
      "compile_seconds": 0.0,
      "mean_reward": 0.5,
      "lengths": {"median": 5.0},
      "batch_buckets_used": [2],
      "executables": 1,
      "executable_temp_MB": 1.0,
      "compiled_during_rollout": 0,
    },
  }
  assert "measured ranges" not in format_summary(summary)
  text = format_summary({**summary, "reference": ref})
  for value in ref.values():
    assert value in text


def test_tlt_mode_trains_the_drafter_online_and_exports_it(tmp_path):
  """--compare=baseline,tlt: one warm start, then both modes; in tlt the drafter's warm
  start, speculative rollouts, online updates in idle slices and the standalone drafter
  artifact at the end; rewards equal to the baseline's step for step (the same tokens)."""
  from tlt_jax.drafter.export import load_drafter

  # No closing rollout report (covered above): its warm-up compiles every SD program.
  out = _cli(
    "--config=configs/default.py:tiny",
    f"--workdir={tmp_path}",
    "--compare=baseline,tlt",
  )
  assert out.returncode == 0, out.stderr[-3000:]
  workdir = str(tmp_path / "tlt")
  summary = _read_json(workdir, "summary.json")
  assert summary["mode"] == "tlt" and summary["rl"]["drafter_updates"] > 0
  assert _read_json(tmp_path, "baseline", "summary.json")["mode"] == "baseline"
  assert os.path.isdir(tmp_path / "shared" / "drafter_warm_start")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  # The bandit may run the last step's chunks plain; some step ran speculative chunks.
  assert rows[-1]["drafter/version"] > 3 and any("spec/accept_length" in r for r in rows)
  _, _, _, info = load_drafter(os.path.join(workdir, "drafter"))
  assert info["mode"] == "tlt" and info["version"] == rows[-1]["drafter/version"]
  # The printed comparison: both runs, one reward per step and run, equal; no speedup, since
  # the tiny config checkpoints every step and the first compiles (a ratio needs 3 steps
  # free of both: tests/test_compare.py), and a sentence that says so.
  assert re.search(r"^baseline .* - ", out.stdout, re.M), out.stdout
  assert re.search(r"^tlt .* - ", out.stdout, re.M), out.stdout
  assert "no speedup: only 0 step(s) free of the first step's compiles" in out.stdout
  steps = re.findall(r"^  step +(\d+): (\S+) \| (\S+)$", out.stdout, re.M)
  assert [int(s) for s, _, _ in steps] == [r["step"] for r in rows]
  assert all(a == b for _, a, b in steps) and len(steps) == 2
  for r, (_, reward, _) in zip(rows, steps):
    assert float(reward) == pytest.approx(r["reward_mean"], abs=1e-4)


def test_compare_names_modes_it_knows(tmp_path):
  workdir = tmp_path / "wd"
  out = _cli("--config=configs/default.py:tiny", f"--workdir={workdir}", "--compare=baseline,fast")
  assert out.returncode == 2 and "Traceback" not in out.stderr
  assert "error: --compare / --modes: each must be one of" in out.stderr
  assert not workdir.exists()  # refused before anything was made


def test_a_bad_config_value_is_one_line_naming_the_field(tmp_path):
  out = _cli(
    "--config=configs/default.py:tiny",
    f"--workdir={tmp_path / 'wd'}",
    "--config.task.checker=bogus",
  )
  assert out.returncode == 2
  assert "error: config.task.checker: Unknown checker 'bogus'" in out.stderr
  assert "Traceback" not in out.stderr
  assert not os.path.exists(tmp_path / "wd" / "tfds")  # refused before the data was built


def test_mode_flag_is_checked():
  config = default.get_config("tiny")
  tok = CharTokenizer()
  config.mode = "fast"
  with pytest.raises(ValueError, match="config.mode must be one of"):
    configuration.engine_config(config, tok)
  config.mode = "sd"
  config.engine.spec_threshold = 0
  with pytest.raises(ValueError, match="spec_threshold > 0"):
    configuration.engine_config(config, tok)
  config.mode = "baseline"
  assert configuration.engine_config(config, tok).spec_threshold == 0


def test_every_engine_setting_a_user_may_change_is_in_the_default_config():
  """`configs/default.py`'s engine section names every `EngineConfig` field but those the
  job sets itself, so a command line can change any of them (`--config.engine.<field>=`:
  ml_collections refuses a key its config does not hold)."""
  import dataclasses

  from tlt_jax.rollout.config import EngineConfig

  set_by_the_job = {"stop_tokens", "harvest_hidden", "harvest_dtype"}  # tokenizer, mode, drafter
  fields = {f.name for f in dataclasses.fields(EngineConfig)}
  assert fields - set(default.get_config().engine) == set_by_the_job


def _rows_written(path):
  """Complete lines of a file that another process may be writing (a poll can land
  mid-line)."""
  with open(path) as f:
    return f.read().count("\n")


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  # Timings, and the update's FLOP rate (seconds differ between runs).
  timed = ("time/", "update/model_tflops")
  return [{k: v for k, v in r.items() if not k.startswith(timed)} for r in rows]


# The tiny policy never solves a problem: an entropy bonus on every token (no dynamic
# sampling) makes each update change the weights, so resuming them exactly matters.
_SIGKILL_ARGS = [
  "--config=configs/default.py:tiny",
  "--config.rl.steps=5",
  "--config.rl.dynamic_sampling=False",
  "--config.rl_loss.entropy_coef=0.01",
  "--config.rollout.num_prompts=0",  # no closing rollout report: not what is tested here
]
# What the drafter changes (speed, its own figures), and the rollout log-probs' agreement
# with the trainer's: the engine records them from a multi-token forward when it speculates.
_NOT_POLICY = (
  "time/",
  "spec/",
  "drafter/",
  "logp_rollout_vs_trainer_max_abs",
  "update/model_tflops",  # a rate: seconds differ between runs
)


def _policy_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if not k.startswith(_NOT_POLICY)} for r in rows]


@pytest.fixture(scope="module")
def uninterrupted_baseline(tmp_path_factory):
  """The reference of both SIGKILL tests: an uninterrupted baseline run, once per module."""
  ref = str(tmp_path_factory.mktemp("ref"))
  out = _cli(*_SIGKILL_ARGS, f"--workdir={ref}")
  assert out.returncode == 0, out.stderr[-3000:]
  return ref


@pytest.mark.parametrize("mode", ["baseline", "sd", "tlt"])
def test_sigkill_mid_run_resumes_exactly(tmp_path, uninterrupted_baseline, mode):
  """Killed with SIGKILL between RL steps, the job resumes from its last checkpoint and
  the following steps' metrics equal those of an uninterrupted run.

  Modes sd and tlt are compared with the uninterrupted BASELINE run (same seeds): sampled
  speculative decoding is coupled (tlt_jax/decode/verify.py), every token the Gumbel-max
  plain decoding draws from the same (sequence, position) key, so the rollouts, and with
  them the rewards, losses, updates and evaluations, do not depend on the drafter, the
  bandit's arm choices, the drafter versions pushed in the long tail or any wall-clock
  scheduling (up to floating-point near-ties, vanishingly rare). Every policy figure must
  therefore equal baseline's, before and after the kill; the drafter's own state (params,
  optimizer, buffer, scheduler estimates) is resumed from its checkpoint beside the
  policy's (tests/test_engine_spec.py checks that state exactly)."""
  import signal
  import time

  args = [*_SIGKILL_ARGS, f"--config.mode={mode}"]
  wd = str(tmp_path / "killed")
  proc = subprocess.Popen(
    [sys.executable, "-m", "tlt_jax.main", *args, f"--workdir={wd}"],
    cwd=ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  path = os.path.join(wd, "metrics.jsonl")
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(path) and _rows_written(path) >= 2:
      break
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert _rows_written(path) < 5, "the run finished before it could be killed"
  out = _cli(*args, f"--workdir={wd}")
  assert out.returncode == 0, out.stderr[-3000:]
  # The rerun says where it resumes (the lock the killed job held went with it).
  assert re.search(r"RL resumes at step [1-4] of 5 from the checkpoint in ", out.stderr)
  if mode == "baseline":  # the same mode: every figure but the timings
    want, got = _metrics(uninterrupted_baseline), _metrics(wd)
  else:
    want, got = _policy_metrics(uninterrupted_baseline), _policy_metrics(wd)
    with open(path) as f:
      rows = [json.loads(line) for line in f]
    assert any("spec/accept_length" in r for r in rows), "no step speculated"
    if mode == "tlt":
      assert rows[-1]["drafter/version"] >= 5  # online updates: at least one each step
  assert [r["step"] for r in got] == [0, 1, 2, 3, 4]
  # The per-step files beside the metrics lost the killed run's tail too (a row per step).
  for name in ("rollout_lengths", "rollout_timelines"):
    with open(os.path.join(wd, f"{name}.jsonl")) as f:
      assert [json.loads(line)["step"] for line in f] == [0, 1, 2, 3, 4], name
  assert all(r["update_tokens"] > 0 for r in got)
  # The evaluation after the last step (the tiny config evaluates only there).
  assert [("eval" in r) for r in got] == [("eval" in r) for r in want] and "eval" in got[-1]
  for a, b in zip(want, got):
    assert b.pop("eval", None) == a.pop("eval", None)
    assert b.pop("first_token_share") == a.pop("first_token_share")  # JSON text
    assert b == pytest.approx(a, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
  "override,message",
  [
    (
      "--config.sampling.tempratur=1.0",
      "error: --config.sampling.tempratur: the config has no field 'tempratur' "
      '(did you mean "temperature"?)',
    ),
    ("--config.samplng.top_p=0.5", "error: --config.samplng.top_p: the config has no field"),
    ("--config.rollout.num_samples=abc", "error: flag --config.rollout.num_samples=abc:"),
    ("--worklog=x", "error: Unknown command line flag 'worklog'"),
  ],
)
def test_cli_rejects_typos_and_bad_types_in_one_line(tmp_path, override, message):
  out = _cli("--config=configs/default.py:tiny", f"--workdir={tmp_path / 'wd'}", override)
  assert out.returncode == 2
  assert out.stderr.strip() == out.stderr.strip().splitlines()[-1] and message in out.stderr
  assert not (tmp_path / "wd").exists()  # refused before anything was made


@pytest.mark.parametrize(
  "section,field,value,message",
  [
    ("sampling", "top_p", 2.0, "config.sampling: top_p must be in"),
    ("sampling", "temperature", -1.0, "config.sampling: temperature"),
    ("engine", "chunk_steps", 0, "config.engine: EngineConfig.chunk_steps"),
    ("engine", "spec_strategies", ("chian3",), "config.engine: unknown speculative strategy"),
    ("engine", "spec_threshold", 9, r"config.engine: EngineConfig.spec_threshold must be"),
    ("model", "num_kv_heads", 3, "config.model: num_heads"),
    ("model", "vocab_size", 10, "smaller than the tokenizer"),
  ],
)
def test_invalid_values_fail_with_the_config_path(section, field, value, message):
  config = default.get_config("tiny")
  config.mode = "sd"  # speculative settings are checked in the modes that use them
  config[section][field] = value
  tok = CharTokenizer()
  with pytest.raises(ValueError, match=message):
    configuration.model_config(config, tok)
    configuration.sampling_config(config)
    configuration.engine_config(config, tok)


def test_a_short_run_with_a_longer_runs_schedule_steps_has_its_optimizer():
  """rl_update.schedule_steps: the learning-rate schedule's horizon apart from rl.steps, so
  a 5-step rerun of a 40-step run takes the very optimizer (so the very updates) of that
  run's first 5 steps; 0 spans the run; a horizon shorter than the run is refused."""
  long, short = default.get_config("tiny"), default.get_config("tiny")
  long.rl.steps, short.rl.steps = 40, 5
  _, _, spanning = configuration.rl_configs(short)
  short.rl_update.schedule_steps = 40
  _, _, want = configuration.rl_configs(long)
  _, _, got = configuration.rl_configs(short)
  assert got == want and got.total_steps == 40 and spanning.total_steps == 5
  short.rl_update.mini_batches = 2  # the schedule counts optimizer steps
  assert configuration.rl_configs(short)[2].total_steps == 80
  short.rl_update.schedule_steps = 4
  with pytest.raises(configuration.ConfigError, match="shorter than rl.steps=5"):
    configuration.rl_configs(short)
  short.rl_update.schedule_steps = -1
  with pytest.raises(configuration.ConfigError, match="schedule_steps must be an int"):
    configuration.rl_configs(short)


def test_sd_bench_config_is_a_50m_policy():
  from configs import sd_bench

  config = sd_bench.get_config()
  tok = CharTokenizer()
  assert 50e6 <= configuration.model_config(config, tok).num_params <= 100e6
  configuration.engine_config(config, tok)


def test_sd_bench_countdown_variant_fits_its_rows():
  """The countdown variant is the same 50M policy; a prompt and its capped search trace fit
  one SFT row and the engine's budget (no target is cut), and unknown variants fail."""
  from configs import group_epochs, sd_bench
  from tlt_jax.data.tasks import get_task

  config = sd_bench.get_config("countdown")
  tok = CharTokenizer()
  assert 50e6 <= configuration.model_config(config, tok).num_params <= 100e6
  examples = get_task("countdown").generate(0, 500, **config.task.params.to_dict())
  longest = max(len(e["question"]) + len(e["solution"]) for e in examples)
  assert longest + 2 <= config.sft.row_len
  with pytest.raises(ValueError, match="unknown variant"):
    sd_bench.get_config("countdwon")
  # The multi-epoch config: prompts recur (8 problems, 2 per step, 16 steps = 4 epochs), the
  # whole rollout is speculative, and group and hybrid drafts are arms of its bandit.
  epochs = group_epochs.get_config()
  epochs.mode = "tlt"  # the speculative settings apply in modes sd and tlt
  rl, _, _ = configuration.rl_configs(epochs)
  configuration.sft_config(epochs)
  assert rl.steps * rl.prompts_per_step >= 4 * epochs.task.train_size
  engine = configuration.engine_config(epochs, tok)
  assert engine.spec_threshold >= rl.prompts_per_step * rl.group_size <= engine.max_batch
  assert {"group8", "hybrid8"} <= set(engine.spec_strategies) and engine.group_history >= 1
  assert max(len(e["solution"]) for e in examples) + 1 <= engine.max_new_tokens


def test_regime_config_is_in_tlts_regime():
  """configs/regime.py keeps the properties its docstring claims: weights beyond a 32 MB
  L3, few rows per engine call (near the measured b* of 4-12) and several calls a step,
  every parameter trained, reasoning-like lengths (the careful effort's median >= 120
  tokens, the longest >= 10x it) from its task's generator within the engine's token
  budget, and a demonstrator mixing a careful and a (mostly) hasty effort, judged by
  outcome alone."""
  import numpy as np

  from configs import regime
  from tlt_jax.data.tasks import get_task

  config = regime.get_config()
  tok = CharTokenizer()
  model = configuration.model_config(config, tok)
  assert model.num_params * 4 >= 1.5 * 32 * 2**20
  rl, _, update = configuration.rl_configs(config)
  assert 4 <= rl.rows_per_call <= 11 and rl.prompts_per_step * rl.group_size >= 8 * rl.rows_per_call
  assert update.trainable == "" and rl.steps >= 40 and update.lr_multipliers
  assert rl.process_credit == ""
  engine = configuration.engine_config(config, tok)
  assert engine.max_batch == rl.rows_per_call == config.engine.spec_threshold
  task = get_task(config.task.name)
  examples = task.generate(0, 4000, **config.task.params.to_dict())
  lengths = np.array([len(e["solution"]) for e in examples])
  careful = np.array([e["solution"].startswith("~") for e in examples])
  assert 0.1 < careful.mean() < 0.3
  # The policy RL leads to (careful) and the warm start's mix, both long-tailed.
  assert np.median(lengths[careful]) >= 120 and np.median(lengths) >= 75
  assert lengths.max() >= 10 * np.median(lengths[careful])
  assert lengths.max() < engine.max_new_tokens
  # The first SFT stages' rows hold all but ~5% of the solutions, rows of 2,048 (the
  # tenth stage's, experiments/regime_warm_start.sh) all but ~1%.
  assert np.mean(lengths + 16 > config.sft.row_len) < 0.07
  assert np.mean(lengths + 16 > 2048) < 0.02
  prompts = [len(e["question"]) for e in examples]
  assert max(prompts) + 1 <= engine.max_prompt_len
  # Every solution stops by format: its last line is the answer (right or, hasty, not),
  # after the line whose counter says one step (or, hasty, two) was left.
  assert all(e["solution"].rsplit("#", 1)[1].isdigit() for e in examples)
  assert all(e["solution"].rsplit(";", 2)[-2].lstrip("~!")[:2] in ("1:", "2:") for e in examples)
  # One update program: every sample fits a row, and the rows a step fills fit the floor.
  assert update.pack_width == engine.slots and update.min_rows >= 16
  # Online drafter updates wait for a whole step's rows, in every variant.
  for variant in ("", "gpu", "small", "tiny"):
    c = regime.get_config(variant)
    want = c.rl.prompts_per_step * c.rl.group_size
    assert configuration.drafter_config(c).min_rows == want <= c.drafter.buffer_rows


def test_regime_gpu_variant_is_the_cpu_curve_at_a_gpus_rows(tmp_path):
  """configs/regime.py:gpu runs from the CPU curve's warm start, carried over: the recipe
  check accepts a folder the CPU variant built; the RL is the CPU's; one engine call holds a
  step's rows; few batch buckets, one update program (every response fits a row, and the
  step's rows fit the floor), and the engine compiled before the first step."""
  from configs import regime

  cpu, config = regime.get_config(""), regime.get_config("gpu")
  (tmp_path / "warm_start").mkdir()
  (tmp_path / "config.json").write_text(cpu.to_json_best_effort())
  configuration.check_same_recipe(config, str(tmp_path), "no")
  assert cpu.rl_loss.to_dict() == config.rl_loss.to_dict()
  differ = {k for k, v in cpu.rl.to_dict().items() if config.rl[k] != v}
  assert differ == {"rows_per_call", "warmup_engine"}
  assert (config.rl_update.learning_rate, config.rl_update.lr_multipliers) == (
    cpu.rl_update.learning_rate,
    cpu.rl_update.lr_multipliers,
  )
  tok = CharTokenizer()
  rl, _, update = configuration.rl_configs(config)
  engine = configuration.engine_config(config, tok)
  assert rl.rows_per_call == 0 and engine.max_batch == rl.prompts_per_step * rl.group_size
  assert len(engine.batch_buckets) <= 6 and config.rl.warmup_engine
  assert update.pack_width == engine.slots and update.min_rows >= 16


def test_packed_warm_start_restores_to_the_models_dtype(tmp_path):
  """experiments/pack_warm_start.py: the policy travels as bfloat16 and restores into the
  float32 model within bfloat16's rounding; the drafter's warm start and the config travel
  as they are; the summary loses the unrounded policy's evaluation."""
  import jax
  import numpy as np
  from flax import nnx
  from tiny_models import TINY_UNTIED

  from experiments.common import pack_warm_starts
  from tlt_jax import checkpoint
  from tlt_jax.models.transformer import init_model

  shared, out = tmp_path / "shared", tmp_path / "packed"
  _, params = nnx.split(init_model(TINY_UNTIED, seed=0))
  checkpoint.save_params(shared / "warm_start", params)
  checkpoint.save_params(shared / "drafter_warm_start", params)
  (shared / "config.json").write_text("{}")
  (shared / "summary.json").write_text(json.dumps({"eval": {"accuracy": 0.5}, "mode": "sd"}))
  summary = pack_warm_starts(str(shared), str(out))
  assert "eval" not in json.loads((out / "summary.json").read_text())
  assert summary["packed"]["unpacked_eval"] == {"accuracy": 0.5}
  restored = checkpoint.restore_params(out / "warm_start", params)
  pairs = [
    (np.asarray(a), np.asarray(b)) for a, b in zip(*map(jax.tree.leaves, (params, restored)))
  ]
  for a, b in pairs:
    assert b.dtype == np.float32
    np.testing.assert_allclose(b, a, rtol=2**-8, atol=0)
  assert any(not np.array_equal(a, b) for a, b in pairs)  # rounded, not copied
  drafter = checkpoint.restore_params(out / "drafter_warm_start", params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(drafter), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_committed_regime_warm_start_fits_the_gpu_variant():
  """The warm start gpu_curve.sh carries (experiments/warm_starts/): built from the gpu
  variant's recipe, and it restores into that variant's policy as float32."""
  import jax
  import numpy as np
  from flax import nnx

  from configs import regime
  from tlt_jax import checkpoint
  from tlt_jax.models.transformer import init_model

  folder = os.path.join(ROOT, "experiments", "warm_starts", "regime_stage11_hostJ_2026-12-04")
  with open(os.path.join(ROOT, "experiments", "gpu_curve.sh")) as f:
    assert os.path.relpath(folder, ROOT) in f.read()  # the script's default
  config = regime.get_config("gpu")
  configuration.check_same_recipe(config, folder, "no")
  model_cfg = configuration.model_config(config, CharTokenizer())
  _, params = nnx.split(init_model(model_cfg, seed=0))
  restored = jax.tree.leaves(checkpoint.restore_params(os.path.join(folder, "warm_start"), params))
  assert sum(x.size for x in restored) == model_cfg.num_params
  assert all(x.dtype == np.float32 and np.isfinite(x).all() for x in restored)


def test_process_credit_takes_the_tasks_step_checker():
  from tlt_jax import train
  from tlt_jax.data.tasks import get_task

  assert train._step_reward_fn(get_task("arithmetic"), "") is None
  steps = train._step_reward_fn(get_task("arithmetic"), "step")
  assert steps({"question": "1,a+2="}, "1;a+2=3;#3") == [(2, 1.0), (8, 1.0), (10, 1.0)]
  with pytest.raises(ValueError, match="has no step checker"):
    train._step_reward_fn(get_task("countdown"), "step")


def test_unknown_variant():
  with pytest.raises(ValueError, match="unknown config variant"):
    default.get_config("huge")


def test_sft_starts_from_init_from(tmp_path):
  """config.sft.init_from: SFT continues from that warm start (with a vanishing rate the
  result is that policy), and a missing directory is a config error before any data."""
  import jax
  import numpy as np

  from tlt_jax import train

  config = default.get_config("tiny")
  tok = CharTokenizer()
  train_split, _ = train.load_data(config, str(tmp_path))
  donor = tmp_path / "donor"
  _, _, donor_params, _ = train.build_policy(config, str(donor), tok, train_split, progress=False)
  config.sft.learning_rate = 1e-30
  _, _, fresh, info = train.build_policy(config, str(tmp_path / "a"), tok, train_split, False)
  assert info["sft_init_from"] is None
  config.sft.init_from = str(donor / "warm_start")
  _, _, cont, info = train.build_policy(config, str(tmp_path / "b"), tok, train_split, False)
  assert info["sft_init_from"] == config.sft.init_from
  close = lambda a, b: jax.tree.map(lambda x, y: np.allclose(x, y, rtol=0, atol=1e-6), a, b)
  same = lambda a, b: all(jax.tree.leaves(close(a, b)))
  assert same(cont, donor_params)
  assert not same(fresh, donor_params)  # a start from scratch is another policy
  config.sft.init_from = str(tmp_path / "missing")
  with pytest.raises(configuration.ConfigError, match="config.sft.init_from"):
    train.train_and_evaluate(config, str(tmp_path / "c"), progress=False)
  assert not os.path.exists(tmp_path / "c" / "tfds")


def test_the_online_drafter_starts_from_the_warm_starts_parameters_alone(tmp_path):
  """train.build_drafter: whether the drafter's warm start is fitted in this run or restored
  from the workdir, mode tlt trains on from the same state: the warm start's parameters, a
  new optimizer state at the online rate, an empty buffer, version 0 (a run that fitted it
  used to carry the fit's optimizer state, buffer and count on)."""
  import jax
  import numpy as np

  from tlt_jax import checkpoint, train

  config = default.get_config("tiny")
  config.mode = "tlt"
  config.drafter.online_learning_rate = 5e-4
  fitted = train.prepare(config, str(tmp_path), progress=False).drafter  # fits it here
  restored = train.prepare(config, str(tmp_path), progress=False).drafter  # restores it
  saved = checkpoint.restore_params(tmp_path / "drafter_warm_start", fitted.params)
  for drafter in (fitted, restored):
    assert drafter.version == 0 and len(drafter.buffer) == 0
    assert drafter.config.learning_rate == 5e-4
    new_state = drafter.optimizer.init(drafter.params)
    pairs = [(drafter.params, saved), (drafter.opt_state, new_state)]
    for got, want in pairs:
      for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  fit = configuration.drafter_config(config, online=False)
  assert fit.learning_rate == config.drafter.learning_rate != 5e-4


def test_the_online_rate_is_not_part_of_the_warm_starts_recipe(tmp_path):
  """drafter.online_learning_rate, keep_steps and min_rows act after the warm start, and
  logit_chunk and remat_attention change only the update's memory: a folder built at others
  is reused; another fit rate is refused; a negative rate is a
  config error."""
  built = default.get_config("")
  (tmp_path / "drafter_warm_start").mkdir()
  (tmp_path / "config.json").write_text(built.to_json_best_effort())
  online = built.copy_and_resolve_references()
  online.drafter.online_learning_rate = 1e-4
  online.drafter.keep_steps = 8
  online.drafter.min_rows = 128
  online.drafter.logit_chunk = 64  # the update's memory, not what it computes
  online.drafter.remat_attention = True
  configuration.check_same_recipe(online, str(tmp_path), "no")
  assert configuration.drafter_config(online).learning_rate == 1e-4
  assert configuration.drafter_config(online).min_rows == 128
  # The fit observes all its rows before it updates: min_rows is the online phase's.
  assert configuration.drafter_config(online, online=False).min_rows == 1
  fit = built.copy_and_resolve_references()
  fit.drafter.learning_rate = 1e-4
  with pytest.raises(configuration.ConfigError, match="drafter.learning_rate"):
    configuration.check_same_recipe(fit, str(tmp_path), "no")
  online.drafter.online_learning_rate = -1.0
  with pytest.raises(configuration.ConfigError, match="online_learning_rate must be"):
    configuration.drafter_config(online)

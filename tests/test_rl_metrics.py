"""Metrics to Weights & Biases and MLflow (stand-in modules put in sys.modules, so nothing is
skipped when the packages are absent), the config section, and the progress bar's figures."""

from __future__ import annotations

import json
import sys
import types

import ml_collections
import numpy as np
import pytest
from flax import nnx
from rl_helpers import IdTokenizer, seven_reward, tiny_grpo
from tiny_models import ONE_PROGRAM_ENGINE, TINY_ONE_LAYER

from tlt_jax.configuration import ConfigError
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.rl import PolicyLossConfig, UpdateConfig
from tlt_jax.rl.metrics import (
  MetricsConfig,
  MetricsLog,
  metrics_config,
  progress_postfix,
  rollout_part_metrics,
  spec_metrics,
)
from tlt_jax.rl.trainer import GRPOTrainer
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.rollout.result import RolloutResult


class FakeWandb(types.ModuleType):
  """wandb's init / run.log / run.finish, recording every call."""

  def __init__(self):
    super().__init__("wandb")
    self.inits, self.logged, self.finished = [], [], 0
    self.fail = False

  def init(self, **kwargs):
    self.inits.append(kwargs)
    module = self

    class Run:
      id = kwargs["id"]

      def log(self, data, step):
        if module.fail:
          raise ConnectionError("offline")
        module.logged.append((step, dict(data)))

      def finish(self):
        module.finished += 1

    return Run()


class FakeMlflow(types.ModuleType):
  """mlflow's fluent API: one active run at a time, metrics by step, a config artifact."""

  def __init__(self):
    super().__init__("mlflow")
    self.experiments, self.starts, self.logged, self.artifacts, self.ended = [], [], [], [], 0

  def set_experiment(self, name):
    self.experiments.append(name)

  def start_run(self, run_id=None, run_name=None):
    self.starts.append((run_id, run_name))
    return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id or "run-1"))

  def log_metrics(self, metrics, step):
    self.logged.append((step, dict(metrics)))

  def log_dict(self, data, path):
    self.artifacts.append((path, data))

  def end_run(self):
    self.ended += 1


@pytest.fixture
def trackers(monkeypatch):
  wandb, mlflow = FakeWandb(), FakeMlflow()
  monkeypatch.setitem(sys.modules, "wandb", wandb)
  monkeypatch.setitem(sys.modules, "mlflow", mlflow)
  return wandb, mlflow


def _row(step):
  return {
    "step": step,
    "reward_mean": 0.25 * step,
    "accuracy": 0.5,
    "skipped": True,  # a bool: not a metric
    "note": "text",
    "eval": {"accuracy": 0.75},
    "rollout_lengths": [[3, 4]],
  }


def _log(workdir, config):
  return MetricsLog(
    str(workdir / "metrics.jsonl"),
    str(workdir / "rollout_lengths.jsonl"),
    str(workdir / "tensorboard"),
    purge_step=0,
    config=config,
  )


def test_rows_go_to_wandb_and_mlflow_and_a_resume_keeps_the_runs(tmp_path, trackers):
  wandb, mlflow = trackers
  (tmp_path / "config.json").write_text(json.dumps({"seed": 3, "rl": {"steps": 2}}))
  cfg = MetricsConfig(loggers="wandb, mlflow", project="proj")
  assert cfg.loggers == ("wandb", "mlflow")
  log = _log(tmp_path, cfg)
  log.write(_row(0))
  log.write(_row(1))
  log.close()
  want = [(s, {"reward_mean": 0.25 * s, "accuracy": 0.5, "eval/accuracy": 0.75}) for s in (0, 1)]
  assert wandb.logged == want and mlflow.logged == want
  (init,) = wandb.inits
  assert init["project"] == "proj" and init["name"] == tmp_path.name
  assert init["resume"] == "allow" and init["dir"] == str(tmp_path)
  assert init["config"] == {"seed": 3, "rl": {"steps": 2}}
  assert mlflow.experiments == ["proj"] and mlflow.starts == [(None, tmp_path.name)]
  assert mlflow.artifacts == [("config.json", {"seed": 3, "rl": {"steps": 2}})]
  assert wandb.finished == 1 and mlflow.ended == 1
  # metrics.jsonl as before; the lengths apart.
  rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [0, 1] and "rollout_lengths" not in rows[0]
  # A resumed run logs to the same W&B and MLflow runs (ids kept in the workdir).
  log = _log(tmp_path, MetricsConfig(loggers=("wandb", "mlflow"), run_name="again"))
  log.write(_row(2))
  log.close()
  assert wandb.inits[1]["id"] == init["id"] and wandb.inits[1]["name"] == "again"
  assert mlflow.starts[1] == ("run-1", None) and len(mlflow.artifacts) == 1
  assert wandb.logged[-1][0] == 2 and mlflow.logged[-1][0] == 2


def test_a_tracker_outage_does_not_stop_the_run(tmp_path, trackers):
  wandb, _ = trackers
  log = _log(tmp_path, MetricsConfig(loggers=("wandb",)))
  wandb.fail = True
  log.write(_row(0))
  wandb.fail = False
  log.write(_row(1))
  log.close()
  assert log.tracker_errors == 1 and [s for s, _ in wandb.logged] == [1]
  assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_default_logs_to_files_only(tmp_path, trackers):
  wandb, mlflow = trackers
  log = _log(tmp_path, None)
  log.write(_row(0))
  log.close()
  assert not wandb.inits and not mlflow.starts and (tmp_path / "metrics.jsonl").exists()
  assert not (tmp_path / "wandb_run_id").exists()


def test_config_errors(monkeypatch):
  with pytest.raises(ValueError, match="not one of"):
    MetricsConfig(loggers=("tensorboard",))
  section = ml_collections.ConfigDict({"metrics": {"loggers": "", "projct": "x"}})
  with pytest.raises(ConfigError, match="config.metrics: unknown field.*projct"):
    metrics_config(section)
  with pytest.raises(ConfigError, match="config.metrics: loggers"):
    metrics_config(ml_collections.ConfigDict({"metrics": {"loggers": "neptune"}}))
  assert metrics_config(ml_collections.ConfigDict({"seed": 0})) == MetricsConfig()
  # Not installed: refused when the config is read, not at the first step.
  monkeypatch.delitem(sys.modules, "wandb", raising=False)
  monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
  with pytest.raises(ValueError, match=r"pip install 'tlt_jax\[wandb\]'"):
    MetricsConfig(loggers="wandb")


def test_progress_postfix():
  row = {
    "reward_mean": 0.4567,
    "accuracy": 0.25,
    "length_mean": 41.6,
    "rollout_tokens": 900,
    "time/rollout": 2.0,
  }
  assert progress_postfix(row) == {"reward": "0.46", "acc": "0.25", "len": "42", "tok/s": "450"}
  tlt = progress_postfix({**row, "spec/accept_length": 2.345, "drafter/version": 7})
  assert tlt["accept"] == "2.35" and tlt["drafter"] == "v7"
  assert "tok/s" not in progress_postfix({**row, "time/rollout": 0.0})


def _two_step_trainer(workdir, grpo=None, **kw) -> GRPOTrainer:
  """Two RL steps of a one-layer policy on eight three-token prompts."""
  graphdef, params = nnx.split(init_model(TINY_ONE_LAYER, seed=0))
  engine = RolloutEngine(
    graphdef, TINY_ONE_LAYER, ONE_PROGRAM_ENGINE, SamplingConfig(temperature=1.0)
  )
  prompts = [{"question": f"{i} {i + 1} {i + 2}", "answer": ""} for i in range(1, 9)]
  return GRPOTrainer(
    graphdef, params, engine, IdTokenizer(), prompts, prompts[:2], seven_reward,
    lambda ex: ex["question"], grpo or tiny_grpo(2, 4), PolicyLossConfig(),
    UpdateConfig(learning_rate=1e-3, total_steps=4, micro_batch=4), str(workdir), **kw,
  )  # fmt: skip


def test_trainer_logs_every_step_and_shows_throughput(tmp_path, trackers, capsys):
  """The trainer hands its MetricsConfig to the log: each step's numbers reach W&B at that
  step, and the progress bar shows the rollout's tokens per second."""
  wandb, _ = trackers
  trainer = _two_step_trainer(tmp_path, metrics=MetricsConfig(loggers=("wandb",), project="p"))
  rows = trainer.run(progress=True)
  assert [s for s, _ in wandb.logged] == [0, 1] and wandb.finished == 1
  for row, (_, logged) in zip(rows, wandb.logged, strict=True):
    assert logged["reward_mean"] == row["reward_mean"]
    assert np.isclose(logged["time/rollout"], row["time/rollout"])
  assert "tok/s=" in capsys.readouterr().err
  # Each step's rollout seconds by part: the prefill and plain chunks, inside the rollout.
  for row in rows:
    parts = {k: v for k, v in row.items() if k.startswith("time/rollout_part/")}
    assert {"time/rollout_part/prefill", "time/rollout_part/plain"} <= parts.keys()
    assert min(parts.values()) >= 0 and sum(parts.values()) <= row["time/rollout"]


def _result(timeline):
  rows = np.zeros((1, 1), np.int32)
  one = np.ones(1, np.int32)
  return RolloutResult(rows, rows.astype(np.float32), None, one, one, one, timeline, 1.0)


def test_rollout_parts_are_device_calls_by_arm_without_compiles():
  """A step's rollout seconds by part, from hand-written timelines: a rebuild's compile is
  counted in its chunk's compile_s too (the pool's seconds over both), so it comes off the
  rebuild alone; a rebuild a drafter push forced is the scheduler's, host entries are
  nobody's part; two rollouts of a step add up."""
  first = [
    {"phase": "prefill", "dt": 1.5, "compile_s": 1.0},
    {"phase": "decode", "dt": 0.25},
    {"phase": "drafter_prefill", "dt": 2.5, "rebuild_compile_s": 2.0},
    {"phase": "spec", "strategy": "chain4", "dt": 4.0, "compile_s": 3.0},  # 2.0 + its own 1.0
    {"phase": "harvest", "dt": 0.5},
    {"phase": "drafter_hook", "dt": 0.5},
    {"phase": "drafter_prefill", "dt": 0.75, "forced_by_push": True},
    {"phase": "spec", "strategy": "chain4", "dt": 2.0},
    {"phase": "decode", "strategy": "plain", "dt": 0.5},
  ]
  second = [{"phase": "prefill", "dt": 0.25}, {"phase": "decode", "dt": 0.25}]
  assert _result(first).seconds_by_part() == {
    "prefill": 0.5,
    "plain": 0.75,
    "drafter_prefill": 0.5,
    "chain4": 5.0,
  }
  assert rollout_part_metrics([_result(first), _result(second)]) == {
    "time/rollout_part/prefill": 0.75,
    "time/rollout_part/plain": 1.0,
    "time/rollout_part/drafter_prefill": 0.5,
    "time/rollout_part/chain4": 5.0,
  }
  assert rollout_part_metrics([]) == {}


def test_spec_metrics_count_the_chunks_run_while_the_bandits_pick_compiled():
  """ "spec/chunks_instead": chunks another arm ran while the bandit's pick compiled in the
  background, over a step's rollouts, also where no drafting arm ran at all."""
  plain = {"phase": "decode", "batch": 4, "tokens": 8, "dt": 0.5, "instead_of": "chain2"}
  spec = {"phase": "spec", "strategy": "chain2", "batch": 4, "tokens": 12, "row_rounds": 4}
  spec |= {"rounds": 2, "accepted": 8, "dt": 1.0, "instead_of": "chain4"}
  assert spec_metrics([_result([plain])]) == {"spec/chunks_instead": 1}
  chosen = {k: v for k, v in spec.items() if k != "instead_of"}  # the bandit's pick ran
  got = spec_metrics([_result([plain]), _result([spec, chosen])])
  assert got["spec/chunks_instead"] == 2 and got["spec/accept_length"] == 3.0
  quiet = {k: v for k, v in plain.items() if k != "instead_of"}
  assert spec_metrics([_result([quiet])]) == {}


def test_a_profiled_step_leaves_a_trace_and_keeps_the_profilers_seconds_apart(tmp_path):
  """`GRPOConfig.profile_steps`: only the named step runs under the profiler, its trace in
  <workdir>/profile/step_<n> (experiments/traces.py's `program_summary` finds the update's
  program in it), and the profiler's start and stop are that row's time/profiler, outside
  its time/step."""
  import dataclasses
  import os

  from experiments.traces import program_summary

  trainer = _two_step_trainer(tmp_path, dataclasses.replace(tiny_grpo(2, 4), profile_steps=(1,)))
  rows = trainer.run()
  assert os.listdir(tmp_path / "profile") == ["step_1"]
  assert "time/profiler" not in rows[0] and rows[1]["time/profiler"] > 0
  summary = program_summary(str(tmp_path / "profile" / "step_1"))
  assert summary["wall_ms"] > 0 and summary["host_dispatch_ms_by_function"]
  with pytest.raises(ValueError, match="profile_steps"):
    dataclasses.replace(tiny_grpo(2, 4), profile_steps=(-1,))

"""What an RL run records per step: speculative-decoding figures of its rollouts, the
writers of metrics.jsonl, rollout_lengths.jsonl and TensorBoard, and optionally Weights &
Biases or MLflow (`MetricsConfig.loggers`), and the progress bar's figures."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging

# Trackers a run can also log to (each an optional extra: pip install 'tlt_jax[wandb]').
LOGGERS = ("wandb", "mlflow")


def spec_metrics(results: Sequence[Any]) -> dict[str, float]:
  """Speculative-decoding figures of a step's rollouts (nothing when SD never ran): the
  accept length over all speculative rounds, their tokens and seconds, and the arm mix
  (chunks per arm, plain decode included) with each draft arm's accept length and the
  row-rounds it is over ("spec/arm/<arm>/..."), also per batch bucket
  ("spec/bucket/<batch>/<arm>/..."); and the chunks another arm ran while the bandit's
  pick compiled in the background ("spec/chunks_instead", where there were any)."""
  instead = sum("instead_of" in e for r in results for e in r.timeline)
  out = {"spec/chunks_instead": instead} if instead else {}
  chunks = [s for s in (r.spec_summary() for r in results) if s["row_rounds"]]
  if not chunks:
    return out
  rounds = sum(s["row_rounds"] for s in chunks)
  out |= {
    "spec/accept_length": sum(s["accept_length"] * s["row_rounds"] for s in chunks) / rounds,
    "spec/tokens": sum(s["tokens"] for s in chunks),
    "spec/seconds": sum(s["seconds"] for s in chunks),
  }
  # Per arm, and per batch bucket and arm: a tail's rows accept fewer tokens than a full
  # bucket's, so one arm's mean differs with the buckets its bandit ran it in.
  per_arm: dict[str, list[int]] = {}
  per_bucket: dict[tuple[int, str], list[int]] = {}
  for r in results:
    for e in r.timeline:
      if e["phase"] in ("decode", "spec"):
        arm = e.get("strategy", "plain")
        for acc in (
          per_arm.setdefault(arm, [0, 0, 0]),
          per_bucket.setdefault((e["batch"], arm), [0, 0, 0]),
        ):
          acc[0] += 1
          if e["phase"] == "spec":
            acc[1] += e["tokens"]
            acc[2] += e["row_rounds"]
  named = [(f"spec/arm/{arm}", v) for arm, v in sorted(per_arm.items())]
  named += [(f"spec/bucket/{b}/{arm}", v) for (b, arm), v in sorted(per_bucket.items())]
  for name, (n, tokens, row_rounds) in named:
    out[f"{name}/chunks"] = n
    if row_rounds:
      out[f"{name}/accept_length"] = tokens / row_rounds
      out[f"{name}/row_rounds"] = row_rounds
  return out


def rollout_part_metrics(results: Sequence[Any]) -> dict[str, float]:
  """A step's rollout seconds by part (`RolloutResult.seconds_by_part`, summed over its
  rollouts) as "time/rollout_part/<part>": what a simulator's prediction is checked
  against part by part (`sim.validate`)."""
  out: dict[str, float] = {}
  for r in results:
    for part, seconds in r.seconds_by_part().items():
      out[f"time/rollout_part/{part}"] = out.get(f"time/rollout_part/{part}", 0.0) + seconds
  return out


def _microseconds(x: Any) -> Any:
  """`x` with its floats rounded to 6 decimals (timelines in seconds: a third the text)."""
  if isinstance(x, float):
    return round(x, 6)
  if isinstance(x, dict):
    return {k: _microseconds(v) for k, v in x.items()}
  if isinstance(x, list | tuple):
    return [_microseconds(v) for v in x]
  return x


def progress_postfix(row: Mapping[str, Any]) -> dict[str, str]:
  """The progress bar's figures of a step's metrics row: reward, accuracy, mean response
  length, rollout throughput (generated tokens per second of the step's rollout phase),
  and when speculative decoding ran the accept length, and the online drafter's version
  (mode tlt)."""
  out = {
    "reward": f"{row['reward_mean']:.2f}",
    "acc": f"{row['accuracy']:.2f}",
    "len": f"{row['length_mean']:.0f}",
  }
  seconds = row.get("time/rollout", 0.0)
  if seconds > 0 and "rollout_tokens" in row:
    out["tok/s"] = f"{row['rollout_tokens'] / seconds:.0f}"
  if "spec/accept_length" in row:
    out["accept"] = f"{row['spec/accept_length']:.2f}"
  if "drafter/version" in row:
    out["drafter"] = f"v{row['drafter/version']}"
  return out


def _loggers(value: str | Sequence[str]) -> tuple[str, ...]:
  items = value.split(",") if isinstance(value, str) else value
  return tuple(dict.fromkeys(s.strip() for s in items if s.strip()))


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
  """Where a run's metrics go besides metrics.jsonl and TensorBoard.

  Attributes:
    loggers: "wandb" and / or "mlflow" (a tuple, or a comma-separated string); each needs
      its package (`pip install 'tlt_jax[wandb]'`, `'tlt_jax[mlflow]'`). (): neither, the
      default.
    project: the W&B project, or the MLflow experiment.
    run_name: the run's name there ("": the workdir's name). A resumed run logs to the same
      W&B / MLflow run (its id is kept in the workdir: wandb_run_id, mlflow_run_id).
  """

  loggers: tuple[str, ...] | str = ()
  project: str = "tlt_jax"
  run_name: str = ""

  def __post_init__(self):
    loggers = _loggers(self.loggers)
    object.__setattr__(self, "loggers", loggers)
    for name in loggers:
      if name not in LOGGERS:
        raise ValueError(f"loggers: {name!r} is not one of {LOGGERS}")
      # Checked now, not at the first step: a run should not fail after its warm start.
      if name not in sys.modules and importlib.util.find_spec(name) is None:
        raise ValueError(
          f"loggers: {name!r} is not installed (pip install 'tlt_jax[{name}]', or drop it)"
        )
    if not self.project:
      raise ValueError("project must not be empty")


def _read(path: str) -> str | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return f.read().strip() or None


def _write(path: str, text: str) -> None:
  with open(path, "w") as f:
    f.write(text + "\n")


class _Wandb:
  """A Weights & Biases run; resumed from the id kept in the workdir."""

  def __init__(self, cfg: MetricsConfig, workdir: str, name: str, run_config: dict | None):
    wandb = importlib.import_module("wandb")
    id_path = os.path.join(workdir, "wandb_run_id")
    run_id = _read(id_path) or uuid.uuid4().hex[:16]
    _write(id_path, run_id)
    self.run = wandb.init(
      project=cfg.project, name=name, id=run_id, resume="allow", dir=workdir, config=run_config
    )

  def log(self, scalars: dict[str, float], step: int) -> None:
    self.run.log(scalars, step=step)

  def close(self) -> None:
    self.run.finish()


class _MLflow:
  """An MLflow run in experiment `project`; resumed from the id kept in the workdir."""

  def __init__(self, cfg: MetricsConfig, workdir: str, name: str, run_config: dict | None):
    self.mlflow = mlflow = importlib.import_module("mlflow")
    mlflow.set_experiment(cfg.project)
    id_path = os.path.join(workdir, "mlflow_run_id")
    run_id = _read(id_path)
    if run_id:
      mlflow.start_run(run_id=run_id)
    else:
      run = mlflow.start_run(run_name=name)
      _write(id_path, run.info.run_id)
      if run_config is not None:  # an artifact: no limits on size or count as for params
        mlflow.log_dict(run_config, "config.json")

  def log(self, scalars: dict[str, float], step: int) -> None:
    self.mlflow.log_metrics(scalars, step=step)

  def close(self) -> None:
    self.mlflow.end_run()


_TRACKERS = {"wandb": _Wandb, "mlflow": _MLflow}


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
  """Every number of a metrics row but its step (the nested eval dict as eval/<key>)."""
  flat = dict(row)
  for k, v in row.get("eval", {}).items():
    flat[f"eval/{k}"] = v
  return {
    k: float(v)
    for k, v in flat.items()
    if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
  }


class MetricsLog:
  """Appends each step's row to metrics.jsonl, its rollouts' response lengths to
  rollout_lengths.jsonl (the trace `tlt_jax.sim` replays), their timelines to
  `timelines_path` (the engine's calls as the run timed them, which `tlt_jax.sim` prices a
  replay with; None: not kept) and every number to TensorBoard
  (workdir/tensorboard), and to W&B / MLflow when `config.loggers` names them (the run's
  config.json, when the workdir has one, goes with them). `purge_step`: TensorBoard drops
  events a killed run logged past the checkpoint the run resumes from (W&B and MLflow keep
  theirs: a resumed run logs those steps again)."""

  def __init__(
    self,
    metrics_path: str,
    lengths_path: str,
    tensorboard_dir: str,
    purge_step: int,
    config: MetricsConfig | None = None,
    timelines_path: str | None = None,
  ):
    # Imported here: tensorboardX imports torch where it is installed (seconds), which
    # a process that only parses flags or reads results should not pay.
    from tensorboardX import SummaryWriter

    self.metrics_path, self.lengths_path = metrics_path, lengths_path
    self.timelines_path = timelines_path
    self.tb = SummaryWriter(tensorboard_dir, purge_step=purge_step)
    self.trackers = []
    self.tracker_errors = 0
    config = config or MetricsConfig()
    if config.loggers:
      workdir = os.path.dirname(os.path.abspath(metrics_path))
      run_config = None
      if os.path.exists(os.path.join(workdir, "config.json")):
        with open(os.path.join(workdir, "config.json")) as f:
          run_config = json.load(f)
      name = config.run_name or os.path.basename(workdir)
      try:
        for logger in config.loggers:
          self.trackers.append(_TRACKERS[logger](config, workdir, name, run_config))
      except BaseException:
        self.close()
        raise

  def write(self, row: dict[str, Any]) -> None:
    """Writes `row`; its "rollout_lengths", "rollout_prompt_lengths" and "rollout_digests"
    entries go to the lengths file only (as "rollouts", "prompts" and "digests": per
    rollout, one length or completion CRC-32 per row), its "rollout_timelines" to the
    timelines file only (as "rollouts": per rollout, {"wall": seconds, "timeline": entries})."""
    lengths = {"step": row["step"], "rollouts": row.pop("rollout_lengths")}
    for key, name in (("rollout_prompt_lengths", "prompts"), ("rollout_digests", "digests")):
      if key in row:
        lengths[name] = row.pop(key)
    with open(self.lengths_path, "a") as f:
      f.write(json.dumps(lengths) + "\n")
    timelines = row.pop("rollout_timelines", None)
    if timelines is not None and self.timelines_path:
      with open(self.timelines_path, "a") as f:
        f.write(json.dumps({"step": row["step"], "rollouts": _microseconds(timelines)}) + "\n")
    with open(self.metrics_path, "a") as f:
      f.write(json.dumps(row) + "\n")
    numbers = scalars(row)
    for k, v in numbers.items():
      self.tb.add_scalar(k, v, row["step"])
    self.tb.flush()
    for tracker in self.trackers:
      try:
        tracker.log(numbers, row["step"])
      except Exception as e:  # noqa: BLE001 - a tracker's outage must not stop training
        self.tracker_errors += 1
        logging.warning("%s could not log step %s: %s", type(tracker).__name__, row["step"], e)

  def close(self) -> None:
    self.tb.close()
    for tracker in self.trackers:
      tracker.close()
    self.trackers = []


def metrics_config(config: Any) -> MetricsConfig:
  """The job config's `metrics` section as a `MetricsConfig` (defaults when it has none);
  a bad field is a `configuration.ConfigError` naming it."""
  from tlt_jax.configuration import ConfigError  # here: configuration imports the trainer

  section = config.get("metrics", None)
  values = section.to_dict() if section is not None else {}
  fields = {f.name for f in dataclasses.fields(MetricsConfig)}
  unknown = sorted(set(values) - fields)
  if unknown:
    raise ConfigError(f"config.metrics: unknown field(s) {unknown}; valid: {sorted(fields)}")
  try:
    return MetricsConfig(**values)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.metrics: {e}") from None

"""Training modes side by side: baseline, sd and tlt on one warm start, their step times.

The same config, prompts and seeds; only `config.mode` differs. The policy's and the
drafter's warm starts are built once in <out>/shared and copied into each run's folder
<out>/<mode> (<out>/<mode>_s<seed> with several seeds). Since speculative rollouts are
token-identical to plain ones, the modes' rewards must match step for step; their step
times are what differs.

Used by `python -m tlt_jax.main --compare=baseline,tlt` (a short table) and by
experiments/e2e_modes.py (the full table, JSON, CSV and plot).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from tlt_jax import configuration, train

MODES = ("baseline", "sd", "tlt")
_WARM = ("warm_start", "drafter_warm_start")


class ModesError(ValueError):
  """A mode list that names no mode or an unknown one (checked before anything runs)."""


def check_modes(modes: list[str]) -> None:
  if not modes or any(m not in MODES for m in modes):
    raise ModesError(f"--compare / --modes: each must be one of {MODES}, got {modes}")


def check_inputs(config: ml_collections.ConfigDict, modes: list[str]) -> None:
  """Checks the modes and every config a comparison runs (the shared warm starts' in mode
  sd, then each mode's) before anything is built: `configuration.job_inputs` raises a
  `ConfigError` naming the field, the file or the row."""
  check_modes(modes)
  for mode in dict.fromkeys(("sd", *modes)):
    cfg = config.copy_and_resolve_references()
    cfg.mode = mode
    configuration.job_inputs(cfg)


def _shared_is_ready(config: ml_collections.ConfigDict, shared: str) -> bool:
  """Whether <out>/shared holds a finished warm start for this config: the drafter's, and
  the policy's unless the policy is a checkpoint (`model.checkpoint`: nothing is written
  for it, each run loads it). A shared folder of another checkpoint is refused."""
  if not os.path.isdir(os.path.join(shared, "drafter_warm_start")):
    return False
  configuration.check_same_recipe(
    config, shared, "give this comparison another output folder or delete that one"
  )
  ckpt = config.model.get("checkpoint", "")
  if not ckpt:
    return os.path.isdir(os.path.join(shared, "warm_start"))
  summary_path = os.path.join(shared, "summary.json")
  if not os.path.isfile(summary_path):
    return False  # the drafter was saved, the run was cut short after: train reuses it
  with open(summary_path) as f:
    source = json.load(f).get("warm_start", {}).get("source", "")
  if os.path.realpath(source) != os.path.realpath(ckpt):
    raise configuration.ConfigError(
      f"config.model.checkpoint={ckpt!r}: {shared} holds the warm starts of another policy "
      f"({source}); give this comparison another --workdir"
    )
  return True


def prepare_shared(config: ml_collections.ConfigDict, out: str, progress: bool = True) -> str:
  """Builds the SFT and drafter warm starts in <out>/shared once (reused when there; a
  checkpoint policy has no SFT warm start, only the drafter's)."""
  shared = os.path.join(out, "shared")
  config.task.data_dir = os.path.join(shared, "tfds")
  if not _shared_is_ready(config, shared):
    warm = config.copy_and_resolve_references()
    warm.mode, warm.rl.steps, warm.rollout.num_prompts = "sd", 0, 0
    # train_and_evaluate reuses a drafter warm start already saved there (a run cut short
    # after it): only what is missing is built.
    train.train_and_evaluate(warm, shared, progress=progress)
  return shared


def _copy_warm_starts(shared: str, workdir: str) -> None:
  """The warm starts in <out>/shared that exist, into a run's folder (with a checkpoint
  policy there is no SFT warm start: the run loads the checkpoint itself)."""
  for piece in _WARM:
    if os.path.isdir(os.path.join(shared, piece)):
      shutil.copytree(os.path.join(shared, piece), os.path.join(workdir, piece))


def run_modes(
  config: ml_collections.ConfigDict,
  out: str,
  modes: list[str],
  seeds: list[int],
  *,
  analyze_only: bool = False,
  keep_finished: bool = False,
  progress: bool = True,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """Runs every (seed, mode) in order (or reads the finished ones with `analyze_only`;
  `keep_finished` reads those and runs the rest, e.g. a seed added to an experiment).

  Returns ({label: {"summary", "mode", "seed", "wall_seconds"}}, one row per run and step
  as `step_row` makes them, with "checkpoint_s", the step's checkpoint seconds).
  """
  check_modes(modes)
  config = config.copy_and_resolve_references()
  if not analyze_only:
    check_inputs(config, modes)  # before the shared warm starts or any run's folder
  shared = None if analyze_only else prepare_shared(config, out, progress)
  results, rows = {}, []
  for seed in seeds:
    for mode in modes:
      label = mode if len(seeds) == 1 else f"{mode}_s{seed}"
      workdir = os.path.join(out, label)
      finished = os.path.isfile(os.path.join(workdir, "summary.json"))
      if analyze_only or (keep_finished and finished):
        if not finished:
          print(f"{label}: no finished run in {workdir}, left out")
          continue
        with open(os.path.join(workdir, "summary.json")) as f:
          results[label] = {"summary": json.load(f), "mode": mode, "seed": seed}
      else:
        if os.path.isdir(workdir):
          shutil.rmtree(workdir)  # a fresh run: resuming would skip the steps we time
        os.makedirs(workdir)
        _copy_warm_starts(shared, workdir)
        cfg = config.copy_and_resolve_references()
        cfg.mode, cfg.seed = mode, seed
        cfg.rollout.num_prompts = 0  # no closing rollout report: the RL steps are the measurement
        start = time.perf_counter()
        summary = train.train_and_evaluate(cfg, workdir, progress=progress)
        results[label] = {
          "summary": summary,
          "mode": mode,
          "seed": seed,
          "wall_seconds": time.perf_counter() - start,
        }
      # A checkpoint window (and in tlt the drafter updates it holds) inflates its step:
      # `mode_table` leaves such steps out of the ratios (the rows carry checkpoint_s).
      rows += read_step_rows(workdir, label)
  return results, rows


def read_step_rows(workdir: str, label: str) -> list[dict[str, Any]]:
  """The step rows (`step_row`) of the run in `workdir`, from its metrics.jsonl: a finished
  run's, or the steps a running or killed one has written (a line cut short by a kill is
  left out)."""
  rows = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      try:
        rows.append(step_row(label, json.loads(line)))
      except json.JSONDecodeError:
        continue
  return rows


def schedule_horizon(workdir: str) -> int | None:
  """The RL steps the learning-rate schedule of the run in `workdir` spans (from its
  config.json; None without one). Runs of one seed train the same policy only under the same
  horizon: past the warmup every step's rate depends on it (`rl_update.schedule_steps`)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  return configuration.schedule_steps(config, configuration.rl_steps(config))


def tokens_equal_steps(workdirs: list[str]) -> list[int]:
  """[steps whose rows drew the same tokens in every run, steps compared]: from the runs'
  rollout_lengths.jsonl, the steps all of them recorded token digests for (runs from
  before 2026-12-03 recorded none: [0, 0])."""
  by_run = []
  for workdir in workdirs:
    with open(os.path.join(workdir, "rollout_lengths.jsonl")) as f:
      rows = (json.loads(line) for line in f if line.strip())
      by_run.append({r["step"]: r["digests"] for r in rows if "digests" in r})
  steps = set.intersection(*(set(d) for d in by_run)) if by_run else set()
  equal = sum(all(d[s] == by_run[0][s] for d in by_run) for s in steps)
  return [equal, len(steps)]


def params_digest(params: Any) -> str:
  """A hash of a parameter tree's bytes: equal digests, equal parameters."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(params):
    h.update(np.ascontiguousarray(jax.device_get(leaf)).tobytes())
  return h.hexdigest()[:16]


class SharedEvaluation:
  """Held-out evaluation once per step for runs whose parameters must be equal.

  The modes roll out the same tokens and apply the same updates, so at a given step their
  parameters are bitwise equal: the first run to reach an evaluation step evaluates, the
  others get its figures after their parameters' digest is checked against it (a run
  whose digest differs is evaluated on its own and flagged `params_differ_from`).
  `evaluate(trainer)` computes a row (default: the trainer's own `evaluate`).
  """

  def __init__(self, evaluate: Callable[[Any], dict[str, Any]] | None = None):
    self._evaluate = evaluate or (lambda trainer: trainer.evaluate())
    self.by_step: dict[int, tuple[str, dict[str, Any], str]] = {}
    self.mismatches: list[dict[str, Any]] = []

  def __call__(self, label: str, trainer: Any) -> dict[str, Any]:
    digest = params_digest(trainer.params)
    hit = self.by_step.get(trainer.step)
    if hit is not None and hit[0] == digest:
      return {**hit[1], "params_digest": digest, "shared_from": hit[2]}
    t = time.perf_counter()
    row = dict(self._evaluate(trainer))
    row["seconds"] = time.perf_counter() - t
    if hit is None:
      self.by_step[trainer.step] = (digest, row, label)
    else:
      row["params_differ_from"] = hit[2]
      self.mismatches.append({"step": trainer.step, "run": label, "against": hit[2]})
    return {**row, "params_digest": digest}


def run_interleaved(
  config: ml_collections.ConfigDict,
  out: str,
  modes: list[str],
  seed: int,
  block: int,
  *,
  evaluate: Callable[[dict[str, Any]], Callable[[Any], dict[str, Any]] | None] | None = None,
  progress: bool = True,
  resume: bool = False,
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]], SharedEvaluation]:
  """Runs the modes in one process, interleaved in blocks of `block` RL steps (all modes'
  steps 0..block-1, then the next block, ...), so that the host's drift over the
  experiment hits every mode alike. Held-out evaluation happens once per evaluation step
  (`SharedEvaluation`); every mode checks that its parameters equal the evaluated ones.

  Warm starts come from <out>/shared (`prepare_shared`); runs go to <out>/<mode>_s<seed>,
  fresh, or with `resume` continuing from the runs' last checkpoints (a comparison cut
  short: the steps it measured keep their rows, the steps after a checkpoint rerun).
  `evaluate(runs)` (given the runs as returned) may return the function that
  evaluates a trainer (e.g. on a faster engine); by default each trainer evaluates with
  its own.

  With `rl.warmup_engine` every run's rollout programs compile first (`warm_up`).

  Returns ({label: {"mode", "seed", "job", "trainer"[, "warmup_s"]}}, {label: its step rows
  (`step_row`)}, the SharedEvaluation with its digests and mismatches).
  """
  check_modes(modes)
  if block < 1:
    raise ValueError(f"block must be >= 1, got {block}")
  config = config.copy_and_resolve_references()
  shared = prepare_shared(config, out, progress)
  runs = {}
  for mode in modes:
    label = f"{mode}_s{seed}"
    workdir = os.path.join(out, label)
    if not (resume and os.path.isdir(workdir)):
      if os.path.isdir(workdir):
        shutil.rmtree(workdir)  # a fresh run: resuming would skip the steps we time
      os.makedirs(workdir)
      _copy_warm_starts(shared, workdir)
    cfg = config.copy_and_resolve_references()
    cfg.mode, cfg.seed = mode, seed
    cfg.rollout.num_prompts = 0
    job = train.prepare(cfg, workdir, progress)
    runs[label] = {"mode": mode, "seed": seed, "job": job, "trainer": train.make_trainer(job)}
  trainers = {label: run["trainer"] for label, run in runs.items()}
  if config.rl.get("warmup_engine", False):
    for run in runs.values():
      run["warmup_s"] = warm_up(run["job"], run["trainer"])
  evaluation = SharedEvaluation(evaluate(runs) if evaluate else None)
  total = int(config.rl.steps)
  for end in range(block, total + block, block):
    end = min(end, total)
    for label, trainer in trainers.items():
      trainer.run(
        progress=progress,
        until=end,
        evaluate=lambda t, label=label: evaluation(label, t),
      )
  rows = {label: read_step_rows(trainer.workdir, label) for label, trainer in trainers.items()}
  return runs, rows, evaluation


def warm_up(job: Any, trainer: Any) -> float:
  """Compiles every program the run's rollouts can need before its first step (on an
  accelerator on several threads at once: `RolloutEngine.warmup`); returns the seconds. A
  device sitting's compiles then overlap, and no step time carries them."""
  cfg = trainer.cfg
  return job.engine.warmup(
    trainer.params,
    num_prompts=sorted({b - a for a, b in trainer.call_groups(cfg.prompts_per_step)}),
    num_samples=cfg.group_size,
    drafter_params=None if job.drafter is None else job.drafter.params,
  )


def step_row(label: str, r: dict[str, Any]) -> dict[str, Any]:
  """One step of one run, as the tables and plots use it."""
  compile_s = r["time/rollout_compile"] + r.get("time/train_compile", 0.0)
  return {
    "mode": label,
    "step": r["step"],
    # The RL step (rollout -> update): lazy compiles (more programs with SD; update
    # shapes that differ between the modes' rollouts) and held-out evaluation (plain
    # decode in every mode) are not the modes' cost, so they are left out.
    "step_s": r["time/step"] - compile_s - r.get("time/eval", 0.0),
    "rollout_s": r["time/rollout"] - r["time/rollout_compile"],
    "compile_s": compile_s,
    "eval_s": r.get("time/eval", 0.0),
    "checkpoint_s": r.get("time/checkpoint", 0.0),
    "tail_s": r.get("time/rollout_tail", ""),
    "generate_s": r.get("time/rollout_generate", ""),
    "harvest_s": r.get("time/rollout_harvest", ""),
    "reward": r["reward_mean"],
    "eval": r.get("eval", {}).get("accuracy", ""),
    "eval_sampled": r.get("eval", {}).get("sampled_accuracy", ""),
    "accept_length": r.get("spec/accept_length", ""),
    "drafter_version": r.get("drafter/version", ""),
    "reclaimed_s": r.get("drafter/reclaimed_s", ""),
    "charged_s": r.get("drafter/rollout_charged_s", ""),
    # The arm mix ("arm:chunks" per arm) and each draft arm's accept length, e.g. group
    # drafts reading more history as a small training set's prompts come back.
    "arm_chunks": json.dumps(_per_arm(r, "chunks")),
    "arm_accept": json.dumps(_per_arm(r, "accept_length")),
    "arm_row_rounds": json.dumps(_per_arm(r, "row_rounds")),
    "data_epoch": r.get("data/epoch", ""),
    # What RL changes in the responses: their length and how they open (the strategy).
    "length_mean": r.get("length_mean", ""),
    # The long tail TLT attacks: the step's longest response against its median.
    "length_median": r.get("length_median", ""),
    "length_max": r.get("length_max", ""),
    "first_token_share": r.get("first_token_share", ""),
    "drafter_updates": r.get("drafter/updates", ""),
    # Host seconds those updates spent building their batches from the buffer.
    "drafter_sample_s": r.get("drafter/sample_s", ""),
    # The update's throughput: model FLOPs (6 x params a real token) a second of its
    # compute, and the padding share of the micro-batches it computed.
    "update_gflops": 1e3 * r["update/model_tflops"] if r.get("update/model_tflops") else "",
    "update_padding": r.get("update/computed_padding", ""),
  }


def _per_arm(r, what):
  return {
    k.split("/")[2]: v for k, v in r.items() if k.startswith("spec/arm/") and k.endswith(what)
  }


# A step whose times a ratio may rest on: not the first (its compiles), no checkpoint window
# (orbax's write, and in tlt the drafter updates filling it) and no held-out evaluation.
# With fewer such steps than this in common with the baseline, no speedup is given.
MIN_CLEAN_STEPS = 3
# time/checkpoint and time/eval above this: the step wrote a checkpoint or evaluated (a
# step that does neither spends microseconds between the two clock reads).
_IDLE_PHASE_S = 1e-3


def clean_steps(rows: list[dict[str, Any]]) -> list[int]:
  """The steps of one run's rows (`step_row`) whose times compare modes: after the first,
  and without a checkpoint or an evaluation."""
  return [
    r["step"]
    for r in rows[1:]
    if r.get("checkpoint_s", 0.0) <= _IDLE_PHASE_S
    and r["eval_s"] <= _IDLE_PHASE_S
    and r["eval"] == ""
  ]


def mode_table(results: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
  """Per run: mean step and rollout time over its clean steps (`clean_steps`; over the
  steps after the first where it has none), and speedups against the baseline of its seed
  over the clean steps the two have in common ("ratio_steps" of them; no speedup with
  fewer than MIN_CLEAN_STEPS: a ratio over a step or two that carried a checkpoint window
  says nothing about the modes). With several seeds, per mode the mean of its runs' figures
  and the range of their speedups."""
  table, by_step, clean = {}, {}, {}
  for label in results:
    mine = [r for r in rows if r["mode"] == label]
    clean[label] = set(clean_steps(mine))
    by_step[label] = {r["step"]: r for r in mine}
    timed = [r for r in mine if r["step"] in clean[label]] or mine[1:] or mine
    step = float(np.mean([r["step_s"] for r in timed]))
    rollout = float(np.mean([r["rollout_s"] for r in timed]))
    rl = results[label]["summary"].get("rl", {})
    gen = [r for r in timed if r["generate_s"] != ""]
    tail = sum(r["tail_s"] for r in gen) / max(sum(r["generate_s"] for r in gen), 1e-9)
    table[label] = {
      # Share of generation time at batch <= max_batch / 4: SD (on only there) can at
      # most cut the rollout by it, so the rollout speedup is capped at 1 / (1 - share).
      "tail_share": tail,
      "rollout_speedup_cap": 1.0 / max(1.0 - tail, 1e-9),
      "step_s": step,
      "rollout_s": rollout,
      "rollout_share": rollout / step,
      "clean_steps": len(clean[label]),
      "reward_mean": float(np.mean([r["reward"] for r in mine])),
      "final_eval": (rl.get("final_eval") or {}).get("accuracy"),
      "final_eval_sampled": (rl.get("final_eval") or {}).get("sampled_accuracy"),
      "accept_length": [r["accept_length"] for r in mine if r["accept_length"] != ""],
    }
  for label, t in table.items():
    info = results[label]
    # The baseline of the same seed: the label with its mode replaced ("tlt_s1" -> "baseline_s1").
    base_label = "baseline" + label[len(info["mode"]) :]
    base = table.get(base_label)
    if base is None:
      continue
    common = sorted(clean[label] & clean[base_label])
    t["ratio_steps"] = len(common)
    if len(common) < MIN_CLEAN_STEPS:
      continue
    mean = lambda run, key, steps=common: float(np.mean([by_step[run][i][key] for i in steps]))
    t["step_speedup"] = mean(base_label, "step_s") / mean(label, "step_s")
    s = mean(base_label, "rollout_s") / mean(label, "rollout_s")
    t["rollout_speedup"] = s
    # Amdahl at the baseline's own rollout share r and at the paper's r = 0.85.
    for name, r in (("implied_at_own_r", base["rollout_share"]), ("implied_at_r085", 0.85)):
      t[name] = 1.0 / ((1 - r) + r / s)
  modes = {info["mode"] for info in results.values()}
  if len(modes) < len(results):  # several seeds: one summary row per mode
    for mode in sorted(modes, key=MODES.index):
      mine = [table[k] for k, info in results.items() if info["mode"] == mode]
      agg = {
        k: float(np.mean([t[k] for t in mine]))
        for k in mine[0]
        if isinstance(mine[0][k], float) and all(isinstance(t.get(k), float) for t in mine)
      }
      agg["accept_length"] = mine[0]["accept_length"]
      agg["clean_steps"] = min(t["clean_steps"] for t in mine)
      if all("ratio_steps" in t for t in mine):
        agg["ratio_steps"] = min(t["ratio_steps"] for t in mine)
      for k in ("step_speedup", "rollout_speedup"):
        if k in agg:
          agg[f"{k}_range"] = [min(t[k] for t in mine), max(t[k] for t in mine)]
      table[f"{mode} (mean of {len(mine)} seeds)"] = agg
  return table


def ratio_note(table: dict[str, Any]) -> str:
  """What the speedups of `mode_table` rest on, in a sentence: the clean steps compared,
  or why there is no ratio."""
  counts = [t["ratio_steps"] for t in table.values() if "ratio_steps" in t]
  if not counts:
    return "no speedup: there is no baseline run to compare with"
  n = min(counts)
  if n < MIN_CLEAN_STEPS:
    return (
      f"no speedup: only {n} step(s) free of the first step's compiles, checkpoints and "
      f"evaluations in every run, and a ratio needs {MIN_CLEAN_STEPS} (run more steps with "
      "--config.rl.steps, or checkpoint and evaluate less often with "
      "--config.rl.checkpoint_every and --config.rl.eval_every)"
    )
  return (
    f"speedups over {n} step(s) in common: the first step (compiles) and those that "
    "checkpointed or evaluated are left out"
  )


def arms_by_epoch(rows: list[dict[str, Any]], steps_per_epoch: int) -> list[dict[str, Any]]:
  """Per run and epoch (pass over the training set): chunks per arm and each draft arm's
  accept length over all its row-rounds. With a small training set the prompts come back
  every epoch, and group drafts read their earlier rollouts. A step's epoch is the one the
  trainer recorded (`data_epoch`); rows without it (older runs) count `steps_per_epoch` RL
  steps an epoch and weight accept lengths by chunks."""
  if steps_per_epoch < 1:
    raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
  out = {}
  for r in rows:
    epoch = r.get("data_epoch", "")
    key = (r["mode"], int(epoch) if epoch != "" else r["step"] // steps_per_epoch)
    chunks, accept = json.loads(r["arm_chunks"]), json.loads(r["arm_accept"])
    row_rounds = json.loads(r.get("arm_row_rounds") or "{}")
    e = out.setdefault(key, {"mode": key[0], "epoch": key[1], "chunks": {}, "_acc": {}})
    for arm, n in chunks.items():
      e["chunks"][arm] = e["chunks"].get(arm, 0) + n
      if arm in accept:
        weight = row_rounds.get(arm, n)
        a = e["_acc"].setdefault(arm, [0.0, 0])
        a[0] += accept[arm] * weight
        a[1] += weight
  for e in out.values():
    e["accept_length"] = {arm: s / n for arm, (s, n) in e.pop("_acc").items() if n}
  return list(out.values())


def arms_markdown(epochs: list[dict[str, Any]]) -> str:
  """`arms_by_epoch` as a markdown table: a row per run and epoch, "chunks (accept)" per arm."""
  arms = sorted({a for e in epochs for a in e["chunks"]})
  lines = ["| run | epoch | " + " | ".join(arms) + " |", "|---|---|" + "---|" * len(arms)]
  for e in epochs:
    cells = []
    for arm in arms:
      n = e["chunks"].get(arm, 0)
      acc = e["accept_length"].get(arm)
      cells.append(f"{n}" + (f" ({acc:.2f})" if acc is not None else ""))
    lines.append(f"| {e['mode']} | {e['epoch']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def markdown(table: dict[str, Any]) -> str:
  """The table of `mode_table` in markdown, with `ratio_note` under it."""
  lines = [
    "| mode | step s | rollout s | rollout share | tail share | step speedup (steps) | "
    "rollout speedup s | implied at r=0.85 | final pass@1 greedy / sampled | "
    "accept length first -> last |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for mode, t in table.items():
    acc = t["accept_length"]
    speed = "-"
    if "step_speedup" in t:
      speed = f"{t['step_speedup']:.2f}x ({t['ratio_steps']})"
    elif "ratio_steps" in t:
      speed = f"- ({t['ratio_steps']})"
    lines.append(
      f"| {mode} | {t['step_s']:.2f} | {t['rollout_s']:.2f} | {t['rollout_share']:.2f} | "
      f"{t['tail_share']:.2f} | {speed} | "
      f"{t.get('rollout_speedup', float('nan')):.2f}x"
      f" | {t.get('implied_at_r085', float('nan')):.2f}x | {t.get('final_eval')} / "
      f"{t.get('final_eval_sampled')} | " + (f"{acc[0]:.2f} -> {acc[-1]:.2f} |" if acc else "- |")
    )
  return "\n".join(lines) + "\n\n" + ratio_note(table)


def side_by_side(table: dict[str, Any], rows: list[dict[str, Any]]) -> str:
  """What `tlt_jax.main --compare` prints: each run's mean step time and speedup (over
  the clean steps it has in common with the baseline, `ratio_note` says how many, or why
  there is none), and the training reward of every step per run in columns (equal rows:
  the same tokens)."""
  labels = [k for k in table if k in {r["mode"] for r in rows}]
  out = ["run        step s   rollout s   step speedup   mean reward"]
  for label in labels:
    t = table[label]
    speed = f"{t['step_speedup']:.2f}x" if "step_speedup" in t else "-"
    out.append(
      f"{label:<10} {t['step_s']:>6.2f}   {t['rollout_s']:>9.2f}   {speed:>12}   "
      f"{t['reward_mean']:>11.3f}"
    )
  out.append(ratio_note({k: table[k] for k in labels}))
  steps = sorted({r["step"] for r in rows})
  reward = {(r["mode"], r["step"]): r["reward"] for r in rows}
  out.append("\nreward by RL step: " + " | ".join(labels))
  for step in steps:
    cells = [reward.get((label, step)) for label in labels]
    out.append(f"  step {step:>3}: " + " | ".join("-" if c is None else f"{c:.4f}" for c in cells))
  return "\n".join(out)

r"""TLT's figure: the same learning curve, sooner. Baseline, sd and tlt on one warm start.

The three modes run in one process, interleaved in blocks of RL steps (every mode's steps
0-9, then 10-19, ...) so that the host's drift hits them alike (`compare.run_interleaved`).
They roll out the same tokens (coupled sampling) and apply the same updates, so their
parameters are equal at every step: held-out accuracy is evaluated once per evaluation
step, after each mode's parameter digest is checked against the evaluated one.

What it reports (<out>/learning_curve.json, .md, .png; per-step CSV):
- the curve: training reward per step and held-out pass@1 (greedy and sampled) against
  each mode's wall-clock seconds (compiles and evaluation left out);
- whether the policy learnt: the last quarter's mean reward over the first quarter's, with
  a bootstrap interval over steps, and against the warm start's reward on the very prompts
  of the last quarter (same keys: the rise is learning, not the data order);
- the speed: step and rollout time per mode, paired per step (median, quartiles, range),
  the baseline's rollout share r, the rollout speedup s, Amdahl(r, s) beside the measured
  end-to-end figure; compile seconds; drafter updates per tlt step; the online and frozen
  drafters' accept lengths on fixed prompts; the update's throughput against the matmul
  rate measured in the same process.

Compiled programs are kept in <out>/compile_cache (`config.compile_cache_dir` names another
folder; `--nocompile_cache`: nowhere), a folder per host inside: `--resume` or a rerun on
the same host loads them.

  python experiments/learning_curve.py --config=configs/regime.py --out=runs/curve --seed=0
  python experiments/learning_curve.py --config=configs/default.py:tiny --out=/tmp/curve \
    --config.rl.steps=8 --block=4     # smoke run, seconds
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import sys
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import cpu_model, matmul_flops, read_bandwidth  # noqa: E402
from experiments.traces import program_summary  # noqa: E402
from tlt_jax import checkpoint, compare, curves  # noqa: E402
from tlt_jax.evaluation import GREEDY, held_out_metrics, problems_digest  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402
from tlt_jax.utils import collector, compile_cache  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "job config")
_OUT = flags.DEFINE_string("out", "runs/learning_curve", "output folder")
_COMPILE_CACHE = flags.DEFINE_bool(
  "compile_cache", True, "keep compiled programs in config.compile_cache_dir or <out>/compile_cache"
)
_MODES = flags.DEFINE_list("modes", ["baseline", "sd", "tlt"], "modes, in the order they run")
_SEED = flags.DEFINE_integer("seed", 0, "RL seed (config.seed: data order and rollout keys)")
_BLOCK = flags.DEFINE_integer("block", 10, "RL steps per mode before the next mode's turn")
_EVAL_BATCH = flags.DEFINE_integer(
  "eval_batch", 32, "rows per held-out evaluation call (its own engine; 0: the trainer's)"
)
_EVAL_SPECULATIVE = flags.DEFINE_bool(
  "eval_speculative",
  True,
  "decode the held-out evaluation speculatively (same tokens; fewer seconds, more programs)",
)
_PREPARE = flags.DEFINE_bool("prepare_only", False, "build the warm starts and stop")
_RESUME = flags.DEFINE_bool(
  "resume", False, "continue the runs in --out from their checkpoints (a comparison cut short)"
)
_TABLES_ONLY = flags.DEFINE_bool(
  "tables_only",
  False,
  "write the per-step tables, the plot and the speed lines of the runs in --out as they "
  "stand (a comparison running, or cut short: ratios over the steps every mode reached), "
  "copy them to --keep, and stop",
)
_MATMUL = flags.DEFINE_float(
  "matmul_gflops",
  0.0,
  "with --tables_only: the host's matmul rate the update is measured against (e.g. the "
  "run's 'host at start' line; 0: measured now, wrong while the runs still compute)",
)
_FROM_STEP = flags.DEFINE_integer(
  "from_step",
  0,
  "with --tables_only: compare the steps from this one on (e.g. the steps that runs resumed "
  "from a checkpoint reran)",
)
_REFERENCE = flags.DEFINE_string(
  "reference", "baseline", "with --tables_only: the mode the speed ratios are taken against"
)
_KEEP = flags.DEFINE_string(
  "keep", "", "a folder (e.g. experiments/results/curve_s0) to copy the per-step tables into"
)


def host_line() -> dict:
  return {
    "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    "cpu": cpu_model(),
    "cores": os.cpu_count(),
    "jax": jax.__version__,
    "devices": f"{jax.device_count()} x {jax.devices()[0].platform}",
    "read_GBps": round(read_bandwidth() / 1e9, 1),
    "matmul_GFLOPs": round(matmul_flops() / 1e9, 1),
  }


class FastEvaluation:
  """Held-out evaluation on an engine of its own: `eval_batch` rows a call, and speculative
  decoding with the warm-start drafter where a run has one (token-identical to plain
  decoding, so the accuracy is the same; only the seconds differ). Called with the runs
  (`compare.run_interleaved`), it builds the engine and returns the evaluation function."""

  def __init__(self, eval_batch: int, speculative: bool = True):
    self.eval_batch, self.speculative = eval_batch, speculative
    self.engine = self.drafter_params = None
    self.warmup_s = 0.0

  def __call__(self, runs: dict):
    drafted = [r for r in runs.values() if self.speculative and r["job"].drafter is not None]
    job = (drafted or list(runs.values()))[0]["job"]
    cfg = dataclasses.replace(job.engine.config, max_batch=self.eval_batch, harvest_hidden=False)
    if not drafted:
      cfg = dataclasses.replace(cfg, spec_threshold=0, capture_hidden=False)
    self.engine = RolloutEngine(
      job.graphdef,
      job.model_cfg,
      cfg,
      job.sampling,
      drafter_graphdef=job.drafter.graphdef if drafted else None,
    )
    # The warm-start drafter, kept before any online update touches it: a tree of its own
    # over the same device arrays (updates make new arrays, and a resume replaces the
    # leaves of the drafter's own State), as `scheduler.slices` keeps its initial params.
    if drafted:
      self.drafter_params = jax.tree.map(lambda x: x, job.drafter.params)
    if job.config.rl.get("warmup_engine", False):
      self.warm_up(next(iter(runs.values()))["trainer"])
    return self.evaluate

  def warm_up(self, trainer):
    """Compiles the evaluation's programs ahead (greedy, one sample a problem; sampled,
    `eval_samples` a problem), as `compare.warm_up` does the runs'."""
    t = time.perf_counter()
    n, samples = len(trainer.evals), trainer.cfg.eval_samples
    for sampling, per_problem in ((GREEDY, 1), (self.engine.sampling, samples)):
      if per_problem:
        per = max(self.eval_batch // per_problem, 1)  # prompts a call, as evaluation splits
        self.engine.warmup(
          trainer.params,
          sampling=sampling,
          num_prompts=sorted({min(per, n - a) for a in range(0, n, per)}),
          num_samples=per_problem,
          drafter_params=self.drafter_params,
        )
    self.warmup_s = time.perf_counter() - t

  def evaluate(self, trainer, params=None):
    """The held-out row of `params` (default: the trainer's own), with its problems'
    digest (`problems_digest`: `--tables_only` draws the warm start's row beside it only
    when that row is of the same problems)."""
    row = held_out_metrics(
      self.engine,
      trainer.params if params is None else params,
      trainer.tokenizer,
      trainer.evals,
      trainer.eval_check,
      trainer.format_prompt,
      samples=trainer.cfg.eval_samples,
      key=trainer.cfg.seed,
      drafter_params=self.drafter_params,
    )
    return {**row, "problems": problems_digest(trainer.evals)}


def replay_rewards(engine, params, trainer, steps, drafter_params=None) -> list[float]:
  """The mean reward `params` earn on the prompts, keys and sequence ids of RL `steps`
  (one rollout a step: no refills), decoded in calls of the engine's max_batch:
  token-for-token what the run's rollout of that step would have been under these
  params."""
  cfg, p, g = trainer.cfg, trainer.cfg.prompts_per_step, trainer.cfg.group_size
  out = []
  per_call = max(engine.config.max_batch // g, 1)  # prompts a call of this engine holds
  for k in steps:
    examples = trainer.data.at(k * p, p)
    prompts = [trainer.tokenizer.encode(trainer.format_prompt(ex), add_bos=True) for ex in examples]
    key = jax.random.fold_in(jax.random.key(cfg.seed), k * 64)
    texts = []
    for a in range(0, p, per_call):
      # Sampling is keyed per (seed, sequence id, position): calls reproduce one call.
      res = engine.generate(
        params,
        prompts[a : a + per_call],
        g,
        key=key,
        seq_id_offset=(k * p + a) * g,
        drafter_params=drafter_params,
      )
      texts += [res.completion(n) for n in range(len(prompts[a : a + per_call]) * g)]
    texts = [trainer.tokenizer.decode(t) for t in texts]
    out.append(
      float(
        np.mean([trainer.reward_fn(t, examples[n // g]["answer"]) for n, t in enumerate(texts)])
      )
    )
  return out


def warm_start_eval(summary_path: str, fast: FastEvaluation, trainer, warm) -> dict:
  """The warm start's held-out row from the shared summary, when it was evaluated on the
  runs' own problems (`problems_digest`). Otherwise it is evaluated here, on the runs'
  problems and keys, and written back: a packed warm start (pack_warm_start.py: rounded,
  built on another host) has no row, a warm start copied in by hand (regime_warm_start.sh's
  instructions) may have no summary at all, or the summary of its SFT stage, whose task
  parameters drew other held-out problems (2026-12-04: a stage built with `median_steps` 4
  recorded 0.273 greedy where the curve's problems gave 0.289)."""
  summary = {}
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
  problems = problems_digest(trainer.evals)
  recorded = summary.get("eval")
  if recorded is None or recorded.get("problems") != problems:
    if recorded is not None:
      print(f"{summary_path}: its warm-start evaluation is of other problems; evaluating again")
      summary["eval_of_other_problems"] = recorded
    t = time.perf_counter()
    row = fast.evaluate(trainer, warm)
    summary["eval"] = {**row, "problems": problems, "seconds": time.perf_counter() - t}
    with open(summary_path, "w") as f:
      json.dump(summary, f, indent=1)
  return summary["eval"]


def baseline_label(rows: dict[str, list[dict]]) -> str | None:
  return next((label for label in rows if label.startswith("baseline")), None)


def speed_table(
  rows: dict[str, list[dict]], modes: list[str], matmul_gflops: float, reference: str = ""
) -> dict:
  """Per mode: mean step / rollout seconds (steps after the first), paired ratios against
  the baseline (or the `reference` run's label) per step, r, s and Amdahl; compile
  seconds; the update's throughput over the host's matmul rate (`curves.update_throughput`).
  Without a baseline run, no ratios."""
  base = reference if reference in rows else baseline_label(rows)
  b = rows[base][1:] if base else []
  table = {}
  for label, mine in rows.items():
    timed = mine[1:]
    t = {
      "step_s": float(np.mean([r["step_s"] for r in timed])),
      "rollout_s": float(np.mean([r["rollout_s"] for r in timed])),
      "compile_s": float(sum(r["compile_s"] for r in mine)),
      "wall_s": float(sum(r["step_s"] for r in mine)),
    }
    t["rollout_share"] = t["rollout_s"] / t["step_s"]
    t["update"] = curves.update_throughput(timed, matmul_gflops)
    if base and label != base:
      t["step_speedup"] = curves.ratio_spread(
        [r["step_s"] for r in b], [r["step_s"] for r in timed]
      )
      t["rollout_speedup"] = curves.ratio_spread(
        [r["rollout_s"] for r in b], [r["rollout_s"] for r in timed]
      )
      r_base = float(np.mean([r["rollout_s"] for r in b]) / np.mean([r["step_s"] for r in b]))
      s = t["rollout_speedup"]["of_totals"]
      t["amdahl"] = curves.amdahl(r_base, s)
      t["wall_speedup"] = float(sum(r["step_s"] for r in rows[base]) / t["wall_s"])
    table[label] = t
  return table


def warn_on_map_count(limit_path: str = "/proc/sys/vm/max_map_count") -> str | None:
  """A warning when the kernel's per-process memory-map limit is Linux's default: each
  compiled XLA CPU program holds memory maps, and three modes' lazily compiled programs in
  one process passed 65,530 maps after ~45 minutes on host G (2026-11-27; the run died in
  LLVM with "Cannot allocate memory" and a segfault)."""
  try:
    with open(limit_path) as f:
      limit = int(f.read())
  except (OSError, ValueError):
    return None
  if limit >= 262_144:
    return None
  return (
    f"vm.max_map_count is {limit}: a long comparison's compiled programs may exhaust it; "
    "raise it (sysctl -w vm.max_map_count=1048576), or continue a crashed comparison "
    "with --resume"
  )


def main(argv):
  del argv
  if warning := warn_on_map_count():
    print(f"warning: {warning}", flush=True)
  out = _OUT.value
  os.makedirs(out, exist_ok=True)
  config = _CONFIG.value
  # A resumed or repeated curve loads its programs instead of compiling them again.
  folder = config.compile_cache_dir or os.path.join(out, "compile_cache")
  cache = compile_cache.enable(folder if _COMPILE_CACHE.value else "")
  print(f"compiled programs cached in {cache or '(nowhere)'}", flush=True)
  if _PREPARE.value:
    print(f"warm starts ready in {compare.prepare_shared(config, out)}")
    return
  if _TABLES_ONLY.value:
    tables_only(out, list(_MODES.value), _SEED.value)
    return
  host_start = host_line()
  print("host at start:", host_start, flush=True)
  collector.settle_heap()  # as the CLI does, before the modes run
  fast = FastEvaluation(_EVAL_BATCH.value, _EVAL_SPECULATIVE.value)
  runs, rows, evaluation = compare.run_interleaved(
    config,
    out,
    list(_MODES.value),
    _SEED.value,
    _BLOCK.value,
    evaluate=fast,
    resume=_RESUME.value,
  )
  host_end = host_line()
  print("host at end:", host_end, flush=True)
  # The per-step tables first: a rerun starts every run afresh (its workdir is wiped), so
  # nothing after this point may be the only copy of what the runs measured.
  write_step_tables(out, rows)
  # Every mode trains the same policy: the baseline's rows, or the first mode's without one.
  base = baseline_label(rows) or next(iter(rows))
  rewards = {label: [r["reward"] for r in rs] for label, rs in rows.items()}
  equal = sum(
    len({round(rewards[label][i], 12) for label in rows}) == 1 for i in range(len(rewards[base]))
  )
  # Did the policy learn, or did the prompts get easier? The warm start on the very
  # prompts (and keys) of the last quarter's steps; step 0 replayed as a check (the
  # warm start is step 0's policy, so it must give the run's own step-0 reward).
  base_trainer = runs[base]["trainer"]
  n = len(rewards[base])
  last = list(range(n - max(n // 4, 1), n))
  warm = checkpoint.restore_params(os.path.join(out, "shared", "warm_start"), base_trainer.params)
  warm_eval = warm_start_eval(os.path.join(out, "shared", "summary.json"), fast, base_trainer, warm)
  with open(base_trainer.metrics_path) as f:
    refills = sum(json.loads(line).get("refills", 0) for line in f)
  t = time.perf_counter()
  warm_rewards = replay_rewards(fast.engine, warm, base_trainer, [0, *last], fast.drafter_params)
  replay = {
    "seconds": time.perf_counter() - t,
    "step0_replayed": warm_rewards[0],
    "step0_run": rewards[base][0],
    "refills": refills,
    "warm_start_last_quarter": float(np.mean(warm_rewards[1:])),
    "trained_minus_warm_start": curves.paired_gap(
      [rewards[base][k] for k in last], warm_rewards[1:]
    ),
  }
  # Compiled programs and their seconds, per run (rollout engine, update) and the
  # evaluation engine: what a device sitting's budget goes to before any step runs.
  programs = {
    label: {
      "rollout": run["job"].engine.pool.compiles,
      "rollout_s": run["job"].engine.pool.compile_seconds,
      "update": run["trainer"].programs.compiles,
      "update_s": run["trainer"].programs.compile_seconds,
    }
    for label, run in runs.items()
  }
  for label, run in runs.items():
    if "warmup_s" in run:
      programs[label]["warmup_wall_s"] = run["warmup_s"]
  if fast.engine is not None:
    programs["evaluation"] = {
      "rollout": fast.engine.pool.compiles,
      "rollout_s": fast.engine.pool.compile_seconds,
      "warmup_wall_s": fast.warmup_s,
    }
  report = {
    "host_start": host_start,
    "host_end": host_end,
    "config": config.to_dict(),
    "warm_start_eval": warm_eval,
    "rewards_equal_steps": [equal, len(rewards[base])],
    # Token for token: every row's completion digest equal in every mode.
    "tokens_equal_steps": compare.tokens_equal_steps(
      [run["trainer"].workdir for run in runs.values()]
    ),
    "params_mismatches": evaluation.mismatches,
    "learning": curves.quarter_rise(rewards[base]),
    "warm_start_replay": replay,
    # The matmul rate: the mean of the host lines at the run's start and end (it drifts).
    "speed": speed_table(
      rows,
      list(_MODES.value),
      (host_start["matmul_GFLOPs"] + host_end["matmul_GFLOPs"]) / 2,
    ),
    "programs": programs,
    "profiles": step_profiles(runs),
  }
  keys = (
    "learning",
    "warm_start_replay",
    "speed",
    "programs",
    "rewards_equal_steps",
    "tokens_equal_steps",
    "params_mismatches",
    "profiles",
  )
  print(json.dumps({k: report[k] for k in keys}, indent=1))
  with open(os.path.join(out, "learning_curve.json"), "w") as f:
    json.dump({**report, "rows": rows}, f, indent=1, default=str)
  notes = speed_notes(report["speed"])
  curves.plot_learning_curves(
    rows,
    os.path.join(out, "learning_curve.png"),
    notes=notes,
    warm_eval=warm_eval,
    title=f"{os.path.basename(out)}: training reward and held-out pass@1 against wall-clock",
  )
  with open(os.path.join(out, "learning_curve.md"), "w") as f:
    f.write(curves.report_markdown(report, rows[base], notes))
  keep(out)
  print("\n".join(notes))


def step_profiles(runs: dict) -> dict:
  """Each run's profiled steps (`--config.rl.profile_steps`, `GRPOConfig.profile_steps`) by
  program (`experiments.traces.program_summary`): where a traced step's seconds went, on the
  device and on the host, small enough to come back from a device sitting."""
  out = {}
  for label, run in runs.items():
    root = os.path.join(run["trainer"].workdir, "profile")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
      out.setdefault(label, {})[name] = program_summary(os.path.join(root, name))
  return out


def write_step_tables(out: str, rows: dict[str, list[dict]]) -> None:
  """<out>/steps_<label>.csv: every run's step rows (`compare.step_row`)."""
  for label, rs in rows.items():
    if not rs:
      continue
    with open(os.path.join(out, f"steps_{label}.csv"), "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=list(rs[0]))
      w.writeheader()
      w.writerows(rs)


def keep(out: str) -> None:
  """Copies the tables, plots and reports in `out` to --keep (when given)."""
  if _KEEP.value:
    os.makedirs(_KEEP.value, exist_ok=True)
    for name in os.listdir(out):
      if name.startswith(("steps_", "learning_curve")):
        shutil.copy(os.path.join(out, name), _KEEP.value)


def speed_notes(sp: dict) -> list[str]:
  """One line a mode of `speed_table`: step and rollout seconds, r, the ratios against the
  baseline with their range, Amdahl's bound, the update's share of the matmul rate."""
  return [
    f"{label}: step {t['step_s']:.1f} s, rollout {t['rollout_s']:.1f} s "
    f"(r {t['rollout_share']:.2f})"
    + (
      f", end to end {t['step_speedup']['of_totals']:.2f}x "
      f"[{t['step_speedup']['range'][0]:.2f}-{t['step_speedup']['range'][1]:.2f}], "
      f"rollout {t['rollout_speedup']['of_totals']:.2f}x, Amdahl {t['amdahl']:.2f}x"
      if "step_speedup" in t
      else ""
    )
    + (
      f"; update {t['update']['median_gflops']:.0f} GFLOP/s, {t['update']['of_matmul']:.2f} "
      "of the matmul rate"
      if t["update"]
      else ""
    )
    + f"; compiles {t['compile_s']:.0f} s"
    for label, t in sp.items()
  ]


def checked_warm_eval(summary_path: str, out: str, labels: list[str]) -> dict | None:
  """The shared summary's warm-start held-out row, if the runs' own evaluations were of the
  same problems (their `problems_digest`s); otherwise None, saying why: a warm start's
  summary may hold its SFT stage's row, of other problems (`warm_start_eval`)."""
  if not os.path.exists(summary_path):
    return None
  with open(summary_path) as f:
    recorded = json.load(f).get("eval")
  if recorded is None:
    return None
  digests = set()
  for label in labels:
    with open(os.path.join(out, label, "metrics.jsonl")) as f:
      for line in f:
        try:
          digests.add(json.loads(line).get("eval", {}).get("problems"))
        except json.JSONDecodeError:
          continue
  digests.discard(None)
  if digests == {recorded.get("problems")}:
    return recorded
  why = "no evaluation of the runs records its problems" if not digests else "other problems"
  print(f"warm start's held-out row left out: {why} (the full run evaluates it)")
  return None


def tables_only(out: str, modes: list[str], seed: int) -> None:
  """The tables, plot and speed lines of the runs in `out` as they stand, without running
  anything: a comparison still running (its finished steps) or cut short (before a
  `--resume`), so that what it measured outlives the machine. The plot and the ratios
  cover the steps every mode reached (from `--from_step` on, against `--reference`); the
  warm start's held-out row is drawn where the shared summary has one of the runs'
  problems (`checked_warm_eval`); no warm-start replay (that needs the engines)."""
  labels = [f"{m}_s{seed}" for m in modes if os.path.isdir(os.path.join(out, f"{m}_s{seed}"))]
  if not labels:
    raise app.UsageError(f"no runs of seed {seed} in {out}")
  rows = {label: compare.read_step_rows(os.path.join(out, label), label) for label in labels}
  write_step_tables(out, rows)
  rows = {label: [r for r in rs if r["step"] >= _FROM_STEP.value] for label, rs in rows.items()}
  n = min(len(rs) for rs in rows.values())
  if n < 2:
    print(f"steps every mode reached: {n}; tables written, no plot or ratios")
    keep(out)
    return
  common = {label: rs[:n] for label, rs in rows.items()}
  reference = f"{_REFERENCE.value}_s{seed}"
  base = reference if reference in common else baseline_label(common) or labels[0]
  warm_eval = checked_warm_eval(os.path.join(out, "shared", "summary.json"), out, labels)
  matmul = _MATMUL.value or matmul_flops() / 1e9
  report = {
    "steps_reached": {label: len(rs) for label, rs in rows.items()},
    "from_step": _FROM_STEP.value,
    "steps_compared": n,
    "reference": base,
    "matmul_gflops": matmul,
    "warm_start_eval": warm_eval,
    "learning": curves.quarter_rise([r["reward"] for r in common[base]]),
    "speed": speed_table(common, [label.rsplit("_s", 1)[0] for label in labels], matmul, reference),
  }
  first = common[base][0]["step"]
  notes = speed_notes(report["speed"])
  with open(os.path.join(out, "learning_curve_partial.json"), "w") as f:
    json.dump({**report, "rows": common}, f, indent=1, default=str)
  curves.plot_learning_curves(
    common,
    os.path.join(out, "learning_curve_partial.png"),
    notes=notes,
    warm_eval=warm_eval,
    title=f"{os.path.basename(out)}: steps {first}-{first + n - 1} of every mode "
    "(comparison unfinished)",
  )
  keep(out)
  print(json.dumps({k: report[k] for k in ("steps_reached", "learning")}, indent=1))
  print("\n".join(notes))


if __name__ == "__main__":
  app.run(main)

r"""End-to-end RL in the three modes, side by side: baseline, sd (frozen drafter), tlt.

The paper's headline table (end-to-end step time and speedup) and its
accepted-length-over-training figure, scaled to this machine. One process, one
config, the same warm-start policy, the same drafter warm start, the same
prompts and seeds; only `config.mode` differs. The warm start and the drafter's
warm start are built once in <out>/shared and copied into each mode's workdir.
With `--seeds=0,1` every mode runs once per RL seed (`config.seed`: data order and
rollout keys; the warm starts are shared), in <out>/<mode>_s<seed>; speedups are
taken against the baseline of the same seed and reported per seed and as their mean.

Writes <out>/e2e_modes.json, .csv (one row per mode and step) and .png
(step time per mode, reward and held-out accuracy curves, accepted length over
RL steps for sd vs tlt, drafter time reclaimed per step).

  python experiments/e2e_modes.py --out=runs/e2e_modes [--config.rl.steps=8]
  python experiments/e2e_modes.py --config=configs/default.py:tiny --out=/tmp/e2e   # smoke
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import time

import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax import train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "job config")
_OUT = flags.DEFINE_string("out", "runs/e2e_modes", "output folder")
_MODES = flags.DEFINE_list("modes", ["baseline", "sd", "tlt"], "modes to run, in order")
_SEEDS = flags.DEFINE_list(
  "seeds", [], "RL seeds (config.seed; default: the config's); each mode runs once per seed"
)
_PREPARE = flags.DEFINE_bool(
  "prepare_only", False, "build the warm starts in <out>/shared and stop (no RL steps)"
)
_ANALYZE = flags.DEFINE_bool(
  "analyze_only", False, "rebuild the tables and plot from the runs already in --out"
)


def _prepare(config, out):
  """SFT warm start and drafter warm start, once, in <out>/shared (reused when there)."""
  shared = os.path.join(out, "shared")
  config.task.data_dir = os.path.join(shared, "tfds")
  if not all(os.path.isdir(os.path.join(shared, d)) for d in ("warm_start", "drafter_warm_start")):
    warm = config.copy_and_resolve_references()
    warm.mode, warm.rl.steps, warm.rollout.num_prompts = "sd", 0, 0
    train.train_and_evaluate(warm, shared)
  return shared


def main(argv):
  del argv
  out = _OUT.value
  os.makedirs(out, exist_ok=True)
  config = _CONFIG.value.copy_and_resolve_references()
  shared = None if _ANALYZE.value else _prepare(config, out)
  if _PREPARE.value:
    print(f"warm starts ready in {shared}")
    return
  results, rows = {}, []
  seeds = [int(s) for s in _SEEDS.value] or [int(config.seed)]
  runs = [(mode, seed) for seed in seeds for mode in _MODES.value]
  for mode, seed in runs:
    label = mode if len(seeds) == 1 else f"{mode}_s{seed}"
    workdir = os.path.join(out, label)
    if _ANALYZE.value:
      with open(os.path.join(workdir, "summary.json")) as f:
        results[label] = {"summary": json.load(f), "mode": mode, "seed": seed}
    else:
      if os.path.isdir(workdir):
        shutil.rmtree(workdir)  # a fresh run: resuming would skip the steps we time
      os.makedirs(workdir)
      for piece in ("warm_start", "drafter_warm_start"):
        shutil.copytree(os.path.join(shared, piece), os.path.join(workdir, piece))
      cfg = config.copy_and_resolve_references()
      cfg.mode, cfg.seed = mode, seed
      cfg.rollout.num_prompts = 0  # no closing rollout report: the RL steps are the measurement
      start = time.perf_counter()
      summary = train.train_and_evaluate(cfg, workdir)
      results[label] = {
        "summary": summary,
        "mode": mode,
        "seed": seed,
        "wall_seconds": time.perf_counter() - start,
      }
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows += [_row(label, json.loads(line)) for line in f]
  table = _table(results, rows)
  host = host_info()
  print(format_host(host), flush=True)
  with open(os.path.join(out, "e2e_modes.json"), "w") as f:
    json.dump(
      {"host": host, "table": table, "steps": rows, "results": results}, f, indent=1, default=str
    )
  with open(os.path.join(out, "e2e_modes.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
  _plot(rows, os.path.join(out, "e2e_modes.png"))
  print(_markdown(table))


def _row(label, r):
  """One step of one run (a mode, or mode_s<seed>), as the table and plot use it."""
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
    "tail_s": r.get("time/rollout_tail", ""),
    "generate_s": r.get("time/rollout_generate", ""),
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
  }


def _per_arm(r, what):
  return {
    k.split("/")[2]: v for k, v in r.items() if k.startswith("spec/arm/") and k.endswith(what)
  }


def _table(results, rows):
  """Per run: mean step and rollout time over steps after the first (compiles), and
  speedups against the baseline of its seed; with several seeds, per mode the mean of
  its runs' figures and the range of their speedups."""
  table = {}
  for mode in results:
    mine = [r for r in rows if r["mode"] == mode]
    timed = mine[1:] if len(mine) > 1 else mine
    step = float(np.mean([r["step_s"] for r in timed]))
    rollout = float(np.mean([r["rollout_s"] for r in timed]))
    rl = results[mode]["summary"].get("rl", {})
    gen = [r for r in timed if r["generate_s"] != ""]
    tail = sum(r["tail_s"] for r in gen) / max(sum(r["generate_s"] for r in gen), 1e-9)
    table[mode] = {
      # Share of generation time at batch <= max_batch / 4: SD (on only there) can at
      # most cut the rollout by it, so the rollout speedup is capped at 1 / (1 - share).
      "tail_share": tail,
      "rollout_speedup_cap": 1.0 / max(1.0 - tail, 1e-9),
      "step_s": step,
      "rollout_s": rollout,
      "rollout_share": rollout / step,
      "final_eval": (rl.get("final_eval") or {}).get("accuracy"),
      "final_eval_sampled": (rl.get("final_eval") or {}).get("sampled_accuracy"),
      "accept_length": [r["accept_length"] for r in mine if r["accept_length"] != ""],
    }
  for label, t in table.items():
    info = results[label]
    base_label = "baseline" if label == info.get("mode", label) else f"baseline_s{info['seed']}"
    base = table.get(base_label)
    if base is None:
      continue
    t["step_speedup"] = base["step_s"] / t["step_s"]
    s = base["rollout_s"] / t["rollout_s"]
    t["rollout_speedup"] = s
    # Amdahl at the baseline's own rollout share r and at the paper's r = 0.85.
    for name, r in (("implied_at_own_r", base["rollout_share"]), ("implied_at_r085", 0.85)):
      t[name] = 1.0 / ((1 - r) + r / s)
  modes = {info.get("mode", label) for label, info in results.items()}
  if len(modes) < len(results):  # several seeds: one summary row per mode
    for mode in sorted(modes, key=_order):
      mine = [table[k] for k, info in results.items() if info.get("mode") == mode]
      agg = {
        k: float(np.mean([t[k] for t in mine]))
        for k in mine[0]
        if isinstance(mine[0][k], float) and all(isinstance(t.get(k), float) for t in mine)
      }
      agg["accept_length"] = mine[0]["accept_length"]
      for k in ("step_speedup", "rollout_speedup"):
        if k in agg:
          agg[f"{k}_range"] = [min(t[k] for t in mine), max(t[k] for t in mine)]
      table[f"{mode} (mean of {len(mine)} seeds)"] = agg
  return table


def _markdown(table):
  lines = [
    "| mode | step s | rollout s | rollout share | tail share | step speedup | "
    "rollout speedup s | implied at r=0.85 | final pass@1 greedy / sampled | "
    "accept length first -> last |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for mode, t in table.items():
    acc = t["accept_length"]
    lines.append(
      f"| {mode} | {t['step_s']:.2f} | {t['rollout_s']:.2f} | {t['rollout_share']:.2f} | "
      f"{t['tail_share']:.2f} | {t.get('step_speedup', float('nan')):.2f}x | "
      f"{t.get('rollout_speedup', float('nan')):.2f}x"
      f" | {t.get('implied_at_r085', float('nan')):.2f}x | {t.get('final_eval')} / "
      f"{t.get('final_eval_sampled')} | " + (f"{acc[0]:.2f} -> {acc[-1]:.2f} |" if acc else "- |")
    )
  return "\n".join(lines)


def _order(label):
  """baseline, sd, tlt; then by seed."""
  return (["baseline", "sd", "tlt"].index(label.split("_s")[0]), label)


def _plot(rows, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  modes = sorted({r["mode"] for r in rows}, key=_order)
  fig, ax = plt.subplots(1, 6, figsize=(26, 3.8))
  for m in modes:
    mine = [r for r in rows if r["mode"] == m]
    steps = [r["step"] for r in mine]
    ax[0].plot(steps, [r["step_s"] for r in mine], marker="o", label=m)
    ax[1].plot(steps, [r["reward"] for r in mine], label=f"{m} train reward")
    ev = [r for r in mine if r["eval"] != ""]
    ax[1].plot([r["step"] for r in ev], [r["eval"] for r in ev], "o--", label=f"{m} pass@1")
    ev = [r for r in mine if r["eval_sampled"] != ""]
    ax[1].plot(
      [r["step"] for r in ev], [r["eval_sampled"] for r in ev], "s:", label=f"{m} sampled pass@1"
    )
    acc = [r for r in mine if r["accept_length"] != ""]
    if acc:
      ax[2].plot([r["step"] for r in acc], [r["accept_length"] for r in acc], marker="o", label=m)
    gen = [r for r in mine if r["generate_s"] != ""]
    if gen:
      line = ax[4].plot(
        [r["step"] for r in gen], [r["generate_s"] for r in gen], "o-", label=f"{m} all"
      )
      ax[4].plot(
        [r["step"] for r in gen],
        [r["tail_s"] for r in gen],
        "s--",
        color=line[0].get_color(),
        label=f"{m} tail",
      )
    for arm in sorted({a for r in mine for a in json.loads(r.get("arm_accept", "{}"))}):
      pts = [(r["step"], json.loads(r["arm_accept"]).get(arm)) for r in mine]
      pts = [(x, y) for x, y in pts if y is not None]
      ax[5].plot(*zip(*pts), marker=".", label=f"{m} {arm}")
    rec = [r for r in mine if r["reclaimed_s"] != ""]
    if rec:
      ax[3].bar(
        [r["step"] - 0.2 for r in rec], [r["reclaimed_s"] for r in rec], 0.4, label="idle reclaimed"
      )
      ax[3].bar(
        [r["step"] + 0.2 for r in rec], [r["charged_s"] for r in rec], 0.4, label="long tail"
      )
  ax[0].set(xlabel="RL step", ylabel="seconds", title="step time")
  ax[1].set(xlabel="RL step", title="reward and held-out accuracy")
  ax[2].set(xlabel="RL step", ylabel="tokens per round", title="accepted length (sd vs tlt)")
  ax[3].set(xlabel="RL step", ylabel="seconds", title="drafter training time (tlt)")
  ax[5].set(xlabel="RL step", ylabel="tokens per round", title="accepted length per draft arm")
  ax[4].set(
    xlabel="RL step", ylabel="seconds", title="generation time: all vs batch <= max/4 (tail)"
  )
  for a in ax:
    a.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  app.run(main)

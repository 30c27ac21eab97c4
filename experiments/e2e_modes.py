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
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax import compare  # noqa: E402

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
  "analyze_only", False, "rebuild the tables and plot from the finished runs in --out"
)
_KEEP = flags.DEFINE_bool(
  "keep_finished",
  False,
  "keep the finished runs in --out (read, not rerun) and run the others: add a seed",
)


def main(argv):
  del argv
  out = _OUT.value
  os.makedirs(out, exist_ok=True)
  config = _CONFIG.value
  if _PREPARE.value:
    shared = compare.prepare_shared(config.copy_and_resolve_references(), out)
    print(f"warm starts ready in {shared}")
    return
  seeds = [int(s) for s in _SEEDS.value] or [int(config.seed)]
  results, rows = compare.run_modes(
    config, out, list(_MODES.value), seeds, analyze_only=_ANALYZE.value, keep_finished=_KEEP.value
  )
  table = compare.mode_table(results, rows)
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
  print(compare.markdown(table))
  # The arm mix and each draft arm's accept length per pass over the training set: with a
  # small set (configs/group_epochs.py) group drafts read more of each prompt's history.
  # The trainer records each step's pass; runs from before it count train_size steps.
  steps_per_epoch = max(1, -(-int(config.task.train_size) // int(config.rl.prompts_per_step)))
  epochs = [e for e in compare.arms_by_epoch(rows, steps_per_epoch) if e["chunks"]]
  if epochs:  # runs that drafted (the baseline records no arms)
    print("\narms by pass over the training set: chunks (accept length)")
    print(compare.arms_markdown(epochs))
    with open(os.path.join(out, "arms_by_epoch.json"), "w") as f:
      json.dump(epochs, f, indent=1)


def _order(label):
  """baseline, sd, tlt; then by seed."""
  return (compare.MODES.index(label.split("_s")[0]), label)


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

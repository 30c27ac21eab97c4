r"""Two or more tlt runs of one seed that differ only in the online drafter's settings.

Speculative decoding never changes a token, so such runs train the very same policy: their
rewards match step by step (checked here) and only the drafter, hence the rollout's seconds,
can differ. Per run: the online and the frozen drafter's accept length on the fixed prompts
at each drafter evaluation (`rl.drafter_eval_every`), drafter updates a step, the rollout's
accept length by quarter of the run, and the rollout's and the step's seconds after the
first step, lazy compiles and evaluations left out as the learning curve leaves them out,
paired step by step with the first run's; the update's seconds too, the same work in every
run, so its ratio is the host's drift between the runs.

  python experiments/learning_curve.py --config=configs/regime.py --modes=tlt --seed=5 \
    --config.rl.steps=20 --config.rl.drafter_eval_every=5 --config.rl.eval_every=0 \
    --out=runs/dd_new
  (the same with --out=runs/dd_old --config.drafter.online_learning_rate=0
   --config.drafter.keep_steps=2)
  python experiments/compare_drafter_runs.py --runs=runs/dd_new/tlt_s5,runs/dd_old/tlt_s5 \
    --labels=new,old
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import compare, curves  # noqa: E402

_RUNS = flags.DEFINE_list(
  "runs", [], "run folders (each with a metrics.jsonl); the first is the reference"
)
_LABELS = flags.DEFINE_list("labels", [], "a name per run (default: the folders' names)")
_OUT = flags.DEFINE_string("out", "", "write the report here as JSON too")


def load_rows(run: str) -> list[dict[str, Any]]:
  with open(os.path.join(run, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  # A resumed run logs the steps after its checkpoint twice: keep the last of each.
  by_step = {r["step"]: r for r in rows}
  return [by_step[s] for s in sorted(by_step)]


def same_policy(runs: dict[str, list[dict]]) -> dict[str, Any]:
  """Steps in common and those whose rewards or lengths differ from the first run's."""
  ref_label, ref = next(iter(runs.items()))
  ref_by = {r["step"]: r for r in ref}
  out = {}
  for label, rows in runs.items():
    if label == ref_label:
      continue
    common = [r for r in rows if r["step"] in ref_by]
    differ = [
      r["step"]
      for r in common
      if (r["reward_mean"], r["length_mean"])
      != (ref_by[r["step"]]["reward_mean"], ref_by[r["step"]]["length_mean"])
    ]
    out[label] = {"steps": len(common), "differing_steps": differ}
  return out


def drafter_evals(rows: list[dict]) -> list[dict[str, Any]]:
  return [
    {
      "step": r["step"],
      "online": r["drafter_eval/accept_online"],
      "frozen": r["drafter_eval/accept_frozen"],
      "online_minus_frozen": r["drafter_eval/accept_online"] - r["drafter_eval/accept_frozen"],
      "version": r.get("drafter_eval/online_version", r.get("drafter/version")),
    }
    for r in rows
    if "drafter_eval/accept_online" in r
  ]


def by_quarter(rows: list[dict], key: str) -> list[float]:
  values = np.asarray([r[key] for r in rows if key in r], np.float64)
  return [float(q.mean()) for q in np.array_split(values, 4) if q.size]


def timed_steps(rows: list[dict]) -> dict[int, dict]:
  """Steps after the first, as the learning curve times them (`compare.step_row`): lazy
  compiles and evaluations (the drafter's included) taken out of their seconds."""
  return {r["step"]: {**compare.step_row("", r), "update_s": r["time/update"]} for r in rows[1:]}


def report(runs: dict[str, list[dict]]) -> dict[str, Any]:
  ref_label = next(iter(runs))
  timed = {label: timed_steps(rows) for label, rows in runs.items()}
  common = sorted(set.intersection(*(set(t) for t in timed.values())))
  out: dict[str, Any] = {"same_policy": same_policy(runs), "timed_steps": common, "runs": {}}
  for label, rows in runs.items():
    updates = [r.get("drafter/updates", 0) for r in rows]
    entry: dict[str, Any] = {
      "steps": len(rows),
      "drafter_evals": drafter_evals(rows),
      "drafter_updates": {"min": int(min(updates)), "mean": float(np.mean(updates))},
      "rollout_accept_by_quarter": by_quarter(rows, "spec/accept_length"),
      "rollout_s": float(sum(timed[label][s]["rollout_s"] for s in common)),
      "step_s": float(sum(timed[label][s]["step_s"] for s in common)),
    }
    if label != ref_label and common:
      ref = timed[ref_label]
      # The update is the same work in every run (same policy, same tokens): its ratio is
      # the host's drift between the runs, the control for the others.
      for what in ("rollout", "step", "update"):
        entry[f"{what}_over_{ref_label}"] = curves.ratio_spread(
          [timed[label][s][f"{what}_s"] for s in common],
          [ref[s][f"{what}_s"] for s in common],
        )
    out["runs"][label] = entry
  return out


def markdown(rep: dict[str, Any]) -> str:
  lines = [
    "| run | step | online | frozen | online - frozen | drafter version |",
    "|---|---|---|---|---|---|",
  ]
  for label, e in rep["runs"].items():
    for d in e["drafter_evals"]:
      lines.append(
        f"| {label} | {d['step']} | {d['online']:.2f} | {d['frozen']:.2f} | "
        f"{d['online_minus_frozen']:+.2f} | {d['version']} |"
      )
  lines += [
    "",
    "| run | updates a step (min / mean) | rollout accept by quarter | rollout s | step s |",
  ]
  lines.append("|---|---|---|---|---|")
  for label, e in rep["runs"].items():
    quarters = " / ".join(f"{q:.2f}" for q in e["rollout_accept_by_quarter"])
    u = e["drafter_updates"]
    lines.append(
      f"| {label} | {u['min']} / {u['mean']:.1f} | {quarters} | "
      f"{e['rollout_s']:.1f} | {e['step_s']:.1f} |"
    )
  for label, e in rep["runs"].items():
    for what in ("rollout", "step", "update"):
      key = next((k for k in e if k.startswith(f"{what}_over_")), None)
      if key:
        r = e[key]
        lines.append(
          f"\n{label} {key.replace('_', ' ')}: {r['of_totals']:.3f} of totals, per step median "
          f"{r['median']:.3f} [{r['quartiles'][0]:.3f}-{r['quartiles'][1]:.3f}]"
        )
  lines.append(
    f"\nsteps timed (after the first, compiles and evaluations out): {len(rep['timed_steps'])}"
  )
  lines.append(f"same policy: {json.dumps(rep['same_policy'])}")
  return "\n".join(lines)


def main(argv):
  del argv
  if len(_RUNS.value) < 2:
    raise app.UsageError("--runs needs two run folders or more")
  labels = _LABELS.value or [os.path.basename(os.path.normpath(r)) for r in _RUNS.value]
  if len(labels) != len(_RUNS.value):
    raise app.UsageError("--labels needs a name per run")
  runs = {label: load_rows(run) for label, run in zip(labels, _RUNS.value)}
  rep = report(runs)
  horizons = {label: compare.schedule_horizon(run) for label, run in zip(labels, _RUNS.value)}
  rep["schedule_horizons"] = horizons
  print(markdown(rep))
  if len(set(horizons.values())) > 1:
    # Past the warmup every step's learning rate depends on the horizon.
    print(
      f"\nWARNING: the runs' learning-rate schedules span different RL steps {horizons}: "
      "their policies part after the warmup (rerun with --config.rl_update.schedule_steps)"
    )
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(rep, f, indent=1)


if __name__ == "__main__":
  app.run(main)

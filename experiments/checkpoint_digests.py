r"""Runs' saved policies compared step by step: a hash per checkpoint, and where two runs'
hashes differ, the parameters that differ most.

Runs of one seed and config train the very same policy in every mode (speculative
decoding changes no token), so their checkpoints at a step hash alike; where they do not,
the largest differences say how: a fraction of each parameter group's learning rate points
at the optimizer's schedule (RESULTS.md, 2026-12-03: the schedule spans `rl.steps`), a
rounding-sized one at arithmetic. Reads the checkpoints alone (no model is built).

  python experiments/checkpoint_digests.py \
    --runs=runs/ex_sd/sd_s5,runs/ex_b/tlt_s5,runs/ex_a/tlt_s5
"""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import compare  # noqa: E402

_RUNS = flags.DEFINE_list(
  "runs", [], "run folders, each with checkpoints/; the first is the reference"
)
_TOP = flags.DEFINE_integer("top", 3, "parameters listed where two runs differ")
_OUT = flags.DEFINE_string("out", "", "write the report here as JSON too")


def saved_params(run: str) -> dict[int, dict]:
  """{step: params as saved (nested dicts of numpy arrays)} for every checkpoint of `run`."""
  manager = ocp.CheckpointManager(os.path.abspath(os.path.join(run, "checkpoints")))
  out = {}
  for step in manager.all_steps():
    args = ocp.args.Composite(state=ocp.args.StandardRestore())
    out[step] = manager.restore(step, args=args)["state"]["params"]
  return out


def largest_differences(a, b, top: int) -> list[tuple[str, float]]:
  """The `top` parameters by max |a - b| (name, value)."""
  diffs = jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), a, b)
  flat = [(jax.tree_util.keystr(k), v) for k, v in jax.tree_util.tree_flatten_with_path(diffs)[0]]
  return sorted(flat, key=lambda kv: -kv[1])[:top]


def report(runs: list[str], top: int) -> dict:
  saved = {run: saved_params(run) for run in runs}
  ref = runs[0]
  steps = sorted({s for by_step in saved.values() for s in by_step})
  rows = []
  for step in steps:
    row = {
      "step": step,
      "digests": {r: compare.params_digest(p[step]) for r, p in saved.items() if step in p},
    }
    if step in saved[ref]:
      for run in runs[1:]:
        if step in saved[run] and row["digests"][run] != row["digests"][ref]:
          row.setdefault("differ", {})[run] = largest_differences(
            saved[ref][step], saved[run][step], top
          )
    rows.append(row)
  horizons = {run: compare.schedule_horizon(run) for run in runs}
  return {"runs": runs, "schedule_horizons": horizons, "steps": rows}


def main(argv):
  del argv
  if not _RUNS.value:
    raise app.UsageError("--runs names at least one run folder")
  rep = report(_RUNS.value, _TOP.value)
  print(f"learning-rate schedules span: {rep['schedule_horizons']}")
  for row in rep["steps"]:
    print(f"after {row['step']} steps: {row['digests']}")
    for run, top in row.get("differ", {}).items():
      listed = ", ".join(f"{name} {value:.3g}" for name, value in top)
      print(f"  {run} differs from {rep['runs'][0]} most in: {listed}")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(rep, f, indent=1)


if __name__ == "__main__":
  app.run(main)

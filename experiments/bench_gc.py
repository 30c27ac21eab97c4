r"""The cycle collector's pauses in a command's processes, under CPython's default settings
and under `tlt_jax.utils.collector.settle_heap` (start-up heap frozen, young collections
rarer; what the CLI, the learning-curve runner and the test suite call).

Each repetition runs the command once per variant (interleaved, so a host's drift falls on
both alike): "default" with TLT_GC=default, which makes `settle_heap` a no-op, "settled"
without it. `experiments/gc_trace` goes first on PYTHONPATH, so every Python process the
command starts (pytest's workers, a job's subprocesses) records its collections. Per
variant: the command's wall seconds, the collections' seconds summed over its processes,
their count by generation, the longest pause, the pauses of 0.1 s or more, and the objects
the full collections found.

  python experiments/bench_gc.py --reps=2 --out=runs/gc -- \
    python -m pytest -n 2 -q -p no:cacheprovider tests/test_engine_spec.py
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
import subprocess
import time

from absl import app, flags

_VARIANTS = flags.DEFINE_list("variants", ["default", "settled"], "default and/or settled")
_REPS = flags.DEFINE_integer("reps", 2, "runs of the command per variant")
_OUT = flags.DEFINE_string("out", "runs/bench_gc", "folder for the traces and the report")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE_SITE = os.path.join(ROOT, "experiments", "gc_trace")
LONG_PAUSE_S = 0.1


def run_traced(command: list[str], variant: str, folder: str) -> float:
  """Runs `command` under `variant` with every process's collections traced into
  `folder`; returns its wall seconds. A failing command is an error."""
  if variant not in ("default", "settled"):
    raise ValueError(f"unknown variant {variant!r}: default or settled")
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder)
  env = dict(os.environ, GC_TRACE_DIR=folder)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (TRACE_SITE, env.get("PYTHONPATH")) if p)
  env.pop("TLT_GC", None)
  if variant == "default":
    env["TLT_GC"] = "default"
  start = time.perf_counter()
  done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
  wall = time.perf_counter() - start
  if done.returncode != 0:
    raise RuntimeError(f"{command} failed ({variant}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
  return wall


def summarise(folder: str) -> dict:
  """The collections recorded in `folder`, over all its processes."""
  processes = []
  for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
    with open(path) as f:
      processes.append(json.load(f))
  events = [e for p in processes for e in p["events"]]
  pauses = [e[2] for e in events]
  return {
    "processes": len(processes),
    "gc_s": sum(pauses),
    "count": [sum(e[1] == g for e in events) for g in range(3)],
    "seconds_by_generation": [sum(e[2] for e in events if e[1] == g) for g in range(3)],
    "max_pause_s": max(pauses, default=0.0),
    "long_pauses": sum(p >= LONG_PAUSE_S for p in pauses),
    "full_collected": sum(e[3] for e in events if e[1] == 2),
    "frozen": max((p["frozen"] for p in processes), default=0),
  }


def spread(xs: list[float]) -> dict[str, float]:
  return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main(argv):
  command = argv[1:]
  if not command:
    raise app.UsageError("give the command after --")
  from host import host_record  # imports JAX here, never in the traced processes

  print(host_record(), flush=True)
  runs: dict[str, list[dict]] = {v: [] for v in _VARIANTS.value}
  for rep in range(_REPS.value):
    for v in _VARIANTS.value:
      wall = run_traced(command, v, os.path.join(_OUT.value, f"{v}_{rep}"))
      row = {"wall_s": wall, **summarise(os.path.join(_OUT.value, f"{v}_{rep}"))}
      runs[v].append(row)
      print(
        f"{v} #{rep}: wall {wall:.1f} s, collections {row['gc_s']:.2f} s in "
        f"{row['processes']} processes (by generation {row['count']}, "
        f"{[round(s, 2) for s in row['seconds_by_generation']]} s), longest pause "
        f"{row['max_pause_s']:.3f} s, {row['long_pauses']} of >= {LONG_PAUSE_S} s, "
        f"full collections found {row['full_collected']} objects",
        flush=True,
      )
  report = {
    "command": command,
    "runs": runs,
    "summary": {
      v: {k: spread([r[k] for r in rs]) for k in ("wall_s", "gc_s", "max_pause_s")}
      for v, rs in runs.items()
    },
  }
  for v, s in report["summary"].items():
    print(
      f"{v}: wall {s['wall_s']['median']:.1f} s [{s['wall_s']['min']:.1f}-"
      f"{s['wall_s']['max']:.1f}], collections {s['gc_s']['median']:.2f} s "
      f"[{s['gc_s']['min']:.2f}-{s['gc_s']['max']:.2f}], longest pause "
      f"{s['max_pause_s']['median']:.3f} s"
    )
  with open(os.path.join(_OUT.value, "bench_gc.json"), "w") as f:
    json.dump(report, f, indent=1)


if __name__ == "__main__":
  app.run(main)

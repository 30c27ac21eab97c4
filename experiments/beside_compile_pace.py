r"""How fast a rollout's chunks ran beside a background compile, against the same cell's
chunks that ran alone: read from runs' recorded timelines (rollout_timelines.jsonl).

With `engine.background_compiles` a chunk that runs while a program compiles on a host
thread teaches the bandit nothing (`rollout.run`): on a 2-core CPU the compile takes one of
the cores the chunk computes on. On an accelerator the compile is host work beside device
work, so those chunks may run at their arm's own pace and could teach. This measures it, per
cell (arm, batch bucket, cache view): the median seconds a step (plain decode) or a round
(speculative) of the chunks beside a compile over that of the chunks run alone. Chunks that
compiled, and each cell's first chunk in the run (its program's first run carries one-time
costs; runs before 2026-12-07 do not mark it), are left out of both.

  python experiments/beside_compile_pace.py \
    --runs=experiments/results/background_compiles_hostG_2026-12-07/tlt_s0
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from absl import app, flags

_RUNS = flags.DEFINE_list("runs", [], "run folders, each with rollout_timelines.jsonl")
_MIN_CHUNKS = flags.DEFINE_integer(
  "min_chunks", 2, "chunks a cell needs on each side (beside a compile, alone) to be compared"
)


def chunk_paces(timelines: Iterable[Sequence[Mapping[str, Any]]]):
  """(cell, seconds per step or round, whether it ran beside a compile) of each chunk that
  compiled nothing and was not its cell's first, in the order the timelines ran."""
  seen = set()
  for timeline in timelines:
    for e in timeline:
      if e["phase"] == "decode" and e.get("steps"):
        cell, units = ("plain", int(e["batch"]), int(e["view"])), e["steps"]
      elif e["phase"] == "spec" and e.get("rounds"):
        cell, units = (e["strategy"], int(e["batch"]), int(e["view"])), e["rounds"]
      else:
        continue
      first = cell not in seen or e.get("first_run")
      seen.add(cell)
      if first or e.get("compile_s") or e.get("rebuild_first_run"):
        continue
      yield cell, e["dt"] / units, bool(e.get("beside_compile"))


def pace_table(timelines: Iterable[Sequence[Mapping[str, Any]]], min_chunks: int = 2) -> dict:
  """Per cell with at least `min_chunks` chunks on each side: their counts, median seconds
  a unit beside a compile and alone, and the ratio; "ratios": the cells' ratios, sorted."""
  paces: dict[tuple, tuple[list[float], list[float]]] = {}
  for cell, pace, beside in chunk_paces(timelines):
    paces.setdefault(cell, ([], []))[0 if beside else 1].append(pace)
  cells = {}
  for cell, (beside, alone) in sorted(paces.items()):
    if min(len(beside), len(alone)) < min_chunks:
      continue
    b, a = statistics.median(beside), statistics.median(alone)
    cells["/".join(map(str, cell))] = {
      "beside": len(beside),
      "alone": len(alone),
      "beside_s": b,
      "alone_s": a,
      "ratio": b / a,
    }
  return {"cells": cells, "ratios": sorted(c["ratio"] for c in cells.values())}


def run_timelines(run: str) -> list[list[dict]]:
  """Every rollout's timeline of a run, step by step."""
  with open(os.path.join(run, "rollout_timelines.jsonl")) as f:
    return [r["timeline"] for line in f for r in json.loads(line)["rollouts"]]


def main(argv):
  del argv
  if not _RUNS.value:
    raise app.UsageError("--runs names at least one run folder")
  for run in _RUNS.value:
    table = pace_table(run_timelines(run), _MIN_CHUNKS.value)
    print(f"{run}:")
    print("| cell (arm/batch/view) | chunks beside / alone | s a unit beside | alone | ratio |")
    print("|---|---|---|---|---|")
    for name, c in table["cells"].items():
      print(
        f"| {name} | {c['beside']} / {c['alone']} | {c['beside_s']:.4f} | {c['alone_s']:.4f} "
        f"| {c['ratio']:.2f} |"
      )
    ratios = table["ratios"]
    if ratios:
      print(
        f"{len(ratios)} cells: beside a compile at {statistics.median(ratios):.2f}x the pace "
        f"alone (median; {ratios[0]:.2f}-{ratios[-1]:.2f})"
      )
    else:
      print("no cell ran chunks both beside a compile and alone")


if __name__ == "__main__":
  app.run(main)

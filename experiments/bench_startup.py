r"""What a fresh Python process spends importing this project's modules: every CLI run, test
subprocess and notebook kernel pays it before its first program compiles.

Each repetition starts one process per variant and module (interleaved, so a host's drift
falls on every variant alike) under `python -X importtime -c "import MODULE"`, and reads the
module's cumulative import seconds and the process's wall seconds; the heaviest modules by
their own import time are listed for the first variant. A variant is `NAME=PATHS`: PATHS
(os.pathsep-separated, may be empty) put before PYTHONPATH, e.g. a folder holding another
version of a package (`pip install --no-deps --target DIR pkg==X`).

  python experiments/bench_startup.py --variants=installed=,ml_dtypes_0.6.0=/tmp/mld_0.6.0
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

_MODULES = flags.DEFINE_list("modules", ["jax", "tlt_jax.main"], "modules imported, each alone")
_VARIANTS = flags.DEFINE_list(
  "variants", ["installed="], "NAME=PATHS: PATHS put before PYTHONPATH (empty: as installed)"
)
_REPS = flags.DEFINE_integer("reps", 5, "processes per variant and module")
_TOP = flags.DEFINE_integer("top", 8, "heaviest modules (own import time) listed")
_OUT = flags.DEFINE_string("out", "", "where to write the JSON report (printed either way)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_importtime(stderr: str) -> dict[str, tuple[float, float]]:
  """`-X importtime`'s lines as {module: (own seconds, cumulative seconds)}; a module
  imported at several depths keeps its shallowest line."""
  out: dict[str, tuple[float, float, int]] = {}
  for line in stderr.splitlines():
    if not line.startswith("import time:") or "self [us]" in line:
      continue
    own, cumulative, name = line[len("import time:") :].split("|")
    depth = len(name) - len(name.lstrip())
    module = name.strip()
    if module not in out or depth < out[module][2]:
      out[module] = (int(own) / 1e6, int(cumulative) / 1e6, depth)
  return {m: (own, cum) for m, (own, cum, _) in out.items()}


def time_import(module: str, paths: str) -> dict:
  """One fresh process importing `module` with `paths` before PYTHONPATH."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (paths, ROOT, env.get("PYTHONPATH", "")) if p)
  start = time.perf_counter()
  done = subprocess.run(
    [sys.executable, "-X", "importtime", "-c", f"import {module}"],
    env=env,
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  wall = time.perf_counter() - start
  if done.returncode != 0:
    raise RuntimeError(
      f"import {module} failed with {paths or 'the installed packages'}:\n{done.stderr[-2000:]}"
    )
  modules = parse_importtime(done.stderr)
  return {"wall_s": wall, "import_s": modules[module][1], "modules": modules}


def spread(xs: list[float]) -> dict[str, float]:
  return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def bench(modules: list[str], variants: dict[str, str], reps: int, top: int) -> dict:
  """Per module and variant the wall and import seconds' median [min-max], the ratio of the
  first variant's median import seconds to each one's, and the first variant's heaviest
  modules by own import seconds (median over its processes)."""
  runs = {m: {v: [] for v in variants} for m in modules}
  for _ in range(reps):
    for m in modules:
      for v, paths in variants.items():
        runs[m][v].append(time_import(m, paths))
  first = next(iter(variants))
  report = {}
  for m in modules:
    table = {}
    for v in variants:
      table[v] = {
        "wall_s": spread([r["wall_s"] for r in runs[m][v]]),
        "import_s": spread([r["import_s"] for r in runs[m][v]]),
      }
      table[v]["first_over_this"] = (
        table[first]["import_s"]["median"] / table[v]["import_s"]["median"]
      )
    own: dict[str, list[float]] = {}
    for r in runs[m][first]:
      for name, (s, _) in r["modules"].items():
        own.setdefault(name, []).append(s)
    heaviest = sorted(own, key=lambda n: -statistics.median(own[n]))[:top]
    table["heaviest_own_s"] = {n: statistics.median(own[n]) for n in heaviest}
    report[m] = table
  return report


def main(argv):
  del argv
  from host import host_record  # imports JAX here, never in the timed processes

  print(host_record(), flush=True)
  variants = dict(v.split("=", 1) for v in _VARIANTS.value)
  report = bench(_MODULES.value, variants, _REPS.value, _TOP.value)
  for m, table in report.items():
    for v in variants:
      row = table[v]
      w, i = row["wall_s"], row["import_s"]
      print(
        f"import {m} [{v}]: {i['median']:.2f} s [{i['min']:.2f}-{i['max']:.2f}], "
        f"process {w['median']:.2f} s [{w['min']:.2f}-{w['max']:.2f}]; "
        f"{row['first_over_this']:.2f}x the first variant's speed"
      )
    heaviest = ", ".join(f"{n} {s:.2f}" for n, s in table["heaviest_own_s"].items())
    print(f"  heaviest own import seconds [{next(iter(variants))}]: {heaviest}")
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump({"variants": variants, "reps": _REPS.value, "report": report}, f, indent=1)


if __name__ == "__main__":
  app.run(main)

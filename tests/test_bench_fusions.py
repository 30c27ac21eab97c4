"""experiments/bench_fusions.py on the regime's tiny variant: every program under both
settings, timed and written out (its figures are the RESULTS entry's; here, that it runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_program_runs_under_every_setting(tmp_path):
  out = tmp_path / "fusions.json"
  cmd = [
    sys.executable,
    "experiments/bench_fusions.py",
    "--config=configs/regime.py:tiny",
    "--programs=update,drafter,decode",
    "--cells=1x1,2x5",
    "--rows=4",
    "--width=128",
    "--context=16",
    "--reps=1",
    f"--out={out}",
  ]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads(out.read_text())["results"]
  got = {(r["program"], r["setting"]) for r in results}
  programs = {"update", "drafter", "decode 1x1", "decode 2x5"}
  assert got == {(p, s) for p in programs for s in ("xla", "dots")}
  assert all(r["median_s"] > 0 for r in results)


def test_an_unknown_program_is_refused_before_anything_compiles():
  cmd = [sys.executable, "experiments/bench_fusions.py", "--programs=update,rollout"]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode != 0
  assert "unknown ['rollout']" in done.stderr, done.stderr[-2000:]

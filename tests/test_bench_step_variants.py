"""experiments/bench_step_variants.py on the regime's tiny variant: both variants of each
choice traced, timed, compared and written out (its figures are RESULTS entries'; here,
that it runs, and that variants computing the same math on a CPU are found to agree)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
  "compare,variants,shape",
  [
    ("write", {"scatter", "update"}, "configs/regime.py:tiny"),
    ("form", {"reduce", "dots"}, "configs/regime.py:tiny"),
    ("head", {"float32", "compute"}, "tiny"),  # a bfloat16 policy, where the heads differ
    ("fused", {"dots", "fused"}, "tiny"),  # cuDNN's attention on GPUs only: the dots here
  ],
)
def test_both_variants_are_timed_per_shape_and_cell(tmp_path, compare, variants, shape):
  out = tmp_path / "variants.json"
  cmd = [
    sys.executable,
    "experiments/bench_step_variants.py",
    f"--compare={compare}",
    f"--shapes={shape}",
    # No rows: a cell that fails, recorded with its error, and the next cells still run.
    f"--cells={'0x1,' if compare == 'fused' else ''}1x1,2x3",
    "--context=16",
    "--reps=2",
    f"--out={out}",
  ]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads(out.read_text())
  assert report["compare"] == compare
  results = report["results"]
  if compare == "fused":
    failed, *results = results
    assert failed["cell"] == "0x1" and failed["error"] and "times_s" not in failed
  assert [(r["shape"], r["cell"]) for r in results] == [(shape, "1x1"), (shape, "2x3")]
  for r in results:
    assert set(r["times_s"]) == variants
    assert all(len(t) == 2 and min(t) > 0 for t in r["times_s"].values())
    assert len(r["ratios"]) == 2
    assert 0 <= r["rows_agree"] <= 1 and r["cache_gap"] >= 0
    if compare in ("write", "fused"):  # the same math on a CPU, fused by XLA its own way
      assert r["rows_agree"] == 1 and r["cache_gap"] < 1e-5

"""experiments/bench_cache_write.py on the regime's tiny variant: both cache writes traced,
timed and written out (its figures are the RESULTS entry's; here, that it runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_both_writes_are_timed_per_policy_and_token_count(tmp_path):
  out = tmp_path / "cache_write.json"
  cmd = [
    sys.executable,
    "experiments/bench_cache_write.py",
    "--shapes=configs/regime.py:tiny",
    "--tokens=1,3",
    "--context=16",
    "--reps=2",
    f"--out={out}",
  ]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads(out.read_text())["results"]
  assert [(r["shape"], r["tokens"]) for r in results] == [
    ("configs/regime.py:tiny", 1),
    ("configs/regime.py:tiny", 3),
  ]
  for r in results:
    assert set(r["times_s"]) == {"scatter", "update"}
    assert all(len(t) == 2 and min(t) > 0 for t in r["times_s"].values())
    assert len(r["ratios"]) == 2

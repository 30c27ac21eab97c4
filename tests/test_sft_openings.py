"""experiments/sft_openings.py: long demonstrations cut after a whole line
(`experiments.common.opening`), and the stage run end to end on the regime's tiny variant
(its figures are the RESULTS entry's; here, that it runs and writes what it says)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
from flax import nnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments.common import opening  # noqa: E402


def test_an_opening_ends_after_a_whole_line():
  solution = "~3:1+2=3;2:3+2=5;1:5+2=7;#7"
  assert opening(solution, 1) == "~3:1+2=3;"
  assert opening(solution, 2) == "~3:1+2=3;2:3+2=5;"
  assert opening(solution, 3) is None  # as long as the solution's lines: kept whole


def test_the_stage_runs_from_a_warm_start_and_saves_its_policy(tmp_path):
  from configs import regime
  from tlt_jax import checkpoint, configuration
  from tlt_jax.data import CharTokenizer
  from tlt_jax.models.transformer import init_model

  config = regime.get_config("tiny")
  model_cfg = configuration.model_config(config, CharTokenizer())
  _, params = nnx.split(init_model(model_cfg, seed=0))
  checkpoint.save_params(tmp_path / "init" / "warm_start", params)
  out = tmp_path / "stage"
  cmd = [
    sys.executable,
    "experiments/sft_openings.py",
    "--config=configs/regime.py:tiny",
    f"--init={tmp_path / 'init' / 'warm_start'}",
    f"--out={out}",
    "--steps=12",
    "--whole=64",
    "--openings=64",
    "--rows=2",
    "--row_len=256",
  ]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads((out / "sft_openings.json").read_text())
  counts = report["counts"]
  assert counts["whole"] + counts["openings"] == 128 and counts["three_digit_openings"] > 0
  assert len(report["history"]) == 12
  trained = checkpoint.restore_params(out / "warm_start", params)
  pairs = zip(jax.tree.leaves(params), jax.tree.leaves(trained), strict=True)
  assert any(not np.array_equal(a, b) for a, b in pairs)  # SFT moved it

"""experiments/deviceless.py where neither the CUDA plugin nor libtpu is installed (this
project's own environment, CI's): it stops at once and says what it needs, rather than
counting a CPU's kernels as a GPU's or a TPU's. Its counting is tests/test_traces.py's
(`loop_kernels`)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
  "target,needs", [("h100", "needs the CUDA plugin"), ("v6e:2x2", "needs libtpu")]
)
def test_without_the_plugin_it_says_what_it_needs(tmp_path, target, needs):
  cmd = [sys.executable, "experiments/deviceless.py", f"--target={target}", f"--out={tmp_path}"]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode != 0
  assert needs in done.stderr, done.stderr[-2000:]
  assert not os.listdir(tmp_path)

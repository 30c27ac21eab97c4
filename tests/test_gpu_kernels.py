"""experiments/gpu_kernels.py where the CUDA plugin is not installed (this project's own
environment, CI's): it stops at once and says what it needs, rather than counting a CPU's
kernels as a GPU's. Its counting is tests/test_traces.py's (`loop_kernels`)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_without_the_cuda_plugin_it_says_what_it_needs(tmp_path):
  cmd = [sys.executable, "experiments/gpu_kernels.py", f"--out={tmp_path}"]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode != 0
  assert "needs the CUDA plugin" in done.stderr, done.stderr[-2000:]
  assert not os.listdir(tmp_path)

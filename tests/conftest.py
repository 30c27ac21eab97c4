"""Shared test set-up.

Every new shape compiles (seconds on these CPUs), so fixtures that build
engines are module-scoped and share compiled programs across tests.

The whole run also shares one persistent XLA compilation cache: the xdist
workers, and the CLI runs and notebook kernels the tests start as subprocesses
(they inherit the environment), build many identical programs (the tiny
config's engines, the SIGKILL test's three runs of one job). A cache hit loads
the very executable a compile would build, so results do not change. The cache
lives in a fresh directory per run (a cold start, as on a new machine) and is
removed at the end; the size limit turns on JAX's file lock, which makes the
directory safe to share between processes.

The suite's programs are tiny and most run a handful of times, so compiling them is
most of its time: LLVM runs without its expensive passes, and XLA's CPU backend emits
fusions with its older emitters (where the jaxlib still has them) and no XNNPACK
(compile-speed settings; the programs compute the same functions and every comparison in
the suite is between runs under the same flags or within a tolerance). Measured in
experiments/RESULTS.md (test suite).

Each test process freezes its start-up heap out of Python's cycle collector and makes its
young collections rarer (`tlt_jax.utils.collector`, as a job does): full collections over
JAX's caches were seconds of every worker's time and found next to nothing.
"""

import os
import shutil
import tempfile
from importlib import metadata

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The benchmarks the suite runs are checks, not figures: their host record leaves out the
# 50M reference policy's forwards (~15 s a process here; experiments/host.py).
os.environ.setdefault("TLT_HOST_FORWARDS", "0")
_FAST_COMPILE = (
  "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
  " --xla_cpu_use_xnnpack=false"
)
# jaxlib 0.11 has no older emitters to pick, and XLA aborts on a flag it does not know.
if tuple(int(p) for p in metadata.version("jaxlib").split(".")[:2]) < (0, 11):
  _FAST_COMPILE += " --xla_cpu_use_fusion_emitters=false"
if _FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

_CACHE_ENV = "TLT_JAX_TEST_XLA_CACHE"
_OWNS_CACHE = _CACHE_ENV not in os.environ  # the xdist controller (or a plain run)
if _OWNS_CACHE:
  os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="tlt_jax_xla_cache_")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ[_CACHE_ENV])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))

# Imported once the environment above is set (JAX reads it on import), so that what every
# test process holds to its end leaves the cycle collector's full collections, as in a job
# (tlt_jax.main).
import jax  # noqa: E402, F401
from flax import nnx  # noqa: E402, F401

from tlt_jax.utils import collector  # noqa: E402

collector.settle_heap()


def pytest_unconfigure(config):
  del config
  if _OWNS_CACHE:
    shutil.rmtree(os.environ[_CACHE_ENV], ignore_errors=True)

"""JAX's persistent compilation cache, kept apart per host.

A resumed or repeated run compiles the same programs again: minutes on a CPU (a curve's
three modes compile ~300 programs). JAX can keep compiled executables on disk and load
them instead. On a CPU an executable is machine code for the host that built it, and JAX's
cache key names the CPU backend but not the processor's instruction sets, so each host
gets a folder of its own (a tag of its model name and instruction-set flags): a workdir
copied to another machine compiles afresh rather than loading code its CPU may not run.
"""

from __future__ import annotations

import hashlib
import os
import platform

import jax

# Least-recently-used entries are dropped past this many bytes (JAX's own eviction).
DEFAULT_MAX_BYTES = 4 << 30


def host_tag() -> str:
  """A short, stable name for this host's processor: its model name and feature flags."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
    cpu = "".join(sorted(set(lines))) or cpu
  except OSError:
    pass
  return f"{platform.machine()}-{hashlib.sha256(cpu.encode()).hexdigest()[:12]}"


def enable(directory: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
  """Caches compiled programs under `directory`/<host tag> and returns that folder; ""
  leaves the cache as it is (off, unless JAX_COMPILATION_CACHE_DIR turned it on), and a
  cache already named by JAX_COMPILATION_CACHE_DIR wins over `directory`. JAX caches the
  programs that took a second or more to compile (its default)."""
  if not directory or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return jax.config.jax_compilation_cache_dir or ""
  path = os.path.join(os.path.abspath(os.path.expanduser(directory)), host_tag())
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
  return path

"""The host a measurement ran on, recorded beside every figure.

Hosts of the same nominal kind differ (on two 2-core "AMD EPYC" machines a 5-token
forward cost 1.5 and 2.8 one-token forwards), so a figure without its host is not a figure.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time

import jax
import jax.numpy as jnp


def cpu_model() -> str:
  """lscpu's model name (falls back to platform.processor())."""
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    for line in out.splitlines():
      if line.startswith("Model name:"):
        return line.split(":", 1)[1].strip()
  except (OSError, subprocess.SubprocessError):
    pass
  return platform.processor() or "unknown"


def read_bandwidth(nbytes: int = 1 << 30) -> float:
  """Bytes/s of a streaming read (a sum over a large array), the decode's access pattern."""
  x = jnp.ones((nbytes // 4,), jnp.float32)
  f = jax.jit(lambda a: jnp.sum(a))
  f(x).block_until_ready()
  times = []
  for _ in range(5):
    t = time.perf_counter()
    f(x).block_until_ready()
    times.append(time.perf_counter() - t)
  return nbytes / min(times)


def host_record(bandwidth_bytes: int = 1 << 28) -> str:
  """One line: date, CPU model, cores, JAX devices and version, streaming read bandwidth."""
  bw = read_bandwidth(bandwidth_bytes) / 1e9
  devices = jax.devices()
  return (
    f"host: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {cpu_model()}, "
    f"{os.cpu_count()} cores, {len(devices)} x {devices[0].platform} "
    f"(jax {jax.__version__}), read bandwidth {bw:.1f} GB/s"
  )

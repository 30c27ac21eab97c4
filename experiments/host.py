"""The host a measurement ran on, recorded beside every figure.

Hosts of the same nominal kind differ (on two 2-core "AMD EPYC" machines a 5-token
forward cost 1.5 and 2.8 one-token forwards), so a figure without its host is not a
figure. `host_info` measures, in the benchmark's own process: CPU model (lscpu), cores,
JAX devices, streaming read bandwidth, and the cost of a cached 1 / 5 / 17-token forward
of the policy at batch 1 (the verification cost curve: what a speculative round pays to
score a draft of 0 / 4 / 16 nodes, in decode steps).

  python experiments/host.py            # this host, with the 50M sd_bench-shaped policy

TLT_HOST_FORWARDS=0 leaves out the default policy's forwards (a benchmark passing its own
policy still times it): where a benchmark's run is a check, not a figure (the test suite),
or where every second is another measurement's (a device sitting, whose real-size stages
time the same policy).
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax.models.transformer import KVCache  # noqa: E402

FORWARD_TOKENS = (1, 5, 17)


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


def matmul_flops(n: int = 2048, reps: int = 5) -> float:
  """Sustained FLOP/s of a square float32 matmul (the arithmetic ceiling)."""
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    f(a).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2 * n**3 / min(times)


# Spec-sheet peaks by device kind: (HBM TB/s, dense bfloat16 TFLOP/s) per device. NVIDIA
# kinds are matched as parts of the runtime's name ("NVIDIA H100 80GB HBM3": the SXM part);
# TPU kinds exactly, under the names the TPU runtime reports (jax's pallas tpu_info lists
# them; "TPU v5" is a v5p, "TPU v5 lite" a v5e), with Cloud TPU's per-chip figures.
NVIDIA_SPECS = {"H100": (3.35, 989.0), "H200": (4.8, 989.0)}
TPU_SPECS = {
  "TPU v4": (1.2, 275.0),
  "TPU v5 lite": (0.819, 197.0),
  "TPU v5e": (0.819, 197.0),
  "TPU v5": (2.765, 459.0),
  "TPU v5p": (2.765, 459.0),
  "TPU v6 lite": (1.638, 918.0),
  "TPU v6e": (1.638, 918.0),
}


def spec_sheet(kind: str | None = None) -> tuple[float, float] | None:
  """(HBM TB/s, bfloat16 TFLOP/s) of a device kind (default: the first device's) from its
  spec sheet; None for a kind not listed (a CPU: measure it instead)."""
  kind = jax.devices()[0].device_kind if kind is None else kind
  if kind in TPU_SPECS:
    return TPU_SPECS[kind]
  return next((v for k, v in NVIDIA_SPECS.items() if k in kind), None)


def reference_policy() -> tuple[nnx.GraphDef, nnx.State]:
  """A random-init policy of configs/sd_bench.py's shapes (~50M), for benchmarks that
  have no policy of their own: the model whose forward costs describe the host."""
  from configs import sd_bench
  from tlt_jax import configuration
  from tlt_jax.data import get_tokenizer
  from tlt_jax.models.transformer import init_model

  config = sd_bench.get_config()
  tokenizer = get_tokenizer(config.task.tokenizer)
  return nnx.split(init_model(configuration.model_config(config, tokenizer), seed=0))


def forward_costs(
  graphdef: nnx.GraphDef,
  params: nnx.State,
  tokens: Sequence[int] = FORWARD_TOKENS,
  *,
  context: int = 192,
  view_len: int = 256,
  reps: int = 15,
) -> dict[int, float]:
  """Median ms of a cached forward of n tokens (logits included) at batch 1, per n.

  The n tokens are written after `context` committed slots and attend to a
  `view_len`-slot view: the shape of a decode step (n = 1) and of verifying an
  n - 1 token draft.
  """
  cfg = nnx.merge(graphdef, params).config
  cache = jax.tree.map(
    lambda x: jax.random.normal(jax.random.key(1), x.shape, x.dtype),
    KVCache.zeros(cfg, 1, view_len),
  )

  @functools.partial(jax.jit, static_argnums=0)
  def fwd(n, params, cache):
    m = nnx.merge(graphdef, params)
    toks = jnp.ones((1, n), jnp.int32)
    pos = context + jnp.arange(n)[None]
    h, cache, _ = m(toks, pos, cache=cache, cache_len=jnp.full((1,), context), view_len=view_len)
    return m.logits(h), cache

  out = {}
  for n in tokens:
    jax.block_until_ready(fwd(n, params, cache))
    times = []
    for _ in range(reps):
      t = time.perf_counter()
      jax.block_until_ready(fwd(n, params, cache))
      times.append(time.perf_counter() - t)
    out[n] = 1e3 * float(np.median(times))
  return out


def host_info(
  policy: tuple[nnx.GraphDef, nnx.State] | None = None, bandwidth_bytes: int | None = None
) -> dict[str, Any]:
  """The host as a JSON-able dict; forward costs of `policy` (default `reference_policy`,
  left out under TLT_HOST_FORWARDS=0)."""
  if policy is None and os.environ.get("TLT_HOST_FORWARDS") == "0":
    params, ms = {}, {}
  else:
    graphdef, params = policy if policy is not None else reference_policy()
    ms = forward_costs(graphdef, params)
  devices = jax.devices()
  if bandwidth_bytes is None:  # a 256 MB read takes ~50 us on an HBM GPU: launch-dominated
    bandwidth_bytes = 1 << (28 if devices[0].platform == "cpu" else 32)
  return {
    "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    "cpu": cpu_model(),
    "cores": os.cpu_count(),
    "devices": f"{len(devices)} x {devices[0].platform}"
    + ("" if devices[0].platform == "cpu" else f" ({devices[0].device_kind})"),
    "jax": jax.__version__,
    "read_bandwidth_gbs": round(read_bandwidth(bandwidth_bytes) / 1e9, 1),
    "policy_params": int(sum(x.size for x in jax.tree.leaves(params))),
    "forward_ms": {str(n): round(v, 2) for n, v in ms.items()},
    "forward_in_steps": {str(n): round(v / ms[min(ms)], 2) for n, v in ms.items()} if ms else {},
  }


def format_host(info: dict[str, Any]) -> str:
  """One line for logs and README tables."""
  fwd = " / ".join(f"{v:.1f}" for v in info["forward_ms"].values())
  steps = " / ".join(f"{v:.2f}" for v in info["forward_in_steps"].values())
  head = (
    f"host: {info['date']}, {info['cpu']}, {info['cores']} cores, {info['devices']} "
    f"(jax {info['jax']}), read bandwidth {info['read_bandwidth_gbs']:.1f} GB/s; "
  )
  if not info["forward_ms"]:
    return head + "forwards not timed (TLT_HOST_FORWARDS=0)"
  return head + (
    f"{info['policy_params'] / 1e6:.0f}M policy at batch 1: "
    f"{'/'.join(info['forward_ms'])}-token forward {fwd} ms = {steps} steps"
  )


def host_record(policy: tuple[nnx.GraphDef, nnx.State] | None = None) -> str:
  """`format_host(host_info(policy))`: what every benchmark prints first."""
  return format_host(host_info(policy))


if __name__ == "__main__":
  print(host_record())

r"""What does a forward over a few rows cost, relative to one row, under XLA flags?

Speculative verification pays when scoring k draft tokens costs about one decode step
(memory-bound on GPUs). This measures that ratio for a stack of MLP blocks shaped like a
50-100M policy's (16 x 512 -> 1536 -> 512, jit; weights in --dtype, float32 accumulation),
once per XLA_FLAGS setting, each in its own process (XLA reads the flags once). Output:
median ms per forward by row count, and each row count's cost in one-row forwards.

  python experiments/bench_few_rows.py
  python experiments/bench_few_rows.py --flags="--xla_cpu_use_xnnpack=true" --rows=1,5,16
  python experiments/bench_few_rows.py --dtype=bfloat16 --flags=,--xla_cpu_use_onednn=true
"""

from __future__ import annotations

import json
import time

import numpy as np
from absl import app, flags

# Flag sets compared by default: XLA's own CPU options that change how small dots run.
_DEFAULT_FLAGS = (
  "",
  "--xla_cpu_use_xnnpack=true",
  "--xla_cpu_experimental_xnn_fusion_type=dot,eltwise",
  "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise",
  "--xla_cpu_use_onednn=true",
  "--xla_cpu_multi_thread_eigen=false",
  # The weights split over two host devices, one core each (tensor parallelism over cores).
  "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false",
)

_FLAGS = flags.DEFINE_list("flags", list(_DEFAULT_FLAGS), "XLA_FLAGS settings to compare")
_ROWS = flags.DEFINE_list("rows", ["1", "5", "16", "64"], "rows (tokens) per forward")
_REPS = flags.DEFINE_integer("reps", 20, "timed forwards per row count")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "weights' dtype")
_CHILD = flags.DEFINE_bool("child", False, "internal: measure under the inherited XLA_FLAGS")


def _measure(rows: list[int], reps: int, dtype: str) -> dict[int, float]:
  import jax
  import jax.numpy as jnp

  d, f, layers = 512, 1536, 16
  key = jax.random.key(0)
  dt = jnp.dtype(dtype)
  normal = lambda i, shape: (jax.random.normal(jax.random.fold_in(key, i), shape) * 0.02).astype(dt)
  up = [normal(i, (d, f)) for i in range(layers)]
  down = [normal(99 + i, (f, d)) for i in range(layers)]

  if jax.device_count() > 1:
    # Megatron-style split over the host devices: up projections by column, down by row
    # (XLA adds the all-reduce after each block); rows are replicated.
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("tensor",))
    up = [jax.device_put(w, NamedSharding(mesh, PartitionSpec(None, "tensor"))) for w in up]
    down = [jax.device_put(w, NamedSharding(mesh, PartitionSpec("tensor", None))) for w in down]

  @jax.jit
  def forward(x, up, down):
    # Weights (and the dots' inputs) in --dtype, accumulation and the residual in float32.
    dot = lambda u, w: jnp.dot(u.astype(dt), w, preferred_element_type=jnp.float32)
    for a, b in zip(up, down):
      x = x + dot(jax.nn.gelu(dot(x, a)), b)
    return x

  out = {}
  for m in rows:
    x = jnp.ones((m, d), jnp.float32)
    forward(x, up, down).block_until_ready()  # compile
    times = []
    for _ in range(reps):
      t = time.perf_counter()
      forward(x, up, down).block_until_ready()
      times.append(time.perf_counter() - t)
    out[m] = 1e3 * float(np.median(times))
  return out


def main(argv):
  del argv
  rows = [int(r) for r in _ROWS.value]
  if _CHILD.value:
    print(json.dumps(_measure(rows, _REPS.value, _DTYPE.value)))
    return
  from common import json_child
  from host import host_record  # the parent process: XLA_FLAGS as inherited

  print(host_record(), flush=True)
  print(f"{'XLA_FLAGS':<52} " + " ".join(f"{m:>8} rows   " for m in rows))
  for setting in _FLAGS.value:
    argv = [__file__, "--child", f"--rows={','.join(map(str, rows))}"]
    out = json_child(argv + [f"--reps={_REPS.value}", f"--dtype={_DTYPE.value}"], setting)
    if "error" in out:
      print(f"{setting or '(default)':<52} failed: {out['error'].splitlines()[-1:]}")
      continue
    ms = {int(k): v for k, v in out.items()}
    cells = " ".join(f"{ms[m]:6.1f} ms ({ms[m] / ms[rows[0]]:3.1f}x)" for m in rows)
    print(f"{setting or '(default)':<52} {cells}")


if __name__ == "__main__":
  app.run(main)

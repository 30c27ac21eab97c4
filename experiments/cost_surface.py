r"""The decode cost surface of a policy on this host, and the batch b* where decode stops
being flat.

Speculative decoding pays where one forward costs about the same for 1 row as for b rows
(the weights, not the arithmetic, bound the step): it spends spare arithmetic on draft
tokens. This script measures where that holds: the time of one cached forward by batch
size x new tokens per row (1: a decode step; 5 / 9 / 17: verifying a chain of 4 / 8 / 16)
at one context length, and by context length for decode steps (the KV reads), and derives

* measured b*: the batch at which a decode step costs twice the batch-1 step (log2
  interpolation): below it, extra rows (or draft tokens) come almost free;
* roofline b*: peak FLOP/s x bytes per parameter / (2 x bandwidth), from the same run's
  measured matmul FLOP/s and streaming bandwidth (what the weights-vs-arithmetic balance
  predicts for a decode step).

The JSON holds the grid in the form `tlt_jax.sim.TableCost.from_dict` reads, so the step
simulator (experiments/simulate.py) is calibrated on the same numbers, and the host record.

  python experiments/cost_surface.py --out=runs/cost_surface   # sd_bench's 50M policy
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import format_host, host_info, matmul_flops  # noqa: E402
from tlt_jax import configuration  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.models.transformer import KVCache, init_model  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sd_bench.py", "policy config")
_OUT = flags.DEFINE_string("out", "runs/cost_surface", "output folder")
_BATCHES = flags.DEFINE_list("batches", ["1", "2", "4", "8", "16", "32", "64"], "batch sizes")
_TOKENS = flags.DEFINE_list("tokens", ["1", "5", "9", "17"], "new tokens per row")
_CONTEXT = flags.DEFINE_integer("context", 192, "cache length of the grid")
_CONTEXTS = flags.DEFINE_list("contexts", ["64", "448"], "more cache lengths (decode steps)")
_REPS = flags.DEFINE_integer("reps", 7, "timed repetitions per cell (median kept)")


def _view(context: int, tokens: int) -> int:
  """The engine's cache view: a power of two covering the context and the new tokens."""
  return 1 << math.ceil(math.log2(context + tokens))


def forward_ms(graphdef, params, batch: int, tokens: int, context: int, reps: int) -> float:
  """Median ms of one cached forward (logits of every new token included)."""
  cfg = nnx.merge(graphdef, params).config
  view = _view(context, tokens)
  cache = jax.tree.map(
    lambda x: jax.random.normal(jax.random.key(1), x.shape, x.dtype),
    KVCache.zeros(cfg, batch, view),
  )

  @functools.partial(jax.jit, donate_argnums=2)
  def fwd(params, toks, cache):
    m = nnx.merge(graphdef, params)
    pos = context + jnp.broadcast_to(jnp.arange(tokens), (batch, tokens))
    lens = jnp.full((batch,), context)
    h, cache, _ = m(toks, pos, cache=cache, cache_len=lens, view_len=view)
    return m.logits(h), cache

  toks = jnp.ones((batch, tokens), jnp.int32)
  _, cache = jax.block_until_ready(fwd(params, toks, cache))
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    _, cache = jax.block_until_ready(fwd(params, toks, cache))
    times.append(time.perf_counter() - t)
  return 1e3 * float(np.median(times))


def measured_bstar(batches, decode_ms) -> float | None:
  """The batch (log2-interpolated) where a decode step first costs twice batch 1's."""
  base = decode_ms[0]
  for (b0, m0), (b1, m1) in zip(zip(batches, decode_ms), zip(batches[1:], decode_ms[1:])):
    if m1 >= 2 * base:
      frac = (2 * base - m0) / (m1 - m0) if m1 > m0 else 0.0
      return float(2 ** (math.log2(b0) + frac * (math.log2(b1) - math.log2(b0))))
  return None


def main(argv):
  del argv
  config = _CONFIG.value
  os.makedirs(_OUT.value, exist_ok=True)
  tokenizer = get_tokenizer(config.task.tokenizer)
  model_cfg = configuration.model_config(config, tokenizer)
  graphdef, params = nnx.split(init_model(model_cfg, seed=0))
  host = host_info((graphdef, params))
  print(format_host(host), flush=True)
  batches = [int(b) for b in _BATCHES.value]
  tokens = [int(t) for t in _TOKENS.value]
  grid = np.zeros((len(tokens), len(batches)))
  for j, b in enumerate(batches):
    for i, t in enumerate(tokens):
      grid[i, j] = forward_ms(graphdef, params, b, t, _CONTEXT.value, _REPS.value)
      print(f"batch {b:3d} tokens {t:2d}: {grid[i, j]:8.2f} ms", flush=True)
  contexts = [int(c) for c in _CONTEXTS.value]
  by_context = {
    c: [forward_ms(graphdef, params, b, 1, c, _REPS.value) for b in batches] for c in contexts
  }
  # ms per row per context token: the decode step's growth from the shortest to the longest.
  lo, hi = min(contexts + [_CONTEXT.value]), max(contexts + [_CONTEXT.value])
  at = {**by_context, _CONTEXT.value: list(grid[0])}
  slope = [max((at[hi][j] - at[lo][j]) / (hi - lo), 0.0) for j in range(len(batches))]
  flops = matmul_flops()
  bandwidth = host["read_bandwidth_gbs"] * 1e9
  bytes_per_param = jnp.dtype(model_cfg.dtype).itemsize
  report = {
    "host": host,
    "policy_params": model_cfg.num_params,
    "batches": batches,
    "tokens": tokens,
    "ms": grid.round(3).tolist(),
    "context": _CONTEXT.value,
    "ms_per_context_token": [round(s, 6) for s in slope],
    "decode_ms_by_context": {str(c): [round(x, 3) for x in v] for c, v in by_context.items()},
    "matmul_gflops": round(flops / 1e9, 1),
    "bstar_measured": measured_bstar(batches, list(grid[0])),
    "bstar_roofline": round(flops * bytes_per_param / (2 * bandwidth), 1),
  }
  with open(os.path.join(_OUT.value, "cost_surface.json"), "w") as f:
    json.dump(report, f, indent=2)
  _plot(report, os.path.join(_OUT.value, "cost_surface.png"))
  print(f"\n{format_host(host)}")
  print("ms per forward (rows: new tokens per row; columns: batch)")
  print("| tokens | " + " | ".join(map(str, batches)) + " |")
  print("|---" * (len(batches) + 1) + "|")
  for i, t in enumerate(tokens):
    print(f"| {t} | " + " | ".join(f"{x:.1f}" for x in grid[i]) + " |")
  print(
    f"b* measured (decode step at twice batch 1's): {report['bstar_measured']}; roofline "
    f"({report['matmul_gflops']} GFLOP/s x {bytes_per_param} B / (2 x "
    f"{host['read_bandwidth_gbs']} GB/s)): {report['bstar_roofline']}"
  )


def _plot(report, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
  base = report["ms"][0][0]
  for t, row in zip(report["tokens"], report["ms"]):
    a.plot(report["batches"], np.array(row) / base, marker="o", label=f"{t} new tokens/row")
  a.set_xscale("log", base=2)
  a.set_yscale("log", base=2)
  a.set_xlabel("batch")
  a.set_ylabel("forward / batch-1 decode step")
  if report["bstar_measured"]:
    a.axvline(report["bstar_measured"], color="grey", linestyle=":", label="b* (measured)")
  a.set_title("cost of a forward")
  a.legend(fontsize=8)
  for c, row in sorted(report["decode_ms_by_context"].items(), key=lambda kv: int(kv[0])):
    b.plot(report["batches"], row, marker="o", label=f"context {c}")
  b.plot(report["batches"], report["ms"][0], marker="o", label=f"context {report['context']}")
  b.set_xscale("log", base=2)
  b.set_xlabel("batch")
  b.set_ylabel("decode step (ms)")
  b.set_title("decode step by context length")
  b.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  app.run(main)

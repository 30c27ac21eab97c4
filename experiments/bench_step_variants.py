r"""Two ways of writing a decode step, timed in one process: what a code choice the compiled
programs only count (experiments/deviceless.py) costs on this host or device.

`--compare`:
  write  the KV cache write of a one-row forward: the batched scatter (`scatter_rows`)
         against the one in-place update `models.transformer.write_rows` takes at one row
         (the scatter reads the slots it overwrites: a kernel of its own per write on a GPU);
  form   attention as multiply-reduce against the dots (`models.attention.attention_form`):
         "auto" takes the dots on a GPU, and on a CPU the multiply-reduce for a few new
         tokens over two rows or more;
  fused  attention as the dots against cuDNN's fused attention (`attention_form("fused")`,
         `models.attention.attend_fused`: one kernel, the scores kept on chip; a bfloat16
         policy on an NVIDIA GPU, the dots elsewhere);
  head   the head's product with both sides cast to float32 first (on every platform until
         2026-12-06, on CPUs still) against the product in the compute dtype summed in
         float32 (`models.precision.head_precision`; "auto" takes it on accelerators): for
         a bfloat16 policy (published shapes) a bfloat16 GEMM where a float32 one ran
         ("highest" in the rollout on a GPU); for a float32 policy the same program.
Each `--shapes` entry (a config file's policy or a published shape,
`experiments.forwards.decode_shape`, random weights) runs an engine chunk's kind of device
loop (`experiments.forwards.Forward`: 16 cached forwards from `--context`) per `--cells`
entry (rows x new tokens a row), traced once with each variant (under
`--matmul_precision`: "highest" as the rollout engine runs on a GPU, `EngineConfig`); both
are timed interleaved, `--reps` rounds: median ms a forward [min-max] and the paired ratio
second / first. Before the timing, both loops run once from the same cache and tokens, and
their outputs are compared (`agreement`): the fraction of rows whose last tokens agree (a
row's first differing argmax changes the rest of its loop, so a rounding apart shows as a
few rows, a wrong program as most) and the caches' largest difference over their largest
entry. A cell whose programs fail to compile or run is recorded with its error, and the
next cell is run.

  python experiments/bench_step_variants.py --compare=write \
      --out=experiments/results/cache_write_hostL_2026-12-05/bench_cache_write.json
  python experiments/bench_step_variants.py --compare=form --shapes=qwen3-8b \
      --cells=2x5,1x2,16x1,2x9 --context=1024
  python experiments/bench_step_variants.py --compare=fused --shapes=qwen3-8b \
      --cells=1x1,1x2,16x5,64x5 --context=1024
  python experiments/bench_step_variants.py --compare=head --shapes=qwen2.5-1.5b \
      --cells=1x1,16x1 --context=256 --reps=5 --matmul_precision=highest
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import random_params  # noqa: E402
from experiments.forwards import Forward, compile_together, decode_shape  # noqa: E402
from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax.models import transformer  # noqa: E402
from tlt_jax.models.attention import attention_form  # noqa: E402
from tlt_jax.models.precision import head_precision  # noqa: E402

_COMPARE = flags.DEFINE_enum("compare", "write", ["write", "form", "fused", "head"], "which choice")
_SHAPES = flags.DEFINE_list(
  "shapes", ["configs/default.py", "configs/regime.py", "configs/sd_bench.py"], "policies"
)
_CELLS = flags.DEFINE_list(
  "cells", ["1x1", "1x5"], "rows x new tokens (1x2: a one-row step on a GPU; 1x5: chain-4)"
)
_CONTEXT = flags.DEFINE_integer("context", 400, "the cache length the loop starts at")
_REPS = flags.DEFINE_integer("reps", 15, "interleaved timed rounds")
_OUT = flags.DEFINE_string("out", "", "write the results as JSON here too")
_PRECISION = flags.DEFINE_enum(
  "matmul_precision",
  "",
  ["", "default", "high", "highest"],
  "jax.default_matmul_precision the loops are traced under ('': the platform's default)",
)

_CHUNK = 16  # forwards a call


@contextlib.contextmanager
def _cache_write(write):
  """Within: attention layers write their cache with `write` (read when a loop is traced)."""
  original = transformer.write_rows
  transformer.write_rows = write
  try:
    yield
  finally:
    transformer.write_rows = original


# Per choice: the two variants, each a name and the setting a loop is traced under.
VARIANTS = {
  "write": (
    ("scatter", lambda: _cache_write(transformer.scatter_rows)),
    ("update", contextlib.nullcontext),
  ),
  "form": (
    ("reduce", lambda: attention_form("reduce")),
    ("dots", lambda: attention_form("dots")),
  ),
  "fused": (
    ("dots", lambda: attention_form("dots")),
    ("fused", lambda: attention_form("fused")),
  ),
  "head": (
    ("float32", lambda: head_precision("float32")),
    ("compute", lambda: head_precision("compute")),
  ),
}


def loops(cfg, graphdef, params, rows: int, tokens: int) -> tuple[dict, dict]:
  """The loop traced under each variant of `--compare`, the two compiled at once
  (`compile_together`: on threads beside an accelerator); each a callable running it, and
  their `agreement`."""
  forwards = {}
  precision = _PRECISION.value or None
  for name, setting in VARIANTS[_COMPARE.value]:
    forwards[name] = Forward(graphdef, cfg, rows, tokens, _CONTEXT.value, _CHUNK)
    with setting(), jax.default_matmul_precision(precision):
      forwards[name].lower(params)
  compile_together(list(forwards.values()), params)
  agreed = agreement(forwards, params)
  return {name: fwd.runner(params) for name, fwd in forwards.items()}, agreed


def agreement(forwards: dict, params) -> dict:
  """Both loops of `forwards` run once from the same random cache and tokens
  (`Forward.first`): the fraction of rows whose last tokens agree, and the largest
  difference between their caches over the first's largest entry (one loop's outputs
  freed before the next runs: at 64 rows an 8B cache is 19 GB)."""
  (_, a), (_, b) = forwards.items()
  caches, tokens = [], []
  for fwd in (a, b):
    cache, toks = fwd.first(params)
    leaves = jax.tree.leaves(cache)
    caches.append(leaves)
    tokens.append(toks)
  gap = max(
    float(jnp.max(jnp.abs(x.astype(jnp.float32) - y))) for x, y in zip(*caches, strict=True)
  )
  scale = max(float(jnp.max(jnp.abs(x.astype(jnp.float32)))) for x in caches[0])
  rows = float(jnp.mean(jnp.all(tokens[0] == tokens[1], axis=-1)))
  return {"rows_agree": rows, "cache_gap": gap / scale}


def _spread(values, scale: float = 1.0) -> str:
  return (
    f"{scale * statistics.median(values):.3f} [{scale * min(values):.3f}-{scale * max(values):.3f}]"
  )


def main(argv):
  del argv
  results, host = [], host_info()
  print(format_host(host), flush=True)
  (first, _), (second, _) = VARIANTS[_COMPARE.value]
  for path in _SHAPES.value:
    cfg = decode_shape(path)
    graphdef, params = random_params(cfg)
    for cell in _CELLS.value:
      rows, tokens = (int(x) for x in cell.split("x"))
      try:
        calls, agreed = loops(cfg, graphdef, params, rows, tokens)
      except Exception as e:  # a device refusing one variant (cuDNN's kernel): the next cell
        print(f"{path} {cell}: error {type(e).__name__}: {str(e)[:400]}", flush=True)
        results.append(dict(shape=path, cell=cell, error=f"{type(e).__name__}: {e}"[:2000]))
        continue
      times = {name: [] for name in calls}
      for _ in range(_REPS.value):
        for name, call in calls.items():
          start = time.perf_counter()
          call()
          times[name].append((time.perf_counter() - start) / _CHUNK)
      ratios = [b / a for a, b in zip(times[first], times[second], strict=True)]
      line = f"{path} {cell}:" + "".join(f"  {n} {_spread(t, 1e3)} ms" for n, t in times.items())
      agree = f"rows agree {agreed['rows_agree']:.2f}, caches {agreed['cache_gap']:.1e} apart"
      print(f"{line}  {second}/{first} {_spread(ratios)}  ({agree})", flush=True)
      results.append(dict(shape=path, cell=cell, times_s=times, ratios=ratios, **agreed))
      _save(
        dict(
          host=host,
          compare=_COMPARE.value,
          context=_CONTEXT.value,
          matmul_precision=_PRECISION.value,
          results=results,
        )
      )


def _save(report: dict) -> None:
  """`--out` rewritten after every cell: a run cut short keeps the cells it finished."""
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  app.run(main)

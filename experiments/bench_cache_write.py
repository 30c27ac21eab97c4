r"""The KV cache write of a one-row forward on this host: one in-place update
(`models.transformer.write_rows`) against the batched scatter (`scatter_rows`) it replaces.

On a GPU the scatter costs a kernel of its own per write (XLA reads the slots it is about to
overwrite; experiments/deviceless.py counts them); this checks that the CPU does not pay
for the change, and on a GPU it times what the count predicts. Each `--shapes` entry (a
config file's policy or a published shape, `experiments.forwards.decode_shape`, random
weights) runs an engine chunk's kind of
device loop (`experiments.common.decode_loop`: 16 cached forwards of `--tokens` new tokens
at one row) traced once with each write; both are timed interleaved in one process,
`--reps` rounds: median ms a forward [min-max] and the paired ratio update / scatter.

  python experiments/bench_cache_write.py \
      --out=experiments/results/cache_write_hostL_2026-12-05/bench_cache_write.json
  python experiments/bench_cache_write.py --shapes=configs/sd_bench.py,qwen3-8b --tokens=1,2
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import decode_loop, random_params  # noqa: E402
from experiments.forwards import decode_shape  # noqa: E402
from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax.models import transformer  # noqa: E402

_SHAPES = flags.DEFINE_list(
  "shapes", ["configs/default.py", "configs/regime.py", "configs/sd_bench.py"], "policies"
)
_TOKENS = flags.DEFINE_list(
  "tokens", ["1", "5"], "new tokens a forward (2: a one-row step on a GPU; 5: a chain-4 verify)"
)
_CONTEXT = flags.DEFINE_integer("context", 400, "the cache length the loop starts at")
_REPS = flags.DEFINE_integer("reps", 15, "interleaved timed rounds")
_OUT = flags.DEFINE_string("out", "", "write the results as JSON here too")

_CHUNK = 16  # forwards a call


def loops(cfg, graphdef, params, tokens: int) -> dict:
  """The loop traced with each write, compiled and run once."""
  calls = {}
  for name, write in (("scatter", transformer.scatter_rows), ("update", transformer.write_rows)):
    original = transformer.write_rows
    transformer.write_rows = write  # read when the loop is traced, at its first call
    try:
      calls[name] = decode_loop(graphdef, params, cfg, 1, tokens, _CHUNK, _CONTEXT.value)
      calls[name]()
    finally:
      transformer.write_rows = original
  return calls


def main(argv):
  del argv
  results, host = [], host_info()
  print(format_host(host), flush=True)
  for path in _SHAPES.value:
    cfg = decode_shape(path)
    graphdef, params = random_params(cfg)
    for tokens in map(int, _TOKENS.value):
      calls = loops(cfg, graphdef, params, tokens)
      times = {name: [] for name in calls}
      for _ in range(_REPS.value):
        for name, call in calls.items():
          start = time.perf_counter()
          call()
          times[name].append((time.perf_counter() - start) / _CHUNK)
      ratios = [u / s for u, s in zip(times["update"], times["scatter"])]
      line = f"{path} {tokens} token(s):"
      for name, t in times.items():
        line += (
          f"  {name} {1e3 * statistics.median(t):.3f} ms [{1e3 * min(t):.3f}-{1e3 * max(t):.3f}]"
        )
      line += (
        f"  update/scatter {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
      )
      print(line, flush=True)
      results.append(dict(shape=path, tokens=tokens, times_s=times, ratios=ratios))
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump(dict(host=host, context=_CONTEXT.value, results=results), f, indent=1)


if __name__ == "__main__":
  app.run(main)

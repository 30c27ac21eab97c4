r"""What the online drafter's buffer costs the host: memory, and seconds to add a rollout
and to sample an update's batch.

The buffer (`tlt_jax.drafter.DrafterBuffer`) keeps every finished row's tokens and target
features between the rollouts that produce them and the drafter updates that read them.
This fills one with rollouts of the given shape (rows' lengths log-normal about a median,
features in bfloat16, random values: only shapes and bytes matter) and times `add` per
rollout and `sample` per batch, median [min-max] over rounds, with the bytes its arrays
hold and a sampled batch's bytes (what an update copies to the device). It uses only the
buffer's public calls, so the same script times another tree's buffer (PYTHONPATH=<that
tree>).

  python experiments/bench_buffer.py                       # configs/regime.py:gpu's shapes
  python experiments/bench_buffer.py --feature_dim=4096 --slots=8192 --capacity=128
  PYTHONPATH=<tree> python experiments/bench_buffer.py --noreuse   # a buffer without `out`
"""

from __future__ import annotations

import inspect
import json
import statistics
import time

import jax.numpy as jnp
import numpy as np
from absl import app, flags
from host import format_host, host_info  # noqa: E402  (experiments/, the script's folder)

from tlt_jax.drafter import DrafterBuffer

_D = flags.DEFINE_integer("feature_dim", 256, "features a position (the policy's width)")
_SLOTS = flags.DEFINE_integer("slots", 3032, "the engine's cache slots (a row's most tokens)")
_CAPACITY = flags.DEFINE_integer("capacity", 512, "rows the buffer holds")
_POSITIONS = flags.DEFINE_integer("positions", 0, "feature positions (0: the buffer's default)")
_ROWS = flags.DEFINE_integer("rows", 128, "rows a rollout adds")
_ADDS = flags.DEFINE_integer("adds", 6, "rollouts added a round")
_PROMPT = flags.DEFINE_integer("prompt", 40, "prompt tokens a row")
_MEDIAN = flags.DEFINE_integer("median", 100, "median response tokens")
_SIGMA = flags.DEFINE_float("sigma", 1.0, "log-normal spread of the response lengths")
_BATCH = flags.DEFINE_list("batch", ["4", "0"], "a sampled batch: rows, row length (0: slots)")
_SAMPLES = flags.DEFINE_integer("samples", 20, "batches sampled a round")
_REUSE = flags.DEFINE_bool(
  "reuse", True, "sample into the previous batch's arrays, as the online drafter does"
)
_ROUNDS = flags.DEFINE_integer("rounds", 5, "rounds")
_OUT = flags.DEFINE_string("out", "", "optional JSON file for the results")


def _rollouts(rng: np.random.Generator) -> list[tuple[np.ndarray, ...]]:
  """`--adds` rollouts as a RolloutResult carries them: hidden states as wide as the
  longest row."""
  out = []
  for _ in range(_ADDS.value):
    response = rng.lognormal(np.log(_MEDIAN.value), _SIGMA.value, _ROWS.value).astype(int)
    length = np.minimum(_PROMPT.value + 2 + response, _SLOTS.value)
    tokens = rng.integers(1, 1000, (_ROWS.value, _SLOTS.value)).astype(np.int32)
    width = int(length.max())
    hidden = rng.standard_normal((_ROWS.value, width, _D.value), np.float32).astype(jnp.bfloat16)
    out.append((tokens, hidden, np.full(_ROWS.value, _PROMPT.value), length))
  return out


def main(argv):
  del argv
  host = host_info()
  print(format_host(host))
  print(f"the buffer of {inspect.getsourcefile(DrafterBuffer)}")
  rng = np.random.default_rng(0)
  rollouts = _rollouts(rng)
  num_rows = int(_BATCH.value[0])
  row_len = int(_BATCH.value[1]) or _SLOTS.value
  kw = {"positions": _POSITIONS.value} if _POSITIONS.value else {}
  adds, samples, nbytes, batch_bytes = [], [], 0, 0
  for r in range(_ROUNDS.value):
    buf = DrafterBuffer(
      _CAPACITY.value, _SLOTS.value, _D.value, keep_steps=2, dtype=jnp.bfloat16, **kw
    )
    for step, rollout in enumerate(rollouts):
      t = time.perf_counter()
      buf.add(*rollout, step=step)
      adds.append(time.perf_counter() - t)
    draws, batch = np.random.default_rng(r), None
    for _ in range(_SAMPLES.value):
      out = {"out": batch} if _REUSE.value and batch is not None else {}
      t = time.perf_counter()
      batch = buf.sample(draws, num_rows, row_len, **out)
      samples.append(time.perf_counter() - t)
      batch_bytes = sum(a.nbytes for a in batch.values())
    nbytes = sum(a.nbytes for a in vars(buf).values() if isinstance(a, np.ndarray))
    rows = len(buf)
  line = lambda x: f"{statistics.median(x):.4f} [{min(x):.4f}-{max(x):.4f}]"  # noqa: E731
  print(f"{_ROWS.value} rows a rollout, {_ADDS.value} rollouts, capacity {_CAPACITY.value}")
  print(
    "| add a rollout, s | sample a batch, s | a batch's bytes | host bytes | rows it may sample |"
  )
  print("|---|---|---|---|---|")
  mib = lambda n: f"{n / 2**20:,.0f} MiB"  # noqa: E731
  print(f"| {line(adds)} | {line(samples)} | {mib(batch_bytes)} | {mib(nbytes)} | {rows} |")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      results = {"add_s": adds, "sample_s": samples, "bytes": nbytes, "rows": rows}
      results["batch_bytes"] = batch_bytes
      ours = (_D, _SLOTS, _CAPACITY, _POSITIONS, _ROWS, _ADDS, _PROMPT, _MEDIAN, _SIGMA, _BATCH)
      ours += (_REUSE,)
      settings = {f.name: f.value for f in ours}
      json.dump({"host": host, "settings": settings, **results}, f)


if __name__ == "__main__":
  app.run(main)

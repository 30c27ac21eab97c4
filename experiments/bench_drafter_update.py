r"""Mode tlt's online drafter update at a target's width: seconds and XLA's temporary bytes
under each memory setting of `DrafterTrainConfig` (`logit_chunk`, `remat_attention`).

At a 150k vocabulary the update's whole-batch float32 logits are tens of GiB, and at rows of
thousands of positions its attention scores as many again (experiments/deviceless.py
--drafter_updates compiles the programs for an H100 without one). Chunking the logit term
and recomputing the scores cost their recomputation; this times it. Each `--settings` entry
("<logit_chunk>[/remat]") is compiled (`experiments.forwards.DrafterUpdateProgram`, random
weights and features), then the programs run interleaved, `--reps` rounds: median [min-max]
ms and each one's time over the first's.

  python experiments/bench_drafter_update.py                      # regime width, vocab 32,768
  python experiments/bench_drafter_update.py --shape=qwen3-8b --batch=4x8192   # a GPU
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time

import jax
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.forwards import DrafterUpdateProgram, decode_shape  # noqa: E402
from experiments.host import format_host, host_info  # noqa: E402

_SHAPE = flags.DEFINE_string("shape", "configs/regime.py", "a published shape or config file")
_VOCAB = flags.DEFINE_integer("vocab", 32768, "the target's vocabulary (0: the shape's own)")
_BATCH = flags.DEFINE_string("batch", "4x2048", "rows x positions a row")
_SETTINGS = flags.DEFINE_list("settings", ["0", "1024", "1024/remat"], "<logit_chunk>[/remat]")
_REPS = flags.DEFINE_integer("reps", 5, "interleaved timed rounds")
_OUT = flags.DEFINE_string("out", "", "write the results as JSON here too")


def main(argv):
  del argv
  cfg = decode_shape(_SHAPE.value)
  if _VOCAB.value:
    cfg = dataclasses.replace(cfg, vocab_size=_VOCAB.value)
  rows, width = map(int, _BATCH.value.split("x"))
  host = host_info()
  print(format_host(host), flush=True)
  print(f"{_SHAPE.value}: width {cfg.d_model}, vocabulary {cfg.vocab_size}; {rows} x {width}")
  calls, cells = {}, {}
  for setting in _SETTINGS.value:
    program = DrafterUpdateProgram(cfg, rows, width, setting)
    compiled, seconds = program.compile()
    args = list(program.random_args())

    def call(c=compiled, a=args):  # the update donates its optimizer state: carry it
      a[0], a[1], _ = jax.block_until_ready(c(*a))

    call()
    calls[setting] = call
    temp = compiled.memory_analysis().temp_size_in_bytes
    cells[setting] = {"compile_s": seconds, "temp_bytes": temp, "times_s": []}
    print(f"{setting}: compiled in {seconds:.1f} s, temporaries {temp / 2**30:.2f} GiB", flush=True)
  for _ in range(_REPS.value):
    for setting, call in calls.items():
      t = time.perf_counter()
      call()
      cells[setting]["times_s"].append(time.perf_counter() - t)
  first = statistics.median(cells[_SETTINGS.value[0]]["times_s"])
  print("| setting | ms, median [min-max] | over the first | temporaries |")
  print("|---|---|---|---|")
  for setting, cell in cells.items():
    t = cell["times_s"]
    med = statistics.median(t)
    print(
      f"| {setting} | {1e3 * med:.1f} [{1e3 * min(t):.1f}-{1e3 * max(t):.1f}] | "
      f"{med / first:.2f} | {cell['temp_bytes'] / 2**30:.2f} GiB |"
    )
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      settings = {"shape": _SHAPE.value, "vocab": cfg.vocab_size, "batch": _BATCH.value}
      json.dump({"host": host, **settings, "cells": cells}, f)


if __name__ == "__main__":
  app.run(main)

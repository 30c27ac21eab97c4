r"""Rollouts from a cold program pool, with and without background compiles: the same
engine calls and tokens, their wall seconds compiles included.

An engine compiles each program the first time a chunk needs it (`configs/regime.py` runs
without a warm-up: most of the batch bucket x cache view x arm programs are never run).
With `EngineConfig.background_compiles` a chunk whose arm the bandit picked but whose
program is not compiled runs a compiled arm while that one compiles on a host thread
(`rollout.run.RolloutRun`); without, the rollout waits for the compile. This times the
first `--calls` engine calls of an RL run (one prompt x `rl.group_size` rows a call, the
first step's key, sequence ids as the trainer gives them) with the config's policy and
drafter warm starts (mode sd: the frozen drafter; tlt's engine runs the same programs),
each variant from an empty pool and a new bandit, the variants interleaved `--reps` times
(order alternating). Per run: the calls' wall seconds, the seconds they waited for
compiles, the background compiles' seconds, the chunks run instead of a compiling arm or
beside a compile, and a digest of every row's tokens (equal in every run: every arm draws
plain decoding's tokens). A compile still running after the last call is waited for and
reported apart ("after"): in an RL step the policy update runs then.

  python experiments/bench_background_compiles.py --config=configs/regime.py \
    --warm_start=experiments/warm_starts/regime_stage11_hostJ_2026-12-04 --out=runs/bg
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
import zlib

import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax import train  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402
from tlt_jax.rollout.pool import ExecutablePool  # noqa: E402
from tlt_jax.utils.keys import folded_key  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "run config")
_WARM = flags.DEFINE_string(
  "warm_start", "", "a folder holding warm_start/ and drafter_warm_start/ (copied to --out)"
)
_OUT = flags.DEFINE_string("out", "runs/bench_background_compiles", "output folder")
_CALLS = flags.DEFINE_integer("calls", 16, "engine calls a run (one prompt's group each)")
_REPS = flags.DEFINE_integer("reps", 2, "runs of each variant, interleaved")


def _job(config, out: str) -> train.Job:
  workdir = os.path.join(out, "job")
  for name in ("warm_start", "drafter_warm_start"):
    if _WARM.value and not os.path.isdir(os.path.join(workdir, name)):
      shutil.copytree(os.path.join(_WARM.value, name), os.path.join(workdir, name))
  config.mode = "sd"
  return train.prepare(config, workdir, progress=False)


def _one_run(job: train.Job, prompts: list[list[int]], background: bool) -> dict:
  """The calls on an engine with an empty pool and a new bandit."""
  cfg = dataclasses.replace(job.engine.config, background_compiles=background)
  pool = ExecutablePool()
  engine = RolloutEngine(
    job.graphdef, job.model_cfg, cfg, job.sampling, pool, drafter_graphdef=job.drafter.graphdef
  )
  g, key = job.config.rl.group_size, folded_key(int(job.config.seed), 0)
  calls, digest, instead, beside = [], 0, 0, 0
  start = time.perf_counter()
  for c, prompt in enumerate(prompts):
    t = time.perf_counter()
    result = engine.generate(
      job.params, [prompt], g, key=key, seq_id_offset=c * g, drafter_params=job.drafter.params
    )
    calls.append(round(time.perf_counter() - t, 3))
    for row, length in zip(result.tokens, result.length):
      digest = zlib.crc32(np.ascontiguousarray(row[:length]).tobytes(), digest)
    chunks = [e for e in result.timeline if e["phase"] in ("decode", "spec")]
    instead += sum("instead_of" in e for e in chunks)
    beside += sum(bool(e.get("beside_compile")) for e in chunks)
  wall = time.perf_counter() - start
  t = time.perf_counter()
  while pool.background_busy:
    time.sleep(0.05)
  return {
    "background_compiles": background,
    "wall_s": round(wall, 3),
    "after_s": round(time.perf_counter() - t, 3),
    "waited_compile_s": round(pool.compile_seconds, 3),
    "background_s": round(pool.background_seconds, 3),
    "programs": pool.compiles,
    "programs_in_background": pool.background_compiles,
    "chunks_instead": instead,
    "chunks_beside_compile": beside,
    "tokens_crc32": digest,
    "call_s": calls,
  }


def main(argv):
  del argv
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    raise SystemExit("JAX_COMPILATION_CACHE_DIR is set: compiles would be cache loads")
  config, out = _CONFIG.value, _OUT.value
  os.makedirs(out, exist_ok=True)
  job = _job(config, out)
  examples = [job.train[i] for i in range(_CALLS.value)]
  prompts = [job.tokenizer.encode(job.prompt(ex), add_bos=True) for ex in examples]
  host = host_info()
  print(format_host(host), flush=True)
  runs = []
  for rep in range(_REPS.value):
    for background in (True, False) if rep % 2 == 0 else (False, True):
      run = _one_run(job, prompts, background)
      run["rep"] = rep
      runs.append(run)
      print(json.dumps({k: v for k, v in run.items() if k != "call_s"}), flush=True)
  if len({r["tokens_crc32"] for r in runs}) != 1:
    raise SystemExit("the runs' tokens differ: a bug (every arm draws plain decoding's tokens)")
  on = [r["wall_s"] for r in runs if r["background_compiles"]]
  off = [r["wall_s"] for r in runs if not r["background_compiles"]]
  ratios = [b / a for a, b in zip(on, off)]
  summary = {
    "calls": _CALLS.value,
    "wall_on_s": on,
    "wall_off_s": off,
    "off_over_on": [round(x, 3) for x in ratios],
    "host": host,
  }
  print(
    f"calls' wall, background compiles on {on} s, off {off} s: off / on "
    f"{', '.join(f'{x:.2f}x' for x in ratios)}; tokens equal in all {len(runs)} runs"
  )
  with open(os.path.join(out, "bench_background_compiles.json"), "w") as f:
    json.dump({"summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
  app.run(main)

r"""Rollouts from a cold program pool, with and without background compiles and compiles
ahead: the same engine calls and tokens, their wall seconds compiles included.

An engine compiles each program the first time a chunk needs it (`configs/regime.py` runs
without a warm-up: most of the batch bucket x cache view x arm programs are never run).
With `EngineConfig.background_compiles` a chunk whose arm the bandit picked but whose
program is not compiled runs a compiled arm while that one compiles on a host thread
(`rollout.run.RolloutRun`); without, the rollout waits for the compile. With
`EngineConfig.compile_ahead` too, the program the rollout likely needs next (the arm's at
the next cache view, the likely arm's at the next smaller batch bucket) compiles there
after a chunk while nothing else does. Variants (`--variants`): "ahead" (both), "background"
(background compiles alone), "off" (every compile waited for). This times the
first `--calls` engine calls of an RL run (one prompt x `rl.group_size` rows a call, the
first step's key, sequence ids as the trainer gives them) with the config's policy and
drafter warm starts (mode sd: the frozen drafter; tlt's engine runs the same programs),
each variant from an empty pool and a new bandit, the variants interleaved `--reps` times
(order rotating). Per run: the calls' wall seconds, the seconds they waited for
compiles, the background compiles' seconds, the chunks run instead of a compiling arm or
beside a compile, the compiles started ahead, and a digest of every row's tokens (equal
in every run: every arm draws plain decoding's tokens). A compile still running after the
last call is waited for and reported apart ("after"): in an RL step the policy update runs
then. The last run of each variant leaves its calls' timelines in
`timelines_<variant>.json`.

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
_VARIANTS = flags.DEFINE_list("variants", ["ahead", "background", "off"], "ahead|background|off")
# variant -> (EngineConfig.background_compiles, EngineConfig.compile_ahead)
VARIANTS = {"ahead": (True, True), "background": (True, False), "off": (False, False)}


def _job(config, out: str) -> train.Job:
  workdir = os.path.join(out, "job")
  for name in ("warm_start", "drafter_warm_start"):
    if _WARM.value and not os.path.isdir(os.path.join(workdir, name)):
      shutil.copytree(os.path.join(_WARM.value, name), os.path.join(workdir, name))
  config.mode = "sd"
  return train.prepare(config, workdir, progress=False)


def _one_run(job: train.Job, prompts: list[list[int]], variant: str) -> tuple[dict, list]:
  """The calls on an engine with an empty pool and a new bandit; (their figures, their
  timelines)."""
  background, ahead = VARIANTS[variant]
  cfg = dataclasses.replace(job.engine.config, background_compiles=background, compile_ahead=ahead)
  pool = ExecutablePool()
  engine = RolloutEngine(
    job.graphdef, job.model_cfg, cfg, job.sampling, pool, drafter_graphdef=job.drafter.graphdef
  )
  g, key = job.config.rl.group_size, folded_key(int(job.config.seed), 0)
  calls, timelines, digest, instead, beside, started = [], [], 0, 0, 0, 0
  start = time.perf_counter()
  for c, prompt in enumerate(prompts):
    t = time.perf_counter()
    result = engine.generate(
      job.params, [prompt], g, key=key, seq_id_offset=c * g, drafter_params=job.drafter.params
    )
    calls.append(round(time.perf_counter() - t, 3))
    timelines.append(result.timeline)
    for row, length in zip(result.tokens, result.length):
      digest = zlib.crc32(np.ascontiguousarray(row[:length]).tobytes(), digest)
    chunks = [e for e in result.timeline if e["phase"] in ("decode", "spec")]
    instead += sum("instead_of" in e for e in chunks)
    beside += sum(bool(e.get("beside_compile")) for e in chunks)
    started += sum("ahead" in e for e in chunks)
  wall = time.perf_counter() - start
  t = time.perf_counter()
  while pool.background_busy:
    time.sleep(0.05)
  figures = {
    "variant": variant,
    "wall_s": round(wall, 3),
    "after_s": round(time.perf_counter() - t, 3),
    "waited_compile_s": round(pool.compile_seconds, 3),
    "background_s": round(pool.background_seconds, 3),
    "programs": pool.compiles,
    "programs_in_background": pool.background_compiles,
    "chunks_instead": instead,
    "chunks_beside_compile": beside,
    "compiles_ahead": started,
    "tokens_crc32": digest,
    "call_s": calls,
  }
  return figures, timelines


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
  variants = list(_VARIANTS.value)
  if not variants or set(variants) - set(VARIANTS):
    raise SystemExit(f"--variants must name some of {sorted(VARIANTS)}, got {variants}")
  runs = []
  for rep in range(_REPS.value):
    shift = rep % len(variants)
    for variant in variants[shift:] + variants[:shift]:
      run, timelines = _one_run(job, prompts, variant)
      run["rep"] = rep
      runs.append(run)
      print(json.dumps({k: v for k, v in run.items() if k != "call_s"}), flush=True)
      with open(os.path.join(out, f"timelines_{variant}.json"), "w") as f:
        json.dump(timelines, f)
  if len({r["tokens_crc32"] for r in runs}) != 1:
    raise SystemExit("the runs' tokens differ: a bug (every arm draws plain decoding's tokens)")
  wall = {v: [r["wall_s"] for r in runs if r["variant"] == v] for v in variants}
  first = variants[0]
  ratios = {
    f"{v}_over_{first}": [round(b / a, 3) for a, b in zip(wall[first], wall[v])]
    for v in variants[1:]
  }
  summary = {"calls": _CALLS.value, "wall_s": wall, **ratios, "host": host}
  print(f"calls' wall seconds by variant: {wall}")
  for name, values in ratios.items():
    print(f"{name}: {', '.join(f'{x:.2f}x' for x in values)}")
  print(f"tokens equal in all {len(runs)} runs")
  with open(os.path.join(out, "bench_background_compiles.json"), "w") as f:
    json.dump({"summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
  app.run(main)

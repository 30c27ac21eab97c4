r"""What copying the rows' hidden states to the host costs a rollout (mode tlt's harvest).

The online drafter trains on the hidden states of every finished row, so in mode tlt the
engine copies them to the host as rows finish (`EngineConfig.harvest_hidden`). On an H200
tlt's rollout spent 0.25 s a step outside its decode chunks where baseline and sd spent
0.04 s (experiments/RESULTS.md, 2026-12-04). This times one engine's rollouts of the
config's policy shape (random weights; each prompt's answer limit drawn log-normal, so
rows finish over the whole rollout as in the long tail) with the copy off, on in float32
and on in the drafter buffer's bfloat16 (cast on the device), settings interleaved round by
round. Output: seconds of a rollout outside its chunks (wall - prefill - decode chunks),
median [min-max] over the rounds, the part of them spent in the harvests themselves (the
timeline's "harvest" entries), the rollout's wall seconds, and the hidden-state positions
its harvests copied (packed: `EngineConfig.harvest_sizes`) against those its rows hold.

  python experiments/bench_harvest.py                      # configs/regime.py:gpu's shapes
  python experiments/bench_harvest.py --prompts=4 --layers=2 --rounds=3   # seconds on a CPU
"""

from __future__ import annotations

import dataclasses
import json
import statistics

import numpy as np
from absl import app, flags
from flax import nnx
from host import format_host, host_info  # noqa: E402  (experiments/, the script's folder)
from ml_collections import config_flags

from tlt_jax import configuration
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models import transformer
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.rollout.pool import ExecutablePool

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py:gpu", "job config")
_PROMPTS = flags.DEFINE_integer("prompts", 16, "prompts a rollout (x the config's group size)")
_LAYERS = flags.DEFINE_integer("layers", 0, "policy layers (0: the config's)")
_MEDIAN = flags.DEFINE_integer("median", 100, "median answer limit (tokens)")
_SIGMA = flags.DEFINE_float("sigma", 1.0, "log-normal spread of the answer limits")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "interleaved rounds")
_OUT = flags.DEFINE_string("out", "", "optional JSON file for the results")

SETTINGS = {"off": {"harvest_hidden": False}, "float32": {}, "bfloat16": {}}


def _outside_chunks(result) -> float:
  prefill = sum(e["dt"] for e in result.timeline if e["phase"] == "prefill")
  return result.wall_seconds - prefill - result.generation_seconds()


def main(argv):
  del argv
  config = _CONFIG.value
  if _LAYERS.value:
    config.model.num_layers = _LAYERS.value
  tok = configuration.tokenizer(config)
  model_cfg = configuration.model_config(config, tok)
  base = configuration.engine_config(config, tok)
  # Plain decoding: what is timed is the copy, not the drafts.
  base = dataclasses.replace(base, spec_threshold=0, stop_tokens=())
  graphdef, params = nnx.split(transformer.init_model(model_cfg, seed=0))
  rng = np.random.default_rng(0)
  group = config.rl.group_size
  prompts = [list(rng.integers(1, model_cfg.vocab_size, 8)) for _ in range(_PROMPTS.value)]
  limits = np.minimum(
    rng.lognormal(np.log(_MEDIAN.value), _SIGMA.value, len(prompts)).astype(int) + 1,
    base.max_new_tokens,
  ).tolist()
  pool, sampling = ExecutablePool(), SamplingConfig(temperature=1.0)
  engines = {}
  for name, changes in SETTINGS.items():
    dtype = name if name != "off" else "float32"
    cfg = dataclasses.replace(base, harvest_dtype=dtype, **changes)
    engines[name] = RolloutEngine(graphdef, model_cfg, cfg, sampling, pool)
  host = host_info()
  print(format_host(host))
  print(f"{len(prompts)} prompts x {group}, answer limits {sorted(limits)}")
  for eng in engines.values():  # compiles
    eng.generate(params, prompts, group, key=0, max_new_tokens=limits)
  copied = {name: [] for name in engines}
  outside = {name: [] for name in engines}
  harvest = {name: [] for name in engines}
  wall = {name: [] for name in engines}
  for r in range(_ROUNDS.value):
    for name, eng in engines.items():
      result = eng.generate(params, prompts, group, key=r + 1, max_new_tokens=limits)
      outside[name].append(_outside_chunks(result))
      harvest[name].append(result.phase_seconds("harvest"))
      wall[name].append(result.wall_seconds)
      entries = [e for e in result.timeline if e["phase"] == "harvest"]
      copied[name].append((sum(e["positions"] for e in entries), int(result.length.sum())))
  rows = {}
  print(
    "| harvest | outside the chunks, s: median [min-max] | of it harvesting, s | wall, s "
    "| positions copied / held |"
  )
  print("|---|---|---|---|---|")
  for name in engines:
    o, h, w, c = outside[name], harvest[name], wall[name], copied[name]
    rows[name] = {"outside_s": o, "harvest_s": h, "wall_s": w, "positions_copied_held": c}
    print(
      f"| {name} | {statistics.median(o):.4f} [{min(o):.4f}-{max(o):.4f}] "
      f"| {statistics.median(h):.4f} | {statistics.median(w):.3f} "
      f"| {sum(x for x, _ in c) / sum(y for _, y in c):.2f} |"
    )
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"host": host, "limits": limits, "group": group, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  app.run(main)

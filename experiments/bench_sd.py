r"""Speculative decoding vs plain decode on a warm-started policy with its trained drafter.

For each batch size B and temperature, the same B held-out prompts are run to
completion (EOS or the token budget) in one batch bucket of B rows (no
compaction, so B is the batch every step pays for). The prompts are the
held-out problems with the longest reference solutions: the long-tail rows that
speculative decoding serves in a rollout, and rows that stay active for the
whole budget, so B is the batch throughout. Configurations:
  plain      - plain decode (spec off),
  <strategy> - speculative decoding with that fixed strategy every chunk,
  adaptive   - the per-bucket bandit choosing among plain and the strategies.
All engines share one executable pool; every configuration is run once untimed
(compiles; the adaptive engine's bandit learns over `--learn_runs` runs), then
the timed repetitions are interleaved across configurations so drift of this
shared CPU hits all alike; the table reports medians.

Reported per (B, temperature, config): tokens/s, speedup over plain, and for
speculative runs the mean accept length (tokens committed per sequence per
round, bonus token included), accepted draft tokens per round, and the cost of
one round in plain decode steps (round time / step time): speculative decoding
gains accept_length / round_cost over plain decode.

  python experiments/bench_sd.py --workdir=runs/sd_policy --out=runs/bench_sd
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import sys
import time

import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import checkpoint, configuration, train  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.data.tasks import format_prompt, format_target  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.models.drafter import init_drafter  # noqa: E402
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine  # noqa: E402
from tlt_jax.rollout.pool import ExecutablePool  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sd_bench.py", "policy config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/sd_policy", "warm_start/ and drafter/ live here")
_OUT = flags.DEFINE_string("out", "runs/bench_sd", "output folder")
_BATCHES = flags.DEFINE_list("batches", ["1", "2", "4", "8", "16", "32", "64"], "batch sizes")
_TEMPS = flags.DEFINE_list("temperatures", ["0", "1"], "sampling temperatures")
_STRATEGIES = flags.DEFINE_list("strategies", ["chain2", "chain4", "tree5x4x16"], "fixed arms")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 96, "token budget per sequence")
_REPS = flags.DEFINE_integer("reps", 2, "timed repetitions per configuration")
_LEARN = flags.DEFINE_integer("learn_runs", 3, "untimed runs for the adaptive bandit to learn")
_ROUNDS = flags.DEFINE_integer("spec_rounds", 4, "speculative rounds per device call")
_RANDOM_DRAFTER = flags.DEFINE_bool(
  "random_drafter", False, "untrained drafter (smoke runs of the script only)"
)


def _engine_config(base: EngineConfig, b: int, strategies, mode: str) -> EngineConfig:
  cfg = dataclasses.replace(
    base,
    max_new_tokens=_MAX_NEW.value,
    max_batch=b,
    min_batch_bucket=b,
    compact=False,
    min_cache_bucket=256,
    spec_rounds=_ROUNDS.value,
  )
  if mode == "plain":
    return dataclasses.replace(cfg, spec_threshold=0)
  if mode == "adaptive":
    return dataclasses.replace(
      cfg, spec_threshold=b, spec_strategies=tuple(strategies), spec_adaptive=True
    )
  return dataclasses.replace(cfg, spec_threshold=b, spec_strategies=(mode,), spec_adaptive=False)


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  os.makedirs(_OUT.value, exist_ok=True)
  tokenizer = get_tokenizer(config.task.tokenizer)
  train_split, test_split = train._load_data(config, workdir)
  model_cfg, graphdef, params, _ = train.build_policy(config, workdir, tokenizer, train_split)
  dgraph, dparams = nnx.split(init_drafter(model_cfg, seed=0))
  if not _RANDOM_DRAFTER.value:
    dparams = checkpoint.restore_params(os.path.join(workdir, "drafter"), dparams)
  base = configuration.engine_config(config, tokenizer)

  batches = [int(b) for b in _BATCHES.value]
  temps = [float(t) for t in _TEMPS.value]
  strategies = list(_STRATEGIES.value)
  modes = ["plain", *strategies, "adaptive"]
  examples = sorted(test_split, key=lambda ex: -len(format_target(ex)))
  prompts = [tokenizer.encode(format_prompt(ex), add_bos=True) for ex in examples]
  prompts = [p for p in prompts if len(p) <= base.max_prompt_len]
  pool = ExecutablePool()
  rows = []
  timed_compiles = 0
  start = time.perf_counter()
  compiles = compile_s = 0.0
  for b in batches:
    # A fresh pool per batch size: the executables of a 50M model add up (LLVM ran out of
    # memory holding every batch size's programs at once on the 24 GB machine).
    compiles, compile_s = compiles + pool.compiles, compile_s + pool.compile_seconds
    pool = ExecutablePool()
    engines = {}
    for mode in modes:
      cfg = _engine_config(base, b, strategies, mode)
      engines[mode] = RolloutEngine(
        graphdef, model_cfg, cfg, pool=pool, drafter_graphdef=None if mode == "plain" else dgraph
      )
    for temp in temps:
      sampling = SamplingConfig(temperature=temp)
      batch_prompts = prompts[:b]

      def run(mode, key, engines=engines, batch_prompts=batch_prompts, sampling=sampling):
        return engines[mode].generate(
          params,
          batch_prompts,
          key=key,
          sampling=sampling,
          drafter_params=None if mode == "plain" else dparams,
        )

      for mode in modes:  # compile every program B can use, then let the bandit learn
        engines[mode].warmup(
          params, sampling, num_prompts=[b], drafter_params=None if mode == "plain" else dparams
        )
        for i in range(_LEARN.value if mode == "adaptive" else 1):
          run(mode, 1000 + i)
      compiled = pool.compiles
      times = {m: [] for m in modes}
      results = {m: [] for m in modes}
      for rep in range(_REPS.value):
        for mode in modes:
          # Same key for every mode in a repetition: greedy runs emit the same tokens.
          r = run(mode, rep)
          times[mode].append(r.wall_seconds)
          results[mode].append(r)
      if pool.compiles != compiled:
        print(f"WARNING: {pool.compiles - compiled} compiles inside timed runs (B={b})")
      timed_compiles += pool.compiles - compiled
      plain_tps = plain_step_ms = None
      for mode in modes:
        tokens = [int(r.num_generated.sum()) for r in results[mode]]
        tps = float(np.median([t / s for t, s in zip(tokens, times[mode])]))
        plain_tps = tps if mode == "plain" else plain_tps
        spec = results[mode][-1].spec_summary()
        chosen = {}
        step_s, round_s = [0.0, 0], [0.0, 0]
        for r in results[mode]:
          for e in r.timeline:
            if e["phase"] in ("decode", "spec"):
              arm = e.get("strategy", "plain")
              chosen[arm] = chosen.get(arm, 0) + 1
              acc = step_s if e["phase"] == "decode" else round_s
              acc[0] += e["dt"]
              acc[1] += e["steps"] if e["phase"] == "decode" else e["rounds"]
        ms = lambda a: 1000 * a[0] / a[1] if a[1] else None
        if mode == "plain":
          plain_step_ms = ms(step_s)
        row = {
          "batch": b,
          "temperature": temp,
          "config": mode,
          "tokens_per_s": round(tps, 1),
          "speedup": round(tps / plain_tps, 3),
          "accept_length": round(spec["accept_length"], 3),
          "accepted_drafts": round(spec["accepted_drafts"], 3),
          "ms_per_step": ms(step_s),
          "ms_per_round": ms(round_s),
          "round_cost_in_steps": ms(round_s) / plain_step_ms if round_s[1] else None,
          "tokens": tokens[-1],
          "chunks_by_arm": chosen,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
  elapsed = time.perf_counter() - start
  report = {
    "rows": rows,
    "crossover": {str(t): crossover(rows, t) for t in temps},
    "compiles": compiles + pool.compiles,
    "compiles_in_timed_runs": timed_compiles,
    "compile_seconds": compile_s + pool.compile_seconds,
    "seconds": elapsed,
    "policy_params": model_cfg.num_params,
    "max_new_tokens": _MAX_NEW.value,
  }
  with open(os.path.join(_OUT.value, "bench_sd.json"), "w") as f:
    json.dump(report, f, indent=2)
  with open(os.path.join(_OUT.value, "bench_sd.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "chunks_by_arm"])
    w.writeheader()
    for r in rows:
      w.writerow({k: v for k, v in r.items() if k != "chunks_by_arm"})
  _plot(rows, modes, temps, os.path.join(_OUT.value, "bench_sd.png"))
  _table(rows, modes, temps)


def _plot(rows, modes, temps, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 3.8), squeeze=False)
  for ax, temp in zip(axes[0], temps):
    for mode in modes:
      pts = [
        (r["batch"], r["speedup"]) for r in rows if r["config"] == mode and r["temperature"] == temp
      ]
      ax.plot(*zip(*pts), marker="o", label=mode, linestyle="--" if mode == "plain" else "-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s vs plain decode")
    ax.set_title(f"speculative decoding speedup, temperature {temp:g}")
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _table(rows, modes, temps):
  for temp in temps:
    print(f"\ntemperature {temp:g}: tokens/s (speedup over plain; accept length)")
    print("| batch | " + " | ".join(modes) + " |")
    print("|---" * (len(modes) + 1) + "|")
    for b in sorted({r["batch"] for r in rows}):
      cells = []
      for mode in modes:
        (r,) = [
          r for r in rows if r["batch"] == b and r["config"] == mode and r["temperature"] == temp
        ]
        acc = "" if mode == "plain" else f"; {r['accept_length']:.2f}"
        cells.append(f"{r['tokens_per_s']:.0f} ({r['speedup']:.2f}x{acc})")
      print(f"| {b} | " + " | ".join(cells) + " |")
    print(
      f"crossover (smallest batch where no fixed strategy beats plain): {crossover(rows, temp)}"
    )


def crossover(rows, temp):
  for b in sorted({r["batch"] for r in rows}):
    fixed = [
      r["speedup"]
      for r in rows
      if r["batch"] == b and r["temperature"] == temp and r["config"] not in ("plain", "adaptive")
    ]
    if max(fixed) < 1.0:
      return b
  return None


if __name__ == "__main__":
  app.run(main)

r"""The rollout engine's own costs on this host: what the step simulator charges.

experiments/cost_surface.py times standalone forwards; a rollout runs the engine's compiled
programs instead, each at a batch bucket and a cache view (the engine attends over a whole
bucket of the cache, whatever the rows' context), around a prefill, drafter-cache rebuilds
and host work between device calls. This script runs the engine itself, with the policy's
shapes (random weights: the cost of a call does not depend on their values) and no stop
tokens, and reads the calls' seconds from the rollouts' timelines
(`tlt_jax.sim.EngineCost.from_timelines`):

* decode chunks and speculative chunks of every draft arm: each rollout starts
  `max_batch` rows whose budgets end a quarter, a half, ... of them at a time, so one
  rollout passes through every batch bucket (and its compactions); prompts of several
  lengths put its chunks in every cache view. The probe's engine keeps the config's cache
  length (`slots`) and buckets, so its programs are the run's;
* the prefill, by prompts and prompt bucket, with the config's own engine;
* host time between calls, at compactions and after the last call.

First-time compiles are left out. The JSON is what `simulate.py --engine_costs` reads.

  python experiments/engine_costs.py --config=configs/regime.py --out=runs/engine_costs_regime

A run that wrote its rollouts' timelines (rollout_timelines.jsonl) already timed its calls:
--from_run=<run folder> writes its costs instead, from its steps after the first
(`tlt_jax.sim.run_costs`; the cells it never timed, such as plain decode steps in a run that
speculated throughout, from --base, an earlier engine_costs.json, at the run's speed).

  python experiments/engine_costs.py --from_run=runs/regime/tlt_s0 \
    --base=runs/engine_costs_regime/engine_costs.json --out=runs/engine_costs_from_run
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax import configuration  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.models.drafter import init_drafter  # noqa: E402
from tlt_jax.models.transformer import init_model  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402
from tlt_jax.rollout.state import round_up  # noqa: E402
from tlt_jax.sim import EngineCost, run_costs  # noqa: E402
from tlt_jax.sim.replay import engine_config  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "run config")
_OUT = flags.DEFINE_string("out", "runs/engine_costs", "output folder")
_ARMS = flags.DEFINE_list("arms", [], "draft arms to time (default: the config's strategies)")
_PROMPTS = flags.DEFINE_list(
  "prompt_lens",
  [],
  "prompt lengths of the chunk probe (default: one start inside each cache view)",
)
_STAGE = flags.DEFINE_integer(
  "stage_tokens", 32, "tokens each batch bucket runs before the next rows finish"
)
_REPS = flags.DEFINE_integer("reps", 3, "rollouts per (arm, prompt length); medians kept")
_FROM_RUN = flags.DEFINE_string(
  "from_run", "", "a run folder with rollout_timelines.jsonl: its own calls, not a probe's"
)
_BASE = flags.DEFINE_string(
  "base", "", "--from_run: an engine_costs.json for the cells the run never timed"
)


def stage_budgets(rows: int, stage: int) -> list[int]:
  """Per-row token budgets that end half the rows after `stage` tokens, half the rest
  `stage` tokens later, ...: row i runs (floor(log2(rows / (rows - i))) + 1) stages."""
  return [stage * (int(math.floor(math.log2(rows / (rows - i)))) + 1) for i in range(rows)]


def default_prompt_lens(views, longest: int) -> list[int]:
  """A start inside each cache view: just past the previous view (8 in the first)."""
  starts = [8] + [v + 1 for v in views[:-1]]
  return sorted({min(s, longest) for s in starts})


def _random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return rng.integers(3, vocab, size=(n, length)).tolist()


def costs_from_run(workdir: str, base_path: str = "") -> dict:
  """engine_costs.json's content from a run's own calls (module doc, --from_run)."""
  paths = [os.path.join(workdir, f) for f in ("config.json", "rollout_timelines.jsonl")]
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise app.UsageError(f"--from_run: {missing} missing (runs from 2026-12-07 write them)")
  with open(paths[0]) as f:
    config = json.load(f)
  with open(paths[1]) as f:
    rows = [json.loads(line) for line in f]
  steps = sorted(r["step"] for r in rows)
  steps = steps[1:] or steps  # the first step compiles
  base = None
  if base_path:
    with open(base_path) as f:
      base = EngineCost.from_dict(json.load(f))
  try:
    cost, drift = run_costs(rows, steps, base)
  except ValueError as e:
    raise app.UsageError(f"--from_run: {e}; --base names an engine_costs.json for it") from None
  return {
    "host": None,
    "config": {"engine": config["engine"], "group_size": config["rl"]["group_size"]},
    "from_run": {"run": workdir, "steps": steps, "drift": drift, "base": base_path or None},
    **cost.to_dict(),
  }


def main(argv):
  del argv
  if _FROM_RUN.value:
    out = costs_from_run(_FROM_RUN.value, _BASE.value)
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, "engine_costs.json"), "w") as f:
      json.dump(out, f, indent=1)
    print(table(EngineCost.from_dict(out), engine_config(out["config"]["engine"])))
    print(f"\nwrote {os.path.join(_OUT.value, 'engine_costs.json')}")
    return
  config = _CONFIG.value
  config.mode = "tlt"
  tokenizer = get_tokenizer(config.task.tokenizer)
  model_cfg = configuration.model_config(config, tokenizer)
  sampling = configuration.sampling_config(config)
  run_cfg = configuration.engine_config(config, tokenizer)
  graphdef, params = nnx.split(init_model(model_cfg, seed=0))
  drafter_graphdef, drafter_params = nnx.split(init_drafter(model_cfg, seed=0))
  host = host_info((graphdef, params))
  print(format_host(host), flush=True)
  g = int(config.rl.group_size)
  rows = run_cfg.max_batch
  if rows % g:
    raise app.UsageError(f"engine.max_batch={rows} is not a multiple of rl.group_size={g}")
  if _STAGE.value < run_cfg.chunk_steps:
    raise app.UsageError(
      f"--stage_tokens={_STAGE.value} < engine.chunk_steps={run_cfg.chunk_steps}: a bucket "
      "would end inside its first chunk and never be timed"
    )
  arms = list(_ARMS.value) or list(run_cfg.spec_strategies)
  unknown = sorted(set(arms) - set(run_cfg.spec_strategies))
  if unknown:
    raise app.UsageError(f"--arms {unknown} are not among the config's {run_cfg.spec_strategies}")

  # The chunk probe: no stop tokens, budgets of a few stages, prompts as long as the cache
  # allows with the run's slots (so the cache views, buckets and programs are the run's).
  budgets = stage_budgets(rows, _STAGE.value)
  longest_prompt = run_cfg.slots - max(budgets)
  probe = dataclasses.replace(
    run_cfg, stop_tokens=(), max_new_tokens=max(budgets), max_prompt_len=longest_prompt
  )
  assert probe.view_buckets == run_cfg.view_buckets, "the probe must keep the run's views"
  prompt_lens = [int(p) for p in _PROMPTS.value] or default_prompt_lens(
    run_cfg.view_buckets, longest_prompt
  )
  plain_cfg = dataclasses.replace(probe, spec_threshold=0)
  engines = {"plain": RolloutEngine(graphdef, model_cfg, plain_cfg, sampling)}
  for arm in arms:
    # The arm first (a non-adaptive engine runs its first strategy) and the config's
    # others after it, so the cache length (deepest draft) is the run's.
    order = (arm, *(s for s in run_cfg.spec_strategies if s != arm))
    cfg = dataclasses.replace(
      probe, spec_threshold=rows, spec_strategies=order, spec_adaptive=False
    )
    engines[arm] = RolloutEngine(
      graphdef, model_cfg, cfg, sampling, drafter_graphdef=drafter_graphdef
    )

  timelines = []
  t_start = time.perf_counter()
  for rep in range(_REPS.value):
    for plen in prompt_lens:
      prompts = _random_prompts(rows // g, plen, model_cfg.vocab_size, seed=rep * 1000 + plen)
      for name, engine in engines.items():
        result = engine.generate(
          params,
          prompts,
          g,
          key=rep,
          max_new_tokens=budgets,
          drafter_params=drafter_params if name != "plain" else None,
        )
        # Its prefill is the probe's shape (prompt buckets up to the stretched length):
        # the run's prefills are timed below.
        chunks = [e for e in result.timeline if e["phase"] != "prefill"]
        timelines.append((chunks, result.wall_seconds))
        print(
          f"rep {rep} prompt {plen} {name}: {result.wall_seconds:.2f} s "
          f"({time.perf_counter() - t_start:.0f} s in all)",
          flush=True,
        )

  # The prefill at the run's own prompt buckets, by prompts per rollout.
  plain_run = RolloutEngine(
    graphdef, model_cfg, dataclasses.replace(run_cfg, spec_threshold=0), sampling
  )
  prompt_counts = sorted({round_up(n, run_cfg.batch_buckets) for n in (1, rows // g)})
  for rep in range(_REPS.value):
    for n in prompt_counts:
      for plen in run_cfg.prompt_buckets:
        prompts = _random_prompts(n, plen, model_cfg.vocab_size, seed=rep)
        result = plain_run.generate(params, prompts, g, key=rep, max_new_tokens=1)
        timelines.append(([result.timeline[0]], None))

  cost = EngineCost.from_timelines(timelines)
  os.makedirs(_OUT.value, exist_ok=True)
  out = {
    "host": host,
    "config": {"engine": dataclasses.asdict(run_cfg), "group_size": g},
    "probe": {"prompt_lens": prompt_lens, "budgets": budgets, "reps": _REPS.value},
    **cost.to_dict(),
  }
  with open(os.path.join(_OUT.value, "engine_costs.json"), "w") as f:
    json.dump(out, f, indent=1)
  print(table(cost, run_cfg))
  print(f"\n{format_host(host)}\nwrote {os.path.join(_OUT.value, 'engine_costs.json')}")


def table(cost: EngineCost, cfg) -> str:
  """ms per plain step and per round of each arm (and in plain steps), by batch x view."""
  lines = []
  views = cfg.view_buckets
  for kind, cells in cost.cells.items():
    if kind in ("prefill", "drafter_prefill"):
      continue
    batches = sorted({b for b, _, _ in cells})
    lines.append(f"\n{kind}: ms per {'step' if kind == 'plain' else 'round'} (in plain steps)")
    lines.append("| batch | " + " | ".join(f"view {v}" for v in views) + " |")
    lines.append("|---|" + "---|" * len(views))
    for b in batches:
      row = []
      for v in views:
        ms = 1000 * (cost.seconds(b, 1, v) if kind == "plain" else cost.round_seconds(kind, b, v))
        steps = ms / (1000 * cost.seconds(b, 1, v))
        row.append(f"{ms:.1f}" + ("" if kind == "plain" else f" ({steps:.2f})"))
      lines.append(f"| {b} | " + " | ".join(row) + " |")
  for kind in ("prefill", "drafter_prefill"):
    cells = cost.cells.get(kind, ())
    if cells:
      lines.append(f"\n{kind} ms: " + ", ".join(f"{b} x {n}: {1000 * s:.0f}" for b, n, s in cells))
  lines.append(
    f"\nhost ms: between calls {1000 * cost.gap_s:.1f}, at a compaction "
    f"{1000 * cost.compact_s:.1f}, after the last call {1000 * cost.finish_s:.1f}"
  )
  return "\n".join(lines)


if __name__ == "__main__":
  app.run(main)

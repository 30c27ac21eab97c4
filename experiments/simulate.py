r"""What TLT does to an RL step, predicted by replaying the rollout engine's policy
(tlt_jax.sim) on response lengths with a decode cost model.

Two uses:

Calibrated on this host: the engine's own costs (experiments/engine_costs.py, whose engine
config sets the buckets; or the forward grid of experiments/cost_surface.py with the
--engine_* flags), response lengths (and prompt lengths) from a run's rollout_lengths.jsonl
(every rollout of every step) or a log-normal fit, the accept lengths this project measured
(bench_sd, e2e_modes), the update's seconds per token; prints the predicted rollout and step
time per mode, to set beside the measured ones.

  python experiments/simulate.py --engine_costs=runs/engine_costs/engine_costs.json \
    --lengths=runs/e2e/baseline/rollout_lengths.jsonl \
    --accept_sd=chain4:3.4,chain8:4.6 --accept_tlt=chain4:3.9,chain8:5.9 \
    --update_ms_per_token=0.9

Validated (--validate=DIR, an experiments/e2e_modes.py output folder): every measured
step of every mode replayed on its own response lengths, prompt lengths and accept lengths
with this host's engine costs (experiments/engine_costs.py: the engine's own calls by batch
bucket and cache view) or cost surface (the baseline calibrates the update and the rest of
a step); the predicted and measured rollout and step times side by side, and whether they
agree within 15%; then step by step, and for runs that record them (metrics from
2026-12-07) the rollout by part: prefill, chunks per arm, drafter-cache rebuilds and the
host time between calls, measured / predicted. Where a run records its accept lengths by
batch bucket, each bucket's arms carry their own (--noby_bucket: the step's mean in every
bucket). Runs that record their rollouts' timelines (rollout_timelines.jsonl, from
2026-12-07) can be priced by their own calls instead of a probe's (--run_costs=pooled: each
run's calls of the compared steps, pooled; --run_costs=per_step: those costs scaled in each
step by how much slower or faster its calls ran), which leaves the host's drift out of what
is being tested.

  python experiments/simulate.py --engine_costs=runs/engine_costs/engine_costs.json \
    --validate=runs/regime
  python experiments/simulate.py --run_costs=per_step --validate=runs/regime

Projected (--project): H100 cost models from published figures for bf16 Qwen2.5-7B (one
GPU per rollout instance) and 32B (4-way tensor parallel), the paper's settings (GRPO,
G = 8, 32k response cap, SD at <= 32 running rows, verification of 32 draft nodes, accept
length 4.59 for a drafter aligned once and 6.53 trained during RL) and DAPO-like response
lengths (median ~470, p90 ~1k: "RL in the Wild" traces); the table in the paper's layout,
then with the group drafts of this project added as a further arm; then a sensitivity
table: the end-to-end speedup by the tail's weight (max / median) and rows per instance.

  python experiments/simulate.py --project

Projected from a device's measured forwards (--project --surface=<real_sizes.json>:<shape>):
the shape's decode and verify forwards as experiments/real_sizes.py measured them on that
device (`TableCost`; rows per instance: the largest batch measured, so nothing is
extrapolated in batch), its drafter step against its decode step, the same DAPO-like
lengths, this project's accept lengths (--accept_sd / --accept_tlt) and an update at
--update_mfu of the device's peak; beside it a roofline of the same device (its spec sheet,
bandwidth at the measured copy rate) and the paper's figure; then one assumption at a time
(tail, rows, accept lengths, update MFU, drafter cost): which moves TLT's figure most.

  python experiments/simulate.py --project --surface=runs/real_sizes/real_sizes.json:qwen3-8b
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import published_shape, split_calls  # noqa: E402
from tlt_jax.sim import (  # noqa: E402
  ACCEPT_FROZEN,
  ACCEPT_ONLINE,
  TAIL_ACCEPT_MEASURED,
  ArmModel,
  Calibration,
  DecodeCost,
  EngineCost,
  EnginePolicy,
  PairedOneRow,
  RooflineCost,
  TableCost,
  arms_from_accept,
  compare,
  device_roofline,
  engine_bandit,
  lognormal_lengths,
  modelled,
  paper_policy,
  predict_modes,
  project_step,
  run_costs,
  step_record,
)

_PROJECT = flags.DEFINE_bool("project", False, "H100 projection in the paper's settings")
_SURFACE = flags.DEFINE_string(
  "surface",
  "",
  "cost_surface.json of this host, or <real_sizes.json>:<shape> (experiments/real_sizes.py's "
  "decode grid of that shape, e.g. runs/real_sizes/real_sizes.json:qwen3-8b)",
)
_LENGTHS = flags.DEFINE_string("lengths", "", "a run's rollout_lengths.jsonl")
_ROWS_PER_CALL = flags.DEFINE_integer(
  "rows_per_call",
  0,
  "--lengths' rollouts split into engine calls of this many rows (rl.rows_per_call: what "
  "one device decodes at once), replayed one by one; a step's seconds are its calls' sum "
  "(0: each rollout as recorded)",
)
_LOGNORMAL = flags.DEFINE_list(
  "lognormal", ["470", "1000", "32768", "128"], "median, p90, cap, rows (without --lengths)"
)
_STEPS = flags.DEFINE_integer("steps", 20, "RL steps replayed (lengths drawn per step)")
_MAX_BATCH = flags.DEFINE_integer("engine_max_batch", 128, "EngineConfig.max_batch")
_MIN_BUCKET = flags.DEFINE_integer("engine_min_batch_bucket", 1, "EngineConfig.min_batch_bucket")
_CHUNK = flags.DEFINE_integer("chunk_steps", 16, "EngineConfig.chunk_steps")
_THRESHOLD = flags.DEFINE_integer("spec_threshold", 32, "EngineConfig.spec_threshold")
_ROUNDS = flags.DEFINE_integer("spec_rounds", 8, "EngineConfig.spec_rounds")
_PROMPT = flags.DEFINE_integer("prompt_len", 128, "prompt tokens")
_ACCEPT_SD = flags.DEFINE_list(
  "accept_sd", [f"{k}:{v}" for k, v in ACCEPT_FROZEN.items()], "frozen drafter"
)
_ACCEPT_TLT = flags.DEFINE_list(
  "accept_tlt", [f"{k}:{v}" for k, v in ACCEPT_ONLINE.items()], "online drafter"
)
_DRAFT_COST = flags.DEFINE_float("draft_cost", 0.1, "drafter forward / target decode step")
_UPDATE = flags.DEFINE_float("update_ms_per_token", 1.0, "policy update, ms per token")
_OTHER = flags.DEFINE_float("other_s", 0.0, "rewards, old log-probs etc., seconds per step")
_DRAFTER_S = flags.DEFINE_float("drafter_s", 0.0, "drafter training per step (tlt), seconds")
_STOCHASTIC = flags.DEFINE_bool("stochastic", True, "draw per-round acceptance per row")
_GROUP_ACCEPT = flags.DEFINE_float(
  "group_accept", 1.8, "group drafts' accept length (this project: 1.4-1.8, RESULTS.md)"
)
_SEED = flags.DEFINE_integer("seed", 0, "length and acceptance draws")
_REWARD_NOISE = flags.DEFINE_float(
  "reward_noise",
  0.1,
  "--validate's replayed bandit: relative spread (log-normal) of the chunk times it is told",
)
_SENS_P90 = flags.DEFINE_list(
  "sensitivity_p90",
  ["1000", "1420", "1990"],
  "--project's sensitivity: p90s of the log-normal (median 470); 1000 / 1420 / 1990 put the "
  "longest of 128 rows near 5 / 10 / 20x the median",
)
_SENS_ROWS = flags.DEFINE_list(
  "sensitivity_rows", ["32", "128", "512"], "--project's sensitivity: rows per instance"
)
_OUT = flags.DEFINE_string("out", "", "write the predictions here as JSON")
_MFU = flags.DEFINE_float("update_mfu", 0.4, "--project from a table: the update's MFU")
_VALIDATE = flags.DEFINE_string("validate", "", "an e2e_modes.py output folder to predict")
_BY_BUCKET = flags.DEFINE_bool(
  "by_bucket",
  True,
  "--validate: each batch bucket's own accept lengths where the run recorded them",
)
_RUN_COSTS = flags.DEFINE_enum(
  "run_costs",
  "",
  ["", "pooled", "per_step"],
  "--validate: price each run by its own calls (rollout_timelines.jsonl): pooled over its "
  "compared steps, or those scaled by each step's drift; --engine_costs prices the runs "
  "without timelines",
)
_ENGINE_COSTS = flags.DEFINE_string(
  "engine_costs",
  "",
  "engine_costs.json of this host (experiments/engine_costs.py): the engine's own calls by "
  "batch bucket and cache view, with prefill, rebuilds and host time; replaces --surface",
)


def _accept(items) -> dict[str, float]:
  out = {}
  for item in items:
    name, _, value = item.partition(":")
    out[name] = float(value)
  return out


def run_lengths(path: str) -> tuple[list[list[int]], list[list[int]] | None]:
  """Every rollout of a run (refills included), in order, and its rows' prompt lengths
  (None: the run predates their record)."""
  out, prompts = [], []
  with open(path) as f:
    for line in f:
      row = json.loads(line)
      out += row["rollouts"]
      prompts += row.get("prompts", [None] * len(row["rollouts"]))
  if not out:
    raise ValueError(f"{path}: no rollouts")
  return out, (None if any(p is None for p in prompts) else prompts)


def _print(title: str, pred: dict) -> None:
  base = pred["baseline"]
  print(f"\n{title}")
  print("| mode | rollout s | step s | rollout speedup | step speedup | arms (chunks) |")
  print("|---|---|---|---|---|---|")
  for mode, m in pred.items():
    arms = ", ".join(f"{k} {v}" for k, v in sorted(m["chunks_by_arm"].items()))
    rs = f"{m['rollout_speedup']:.2f}x" if mode != "baseline" else "-"
    ss = f"{m['step_speedup']:.2f}x" if mode != "baseline" else "-"
    print(f"| {mode} | {m['rollout_s']:.1f} | {m['step_s']:.1f} | {rs} | {ss} | {arms} |")
  print(f"rollout share of the baseline step: {base['rollout_share']:.2f}")


# Published figures (see the module docstring): H100 SXM dense bf16 989 TFLOP/s, HBM3
# 3.35 TB/s; bandwidth efficiency 0.8 puts a 7B decode step at ~5.7 ms + 0.5 ms overhead,
# the 6.1-6.3 ms a token reported for batch-1 decode of 7-8B models on one H100.
_H100 = dict(peak_flops=989e12, bandwidth=3.35e12, bandwidth_efficiency=0.8, overhead_s=5e-4)
_MODELS = {
  # params, layers, kv heads, head dim, GPUs per rollout instance
  "Qwen2.5-7B": (7.6e9, 28, 4, 128, 1),
  "Qwen2.5-32B": (32.8e9, 64, 8, 128, 4),
}


def _h100_model(name: str):
  """A published model's H100 cost model, its arms (frozen drafter, online drafter, group
  drafts) and its update's seconds per token."""
  params, layers, kv_heads, head_dim, gpus = _MODELS[name]
  cost = RooflineCost(
    params=params,
    bytes_per_param=2,
    kv_bytes_per_token=2 * layers * kv_heads * head_dim * 2,
    peak_flops=gpus * _H100["peak_flops"],
    bandwidth=gpus * _H100["bandwidth"],
    bandwidth_efficiency=_H100["bandwidth_efficiency"],
    overhead_s=_H100["overhead_s"],
  )
  # A tree of 32 verified nodes (the paper's arms: depth 8, top-k 4); the drafter is one
  # decoder layer: about 1 / layers of a step, plus the LM head's share.
  draft_cost = 1.0 / layers + 0.05
  frozen = ArmModel("tree8x4x32", 32, 4.59, 8, draft_cost)
  online = ArmModel("tree8x4x32", 32, 6.53, 8, draft_cost)
  group = ArmModel("group16", 17, _GROUP_ACCEPT.value, 0)
  # Update: 3 x 2 x params FLOPs a token (forward + backward) at 40% of the instance's
  # peak; the paper's rollout share is ~0.85 of a step, so other time stays 0 here.
  update_s = 6 * params / (0.4 * gpus * _H100["peak_flops"])
  return cost, (frozen, online, group), update_s, gpus


def project() -> dict:
  """The paper's settings on H100 cost models; see the module docstring."""
  results = {}
  traces = lognormal_lengths(470, 1000, 32768, 128, _STEPS.value, _SEED.value)
  for name in _MODELS:
    cost, (frozen, online, group), update_s, gpus = _h100_model(name)
    tail = f"paper, the one-row tail accepting {TAIL_ACCEPT_MEASURED}x the draft tokens"
    for label, arms, tail_accept in (
      ("paper", ([frozen], [online]), 1.0),
      ("+group", ([frozen, group], [online, group]), 1.0),
      (tail, ([frozen], [online]), TAIL_ACCEPT_MEASURED),
    ):
      pred = predict_modes(
        cost, paper_policy(128), traces, arms[0], arms[1], update_s, tail_accept=tail_accept
      )
      results[f"{name} {label}"] = pred
      _print(f"{name}, {gpus} x H100, {label}", pred)
  print(
    "\nPaper (REFERENCE: 64 H100s vs veRL): Qwen2.5-7B 1.86x, Qwen2.5-32B 2.12x end to end;"
    " SD alone at batch 1 2.61x (7B)."
  )
  results["sensitivity"] = sensitivity()
  return results


def project_measured(surface: str) -> dict:
  """--project --surface=<real_sizes.json>:<shape>; see the module docstring."""
  path, name = surface.rsplit(":", 1)
  with open(path) as f:
    measured = json.load(f)
  table = surface_table(surface)
  cfg = published_shape(name)
  roofline, peak = device_roofline(measured, cfg, _H100["overhead_s"])
  if peak is None:
    raise app.UsageError(f"{path}: no bandwidth stage measured (run real_sizes.py's first)")
  step_ms = 1e3 * table.seconds(1, 1, table.context)
  drafter_ms = (measured.get("drafter_step") or {}).get(f"{name}/1")
  base = {
    "p90": 1000.0,
    "rows": max(table.batches),
    "accept": 1.0,
    "tail_accept": 1.0,
    "mfu": _MFU.value,
    "draft": drafter_ms / step_ms if drafter_ms else _DRAFT_COST.value,
  }

  def run(cost, **change):
    a = {**base, **change}
    return project_step(
      cost,
      cfg,
      peak,
      _accept(_ACCEPT_SD.value),
      _accept(_ACCEPT_TLT.value),
      rows=a["rows"],
      draft=a["draft"],
      mfu=a["mfu"],
      p90=a["p90"],
      accept=a["accept"],
      tail_accept=a["tail_accept"],
      steps=_STEPS.value,
      seed=_SEED.value,
    )

  device = ", ".join(measured.get("devices", [])) or "the measured device"
  results = {"base": base, "measured": run(table)}
  print(
    f"\n{name} on {device}: forwards measured at batch {min(table.batches)}-{base['rows']}, "
    f"context {table.context:.0f}; drafter {base['draft']:.3f} of a step; update at MFU "
    f"{base['mfu']}; lengths median 470, p90 1k (DAPO)"
  )
  print("| cost model | rows | baseline step s | rollout share | sd | tlt |")
  print("|---|---|---|---|---|---|")
  rows = [("measured forwards", results["measured"])]
  if 2 in table.tokens:
    # The engine's one-row step on a GPU (EngineConfig.one_row_step): a two-token forward.
    # The drafter's step is measured in ms: the same ms against the cheaper one-row step.
    paired = PairedOneRow(table)
    draft = base["draft"] * step_ms / (1e3 * paired.seconds(1, 1, table.context))
    results["measured_paired"] = run(paired, draft=draft if drafter_ms else base["draft"])
    rows.append(("measured forwards, one-row steps as two tokens", results["measured_paired"]))
  if roofline is not None:
    results["roofline"] = run(roofline)
    rows.append(("roofline of the same device", results["roofline"]))
  for label, pred in rows:
    b = pred["baseline"]
    print(
      f"| {label} | {base['rows']} | {b['step_s']:.1f} | {b['rollout_share']:.2f} | "
      f"{pred['sd']['step_speedup']:.2f}x | {pred['tlt']['step_speedup']:.2f}x |"
    )
  print("| the paper (Qwen2.5-7B, 64 H100s, against veRL) | 128 | - | - | - | 1.86x |")
  results["sensitivity"] = _one_at_a_time(base, lambda **c: run(table, **c))
  return results


def _one_at_a_time(base: dict, run) -> list[dict]:
  """TLT's projected speedup with one assumption moved at a time, largest swing first."""
  moves = [
    ("tail p90 (max / median)", "p90", (600.0, 2000.0)),
    ("rows per instance", "rows", (max(base["rows"] // 4, 1), max(base["rows"] // 2, 1))),
    ("accepted draft tokens (x)", "accept", (0.75, 1.25)),
    ("one-row tail's accepted draft tokens (x)", "tail_accept", (TAIL_ACCEPT_MEASURED, 1.0)),
    ("update MFU", "mfu", (0.2, 0.6)),
    ("drafter cost (of a step)", "draft", (base["draft"] / 2, base["draft"] * 2)),
  ]
  out = []
  for label, key, (low, high) in moves:
    if low == high == base[key]:
      continue  # nothing to move (one row an instance has no fewer rows)
    lo, hi = (run(**{key: v})["tlt"]["step_speedup"] for v in (low, high))
    out.append({"assumption": label, "low": low, "high": high, "tlt_low": lo, "tlt_high": hi})
  out.sort(key=lambda r: -abs(r["tlt_high"] - r["tlt_low"]))
  print("\nOne assumption at a time (measured forwards), TLT end to end:")
  print("| assumption | base | low | high | tlt at low | tlt at high |")
  print("|---|---|---|---|---|---|")
  for r in out:
    key = next(k for label, k, _ in moves if label == r["assumption"])
    print(
      f"| {r['assumption']} | {base[key]:.3g} | {r['low']:.3g} | {r['high']:.3g} | "
      f"{r['tlt_low']:.2f}x | {r['tlt_high']:.2f}x |"
    )
  print(f"moves TLT's figure most: {out[0]['assumption']}")
  return out


def sensitivity() -> list[dict]:
  """TLT's projected end-to-end speedup by the tail's weight and the rows per instance.

  The projection's log-normal (median 470, p90 1k) puts the longest of 128 rows at ~5x the
  median, while public DAPO traces reach 9-23x: a heavier tail keeps the tail's few rows
  running longer, and more rows per instance make the full-batch phase cheaper per row.
  """
  rows_list = [int(r) for r in _SENS_ROWS.value]
  p90s = [float(p) for p in _SENS_P90.value]
  out = []
  print("\nSensitivity: TLT end-to-end speedup (online drafter; +group drafts)")
  header = " | ".join(f"{n} tlt | {n} +group" for n in _MODELS)
  print(f"| p90 | rows | max / median | rollout share (mean of models) | {header} |")
  print("|---|---|---|---|" + "---|" * (2 * len(_MODELS)))
  for p90 in p90s:
    for rows in rows_list:
      traces = lognormal_lengths(470, p90, 32768, rows, _STEPS.value, _SEED.value)
      ratio = float(np.mean([max(t) / np.median(t) for t in traces]))
      cell = {"p90": p90, "rows": rows, "max_over_median": ratio}
      shares = []
      for name in _MODELS:
        cost, (frozen, online, group), update_s, _ = _h100_model(name)
        for label, arms in (("tlt", [online]), ("+group", [online, group])):
          pred = predict_modes(
            cost, paper_policy(rows), traces, [frozen], arms, update_s, 0.0, 0.0, True
          )
          cell[f"{name} {label}"] = pred["tlt"]["step_speedup"]
          shares.append(pred["baseline"]["rollout_share"])
      cell["rollout_share"] = float(np.mean(shares))
      out.append(cell)
      speeds = " | ".join(f"{cell[f'{n} tlt']:.2f}x | {cell[f'{n} +group']:.2f}x" for n in _MODELS)
      print(f"| {p90:.0f} | {rows} | {ratio:.1f} | {cell['rollout_share']:.2f} | {speeds} |")
  return out


def rebuilt_prompt_lengths(config: dict, rows: list[dict]) -> list[dict]:
  """Runs from before rollout_lengths.jsonl recorded prompt lengths: each rollout's prompt
  lengths rebuilt from the trainer's data order (`rl.trainer.GRPOTrainer`: a permutation
  of the training split keyed by the seed, `prompts_per_step` examples per rollout,
  refills included, each prompt encoded with a BOS, G rows per prompt)."""
  import ml_collections

  from tlt_jax import configuration
  from tlt_jax.train import load_data

  cfg = ml_collections.ConfigDict(config)
  tokenizer = configuration.tokenizer(cfg)
  fmt = configuration.prompt_format(cfg, tokenizer)
  train, _ = load_data(cfg, cfg.task.data_dir)
  order = np.random.default_rng(int(cfg.seed)).permutation(len(train))
  p, g = int(cfg.rl.prompts_per_step), int(cfg.rl.group_size)
  cursor, out = 0, []
  for row in sorted(rows, key=lambda r: r["step"]):
    prompts = []
    for _ in row["rollouts"]:
      examples = [train[int(order[(cursor + i) % len(order)])] for i in range(p)]
      cursor += p
      lens = [len(tokenizer.encode(fmt(ex), add_bos=True)) for ex in examples]
      prompts.append([n for n in lens for _ in range(g)])
    out.append({**row, "prompts": prompts})
  return out


def _run_records(workdir: str, config: dict, rebuild_prompts: bool) -> list:
  """The StepRecords of one run folder, after its first step (compiles, warm-up)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    metrics = [json.loads(line) for line in f]
  with open(os.path.join(workdir, "rollout_lengths.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  if rebuild_prompts and any("prompts" not in r for r in rows):
    rows = rebuilt_prompt_lengths(config, rows)
  lengths = {row["step"]: row for row in rows}
  records = [step_record(m, lengths[m["step"]]) for m in metrics]
  return records[1:] if len(records) > 1 else records


def _costs_of_run(workdir: str, records: list, cost: DecodeCost | None):
  """The costs one run is priced with: `cost`, or with --run_costs the run's own calls
  (its rollout_timelines.jsonl, the compared steps), pooled or per step; and per step the
  costs in place of `cost` (None: `cost` throughout)."""
  if not _RUN_COSTS.value:
    return cost, None
  path = os.path.join(workdir, "rollout_timelines.jsonl")
  if not os.path.isfile(path):
    if cost is None:
      raise app.UsageError(
        f"--run_costs: {path} does not exist (runs from 2026-12-07 write it); name "
        "--engine_costs for the runs without it"
      )
    print(f"{os.path.basename(workdir)}: no rollout timelines, priced by --engine_costs")
    return cost, None
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  steps = {r.step for r in records}
  # What the run never timed (plain steps, where it speculated throughout) is the probe's.
  base = cost if isinstance(cost, EngineCost) else None
  pooled, drift = run_costs(rows, steps, base)
  line = f"{os.path.basename(workdir)}: priced by its own calls"
  if base is not None:
    calls = [
      (c["timeline"], c["wall"]) for row in rows if row["step"] in steps for c in row["rollouts"]
    ]
    line += f" ({base.drift(calls):.2f}x the probe's seconds where both timed a call)"
  drifts = " ".join(f"{drift[r.step]:.2f}" for r in records)
  print(f"{line}; each step's against them: {drifts}")
  if _RUN_COSTS.value == "pooled":
    return pooled, None
  return pooled, [pooled.scaled(drift[r.step]) for r in records]


def validate(run_dir: str, cost: DecodeCost | None) -> dict:
  """Predicted vs measured per run of an e2e_modes.py folder (see the module docstring);
  `cost` None: each run priced by its own calls (--run_costs)."""
  labels = sorted(
    d for d in os.listdir(run_dir) if os.path.isfile(os.path.join(run_dir, d, "metrics.jsonl"))
  )
  configs, records = {}, {}
  for label in labels:
    with open(os.path.join(run_dir, label, "config.json")) as f:
      configs[label] = json.load(f)
    records[label] = _run_records(
      os.path.join(run_dir, label), configs[label], cost is None or isinstance(cost, EngineCost)
    )
  baselines = [k for k in labels if configs[k]["mode"] == "baseline"]
  if not baselines:
    raise app.UsageError(f"{run_dir}: no baseline run to calibrate the update with")
  results, arm_lines, step_lines, part_tables = {}, [], [], []
  print(
    "\n| run | steps | rollout s measured / predicted | step s measured / predicted | "
    "ratios | within 15% |"
  )
  print("|---|---|---|---|---|---|")
  for label in labels:
    cfg, mode = configs[label], configs[label]["mode"]
    # The baseline of the same seed when there are several (mode_s<seed> folders).
    suffix = label[len(mode) :]
    base = f"baseline{suffix}" if f"baseline{suffix}" in records else baselines[0]
    eng = cfg["engine"]
    policy = EnginePolicy.from_engine(eng, samples=cfg["rl"]["group_size"])
    run_cost, step_costs = _costs_of_run(os.path.join(run_dir, label), records[label], cost)
    if not isinstance(run_cost, EngineCost):
      # Standalone forwards by mean context: no views, one prompt length for every row.
      policy = dataclasses.replace(policy, views=(), prompt_len=_PROMPT.value)
    calibration = Calibration.from_baseline(records[base])
    # Speculative runs three times: with the converged bandit's arms (what a projection
    # uses), with the engine's bandit replayed (learning from the replayed chunks, its
    # exploration included) and with the arm mix the run's bandit chose.
    variants = [(label, False, False)]
    if mode != "baseline":
      variants += [
        (f"{label}, bandit replayed", False, True),
        (f"{label}, its arm mix", True, False),
      ]
    known = sorted({a for r in records[label] for a in modelled(tuple(r.accept))})
    for name, measured_arms, replay_bandit in variants:
      bandit = None
      if replay_bandit and known and eng.get("spec_adaptive", True):
        bandit = engine_bandit(eng, known, seed=int(cfg.get("seed", 0)))
      out = compare(
        records[label],
        run_cost,
        policy,
        calibration,
        speculative=mode != "baseline",
        draft_cost=_DRAFT_COST.value,
        measured_arms=measured_arms,
        bandit=bandit,
        reward_noise=_REWARD_NOISE.value,
        stochastic=_STOCHASTIC.value,
        seed=_SEED.value,
        by_bucket=_BY_BUCKET.value,
        step_costs=step_costs,
      )
      results[name] = out
      print(
        f"| {name} | {out['steps']} | {out['measured_rollout_s']:.2f} / "
        f"{out['predicted_rollout_s']:.2f} | {out['measured_step_s']:.2f} / "
        f"{out['predicted_step_s']:.2f} | {out['rollout_ratio']:.2f} / {out['step_ratio']:.2f} | "
        f"{'yes' if out['within_tolerance'] else 'NO'} |"
      )
      ratios = " ".join(f"{x:.2f}" for x in out["rollout_ratios"])
      step_lines.append(f"| {name} | {ratios} |")
      if out["parts"]:
        part_tables.append(_parts_table(name, out["parts"]))
      if bandit is not None:
        measured = {}
        for r in records[label]:
          for arm, n in r.chunks.items():
            measured[arm] = measured.get(arm, 0) + n
        arm_lines.append(f"| {name} | {_counts(out['chunks'])} | {_counts(measured)} |")
  print("\n| run | rollout predicted / measured, step by step |\n|---|---|")
  print("\n".join(step_lines))
  if arm_lines:
    print("\n| run | chunks by arm, replayed | measured |\n|---|---|---|")
    print("\n".join(arm_lines))
  for table in part_tables:
    print(table)
  return results


def _parts_table(name: str, parts: list) -> str:
  """Rollout seconds by part, measured / predicted, in the run's steps from its second (the
  first, which compiles, is left out as everywhere here)."""
  order = {"prefill": 0, "plain": 1, "drafter_prefill": 3, "host": 4}
  names = sorted(
    {p for step in parts for side in ("measured", "predicted") for p in step[side]},
    key=lambda p: (order.get(p, 2), p),
  )
  lines = [
    f"\n{name}: rollout seconds by part, measured / predicted",
    "| step | " + " | ".join(names) + " |",
    "|---|" + "---|" * len(names),
  ]
  for step in parts:
    m, p = step["measured"], step["predicted"]
    cells = [f"{m.get(k, 0.0):.2f} / {p.get(k, 0.0):.2f}" for k in names]
    lines.append(f"| {step['step']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def surface_table(value: str) -> TableCost:
  """--surface: a cost_surface.json, or a real_sizes.json and the shape to take from its
  decode grid ("path:shape")."""
  path, shape = value, ""
  if not os.path.isfile(value) and ":" in value:
    path, shape = value.rsplit(":", 1)
  with open(path) as f:
    table = json.load(f)
  if "decode_grid" in table:
    if not shape:
      shapes = sorted({k.rsplit("/", 3)[0] for k in table["decode_grid"]})
      raise app.UsageError(f"--surface={value}: name the shape, as {path}:<one of {shapes}>")
    return TableCost.from_decode_grid(table["decode_grid"], shape)
  return TableCost.from_dict(table)


def _counts(chunks) -> str:
  return ", ".join(f"{k} {v}" for k, v in sorted(chunks.items(), key=lambda kv: -kv[1]))


def main(argv):
  del argv
  if _PROJECT.value and _SURFACE.value:
    results = project_measured(_SURFACE.value)
  elif _PROJECT.value:
    results = project()
  elif _VALIDATE.value:
    if _RUN_COSTS.value and _SURFACE.value:
      raise app.UsageError("--run_costs prices by the engine's calls: not with --surface")
    if _RUN_COSTS.value and not _ENGINE_COSTS.value:
      cost = None
    elif _ENGINE_COSTS.value:
      with open(_ENGINE_COSTS.value) as f:
        cost = EngineCost.from_dict(json.load(f))
    elif _SURFACE.value:
      cost = surface_table(_SURFACE.value)
    else:
      raise app.UsageError(
        "--validate needs --engine_costs (experiments/engine_costs.py), --surface "
        "(experiments/cost_surface.py) or --run_costs (each run's own calls)"
      )
    results = validate(_VALIDATE.value, cost)
  else:
    prompts, calls = None, 1
    if _LENGTHS.value:
      traces, prompts = run_lengths(_LENGTHS.value)
      if _ROWS_PER_CALL.value:
        try:
          traces, prompts, calls = split_calls(traces, prompts, _ROWS_PER_CALL.value)
        except ValueError as e:
          raise app.UsageError(f"--rows_per_call: {e}") from None
    else:
      median, p90, cap, rows = (float(x) for x in _LOGNORMAL.value)
      traces = lognormal_lengths(median, p90, int(cap), int(rows), _STEPS.value, _SEED.value)
    if _ENGINE_COSTS.value:
      # The engine the costs were measured with sets the buckets, views and threshold.
      with open(_ENGINE_COSTS.value) as f:
        measured = json.load(f)
      cost = EngineCost.from_dict(measured)
      engine = measured["config"]["engine"]
      policy = EnginePolicy.from_engine(engine, samples=measured["config"]["group_size"])
      policy = dataclasses.replace(policy, prompt_len=_PROMPT.value)
      source = _ENGINE_COSTS.value
    elif _SURFACE.value:
      cost = surface_table(_SURFACE.value)
      policy = EnginePolicy(
        max_batch=_MAX_BATCH.value,
        min_batch_bucket=_MIN_BUCKET.value,
        chunk_steps=_CHUNK.value,
        spec_threshold=_THRESHOLD.value,
        spec_rounds=_ROUNDS.value,
        prompt_len=_PROMPT.value,
      )
      source = _SURFACE.value
    else:
      raise app.UsageError("--engine_costs, --surface (this host's costs) or --project")
    arms_sd = arms_from_accept(_accept(_ACCEPT_SD.value), _DRAFT_COST.value)
    arms_tlt = arms_from_accept(_accept(_ACCEPT_TLT.value), _DRAFT_COST.value)
    results = predict_modes(
      cost,
      policy,
      traces,
      arms_sd,
      arms_tlt,
      _UPDATE.value / 1000.0,
      _OTHER.value,
      _DRAFTER_S.value,
      _STOCHASTIC.value,
      prompts,
    )
    what = f"{len(traces)} rollouts"
    if calls > 1:
      what = f"{len(traces)} engine calls of {_ROWS_PER_CALL.value} rows, {calls} a rollout"
    _print(f"this host ({source}), {what}", results)
    if calls > 1:
      for m in results.values():
        m["rollout_s_all_calls"] = calls * m["rollout_s"]
        m["step_s_all_calls"] = calls * m["step_s"]
      per_step = ", ".join(f"{k} {m['step_s_all_calls']:.1f}" for k, m in results.items())
      print(f"seconds a recorded rollout ({calls} calls): {per_step}")
  if _OUT.value:
    os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  app.run(main)

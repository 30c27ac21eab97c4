r"""Speculative decoding vs plain decode on a warm-started policy with its trained drafter.

For each batch size B and temperature, the same B held-out prompts are run to
completion (EOS or the token budget) in one batch bucket of B rows (no
compaction, so B is the batch every step pays for). The prompts are the
held-out problems with the longest reference solutions: the long-tail rows that
speculative decoding serves in a rollout, and rows that stay active for the
whole budget, so B is the batch throughout. Where the longest problems are rare
ones a policy never learnt (the regime's `stride` counts of 100-125, left out of its
SFT rows), `--prompts=fill` takes the shortest problems that still fill the budget
instead. Configurations:
  plain      - plain decode (spec off),
  <strategy> - speculative decoding with that fixed strategy every chunk,
  adaptive   - the per-bucket bandit choosing among plain and the strategies, with the
               first of `--explorations` as its UCB bonus's weight
               (`EngineConfig.bandit_exploration`);
  adaptive_e<weight> - the same bandit with each further weight listed there,
  control    - with `--control=ARM`, a second engine running that fixed arm: its ratio to
               the arm's own row is the run's noise floor for "within x% of the best arm".
All engines share one executable pool; every configuration is run once untimed
(compiles; the adaptive engine's bandit learns over `--learn_runs` runs), then
the `--reps` timed repetitions are interleaved across configurations, each repetition in
a rotated order, so drift of this shared CPU (and any effect of a configuration's place
in the sequence) hits all alike. A repetition at batch B is max(1, 8 // B)
rollouts (different keys, the same for every configuration), so that even a
batch-1 repetition lasts seconds.

Reported per (B, temperature, config): tokens/s (min / median / max over the
repetitions), the speedup over plain as the median of per-repetition ratios
(each repetition's run over the same repetition's plain run) with its min and
max, and for speculative runs the mean accept length (tokens committed per
sequence per round, bonus token included) and the cost of one round in plain
decode steps (round time / step time): speculative decoding gains
accept_length / round_cost over plain decode. The adaptive engine is also
compared with the best fixed arm of its row, per repetition.

For `--profile_batches`, a per-round cost table of every fixed arm: draft,
target forward over the draft, verification, commit, drafter-cache extension
(device ms from `tlt_jax.rollout.profile.round_costs`) and host time (the
measured ms per round less the device round), in ms and in decode steps.

The host (CPU, cores, bandwidth, 1 / 5 / 17-token forward of this policy) is
measured first and written with the results.

  python experiments/bench_sd.py --workdir=runs/sd_policy --out=runs/bench_sd
  python experiments/bench_sd.py --merge=runs/a/bench_sd.json,runs/b/bench_sd.json \
    --out=runs/bench_sd_all   # sittings of one host, one table and plot
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import sys
import time
from typing import Any

import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import call_phases_ms, rows_differing  # noqa: E402
from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax import checkpoint, configuration, train  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.data.tasks import format_prompt, format_target  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.models.drafter import init_drafter  # noqa: E402
from tlt_jax.rollout.config import EngineConfig  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402
from tlt_jax.rollout.history import PromptHistory  # noqa: E402
from tlt_jax.rollout.pool import ExecutablePool  # noqa: E402
from tlt_jax.rollout.profile import round_costs  # noqa: E402
from tlt_jax.rollout.speculative import STAGES  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sd_bench.py", "policy config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/sd_policy", "warm_start/ and drafter/ live here")
_OUT = flags.DEFINE_string("out", "runs/bench_sd", "output folder")
_BATCHES = flags.DEFINE_list("batches", ["1", "2", "4", "8", "16", "32", "64"], "batch sizes")
_TEMPS = flags.DEFINE_list("temperatures", ["0", "1"], "sampling temperatures")
_STRATEGIES = flags.DEFINE_list(
  "strategies", ["chain2", "chain4", "chain8", "chain12"], "fixed arms"
)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 96, "token budget per sequence")
_PROMPTS = flags.DEFINE_enum(
  "prompts",
  "longest",
  ["longest", "fill"],
  "which held-out problems: those with the longest reference solutions, or the shortest whose "
  "reference still fills --max_new_tokens (typical problems, where the longest are rare ones)",
)
_REPS = flags.DEFINE_integer("reps", 3, "timed repetitions per configuration (interleaved)")
_PROFILE = flags.DEFINE_list("profile_batches", ["1", "16"], "batches with a round-cost table")
_PROFILE_ARMS = flags.DEFINE_list(
  "profile_strategies", [], "arms in the round-cost table (default: every fixed arm)"
)
_EXPLORATIONS = flags.DEFINE_list(
  "explorations",
  ["0.2"],
  "the bandit's bonus weights: adaptive, then adaptive_e<weight> for more (one bandit per "
  "mode and temperature learns over all --batches, in their order, as in RL)",
)
_CONTROL = flags.DEFINE_string(
  "control", "", "a fixed arm run twice (mode 'control'): the noise floor of the comparison"
)
_LEARN = flags.DEFINE_integer("learn_runs", 6, "untimed runs for the adaptive bandit to learn")
_LEARN_CHUNKS = flags.DEFINE_integer(
  "learn_chunks", 40, "rewarded chunks the adaptive bandit sees before timing (beyond learn_runs)"
)
_LEARN_MAX = flags.DEFINE_integer("learn_max_runs", 40, "cap on learning runs")
_CALLS = flags.DEFINE_integer(
  "calls_per_rep", 0, "rollouts per timed repetition (0: max(1, 8 // batch))"
)
_PROMPT_SETS = flags.DEFINE_integer(
  "prompt_sets",
  0,
  "different prompt sets a repetition's calls cycle through (0: one per call, so a batch-1 "
  "figure is over 8 prompts' texts, not one greedy sequence's; 1: the same prompts in every call)",
)
_ROUNDS = flags.DEFINE_integer("spec_rounds", 8, "speculative rounds per device call")
_DRAFTER = flags.DEFINE_string("drafter", "drafter", "<workdir>/<drafter>: the drafter's params")
_DRAFTER_GREEDY = flags.DEFINE_string(
  "drafter_greedy",
  "",
  "<workdir>/<name>: the drafter used at temperature 0 (e.g. one trained with "
  "train_drafter.py --teacher_temperature=0); '': --drafter at every temperature",
)
_SAMPLES = flags.DEFINE_integer(
  "samples",
  1,
  "G: rows per prompt (min(G, B)), as in GRPO; group drafts read the live siblings and, at "
  "B < G and temperature > 0, the G - B that finished (in the history)",
)
_HISTORY = flags.DEFINE_integer(
  "history_rollouts",
  0,
  "earlier rollouts of each prompt (other keys, plain decode) in the group-draft history of "
  "every timed run at temperature > 0 (at 0 they are the answer itself); 0: group drafts read "
  "only the rollout's own rows",
)
_MERGE = flags.DEFINE_list(
  "merge",
  [],
  "bench_sd.json files of earlier sittings on one host (different batches): print their "
  "tables and plot them together into --out, measuring nothing",
)
_RANDOM_DRAFTER = flags.DEFINE_bool(
  "random_drafter", False, "untrained drafter (smoke runs of the script only)"
)


def _adaptive_modes() -> dict[str, float]:
  """Adaptive configurations by name: their bandit's bonus weight."""
  weights = [float(w) for w in _EXPLORATIONS.value]
  return {"adaptive": weights[0], **{f"adaptive_e{w:g}": w for w in weights[1:]}}


def _engine_config(base: EngineConfig, b: int, strategies, mode: str) -> EngineConfig:
  cfg = dataclasses.replace(
    base,
    max_new_tokens=_MAX_NEW.value,
    max_batch=b,
    min_batch_bucket=b,
    compact=False,
    min_cache_bucket=256,
    spec_rounds=_ROUNDS.value,
    # Room for the seeded history: earlier rollouts and the finished siblings.
    group_history=max(base.group_history, _HISTORY.value + 1),
  )
  if mode == "plain":
    return dataclasses.replace(cfg, spec_threshold=0)
  if mode == "control":
    mode = _CONTROL.value
  if mode in _adaptive_modes():
    return dataclasses.replace(
      cfg,
      spec_threshold=b,
      spec_strategies=tuple(strategies),
      spec_adaptive=True,
      bandit_exploration=_adaptive_modes()[mode],
    )
  return dataclasses.replace(cfg, spec_threshold=b, spec_strategies=(mode,), spec_adaptive=False)


def _spread(xs) -> dict[str, float]:
  return {"min": float(np.min(xs)), "median": float(np.median(xs)), "max": float(np.max(xs))}


def _arm_times(results) -> tuple[dict[str, int], list[float], list[float], float]:
  """Chunks per arm, (seconds, count) of plain steps and of speculative rounds, and the
  seconds outside every timed phase (host work between device calls)."""
  chosen = {}
  step_s, round_s = [0.0, 0], [0.0, 0]
  between = 0.0
  for r in results:
    between += r.wall_seconds - sum(e["dt"] for e in r.timeline)
    for e in r.timeline:
      if e["phase"] in ("decode", "spec"):
        arm = e.get("strategy", "plain")
        chosen[arm] = chosen.get(arm, 0) + 1
        acc = step_s if e["phase"] == "decode" else round_s
        acc[0] += e["dt"]
        acc[1] += e["steps"] if e["phase"] == "decode" else e["rounds"]
  return chosen, step_s, round_s, between


def _call_table(rows) -> None:
  """Per call: the prompt's prefill (paid alike by every mode), the generation (decode,
  speculative chunks and drafter-cache builds) and host time; generation-only speedup.
  A short answer's fixed prefill caps the whole call's speedup below the generation's."""
  print("\nwhere a rollout call's time goes, ms per call (means over the timed calls)")
  print("| batch | T | config | prefill | generation | outside | call | generation speedup |")
  print("|---|---|---|---|---|---|---|---|")
  gen = lambda c: sum(v for k, v in c.items() if k not in ("prefill", "outside"))
  for r in rows:
    if r["config"] == "control":
      continue
    (plain,) = [
      x
      for x in rows
      if (x["batch"], x["temperature"], x["config"]) == (r["batch"], r["temperature"], "plain")
    ]
    c = r["ms_per_call"]
    print(
      f"| {r['batch']} | {r['temperature']:g} | {r['config']} | {c.get('prefill', 0):.0f} | "
      f"{gen(c):.0f} | {c.get('outside', 0):.1f} | {sum(c.values()):.0f} | "
      f"{gen(plain['ms_per_call']) / gen(c):.2f}x |"
    )


def merge(paths: list[str], out: str) -> None:
  """One table and plot from several runs' bench_sd.json on the same host and policy."""
  reports = []
  for path in paths:
    with open(path) as f:
      reports.append(json.load(f))
  cpus = {(r["host"]["cpu"], r["host"]["cores"], r["policy_params"]) for r in reports}
  if len(cpus) != 1:
    raise app.UsageError(f"--merge: the runs differ in host or policy: {sorted(cpus)}")
  rows = [row for r in reports for row in r["rows"]]
  keys = [(row["batch"], row["temperature"], row["config"]) for row in rows]
  if len(set(keys)) != len(keys):
    raise app.UsageError("--merge: a (batch, temperature, configuration) is in two runs")
  modes = list(dict.fromkeys(row["config"] for row in rows))
  temps = sorted({row["temperature"] for row in rows})
  adaptive = [m for m in modes if m.startswith("adaptive")]
  for r in reports:
    print(format_host(r["host"]))
  os.makedirs(out, exist_ok=True)
  _plot(rows, modes, temps, os.path.join(out, "bench_sd.png"))
  _table(rows, modes, temps, adaptive)
  _cost_table([p for r in reports for p in r["round_costs"]])


def main(argv):
  del argv
  if _MERGE.value:
    return merge(_MERGE.value, _OUT.value)
  config, workdir = _CONFIG.value, _WORKDIR.value
  os.makedirs(_OUT.value, exist_ok=True)
  tokenizer = get_tokenizer(config.task.tokenizer)
  train_split, test_split = train.load_data(config, workdir)
  model_cfg, graphdef, params, _ = train.build_policy(config, workdir, tokenizer, train_split)
  dgraph, dparams = nnx.split(init_drafter(model_cfg, seed=0))
  greedy_dparams = dparams
  if not _RANDOM_DRAFTER.value:
    restore = lambda name: checkpoint.restore_params(os.path.join(workdir, name), dparams)
    greedy_dparams = restore(_DRAFTER_GREEDY.value or _DRAFTER.value)
    dparams = restore(_DRAFTER.value)
  drafters = {"sampled": dparams, "greedy": greedy_dparams}
  base = configuration.engine_config(config, tokenizer)
  # --config.parallel.devices / rollout_tensor: rows and weights over host devices (with
  # XLA_FLAGS=--xla_force_host_platform_device_count, a device per core).
  mesh = configuration.mesh(config)
  host = host_info((graphdef, params))
  print(format_host(host), flush=True)

  batches = [int(b) for b in _BATCHES.value]
  temps = [float(t) for t in _TEMPS.value]
  strategies = list(_STRATEGIES.value)
  adaptive = list(_adaptive_modes())
  if _CONTROL.value and _CONTROL.value not in strategies:
    raise app.UsageError(f"--control={_CONTROL.value} is not one of --strategies {strategies}")
  modes = ["plain", *strategies, *adaptive, *(["control"] if _CONTROL.value else [])]
  examples = sorted(test_split, key=lambda ex: -len(format_target(ex)))
  if _PROMPTS.value == "fill":  # shortest first among those that fill the token budget
    fills = lambda ex: len(tokenizer.encode(format_target(ex))) >= _MAX_NEW.value
    filling = [ex for ex in examples if fills(ex)]
    examples = filling[::-1] + [ex for ex in examples if not fills(ex)]
  prompts = [tokenizer.encode(format_prompt(ex), add_bos=True) for ex in examples]
  prompts = [p for p in prompts if len(p) <= base.max_prompt_len]
  rows, profiles = [], []
  learning = {}  # (batch, temperature, mode) -> an adaptive bandit's learning runs and chunks
  timed_compiles = 0
  start = time.perf_counter()
  compiles = compile_s = 0.0
  pool = ExecutablePool()
  # One bandit per adaptive mode and temperature over all batch sizes (its buckets), as in
  # an RL run whose rollouts pass through every bucket.
  bandits: dict[tuple[str, float], Any] = {}
  for b in batches:
    # A fresh pool per batch size: the executables of a 50M model add up (LLVM ran out of
    # memory holding every batch size's programs at once on the 24 GB machine).
    compiles, compile_s = compiles + pool.compiles, compile_s + pool.compile_seconds
    pool = ExecutablePool()
    engines = {}
    for mode in [m for m in modes if m not in adaptive]:  # adaptive: per temperature, below
      cfg = _engine_config(base, b, strategies, mode)
      engines[mode] = RolloutEngine(
        graphdef,
        model_cfg,
        cfg,
        pool=pool,
        drafter_graphdef=None if mode == "plain" else dgraph,
        mesh=mesh,
      )
    for temp in temps:
      sampling = SamplingConfig(temperature=temp)
      dparams = drafters["greedy" if temp == 0 else "sampled"]
      for mode in adaptive:
        engines[mode] = RolloutEngine(
          graphdef,
          model_cfg,
          _engine_config(base, b, strategies, mode),
          sampling,
          pool=pool,
          drafter_graphdef=dgraph,
          bandit=bandits.get((mode, temp)),
          mesh=mesh,
        )
        bandits[(mode, temp)] = engines[mode].bandit
      g = min(_SAMPLES.value, b)
      calls = _CALLS.value or max(1, 8 // b)
      per_set = max(1, b // g)
      num_sets = min(_PROMPT_SETS.value or calls, len(prompts) // per_set)
      prompt_sets = [prompts[j * per_set : (j + 1) * per_set] for j in range(num_sets)]
      batch_prompts = prompt_sets[0]
      # Group drafts read a fixed history in every run (none by default): runs of the same
      # prompts must not read each other (the same keys give the same text).
      seeded = [_seed_history(engines["plain"], params, ps, g, sampling) for ps in prompt_sets]

      def run(
        mode,
        key,
        engines=engines,
        prompt_sets=prompt_sets,
        sampling=sampling,
        g=g,
        seeded=seeded,
        dparams=dparams,
      ):
        engine = engines[mode]
        which = key % len(prompt_sets)  # the call's prompts: keys count the calls
        if engine.history is not None:
          engine.history.load_state_dict(seeded[which])
        return engine.generate(
          params,
          prompt_sets[which],
          g,
          key=key,
          sampling=sampling,
          drafter_params=None if mode == "plain" else dparams,
        )

      lens = [len(q) for ps in prompt_sets for q in ps]
      warm = dict(num_prompts=[len(batch_prompts)], num_samples=g, prompt_lens=lens)
      with pool.compiling_ahead():  # every mode's programs side by side (accelerators)
        for mode in modes:
          dp = None if mode == "plain" else dparams
          engines[mode].warmup(params, sampling, drafter_params=dp, **warm)
      for mode in modes:  # compile every program B can use, then let the bandit learn
        dp = None if mode == "plain" else dparams
        engines[mode].warmup(params, sampling, drafter_params=dp, **warm)
        if mode not in adaptive:
          run(mode, 1000)
          continue
        # The bandit learns over at least --learn_runs rollouts and --learn_chunks rewarded
        # chunks: a batch-64 rollout gives it 2-3 chunks, a batch-1 rollout ten.
        learned, i, first = 0, 0, []
        while i < _LEARN.value or (learned < _LEARN_CHUNKS.value and i < _LEARN_MAX.value):
          r = run(mode, 1000 + i)
          rewarded = [e for e in r.timeline if "reward" in e]
          learned += len(rewarded)
          # The bandit's first measurements: one slow early pull can keep an arm out for good.
          first += [
            [
              e.get("strategy", "plain"),
              round(e["reward"], 2),
              round(e["dt"], 4),
            ]
            for e in rewarded
          ][: max(0, 12 - len(first))]
          i += 1
        learning[(b, temp, mode)] = {"runs": i, "rewarded_chunks": learned, "first": first}
      compiled = pool.compiles
      results = {m: [] for m in modes}
      tps = {m: [] for m in modes}
      for rep in range(_REPS.value):
        # Rotated order: each configuration takes different places in the sequence.
        offset = rep * len(modes) // _REPS.value
        for mode in modes[offset:] + modes[:offset]:
          # Same keys for every mode in a repetition: the same tokens (coupled sampling).
          # Several calls per repetition at small batch: a single batch-1 rollout lasts
          # under a second, too short to time on a shared machine.
          rs = [run(mode, 100 * rep + i) for i in range(calls)]
          results[mode] += rs
          tokens = sum(int(r.num_generated.sum()) for r in rs)
          tps[mode].append(tokens / sum(r.wall_seconds for r in rs))
      if pool.compiles != compiled:
        print(f"WARNING: {pool.compiles - compiled} compiles inside timed runs (B={b})")
      timed_compiles += pool.compiles - compiled
      tps = {m: np.array(v) for m, v in tps.items()}
      plain_step_ms = None
      batch_rows = []
      for mode in modes:
        spec = results[mode][-1].spec_summary()
        chosen, step_s, round_s, between_s = _arm_times(results[mode])
        ms = lambda a: 1000 * a[0] / a[1] if a[1] else None
        if mode == "plain":
          plain_step_ms = ms(step_s)
        ratio = tps[mode] / tps["plain"]  # paired: each repetition against its own plain run
        row = {
          "batch": b,
          "temperature": temp,
          "config": mode,
          "tokens_per_s": round(float(np.median(tps[mode])), 1),
          "tokens_per_s_spread": {k: round(v, 1) for k, v in _spread(tps[mode]).items()},
          "speedup": round(float(np.median(ratio)), 3),
          "speedup_spread": {k: round(v, 3) for k, v in _spread(ratio).items()},
          "accept_length": round(spec["accept_length"], 3),
          "accepted_drafts": round(spec["accepted_drafts"], 3),
          "ms_per_step": ms(step_s),
          "ms_per_round": ms(round_s),
          "round_cost_in_steps": ms(round_s) / plain_step_ms if round_s[1] else None,
          "between_calls_ms_per_round": ms([between_s, round_s[1]]),
          "tokens": int(results[mode][-1].num_generated.sum()),
          "calls_per_rep": calls,
          "prompt_sets": num_sets,
          "samples": g,
          "finished_siblings": _SAMPLES.value - g if temp > 0 else 0,
          "history_rollouts": _HISTORY.value if temp > 0 else 0,
          "chunks_by_arm": chosen,
          "corpus_ms_per_chunk": _corpus_ms(results[mode]),
          "by_chunk": _by_chunk(results[mode]),
          "ms_per_call": call_phases_ms(results[mode]),
        }
        batch_rows.append(row)
      # Token identity at scale: every call of a repetition used the same keys in every mode.
      for row in batch_rows:
        pairs = list(zip(results[row["config"]], results["plain"]))
        row["rows_compared"] = sum(len(a.length) for a, _ in pairs)
        row["rows_differing_from_plain"] = sum(int(rows_differing(a, p).sum()) for a, p in pairs)
      fixed = [r for r in batch_rows if r["config"] in strategies]
      best = max(fixed, key=lambda r: r["speedup"])
      for row in batch_rows:
        if row["config"] in adaptive:
          vs_best = tps[row["config"]] / tps[best["config"]]
          row["learning"] = learning[(b, temp, row["config"])]
          row["bandit_exploration"] = _adaptive_modes()[row["config"]]
          bandit = engines[row["config"]].bandit
          # What the bandit believed after the timed runs, per bucket it used at this batch
          # size, to read its picks.
          row["bandit_view"] = {
            str(bucket): {
              arm: (v["pulls"], v["mean"] and round(v["mean"], 3)) for arm, v in arms.items()
            }
            for bucket, arms in bandit.summary().items()
            if bucket <= b
          }
          row["best_fixed"] = best["config"]
          row["vs_best_fixed"] = {k: round(v, 3) for k, v in _spread(vs_best).items()}
        if row["config"] == "control":  # the same programs as its twin: the noise floor
          row["control_of"] = _CONTROL.value
          twin = tps["control"] / tps[_CONTROL.value]
          row["vs_twin"] = {k: round(v, 3) for k, v in _spread(twin).items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
      if b in [int(x) for x in _PROFILE.value]:
        for strategy in _PROFILE_ARMS.value or strategies:
          prof = round_costs(
            engines[strategy], params, dparams, batch_prompts, sampling, strategy, num_samples=g
          )
          (measured,) = [r for r in batch_rows if r["config"] == strategy]
          prof["measured_round_ms"] = measured["ms_per_round"]
          prof["between_calls_ms_per_round"] = measured["between_calls_ms_per_round"]
          prof["measured_step_ms"] = plain_step_ms
          profiles.append(prof)
          print(json.dumps({"profile": prof}), flush=True)
  elapsed = time.perf_counter() - start
  report = {
    "host": host,
    "rows": rows,
    "round_costs": profiles,
    "crossover": {str(t): crossover(rows, t) for t in temps},
    "compiles": compiles + pool.compiles,
    "compiles_in_timed_runs": timed_compiles,
    "compile_seconds": compile_s + pool.compile_seconds,
    "seconds": elapsed,
    "policy_params": model_cfg.num_params,
    "max_new_tokens": _MAX_NEW.value,
    "drafter": _DRAFTER.value,
    "drafter_greedy": _DRAFTER_GREEDY.value or _DRAFTER.value,
    "reps": _REPS.value,
  }
  with open(os.path.join(_OUT.value, "bench_sd.json"), "w") as f:
    json.dump(report, f, indent=2)
  flat = [k for k in rows[0] if not isinstance(rows[0][k], dict)]
  with open(os.path.join(_OUT.value, "bench_sd.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=flat)
    w.writeheader()
    for r in rows:
      w.writerow({k: r[k] for k in flat})
  _plot(rows, modes, temps, os.path.join(_OUT.value, "bench_sd.png"))
  print("\n" + format_host(host))
  _table(rows, modes, temps, adaptive)
  _call_table(rows)
  _cost_table(profiles)


def _seed_history(engine, params, prompts, g, sampling) -> dict:
  """State of a group-draft history holding `--history_rollouts` earlier rollouts of each
  prompt (plain decode, keys no timed run uses) and, where the batch holds fewer rows of a
  prompt than --samples (g < G), the G - g siblings that already finished: a rollout's
  tail, where the last rows of a group run alone and their siblings' text is all written.
  Neither at temperature 0: every sample of a prompt is the same text there, so the history
  would hold the very answer being drafted (RL samples at temperature > 0)."""
  sampled = sampling.temperature > 0
  finished = _SAMPLES.value - g if sampled else 0
  earlier = _HISTORY.value if sampled else 0
  history = PromptHistory(max(earlier + (finished > 0), 1), context=engine.config.group_ngram)
  for i in range(earlier):
    r = engine.generate(params, prompts, g, key=50_000 + i, sampling=sampling)
    for p, prompt in enumerate(prompts):
      history.add(prompt, [r.completion(n) for n in range(p * g, (p + 1) * g)])
  if finished > 0:  # one sample per prompt a call: the engine holds only the batch's rows
    rs = [
      engine.generate(params, prompts, 1, key=60_000 + j, sampling=sampling)
      for j in range(finished)
    ]
    for p, prompt in enumerate(prompts):
      history.add(prompt, [r.completion(p) for r in rs])
  return history.state_dict()


def _by_chunk(results) -> dict[str, list]:
  """Per chunk index within a rollout (median over the timed rollouts): the speed of an
  active row (the bandit's reward, tokens per second per row active during the chunk),
  accept length, and how many of the rollouts reached that chunk. Shows whether an arm's
  chunks differ by phase (the bandit sees deep arms' first chunks only in short rollouts)."""
  speed, accept = [], []
  for r in results:
    chunks = [e for e in r.timeline if e["phase"] in ("decode", "spec")]
    for i, e in enumerate(chunks):
      if i == len(speed):
        speed.append([])
        accept.append([])
      if e["phase"] == "decode":
        speed[i].append(e["steps"] / e["dt"])
      elif e["row_rounds"]:
        speed[i].append(e["tokens"] / e["row_rounds"] * e["rounds"] / e["dt"])
        accept[i].append(e["tokens"] / e["row_rounds"])
  med = lambda xs: round(float(np.median(xs)), 3) if xs else None
  return {
    "row_speed": [med(x) for x in speed],
    "accept": [med(x) for x in accept],
    "rollouts": [len(x) for x in speed],
  }


def _corpus_ms(results) -> float | None:
  """Host ms per group chunk spent building the group corpus (None: no group chunk)."""
  got = [e["corpus_s"] for r in results for e in r.timeline if "corpus_s" in e]
  return 1e3 * float(np.mean(got)) if got else None


def _plot(rows, modes, temps, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 3.8), squeeze=False)
  for ax, temp in zip(axes[0], temps):
    for mode in modes:
      pts = sorted(
        (r["batch"], r["speedup"]) for r in rows if r["config"] == mode and r["temperature"] == temp
      )
      ax.plot(*zip(*pts), marker="o", label=mode, linestyle="--" if mode == "plain" else "-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s vs plain decode")
    ax.set_title(f"speculative decoding speedup, temperature {temp:g}")
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _table(rows, modes, temps, adaptive):
  for temp in temps:
    print(
      f"\ntemperature {temp:g}: tokens/s (median speedup over plain [min-max over "
      "repetitions]; accept length); adaptive / best fixed arm"
    )
    print("| batch | " + " | ".join(modes) + "".join(f" | {a} vs best" for a in adaptive) + " |")
    print("|---" * (len(modes) + len(adaptive) + 1) + "|")
    for b in sorted({r["batch"] for r in rows if r["temperature"] == temp}):
      cells = []
      for mode in modes:
        (r,) = [
          r for r in rows if r["batch"] == b and r["config"] == mode and r["temperature"] == temp
        ]
        sp = r["speedup_spread"]
        acc = "" if mode == "plain" else f"; {r['accept_length']:.2f}"
        cells.append(
          f"{r['tokens_per_s']:.0f} ({sp['median']:.2f}x [{sp['min']:.2f}-{sp['max']:.2f}]{acc})"
        )
      for a in adaptive:
        (ad,) = [
          r for r in rows if r["batch"] == b and r["config"] == a and r["temperature"] == temp
        ]
        vb = ad["vs_best_fixed"]
        cells.append(f"{vb['median']:.2f} [{vb['min']:.2f}-{vb['max']:.2f}] of {ad['best_fixed']}")
      print(f"| {b} | " + " | ".join(cells) + " |")
    for r in rows:
      if r["config"] == "control" and r["temperature"] == temp:
        vt = r["vs_twin"]
        print(
          f"noise floor, batch {r['batch']}: {r['control_of']} run twice, "
          f"{vt['median']:.3f} [{vt['min']:.3f}-{vt['max']:.3f}]"
        )
    print(
      f"crossover (smallest batch where no fixed strategy beats plain): {crossover(rows, temp)}"
    )
    ts = [r for r in rows if r["temperature"] == temp and r["config"] != "plain"]
    ts = [r for r in ts if "rows_compared" in r]  # earlier runs' JSON (--merge) lacks it
    if ts:
      print(
        f"token identity: {sum(r['rows_differing_from_plain'] for r in ts)} of "
        f"{sum(r['rows_compared'] for r in ts)} speculative rows differ from plain decoding"
      )


def _cost_table(profiles):
  if not profiles:
    return
  print(
    "\nper-round cost, ms (decode steps): device stages (profiled, interleaved); call = the "
    "rollout's measured round less the device round (dispatch, transfers); between = host "
    "time between device calls per round; rollout = the rollout's round + between"
  )
  cols = [*STAGES, "call", "between", "rollout"]
  print("| batch | T | arm | accept | " + " | ".join(cols) + " | step ms |")
  print("|---" * (len(cols) + 5) + "|")
  for p in profiles:
    step = p["step_ms"]
    cells = [f"{p['stage_ms'][k]:.2f} ({p['stage_steps'][k]:.2f})" for k in STAGES]
    call = p["measured_round_ms"] - p["round_ms"] if p["measured_round_ms"] else float("nan")
    between = p["between_calls_ms_per_round"] or 0.0
    total = (p["measured_round_ms"] or p["round_ms"]) + between
    for x in (call, between, total):
      cells.append(f"{x:.2f} ({x / step:.2f})")
    print(
      f"| {p['batch']} | {p['temperature']:g} | {p['strategy']} | {p['accept_length']:.2f} | "
      + " | ".join(cells)
      + f" | {step:.2f} |"
    )


def crossover(rows, temp):
  for b in sorted({r["batch"] for r in rows}):
    fixed = [
      r["speedup"]
      for r in rows
      if r["batch"] == b
      and r["temperature"] == temp
      and r["config"] not in ("plain", "control")
      and not r["config"].startswith("adaptive")
    ]
    if max(fixed) < 1.0:
      return b
  return None


if __name__ == "__main__":
  app.run(main)

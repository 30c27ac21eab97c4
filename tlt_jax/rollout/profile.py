"""Where a speculative round's time goes: draft, target forward, verify, commit, extension.

`round_costs` prefills real prompts with an engine, decodes a few plain steps so the
rows have context, then times the engine's own speculative program with every round
cut after each stage in turn (`speculative.RoundStages`, composed here): the cumulative
times, differenced, give each stage's device cost inside the fused round, and a
plain decode chunk over the same rows gives the unit (one decode step). Host time
per round is what a real rollout's timeline shows beyond the full round's device
time (the caller compares with its measured ms per round).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tlt_jax.decode import drafting
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.rollout import programs
from tlt_jax.rollout.speculative import STAGES, RoundCarry, RoundStages, SpecStrategy, run_rounds
from tlt_jax.rollout.state import round_up


def _interleaved(calls: dict[str, tuple], reps: int) -> dict[str, list[float]]:
  """Seconds of every fn(*args) in `calls`, the calls interleaved in each repetition so that
  drift of a shared machine hits all alike (args are copied first: programs may update them
  in place). One untimed round first (compiles, first-execution costs)."""
  times = {name: [] for name in calls}
  for rep in range(reps + 1):
    for name, (fn, args) in calls.items():
      fresh = jax.tree.map(jnp.copy, args)
      jax.block_until_ready(fresh)
      t = time.perf_counter()
      jax.block_until_ready(fn(*fresh))
      if rep:
        times[name].append(time.perf_counter() - t)
  return times


def round_cut_after(stages: RoundStages, stop: str):
  """A round of `stages` cut after stage `stop` (the whole round for the last stage). Each
  cut round carries what it computed into the next (the state's cache, the accepted
  counts), so no stage is loop-invariant work XLA could hoist; the state is then not a
  rollout's: only the timing means anything."""
  if stop not in STAGES:
    raise ValueError(f"stop must be one of {STAGES}, got {stop!r}")
  if stop == STAGES[-1]:
    return stages.full_round

  def round_fn(carry: RoundCarry) -> RoundCarry:
    st, dcache, dlen, stats = carry
    counted = lambda accepted: stats.replace(
      rounds=stats.rounds + 1, accepted=stats.accepted + accepted
    )
    dr, dcache = stages.draft(st, dcache, dlen)
    if stop == "draft":
      return st, dcache, dlen, counted(dr.tokens[:, -1])
    h, cache = stages.forward(st, dr)
    if stop == "forward":
      return (
        st.replace(cache=cache),
        dcache,
        dlen,
        counted((h.sum(axis=(1, 2)) > 0).astype(jnp.int32)),
      )
    vr = stages.verify(st, dr, h)
    if stop == "verify":
      return st.replace(cache=cache), dcache, dlen, counted(vr.num_accepted)
    return stages.commit(st, h, cache, vr)[0], dcache, dlen, counted(vr.num_accepted)

  return round_fn


@dataclasses.dataclass(frozen=True)
class _Profiled:
  """Rows ready for profiled rounds: prefilled, decoded `context_steps` plain steps, their
  drafter cache built, and what the programs are compiled for."""

  state: Any
  dcache: Any
  dlen: Any
  corpus: Any
  static: programs.DecodeStatic
  key: jax.Array
  view: int
  dview: int
  decode: Any  # the jitted plain decode chunk at `view`


def _profiled_rows(
  engine, params, drafter_params, prompts, sampling, strategy, rounds, context_steps, num_samples
) -> _Profiled:
  # A budget with room for the context and every profiled round (the rounds' programs are
  # the engine's own, at a cache bucket that fits them).
  need = context_steps + rounds * strategy.max_emit + 1
  cfg = dataclasses.replace(engine.config, max_new_tokens=max(engine.config.max_new_tokens, need))
  prompts = [p for p in prompts for _ in range(num_samples)]
  b = len(prompts)
  lens = np.array([len(p) for p in prompts], np.int32)
  prompts_np = np.zeros((len(prompts), int(lens.max())), np.int32)
  for i, p in enumerate(prompts):
    prompts_np[i, : len(p)] = p
  key = jax.random.key(0)
  max_new = np.full((len(prompts),), cfg.max_new_tokens, np.int32)
  seq_ids = np.arange(len(prompts), dtype=np.int32)
  # Without stop tokens: every row stays active for the whole profile (the stop check's
  # cost is kept; only its effect is gone).
  static = dataclasses.replace(engine.programs.static(sampling), stop_tokens=())
  # The engine's matmul precision and, at one row, its kind of step (`one_row_step`).
  at_precision = engine.programs.at_precision
  state = jax.jit(
    at_precision(
      functools.partial(
        programs.prefill,
        engine.graphdef,
        static=static,
        slots=cfg.slots,
        cache_slots=cfg.cache_slots,
      )
    )
  )(
    params,
    jnp.asarray(prompts_np),
    jnp.asarray(lens),
    jnp.arange(len(prompts)),
    jnp.asarray(seq_ids),
    jnp.asarray(max_new),
    key,
  )
  longest = int(lens.max()) + context_steps + rounds * strategy.max_emit + strategy.nodes
  view = round_up(min(longest, cfg.cache_slots), cfg.view_buckets)
  paired = engine.config.pairs_step(b)
  decode = jax.jit(
    at_precision(
      functools.partial(
        programs.decode_chunk, engine.graphdef, static=static, view_len=view, paired=paired
      )
    )
  )
  state, _ = decode(params, state, key, np.int32(context_steps))
  if bool(np.asarray(state.done).any()):
    raise ValueError("a profiled row reached its token budget within the context steps")
  width = min(view, cfg.slots)
  corpus = None
  if strategy.uses_group:
    siblings = np.full((b, cfg.group_siblings), -1, np.int32)
    for i in range(b):
      group = np.arange(i - i % num_samples, i - i % num_samples + num_samples)
      siblings[i, : min(num_samples, cfg.group_siblings)] = np.concatenate(
        [[i], group[group != i]]
      )[: cfg.group_siblings]
    corpus = engine.programs.corpus(siblings, np.full((b, cfg.group_reference_len), -1, np.int32))
  dcache, dlen = jax.jit(
    at_precision(
      lambda tp, dp, st: drafting.prefill_drafter_cache(
        engine.drafter_graphdef,
        dp,
        engine.graphdef,
        tp,
        st.tokens[:, :width],
        st.hidden[:, :width],
        st.length,
        slots=cfg.drafter_slots,
      )
    )
  )(params, drafter_params, state)
  dview = min(view + cfg.drafter_margin, cfg.drafter_slots)
  return _Profiled(state, dcache, dlen, corpus, static, key, view, dview, decode)


def round_costs(
  engine,
  params: nnx.State,
  drafter_params: nnx.State,
  prompts: Sequence[Sequence[int]],
  sampling: SamplingConfig,
  strategy: str | SpecStrategy,
  *,
  rounds: int = 12,
  reps: int = 7,
  context_steps: int = 32,
  num_samples: int = 1,
  stages: Sequence[str] = STAGES,
) -> dict[str, Any]:
  """Per-round device cost of each stage of `strategy` on `prompts` (`num_samples` rows
  each; group drafts read the sibling rows, no history).

  Returns ms per decode step, ms per round cumulative up to each stage
  (`cumulative_ms`), each stage's own ms (`stage_ms`) and its cost in decode steps
  (`stage_steps`), and the accept length the profiled rounds reached. `stages`: the cut
  points timed (the whole round always; a stage's ms is then from the cut before it), fewer
  programs to compile where only the round's cost is wanted.
  """
  strategy = SpecStrategy.parse(strategy)
  cuts = [s for s in STAGES if s in stages or s == STAGES[-1]]
  rows = _profiled_rows(
    engine, params, drafter_params, prompts, sampling, strategy, rounds, context_steps, num_samples
  )
  match = engine.config.group_match
  calls = {"step": (rows.decode, (params, rows.state, rows.key, np.int32(rounds)))}
  for stage in cuts:

    def run(tp, dp, st, dc, dl, corpus, k, r, stage=stage):
      stages = RoundStages.build(
        engine.graphdef,
        tp,
        engine.drafter_graphdef,
        dp,
        dc,
        k,
        static=rows.static,
        strategy=strategy,
        view_len=rows.view,
        cache_slots=st.cache.slots,
        drafter_view_len=rows.dview,
        corpus=corpus,
        group_match=match,
      )
      return run_rounds(round_cut_after(stages, stage), st, dc, dl, r)

    args = (params, drafter_params, rows.state, rows.dcache, rows.dlen, rows.corpus)
    calls[stage] = (jax.jit(engine.programs.at_precision(run)), (*args, rows.key, np.int32(rounds)))
  times = _interleaved(calls, reps)
  ms = {name: 1e3 * float(np.median(t)) / rounds for name, t in times.items()}
  step_ms = ms.pop("step")
  cumulative = ms
  fn, args = calls[STAGES[-1]]
  stats = jax.device_get(fn(*args)[3])
  accept = float(stats.emitted.sum() / max(int(stats.row_rounds.sum()), 1))
  stage_ms, prev = {}, 0.0
  for stage in cuts:
    stage_ms[stage] = cumulative[stage] - prev
    prev = cumulative[stage]
  return {
    "strategy": strategy.name,
    "batch": rows.state.batch,
    "temperature": sampling.temperature,
    "view": rows.view,
    "rounds": rounds,
    "step_ms": step_ms,
    "round_ms": cumulative[STAGES[-1]],
    "round_steps": cumulative[STAGES[-1]] / step_ms,
    "accept_length": accept,
    "cumulative_ms": cumulative,
    "stage_ms": stage_ms,
    "stage_steps": {k: v / step_ms for k, v in stage_ms.items()},
  }

"""Cost models for the RL-step simulator: what one forward costs, and what a draft accepts.

A decode cost model answers one question, `seconds(batch, tokens, context)`: the time of one
forward of the policy over `batch` rows with `tokens` new tokens each (1: a decode step;
depth + 1: verifying a chain draft) at a mean cache length of `context` tokens. Two forms:

* `TableCost`: measured on a host (experiments/cost_surface.py writes the table, and
  experiments/real_sizes.py's decode grid converts to one): ms per forward on a grid of
  batch sizes and new tokens per row at one context length, plus the measured growth per
  context token; interpolated linearly in log2(batch) and log2(tokens).
* `RooflineCost`: from a model's size and a device's published peak figures, for hosts one
  cannot measure on: a forward costs the larger of its arithmetic (2 x params FLOPs a token,
  at a sustained fraction of peak) and its memory traffic (the weights once, each row's KV
  cache), plus a fixed launch overhead.

* `PairedOneRow`: another model with a one-row decode step charged as a one-row, two-token
  forward, as the engine runs it on a GPU (`EngineConfig.one_row_step`).

* `EngineCost`: the rollout engine's own device calls, timed in its rollout timelines on a
  host (experiments/engine_costs.py): a plain decode step and a speculative round of each
  arm by batch bucket and cache view, a prompt prefill, a drafter-cache rebuild, and the
  host time between and after device calls. The replay charges what the engine runs.

`ArmModel` describes a speculative-decoding strategy to the simulator: the nodes the target
verifies per row, the tokens a round emits per row on average (its accept length, taken
from this project's measured drafter curves), and the drafter's cost per round as a fraction
of a target decode step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = [
  "ArmModel",
  "DecodeCost",
  "EngineCost",
  "PairedOneRow",
  "RooflineCost",
  "TableCost",
  "arms_from_accept",
  "chain_accept_length",
  "per_token_acceptance",
]


class DecodeCost(Protocol):
  def seconds(self, batch: int, tokens: int, context: float) -> float:
    """One forward: `batch` rows x `tokens` new tokens, mean cache length `context`."""
    ...


def _interp_log2(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
  """ys at x, linear in log2(x) inside xs; outside, the nearest segment extended (at least
  proportional growth past the largest x: more rows never cost less per row)."""
  lx, lxs = math.log2(x), np.log2(xs)
  if len(xs) == 1:
    return float(ys[0] * (x / xs[0] if x > xs[0] else 1.0))
  if x > xs[-1]:
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])  # per unit of x, not of log2(x)
    return float(ys[-1] + max(slope, ys[-1] / xs[-1]) * (x - xs[-1]))
  if x < xs[0]:
    return float(ys[0])
  return float(np.interp(lx, lxs, ys))


@dataclasses.dataclass(frozen=True)
class TableCost:
  """Measured forward times.

  Attributes:
    batches: batch sizes of the grid (ascending).
    tokens: new tokens per row of the grid (ascending; 1 = decode).
    ms: [len(tokens), len(batches)] forward time in ms at `context`.
    context: the cache length the grid was measured at.
    ms_per_context_token: extra ms per row per cache token beyond `context` (the KV
      reads), by batch (len(batches)); 0 where not measured.
  """

  batches: tuple[int, ...]
  tokens: tuple[int, ...]
  ms: tuple[tuple[float, ...], ...]
  context: float
  ms_per_context_token: tuple[float, ...] = ()

  def __post_init__(self):
    b, t = np.asarray(self.batches), np.asarray(self.tokens)
    grid = np.asarray(self.ms, dtype=float)
    if b.ndim != 1 or not b.size or np.any(np.diff(b) <= 0) or b[0] < 1:
      raise ValueError(f"batches must be ascending positive ints, got {self.batches}")
    if t.ndim != 1 or not t.size or np.any(np.diff(t) <= 0) or t[0] < 1:
      raise ValueError(f"tokens must be ascending positive ints, got {self.tokens}")
    if grid.shape != (t.size, b.size) or not np.all(grid > 0):
      raise ValueError(f"ms must be positive, shape {(t.size, b.size)}, got {grid.shape}")
    if self.ms_per_context_token and len(self.ms_per_context_token) != b.size:
      raise ValueError("ms_per_context_token needs one value per batch size")

  @classmethod
  def from_dict(cls, d: Mapping) -> TableCost:
    return cls(
      batches=tuple(int(x) for x in d["batches"]),
      tokens=tuple(int(x) for x in d["tokens"]),
      ms=tuple(tuple(float(x) for x in row) for row in d["ms"]),
      context=float(d["context"]),
      ms_per_context_token=tuple(float(x) for x in d.get("ms_per_context_token", ())),
    )

  @classmethod
  def from_decode_grid(cls, grid: Mapping[str, Mapping], shape: str) -> TableCost:
    """From experiments/real_sizes.py's `decode_grid` ("shape/context/batch/tokens" ->
    {"ms": a forward's median ms}): the batches measured at every token count at the
    smallest context, and, at the batches also measured at a larger one, the decode step's
    ms per context token between the two (0 elsewhere)."""
    cells = {}
    for key, cell in grid.items():
      name, context, batch, tokens = key.rsplit("/", 3)
      if name == shape:
        cells[int(context), int(batch), int(tokens)] = float(cell["ms"])
    if not cells:
      shapes = sorted({k.rsplit("/", 3)[0] for k in grid})
      raise ValueError(f"no decode_grid cell of shape {shape!r}; measured: {shapes}")
    base = min(c for c, _, _ in cells)
    tokens = sorted({t for c, _, t in cells if c == base})
    batches = sorted(
      b for b in {b for c, b, _ in cells if c == base} if all((base, b, t) in cells for t in tokens)
    )
    if not batches:
      raise ValueError(f"{shape}: no batch measured at every token count {tokens}")
    step = min(tokens)

    def slope(b: int) -> float:
      longer = sorted(c for c, bb, t in cells if bb == b and t == step and c > base)
      if not longer:
        return 0.0
      return (cells[longer[-1], b, step] - cells[base, b, step]) / (longer[-1] - base)

    slopes = tuple(slope(b) for b in batches)
    return cls(
      batches=tuple(batches),
      tokens=tuple(tokens),
      ms=tuple(tuple(cells[base, b, t] for b in batches) for t in tokens),
      context=float(base),
      ms_per_context_token=slopes if any(slopes) else (),
    )

  def seconds(self, batch: int, tokens: int, context: float) -> float:
    b = np.asarray(self.batches, dtype=float)
    grid = np.asarray(self.ms, dtype=float)
    by_tokens = np.array([_interp_log2(batch, b, row) for row in grid])
    ms = _interp_log2(tokens, np.asarray(self.tokens, dtype=float), by_tokens)
    if self.ms_per_context_token:
      slope = _interp_log2(batch, b, np.asarray(self.ms_per_context_token))
      ms += max(slope, 0.0) * (context - self.context)
    return max(ms, 1e-6) / 1000.0


@dataclasses.dataclass(frozen=True)
class RooflineCost:
  """A forward from peak figures: max(FLOPs / sustained FLOP/s, bytes / sustained bandwidth)
  + overhead.

  Attributes:
    params: policy parameters (the weights read once per forward).
    bytes_per_param: 2 for bf16.
    kv_bytes_per_token: KV-cache bytes per cached token of one row (2 x layers x kv heads x
      head dim x bytes).
    peak_flops, bandwidth: the device's (FLOP/s, bytes/s), over the devices of one
      rollout instance (tensor parallel: their sum).
    flops_efficiency, bandwidth_efficiency: the sustained fractions of peak.
    overhead_s: fixed time per forward (launches, sampling, synchronisation).
  """

  params: float
  bytes_per_param: float
  kv_bytes_per_token: float
  peak_flops: float
  bandwidth: float
  flops_efficiency: float = 0.6
  bandwidth_efficiency: float = 0.8
  overhead_s: float = 0.0

  def seconds(self, batch: int, tokens: int, context: float) -> float:
    flops = 2.0 * self.params * batch * tokens
    traffic = self.params * self.bytes_per_param + batch * context * self.kv_bytes_per_token
    compute_s = flops / (self.peak_flops * self.flops_efficiency)
    memory_s = traffic / (self.bandwidth * self.bandwidth_efficiency)
    return self.overhead_s + max(compute_s, memory_s)


@dataclasses.dataclass(frozen=True)
class PairedOneRow:
  """`cost` with its one-row decode step charged as a one-row forward of two tokens: the
  engine's step on a GPU (`EngineConfig.one_row_step`), whose one-token products XLA turns
  into reductions there. Every other forward is `cost`'s."""

  cost: DecodeCost

  def seconds(self, batch: int, tokens: int, context: float) -> float:
    if batch == 1 and tokens == 1:
      return self.cost.seconds(1, 2, context)
    return self.cost.seconds(batch, tokens, context)


# Timeline phases of device calls whose seconds EngineCost tables, by (batch, length) cell:
# a decode step (per step), a speculative round (per round, keyed by the arm), a prefill
# (prompts bucket, prompt bucket) and a drafter-cache rebuild (rows bucket, width).
_PLAIN, _PREFILL, _REBUILD = "plain", "prefill", "drafter_prefill"
# A chunk that compiled, or ran beside a background compile (`rollout.run`), measured more
# than its program (and so did its host gaps).
_BUSY = ("compile_s", "beside_compile")


@functools.lru_cache(maxsize=1024)
def _grid(cells: tuple[tuple[int, int, float], ...]) -> tuple[np.ndarray, tuple]:
  """`cells` as `_grid_seconds` reads them: the measured batches (ascending) and, per batch,
  its lengths and seconds as arrays (ascending in length)."""
  by_batch: dict[int, list[tuple[int, float]]] = {}
  for b, n, sec in cells:
    by_batch.setdefault(int(b), []).append((int(n), float(sec)))
  batches = sorted(by_batch)
  rows = tuple(
    (np.array([n for n, _ in pts], dtype=float), np.array([s for _, s in pts], dtype=float))
    for pts in (sorted(by_batch[b]) for b in batches)
  )
  return np.asarray(batches, dtype=float), rows


# A replay prices the same few (bucket, view) cells thousands of times a rollout: each is
# interpolated once (the cells are a frozen cost's tuples).
@functools.lru_cache(maxsize=1 << 16)
def _grid_seconds(cells: tuple[tuple[int, int, float], ...], batch: int, length: float) -> float:
  """Seconds at (batch, length) from (batch, length, seconds) cells: linear in log2(length)
  within each measured batch, then in log2(batch) across them (`_interp_log2`)."""
  batches, rows = _grid(cells)
  at_length = np.array([_interp_log2(max(length, 1.0), xs, ys) for xs, ys in rows])
  return _interp_log2(batch, batches, at_length)


@dataclasses.dataclass(frozen=True)
class EngineCost:
  """Seconds of the rollout engine's own device calls on one host (see the module doc).

  The engine attends over a whole cache view (a bucket of the cache) and pads a batch to
  its bucket, so its steps cost by (batch bucket, view), not by the rows' mean context.

  Attributes:
    cells: per kind, (batch, length, seconds) medians: "plain" (one decode step; length =
      view), one entry per draft arm (one round), "prefill" (batch = prompts bucket,
      length = prompt bucket) and "drafter_prefill" (rows bucket, width).
    gap_s: host time between two device calls in one batch bucket (arm choice, reading
      lengths back).
    compact_s: host time of a move to a smaller bucket (harvesting finished rows, the
      gather program).
    finish_s: host time after the last call (harvesting the rest, assembling the result).
  """

  cells: Mapping[str, tuple[tuple[int, int, float], ...]]
  gap_s: float = 0.0
  compact_s: float = 0.0
  finish_s: float = 0.0

  def __post_init__(self):
    # Tuples throughout: the cells are this frozen cost's and key `_grid_seconds`'s cache.
    cells = {k: tuple(tuple(c) for c in v) for k, v in self.cells.items()}
    object.__setattr__(self, "cells", cells)
    if _PLAIN not in self.cells or not self.cells[_PLAIN]:
      raise ValueError("EngineCost needs measured plain decode steps")
    for kind, cells in self.cells.items():
      for cell in cells:
        if len(cell) != 3 or cell[0] < 1 or cell[1] < 1 or not cell[2] > 0:
          raise ValueError(f"EngineCost cell {cell} of {kind!r}: need (batch, length, s > 0)")
    if min(self.gap_s, self.compact_s, self.finish_s) < 0:
      raise ValueError("EngineCost host times must be >= 0")

  def seconds(self, batch: int, tokens: int, context: float) -> float:
    """A decode step (`tokens` = 1) at cache view `context`; rounds: `round_seconds`."""
    if tokens != 1:
      raise ValueError(f"EngineCost times whole rounds per arm, not {tokens}-token forwards")
    return _grid_seconds(self.cells[_PLAIN], batch, context)

  def round_seconds(self, arm: str, batch: int, view: float) -> float:
    """One speculative round of `arm` (draft, verify, commit) at cache view `view`."""
    if arm not in self.cells:
      measured = sorted(set(self.cells) - {_PLAIN, _PREFILL, _REBUILD})
      raise ValueError(f"arm {arm!r} was not measured (measured: {measured})")
    return _grid_seconds(self.cells[arm], batch, view)

  def prefill_seconds(self, prompts: int, prompt_len: int) -> float:
    """A prompt prefill (0 where none was measured)."""
    cells = self.cells.get(_PREFILL)
    return _grid_seconds(cells, prompts, prompt_len) if cells else 0.0

  def rebuild_seconds(self, batch: int, width: int) -> float:
    """A drafter-cache rebuild (0 where none was measured)."""
    cells = self.cells.get(_REBUILD)
    return _grid_seconds(cells, batch, width) if cells else 0.0

  def to_dict(self) -> dict:
    return {
      "cells": {k: [list(c) for c in v] for k, v in self.cells.items()},
      "gap_s": self.gap_s,
      "compact_s": self.compact_s,
      "finish_s": self.finish_s,
    }

  @classmethod
  def from_dict(cls, d: Mapping) -> EngineCost:
    cells = {k: tuple((int(b), int(n), float(s)) for b, n, s in v) for k, v in d["cells"].items()}
    return cls(cells, float(d["gap_s"]), float(d["compact_s"]), float(d["finish_s"]))

  def call_seconds(self, kind: str, batch: int, length: int) -> float:
    """One call's seconds in `kind`'s cells: a decode step or an arm's round (per step or
    round), a prefill or a drafter-cache rebuild (`_timeline_calls`)."""
    if kind == _PLAIN:
      return self.seconds(batch, 1, length)
    if kind == _PREFILL:
      return self.prefill_seconds(batch, length)
    if kind == _REBUILD:
      return self.rebuild_seconds(batch, length)
    return self.round_seconds(kind, batch, length)

  def scaled(self, factor: float) -> EngineCost:
    """Every device call `factor` times as long; the host times as they are."""
    if not factor > 0:
      raise ValueError(f"scale factor must be > 0, got {factor}")
    cells = {k: tuple((b, n, s * factor) for b, n, s in v) for k, v in self.cells.items()}
    return dataclasses.replace(self, cells=cells)

  def drift(self, rollouts: Iterable[tuple[Sequence[Mapping[str, Any]], float | None]]) -> float:
    """How much longer the device calls of these timelines took than this cost prices them:
    their seconds over the seconds priced at their cells (compiling calls left out, as in
    `from_timelines`); 1.0 where there is no such call, or none this cost can price."""
    measured = priced = 0.0
    for timeline, _ in rollouts:
      for kind, batch, length, seconds, units in _timeline_calls(timeline):
        if kind in self.cells:
          measured += seconds * units
          priced += self.call_seconds(kind, batch, length) * units
    return measured / priced if priced > 0 else 1.0

  @classmethod
  def from_timelines(
    cls,
    rollouts: Iterable[tuple[Sequence[Mapping[str, Any]], float | None]],
    base: EngineCost | None = None,
    min_calls: int = 3,
  ) -> EngineCost:
    """The medians of rollouts' timelines (`RolloutResult.timeline`, `.wall_seconds`;
    None: the rollout's end is not timed).

    Calls that compiled a program are left out (their seconds are one-time); so is the
    host time around them. A decode chunk counts per step, a speculative one per round.
    The drafter's scheduler (its "drafter_hook" entries) is not host time of the engine.
    `base`: the cells these timelines lack (a kind, or a batch and length of one, they
    never ran without compiling: plain decode steps in a rollout that speculated
    throughout) are `base`'s, scaled by these calls' drift against it (`drift`); so are
    the cells both have where these timelines have fewer than `min_calls` calls (a median
    of one or two calls is noise).
    """
    rollouts = list(rollouts)
    samples: dict[str, dict[tuple[int, int], list[float]]] = {}
    gaps, compacts, finishes = [], [], []
    for timeline, wall in rollouts:
      for kind, batch, length, seconds, _ in _timeline_calls(timeline):
        samples.setdefault(kind, {}).setdefault((batch, length), []).append(seconds)
      # Harvests are host work inside the gaps between chunks (a compaction's, the finish's):
      # the gaps below measure them whole.
      entries = sorted((e for e in timeline if e["phase"] != "harvest"), key=lambda e: e["t"])
      if not entries:
        continue
      hook_s = 0.0  # the scheduler's seconds since the last device call
      before = None
      for after in entries:
        if after["phase"] == "drafter_hook":
          hook_s += after["dt"]
          continue
        # A rebuild runs right before its chunk: the host time is the gap before the rebuild.
        skip = before is None or before["phase"] == _REBUILD
        if not (skip or any(e.get(k) for e in (before, after) for k in _BUSY)):
          gap = after["t"] - (before["t"] + before["dt"]) - hook_s
          (compacts if after["batch"] < before["batch"] else gaps).append(gap)
        before, hook_s = after, 0.0
      clean = not any(e.get("compile_s", 0.0) or e.get("rebuild_compile_s", 0.0) for e in entries)
      if clean and wall is not None:
        finishes.append(wall - (entries[-1]["t"] + entries[-1]["dt"]))
    cells = {
      kind: tuple((b, n, float(np.median(v))) for (b, n), v in sorted(by_cell.items()))
      for kind, by_cell in samples.items()
    }
    if base is not None:
      drift = base.drift(rollouts)
      for kind, known in base.cells.items():
        calls = samples.get(kind, {})
        merged = {(b, n): s * drift for b, n, s in known}
        merged.update(
          {(b, n): s for b, n, s in cells.get(kind, ()) if len(calls[b, n]) >= min_calls}
        )
        merged.update({(b, n): s for b, n, s in cells.get(kind, ()) if (b, n) not in merged})
        cells[kind] = tuple((b, n, s) for (b, n), s in sorted(merged.items()))
    if _PLAIN not in cells:
      raise ValueError("no decode chunk without a compile in these timelines (and no base)")
    med = lambda xs: max(float(np.median(xs)), 0.0) if xs else 0.0
    return cls(cells, med(gaps), med(compacts), med(finishes))


def _timeline_calls(timeline: Sequence[Mapping[str, Any]]):
  """A timeline's device calls that compiled nothing (nor ran beside a compile, nor ran
  their program for the first time), as (kind, batch, length, seconds per unit, units): a
  decode chunk per step ("plain", batch bucket, cache view), a speculative one per round (its
  arm), a prefill ("prefill", prompts bucket, prompt bucket) and a drafter-cache rebuild
  ("drafter_prefill", rows bucket, width)."""
  for e in timeline:
    if any(e.get(k) for k in (*_BUSY, "rebuild_compile_s", "first_run")):
      continue
    phase, batch, view = e["phase"], int(e.get("batch", 0)), int(e.get("view", 0))
    if phase == "decode" and e.get("steps"):
      yield _PLAIN, batch, view, e["dt"] / e["steps"], e["steps"]
    elif phase == "spec" and e.get("rounds"):
      yield e["strategy"], batch, view, e["dt"] / e["rounds"], e["rounds"]
    elif phase == "prefill":
      yield _PREFILL, int(e["prompts"]), view, e["dt"], 1
    elif phase == _REBUILD:
      yield _REBUILD, batch, view, e["dt"], 1


def chain_accept_length(per_token: float, depth: int) -> float:
  """Tokens a chain draft of `depth` emits per round when each draft token is accepted with
  probability `per_token` independently (the bonus/correction token included):
  (1 - a^(depth + 1)) / (1 - a)."""
  if not 0.0 <= per_token <= 1.0 or depth < 1:
    raise ValueError(f"need 0 <= per_token <= 1 and depth >= 1, got {per_token}, {depth}")
  if per_token == 1.0:
    return float(depth + 1)
  return (1.0 - per_token ** (depth + 1)) / (1.0 - per_token)


@functools.lru_cache(maxsize=4096)
def per_token_acceptance(accept_length: float, nodes: int) -> float:
  """The i.i.d. per-token acceptance a whose chain of depth nodes - 1 emits `accept_length`
  tokens per round (bisection on (1 - a^n) / (1 - a)): `chain_accept_length`'s inverse,
  from which the replay draws each row's accepted tokens."""
  n = nodes
  if accept_length >= n:
    return 1.0
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    value = n if mid == 1.0 else (1 - mid**n) / (1 - mid)
    lo, hi = (mid, hi) if value < accept_length else (lo, mid)
  return (lo + hi) / 2


@dataclasses.dataclass(frozen=True)
class ArmModel:
  """A draft strategy as the simulator sees it.

  Attributes:
    name: the engine's strategy name ("chain8", "group16", ...).
    nodes: tokens per row the target verifies in one round (depth + 1 for a chain).
    accept_length: mean tokens a round emits per row (1 .. max emit).
    draft_steps: drafter forwards per round (the chain's depth; 0 for model-free drafts).
    draft_cost: one drafter forward as a fraction of a target decode step at the same
      batch (a one-layer drafter of an L-layer target: about 1 / L plus the LM head).
    rounds: how many row-rounds measured `accept_length` (its weight where several arms'
      accept lengths are fitted together, `replay.chain_acceptance`; 0: unknown).
  """

  name: str
  nodes: int
  accept_length: float
  draft_steps: int
  draft_cost: float = 0.0
  rounds: float = 0.0

  def __post_init__(self):
    if self.nodes < 2 or not 1.0 <= self.accept_length <= self.nodes:
      raise ValueError(
        f"arm {self.name}: need nodes >= 2 and 1 <= accept_length <= nodes, got "
        f"{self.nodes}, {self.accept_length}"
      )
    if self.draft_steps < 0 or self.draft_cost < 0 or self.rounds < 0:
      raise ValueError(f"arm {self.name}: draft_steps, draft_cost and rounds must be >= 0")

  def round_seconds(self, cost: DecodeCost, batch: int, context: float) -> float:
    """Draft, then verify every row's `nodes` tokens in one target forward (an
    `EngineCost` times the engine's whole round of this arm)."""
    if isinstance(cost, EngineCost):
      return cost.round_seconds(self.name, batch, context)
    step = cost.seconds(batch, 1, context)
    return self.draft_steps * self.draft_cost * step + cost.seconds(batch, self.nodes, context)


def arms_from_accept(
  accept: Mapping[str, float], draft_cost: float, rounds: Mapping[str, float] | None = None
) -> tuple[ArmModel, ...]:
  """ArmModels of chain/group strategies ("chain<d>", "group<d>", "hybrid<d>") from measured
  accept lengths (and the row-rounds that measured each, `rounds`); model-free arms (group
  drafts) cost no drafter forwards."""
  out = []
  for name, length in accept.items():
    digits = "".join(ch for ch in name if ch.isdigit())
    if not digits or name[: -len(digits)] not in ("chain", "group", "hybrid"):
      raise ValueError(f"arm {name!r}: expected chain<d>, group<d> or hybrid<d>")
    depth = int(digits)
    drafted = 0 if name.startswith("group") else depth  # group drafts: no drafter forwards
    weight = float((rounds or {}).get(name, 0.0))
    out.append(ArmModel(name, depth + 1, float(length), drafted, draft_cost, weight))
  return tuple(out)

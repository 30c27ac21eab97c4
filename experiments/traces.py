"""Where a profiled program's device time went: a Chrome-format trace (what
`jax.profiler.trace(..., create_perfetto_trace=True)` writes) summarised by kernel kind and by
trace line, small enough to come back from a device sitting whose trace folder does not.

An accelerator's process ("/device:GPU:0", "/device:TPU:0") holds several lines (threads):
kernels on a GPU's streams, XLA ops on a TPU's "XLA Ops" line, and lines that span them
("Steps", "XLA Modules": a module's span contains its ops). Only kernel lines are summed by
kind (a GPU's stream lines where it has them, else every line that is not a span line);
every line's total is reported beside, so a trace whose lines are named otherwise still
shows where time went.
On a CPU there is no accelerator process: every event but Python's frames is counted (host work
and XLA's thunks together, a rehearsal's figure).
"""

from __future__ import annotations

import glob
import gzip
import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any

KINDS = (
  ("products", re.compile(r"gemm|gemv|cublas|cutlass|matmul|dot|wgmma|convolution", re.I)),
  ("reductions", re.compile(r"reduc", re.I)),
  ("element-wise", re.compile(r"fusion|loop|copy|convert|broadcast|transpose", re.I)),
)
# An accelerator's process; not "/device:CUSTOM:Megascale Trace", which libtpu's profiler
# adds wherever it is installed (a CPU fallback included).
ACCELERATOR = re.compile(r"^/device:(GPU|TPU):")
# Lines that span the kernels of other lines (steps, modules, annotations): never summed.
SPAN_LINES = re.compile(r"^(Steps|XLA Modules|XLA TraceMe|TraceMe|Framework|Source|Launch)", re.I)


def trace_events(trace_dir: str) -> list[dict[str, Any]] | None:
  """The events of the newest Chrome-format trace under `trace_dir` (None: there is none)."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*.json.gz"), recursive=True)
  if not paths:
    return None
  with gzip.open(max(paths, key=os.path.getmtime)) as f:
    events = json.load(f)
  return events["traceEvents"] if isinstance(events, dict) else events


def trace_summary(trace_dir: str, steps: int) -> dict[str, Any]:
  """`summarise_events` of the newest Chrome-format trace under `trace_dir`."""
  events = trace_events(trace_dir)
  if events is None:
    return {"error": f"no Chrome-format trace under {trace_dir}"}
  return summarise_events(events, steps)


_DISPATCH = re.compile(r"^PjitFunction\((?P<name>.*)\)$")
_WAIT = re.compile(r"Await|BlockHostUntilReady", re.I)
_MODULE_RUN = re.compile(r"\(\d+\)$")


def program_summary(trace_dir: str, top: int = 12) -> dict[str, Any]:
  """Where a traced stretch of a run (an RL step: `GRPOConfig.profile_steps`) went, by
  program: the trace's wall span; on an accelerator each XLA module's device time and runs
  (its "XLA Modules" line); on the host each jitted function's dispatch time and calls
  (JAX's "PjitFunction(name)" spans) and the time the host waited for device buffers. The
  `top` costliest of each, in ms."""
  events = trace_events(trace_dir)
  if events is None:
    return {"error": f"no Chrome-format trace under {trace_dir}"}
  processes = _names(events, "process_name", lambda e: e["pid"])
  threads = _names(events, "thread_name", lambda e: (e["pid"], e.get("tid")))
  device = {pid for pid, name in processes.items() if ACCELERATOR.match(name)}
  spans = _outermost(e for e in events if e.get("ph") == "X" and not e["name"].startswith("$"))
  modules: dict[str, list[float]] = {}
  dispatch: dict[str, list[float]] = {}
  wait_ms = 0.0
  for e in spans:
    ms = e.get("dur", 0) / 1e3
    line = threads.get((e.get("pid"), e.get("tid")), "")
    if e.get("pid") in device:
      if not line.startswith("XLA Modules"):
        continue
      cell = modules.setdefault(_MODULE_RUN.sub("", e["name"]), [0, 0.0])
    elif (match := _DISPATCH.match(e["name"])) is not None:
      cell = dispatch.setdefault(match["name"], [0, 0.0])
    else:
      wait_ms += ms if _WAIT.search(e["name"]) else 0.0
      continue
    cell[0], cell[1] = cell[0] + 1, cell[1] + ms
  start = min((e["ts"] for e in spans), default=0.0)
  end = max((e["ts"] + e.get("dur", 0) for e in spans), default=0.0)

  def ranked(cells):
    best = sorted(cells.items(), key=lambda kv: -kv[1][1])[:top]
    return {name[:80]: {"calls": n, "ms": round(ms, 3)} for name, (n, ms) in best}

  return {
    "wall_ms": round((end - start) / 1e3, 3),
    "device_busy_ms": round(sum(ms for _, ms in modules.values()), 3),
    "device_ms_by_program": ranked(modules),
    "host_dispatch_ms": round(sum(ms for _, ms in dispatch.values()), 3),
    "host_dispatch_ms_by_function": ranked(dispatch),
    "host_wait_ms": round(wait_ms, 3),
  }


def summarise_events(events: Sequence[dict[str, Any]], steps: int) -> dict[str, Any]:
  """Per step (`steps`: the forwards the traced calls ran): kernels, busy ms, ms by kernel
  kind, the costliest kernels, and ms by line (see the module docstring)."""
  processes = _names(events, "process_name", lambda e: e["pid"])
  threads = _names(events, "thread_name", lambda e: (e["pid"], e.get("tid")))
  device = {pid for pid, name in processes.items() if ACCELERATOR.match(name)}
  spans = [
    e
    for e in events
    if e.get("ph") == "X"
    and not e["name"].startswith("$")  # Python frames ("$file:line name") are the host's
    and (not device or e.get("pid") in device)
  ]
  lines: dict[tuple, float] = {}
  for e in spans:
    line = (e.get("pid"), e.get("tid"))
    lines[line] = lines.get(line, 0.0) + e.get("dur", 0) / 1e3
  kernel_lines = _kernel_lines(lines, threads) if device else set(lines)
  kernels = [e for e in spans if (e.get("pid"), e.get("tid")) in kernel_lines]
  by_kind: dict[str, float] = {}
  by_name: dict[str, float] = {}
  for e in kernels:
    kind = next((k for k, pattern in KINDS if pattern.search(e["name"])), "other")
    by_kind[kind] = by_kind.get(kind, 0.0) + e.get("dur", 0) / 1e3
    by_name[e["name"]] = by_name.get(e["name"], 0.0) + e.get("dur", 0) / 1e3
  top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
  return {
    "device_processes": sorted(processes[p] for p in device),
    "kernels_per_step": len(kernels) / steps,
    "busy_ms_per_step": sum(by_kind.values()) / steps,
    "by_kind_ms_per_step": {k: round(ms / steps, 4) for k, ms in by_kind.items()},
    "top_ms_per_step": {name[:80]: round(ms / steps, 4) for name, ms in top},
    "lines_ms_per_step": {
      f"{processes.get(pid, pid)}/{threads.get((pid, tid), tid)}": round(ms / steps, 4)
      for (pid, tid), ms in sorted(lines.items(), key=lambda kv: -kv[1])[:12]
    },
  }


def _outermost(spans) -> list[dict[str, Any]]:
  """`spans` less those inside an earlier span of the same name on the same line (JAX
  nests its own annotations: one call, two spans)."""
  kept, ends = [], {}
  for e in sorted(spans, key=lambda e: e["ts"]):
    key = (e.get("pid"), e.get("tid"), e["name"])
    if e["ts"] < ends.get(key, float("-inf")):
      continue
    ends[key] = e["ts"] + e.get("dur", 0)
    kept.append(e)
  return kept


def _names(events, kind: str, key) -> dict:
  return {
    key(e): e.get("args", {}).get("name", "")
    for e in events
    if e.get("ph") == "M" and e.get("name") == kind
  }


def _kernel_lines(lines: dict[tuple, float], threads: dict[tuple, str]) -> set[tuple]:
  """A device's kernel lines: its stream lines where it has any (a GPU), else every line
  that does not span others (a TPU's "XLA Ops")."""
  streams = {line for line in lines if threads.get(line, "").startswith("Stream")}
  if streams:
    return streams
  return {line for line in lines if not SPAN_LINES.match(threads.get(line, ""))}


# An HLO instruction of an optimised module's text: its name, result shape (a tuple's in
# parentheses), opcode, operands and the rest of the line (attributes, metadata).
_INSTRUCTION = re.compile(
  r"^\s*(?:ROOT )?%(?P<name>\S+) = (?P<shape>\(.*?\)|\S+) (?P<op>[\w\-]+)\((?P<args>[^)]*)\)"
  r"(?P<rest>.*)$"
)
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(?P<name>\S+) .*\{$")
_LAYOUT = re.compile(r"\{[^{}]*\}")
# Opcodes that say nothing of what a fusion computes.
_PLUMBING = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element", "reshape"}


def kernel_name(instruction: str) -> str:
  """The name a GPU kernel of an HLO instruction carries in a trace (XLA writes '.' and '-'
  as '_': "input_reduce_fusion.180" runs as "input_reduce_fusion_180")."""
  return re.sub(r"[.\-]", "_", instruction)


def describe_kernels(hlo_text: str, names: Sequence[str]) -> dict[str, str]:
  """What each kernel of `names` computes, from the optimised module's text
  (`compiled.as_text()`) of the traced program: its instruction's result and operand
  shapes, the opcodes of the computation it calls (a fusion's), and the JAX op it came from.
  A kernel's name alone ("input_reduce_fusion_180") does not say which product or
  reduction it is. Names without an instruction (a CPU's thunks, libraries' kernels) are
  left out."""
  shapes: dict[str, str] = {}
  found: dict[str, re.Match] = {}
  opcodes: dict[str, list[str]] = {}
  computation = ""
  for line in hlo_text.splitlines():
    head = _COMPUTATION.match(line)
    if head and " = " not in line.split("{", 1)[0]:
      computation = head["name"]
      continue
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    shapes[m["name"]] = _LAYOUT.sub("", m["shape"])
    opcodes.setdefault(computation, []).append(m["op"])
    found.setdefault(kernel_name(m["name"]), m)
  out = {}
  for name in names:
    m = found.get(kernel_name(name))
    if m is None:
      continue
    operands = [shapes.get(a.strip().lstrip("%"), "?") for a in m["args"].split(",") if a.strip()]
    called = re.search(r"calls=%(\S+?)[,\s]", m["rest"] + " ")
    inner = [op for op in opcodes.get(called[1], []) if op not in _PLUMBING] if called else []
    source = re.search(r'op_name="([^"]*)"', m["rest"])
    text = f"{m['op']} {shapes[m['name']]} <- {', '.join(operands)}"
    if inner:
      text += f" [{' '.join(dict.fromkeys(inner))}]"
    if source:
      text += f" ({source[1]})"
    out[name] = text[:300]
  return out


# Instructions of a loop body that launch nothing: plumbing between its kernels.
_NO_KERNEL = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element"}


def _kind(instruction: str) -> str:
  """The kind (`KINDS`) a trace's summary would sort this instruction's kernel into."""
  name = kernel_name(instruction)
  return next((k for k, pattern in KINDS if pattern.search(name)), "other")


def _outer_body(hlo_text: str) -> str | None:
  """The name of the body of the entry's loop, the outermost (a nested loop's body may come
  first in the text)."""
  entry = hlo_text[hlo_text.find("\nENTRY ") + 1 :] if "\nENTRY " in hlo_text else hlo_text
  body = re.search(r"\bwhile\(.*?\bbody=%([^\s,]+)", entry) or re.search(
    r"\bwhile\(.*?\bbody=%([^\s,]+)", hlo_text
  )
  return body[1] if body else None


def loop_kernels(hlo_text: str) -> dict[str, Any]:
  """The kernels one trip of a compiled program's device loop launches (the entry's, the
  outermost), counted from the optimised module's text (`compiled.as_text()`): every
  instruction of the loop's body but plumbing (parameters, tuples, bitcasts, constants), by
  the kind its kernel's name gives (`KINDS`, as a trace's summary sorts them). On a GPU each
  is one launch (a fusion, a library call, a copy); a nested loop or call counts once.
  `written_bytes`: the bytes of the kernels' results, which each writes to memory, but for
  in-place updates and nested loops (`_written`): where a step's intermediates go through
  memory. A GPU module's names only: a TPU's do not say which fusions update in place.
  Returns {} where the module has no loop."""
  body = _outer_body(hlo_text)
  if body is None:
    return {}
  kernels = [m for m in _computations(hlo_text)[body] if m["op"] not in _NO_KERNEL]
  names = [m["name"] for m in kernels]
  by_kind: dict[str, int] = {}
  for name in names:
    by_kind[_kind(name)] = by_kind.get(_kind(name), 0) + 1
  written = sum(_written(m) for m in kernels)
  return {"kernels": len(names), "by_kind": by_kind, "names": names, "written_bytes": written}


def _written(instruction: re.Match) -> int:
  """The bytes a kernel writes, as `loop_kernels` counts them: its result's, but none for a
  loop (its body's kernels write) or an in-place update (a dynamic-update-slice or scatter
  fusion writes a few slots of the buffer its result names: a KV cache)."""
  name = kernel_name(instruction["name"])
  if instruction["op"] == "while" or "dynamic_update_slice" in name or "scatter" in name:
    return 0
  return _shape_bytes(instruction["shape"])


def _shape_bytes(shape: str) -> int:
  """The bytes of an HLO result shape ("bf16[4096,1024]{1,0}", or a tuple's parts)."""
  total = 0
  for kind, bits, dims in re.findall(r"([a-z]+)(\d*)\w*\[([\d,]*)\]", _LAYOUT.sub("", shape)):
    # An element's bits are in its type's name (bf16, f32, s32, f8e4m3fn); pred is a byte.
    size = 1 if kind == "pred" else max(1, int(bits) // 8)
    total += math.prod(int(d) for d in dims.split(",") if d) * size
  return total


def _computations(hlo_text: str) -> dict[str, list[re.Match]]:
  """Each computation's instructions, by the computation's name."""
  out: dict[str, list[re.Match]] = {}
  current: list[re.Match] = []
  for line in hlo_text.splitlines():
    head = _COMPUTATION.match(line)
    if head and " = " not in line.split("{", 1)[0]:
      current = out.setdefault(head["name"], [])
      continue
    m = _INSTRUCTION.match(line)
    if m:
      current.append(m)
  return out


def trip_kernels(hlo_text: str) -> dict[str, Any]:
  """`loop_kernels` with the loops inside the trip run out: a nested loop (a drafter's
  steps inside a speculative round) adds its body's kernels times its known trip count,
  recursively; one whose count XLA does not know adds its body once and is counted in
  `unknown_trips`. Returns {} where the module has no loop."""
  outer = _outer_body(hlo_text)
  if outer is None:
    return {}
  computations = _computations(hlo_text)
  by_kind: dict[str, int] = {}
  unknown = written = 0

  def run(computation: str, times: int) -> None:
    nonlocal unknown, written
    for m in computations.get(computation, []):
      if m["op"] in _NO_KERNEL:
        continue
      body = re.search(r"\bbody=%([^\s,]+)", m["rest"]) if m["op"] == "while" else None
      if body is None:
        by_kind[_kind(m["name"])] = by_kind.get(_kind(m["name"]), 0) + times
        written += _written(m) * times
        continue
      trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', m["rest"])
      unknown += trips is None
      run(body[1], times * (int(trips[1]) if trips else 1))

  run(outer, 1)
  counted = {"kernels": sum(by_kind.values()), "by_kind": by_kind}
  return {**counted, "unknown_trips": unknown, "written_bytes": written}

"""A pool of ahead-of-time compiled executables, one per static key.

The rollout engine asks for a program by (name, static shapes/options); the
pool lowers and compiles it once, records compile time and memory, and hands
back the executable. After warm-up, a rollout never compiles: `compiles` stays
put, which tests and benchmarks check.

The pool evicts the least recently used programs beyond `max_executables`, or
beyond `max_mappings` memory mappings: on CPU every executable keeps its JIT code
in 150 (a decode chunk) to 500+ (a speculative chunk) mappings, a process may hold
65530 (vm.max_map_count), and a speculative engine's full warm-up plus a greedy
evaluation set otherwise dies with "LLVM ERROR: Unable to allocate section memory".
Mappings are counted from /proc/self/maps around each compile (Linux; elsewhere
only the count cap applies).

Every key also holds what the program reads from module globals at trace time:
`transformer._ATTENTION_FORM` (experiments switch it between compiles), so a
program traced under another form is never handed back. Each compile traces a
fresh wrapper of `fn`: JAX caches traces by function identity across `jax.jit`
wrappers, and would otherwise hand back the jaxpr traced under the old form.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax

from tlt_jax.models import transformer


def _mappings() -> int | None:
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return None


@dataclasses.dataclass
class CompiledEntry:
  executable: Any
  compile_seconds: float
  # Bytes of generated code + temporaries reported by XLA (None if unavailable).
  temp_bytes: int | None
  argument_bytes: int | None
  calls: int = 0
  mappings: int = 0  # memory mappings its JIT code added (CPU, Linux)


def _trace_globals() -> tuple[Any, ...]:
  """The module globals programs read at trace time (not their arguments)."""
  return (transformer._ATTENTION_FORM,)


def _fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` behind a new function object, so JAX traces it anew (its trace cache is keyed
  by function identity, not by the globals the trace read)."""

  @functools.wraps(fn)
  def traced(*args):
    return fn(*args)

  return traced


def _placement(leaves: list[Any]) -> tuple[Any, ...]:
  """The (device set, partition spec) pairs of the committed array arguments (uncommitted
  and host values follow the others): weights replicated or split over a tensor group
  are different programs on the same devices. One device: () so single-device keys stay
  simple."""
  placed = {
    (tuple(sorted(d.id for d in x.sharding.device_set)), getattr(x.sharding, "spec", None))
    for x in leaves
    if isinstance(x, jax.Array) and x.committed
  }
  if all(len(d) <= 1 for d, _ in placed) and len({d for d, _ in placed}) <= 1:
    return ()
  return tuple(sorted(placed, key=repr))


class ExecutablePool:
  """Compiled programs keyed by a hashable static key."""

  def __init__(self, max_executables: int = 1000, max_mappings: int = 40_000):
    for name, v in (("max_executables", max_executables), ("max_mappings", max_mappings)):
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    self.max_executables, self.max_mappings = max_executables, max_mappings
    self._entries: dict[Hashable, CompiledEntry] = {}
    self._compiles = 0
    self._compile_seconds = 0.0
    self.evictions = 0

  def get(
    self,
    key: Hashable,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    donate_argnums: tuple[int, ...] = (),
  ) -> Any:
    """Returns the executable for `key`, compiling `fn` for `args` if new.

    `fn` must be a pure function whose static parts are already bound (the
    key must identify them); `args` fix the shapes.
    """
    # The placement is part of the program: the same shapes on 8 devices or on 2
    # are different executables (a compacted bucket runs on fewer devices). So is the
    # argument tree (a list where a tuple was compiled is refused by the executable),
    # and the trace-time globals (the attention form).
    leaves, treedef = jax.tree.flatten(args)
    key = (key, _placement(leaves), treedef, _trace_globals())
    entry = self._entries.get(key)
    if entry is None:
      start = time.perf_counter()
      before = _mappings()
      compiled = jax.jit(_fresh(fn), donate_argnums=donate_argnums).lower(*args).compile()
      after = _mappings()
      seconds = time.perf_counter() - start
      temp = arg = None
      try:
        mem = compiled.memory_analysis()
        temp = int(mem.temp_size_in_bytes)
        arg = int(mem.argument_size_in_bytes)
      except Exception:  # noqa: BLE001 - memory stats are best effort per backend.
        pass
      maps = max(after - before, 0) if before is not None and after is not None else 0
      entry = CompiledEntry(compiled, seconds, temp, arg, mappings=maps)
      self._compiles += 1
      self._compile_seconds += seconds
      while self._entries and (
        len(self._entries) >= self.max_executables or self.mappings + maps > self.max_mappings
      ):
        del self._entries[next(iter(self._entries))]  # least recently used
        self.evictions += 1
      self._entries[key] = entry
    else:
      self._entries[key] = self._entries.pop(key)  # most recently used last
    entry.calls += 1
    return entry.executable

  def __contains__(self, key: Hashable) -> bool:
    """Whether a program for `key` (as given to `get`), traced under the current
    globals, is held (for any placement and argument tree)."""
    now = _trace_globals()
    return any(k[0] == key and k[3] == now for k in self._entries)

  @property
  def compiles(self) -> int:
    """Programs compiled so far (recompiles after an eviction count again)."""
    return self._compiles

  @property
  def compile_seconds(self) -> float:
    return self._compile_seconds

  def __len__(self) -> int:
    return len(self._entries)

  @property
  def mappings(self) -> int:
    """Memory mappings held by the pool's executables (0 where not measurable)."""
    return sum(e.mappings for e in self._entries.values())

  def summary(self) -> list[dict[str, Any]]:
    """One row per executable: key, compile time, memory, calls."""
    return [
      {
        "key": str(k[0]),
        "devices": max((len(d) for d, _ in k[1]), default=1),
        "attention_form": k[3][0],
        "compile_s": round(e.compile_seconds, 3),
        "temp_bytes": e.temp_bytes,
        "argument_bytes": e.argument_bytes,
        "calls": e.calls,
      }
      for k, e in self._entries.items()
    ]

"""A pool of ahead-of-time compiled executables, one per static key.

The rollout engine asks for a program by (name, static shapes/options); the
pool lowers and compiles it once, records compile time and memory, and hands
back the executable. After warm-up, a rollout never compiles: `compiles` stays
put, which tests and benchmarks check.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax


@dataclasses.dataclass
class CompiledEntry:
  executable: Any
  compile_seconds: float
  # Bytes of generated code + temporaries reported by XLA (None if unavailable).
  temp_bytes: int | None
  argument_bytes: int | None
  calls: int = 0


def _placement(args: tuple[Any, ...]) -> tuple[Any, ...]:
  """The device sets of the committed array arguments (uncommitted and host values
  follow the others). One device: () so single-device keys stay simple."""
  devices = {
    tuple(d.id for d in x.sharding.device_set)
    for x in jax.tree.leaves(args)
    if isinstance(x, jax.Array) and x.committed
  }
  if all(len(d) <= 1 for d in devices) and len(devices) <= 1:
    return ()
  return tuple(sorted(devices))


class ExecutablePool:
  """Compiled programs keyed by a hashable static key."""

  def __init__(self):
    self._entries: dict[Hashable, CompiledEntry] = {}

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
    # are different executables (a compacted bucket runs on fewer devices).
    key = (key, _placement(args))
    entry = self._entries.get(key)
    if entry is None:
      start = time.perf_counter()
      compiled = jax.jit(fn, donate_argnums=donate_argnums).lower(*args).compile()
      seconds = time.perf_counter() - start
      temp = arg = None
      try:
        mem = compiled.memory_analysis()
        temp = int(mem.temp_size_in_bytes)
        arg = int(mem.argument_size_in_bytes)
      except Exception:  # noqa: BLE001 - memory stats are best effort per backend.
        pass
      entry = CompiledEntry(compiled, seconds, temp, arg)
      self._entries[key] = entry
    entry.calls += 1
    return entry.executable

  def __contains__(self, key: Hashable) -> bool:
    return key in self._entries

  @property
  def compiles(self) -> int:
    return len(self._entries)

  @property
  def compile_seconds(self) -> float:
    return sum(e.compile_seconds for e in self._entries.values())

  def summary(self) -> list[dict[str, Any]]:
    """One row per executable: key, compile time, memory, calls."""
    return [
      {
        "key": str(k[0]),
        "devices": max((len(d) for d in k[1]), default=1),
        "compile_s": round(e.compile_seconds, 3),
        "temp_bytes": e.temp_bytes,
        "argument_bytes": e.argument_bytes,
        "calls": e.calls,
      }
      for k, e in self._entries.items()
    ]

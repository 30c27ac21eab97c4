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

Warm-ups compile many programs (a speculative engine's: every strategy x cache bucket);
on an accelerator each takes seconds to tens of seconds of single-threaded XLA work
(experiments/RESULTS.md). `compiling_ahead` overlaps them: inside
it a miss is lowered on the calling thread, compiled on a worker thread, and answered at
once by a stand-in whose call returns zeros shaped like the program's outputs, so a
warm-up walks on to the programs those outputs feed; leaving it waits for every compile.

A rollout that can run a chunk with another program while one compiles (the adaptive
engine: every arm emits the same tokens) asks with `on_miss="background"`: a miss is
traced, lowered and compiled on a host thread, in a copy of the caller's context, from the
arguments' shapes, and `get` answers None at once; the program joins the pool at a later
`get` once it is ready (`background_busy` says whether one is still compiling). One such
compile runs at a time: on an accelerator the host's compile then overlaps device work; on
a 2-core CPU it overlaps a decode that leaves part of the second core idle
(experiments/RESULTS.md, 2026-12-07, background compiles). Its seconds are
`background_seconds`, not `compile_seconds` (what callers waited for).

A program's first execution carries one-time costs (on XLA:CPU a loop body's first run is
far slower than the next: experiments/RESULTS.md): `first_runs` counts the executables
handed out for their first call, so a caller that times calls can leave that one out (the
rollout's bandit learns nothing from it, the simulator's cost tables skip it).

Every key also holds what the program reads from its context at trace time:
`attention.current_attention_form()`, `current_causal_block()`, `current_key_windows()`,
`precision.current_head_precision()` and `products.current_row_products()` (experiments
switch them with `attention.attention_form` / `causal_block` / `key_windows` /
`head_precision` / `one_row_products` between compiles), so a program
traced under another form is never handed back. Each compile traces a
fresh wrapper of `fn`: JAX caches traces by function identity across `jax.jit`
wrappers, and would otherwise hand back the jaxpr traced under the old form.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.models import attention
from tlt_jax.models.precision import current_head_precision
from tlt_jax.models.products import current_row_products


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
  """What programs read from their context at trace time (not their arguments)."""
  return (
    attention.current_attention_form(),
    attention.current_causal_block(),
    attention.current_key_windows(),
    current_head_precision(),
    current_row_products(),
  )


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


def _timed_compile(lowered: Any, lower_seconds: float) -> tuple[Any, float]:
  """Compiles on a worker thread; seconds = lowering + this compile (not the overlap)."""
  start = time.perf_counter()
  return lowered.compile(), lower_seconds + time.perf_counter() - start


def _abstract(x: Any) -> Any:
  """An argument as what a lowering reads of it: shape, dtype and, where committed, its
  placement (a background compile must not hold buffers the caller may donate meanwhile)."""
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if x.committed else None)
  if isinstance(x, np.ndarray | np.generic):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)
  return x


def _background_compile(context: contextvars.Context, build: Callable[[], Any]) -> tuple:
  """(executable, seconds, mappings added) of `build()`'s lowering, compiled on this
  thread in the caller's `context` (the trace-time globals are context variables)."""
  start = time.perf_counter()
  before = _mappings()
  compiled = context.run(lambda: build().compile())
  after = _mappings()
  maps = max(after - before, 0) if before is not None and after is not None else 0
  return compiled, time.perf_counter() - start, maps


def default_compile_workers() -> int:
  """Compile threads for a warm-up: one on CPU (XLA's CPU compiles already share the
  cores with the test workers, and each holds hundreds of JIT mappings), up to 8 on an
  accelerator, where the compiles are host work that the device waits on. The environment
  variable TLT_COMPILE_WORKERS overrides both."""
  if os.environ.get("TLT_COMPILE_WORKERS"):
    return max(1, int(os.environ["TLT_COMPILE_WORKERS"]))
  if jax.default_backend() == "cpu":
    return 1
  return max(1, min(8, os.cpu_count() or 1))


class _Compiling:
  """Stand-in for a program whose compile runs on a worker (`compiling_ahead`)."""

  def __init__(self, out_info: Any):
    self.out_info = out_info

  def __call__(self, *args: Any) -> Any:
    del args  # nothing runs: the outputs only carry shapes to the next lowering
    return jax.tree.map(lambda o: jnp.zeros(o.shape, o.dtype), self.out_info)  # keys too


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
    # While compiling ahead: key -> (stand-in, future of (executable, seconds)).
    self._ahead: dict[Hashable, tuple[_Compiling, concurrent.futures.Future]] | None = None
    self._executor: concurrent.futures.ThreadPoolExecutor | None = None
    # Background compiles (`on_miss="background"`): full key -> future, one thread.
    self._background: dict[Hashable, concurrent.futures.Future] = {}
    self._background_executor: concurrent.futures.ThreadPoolExecutor | None = None
    self.background_compiles = 0
    self.background_seconds = 0.0
    # Executables handed out for their first call (see `first_runs` in the module docstring).
    self.first_runs = 0

  def get(
    self,
    key: Hashable,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    donate_argnums: tuple[int, ...] = (),
    compiler_options: dict[str, str] | None = None,
    on_miss: str = "compile",
  ) -> Any:
    """Returns the executable for `key`, compiling `fn` for `args` if new.

    `fn` must be a pure function whose static parts are already bound (the
    key must identify them), not itself jitted; `args` fix the shapes.
    `compiler_options`: XLA's options for this program (`jax.jit`'s; part of the key), e.g.
    `utils.cpu_fusions.compiler_options`.
    `on_miss`: "compile" (here, or wait for its background compile) or "background" (start
    its compile on the background thread unless one is running, and return None).
    """
    if on_miss not in ("compile", "background"):
      raise ValueError(f"on_miss must be compile or background, got {on_miss!r}")
    # The placement is part of the program: the same shapes on 8 devices or on 2
    # are different executables (a compacted bucket runs on fewer devices). So is the
    # argument tree (a list where a tuple was compiled is refused by the executable),
    # and the trace-time globals (the attention form).
    leaves, treedef = jax.tree.flatten(args)
    # Shapes and dtypes too, as jax.jit keys them: a program compiled for bfloat16 weights
    # is not handed float32 ones (the executable would refuse them).
    avals = tuple((getattr(x, "shape", None), getattr(x, "dtype", type(x))) for x in leaves)
    options = compiler_options or None
    key = (key, _placement(leaves), treedef, _trace_globals(), avals)
    key += (tuple(sorted(options.items())),) if options else ()
    self._collect()
    entry = self._entries.get(key)
    if entry is None and self._ahead is not None:
      if key not in self._ahead:
        start = time.perf_counter()
        jitted = jax.jit(_fresh(fn), donate_argnums=donate_argnums, compiler_options=options)
        lowered = jitted.lower(*args)
        lower_s = time.perf_counter() - start
        future = self._executor.submit(_timed_compile, lowered, lower_s)
        self._ahead[key] = (_Compiling(lowered.out_info), future)
      return self._ahead[key][0]
    if on_miss == "background":  # the caller runs nothing now: no call is counted
      if entry is None and not self.background_busy:
        self._start_background(key, fn, args, donate_argnums, options)
      return None if entry is None else entry.executable
    if entry is None and key in self._background:
      start = time.perf_counter()
      self._background[key].result()  # started earlier: wait for it, do not compile twice
      self._compile_seconds += time.perf_counter() - start
      self._collect()
      entry = self._entries.get(key)
    if entry is None:
      start = time.perf_counter()
      before = _mappings()
      jitted = jax.jit(_fresh(fn), donate_argnums=donate_argnums, compiler_options=options)
      compiled = jitted.lower(*args).compile()
      after = _mappings()
      maps = max(after - before, 0) if before is not None and after is not None else 0
      entry = self._add(key, compiled, time.perf_counter() - start, maps)
    else:
      self._entries[key] = self._entries.pop(key)  # most recently used last
    entry.calls += 1
    self.first_runs += entry.calls == 1
    return entry.executable

  def _start_background(self, key, fn, args, donate_argnums, options) -> None:
    abstract = jax.tree.map(_abstract, args)

    def build():
      jitted = jax.jit(_fresh(fn), donate_argnums=donate_argnums, compiler_options=options)
      return jitted.lower(*abstract)

    if self._background_executor is None:
      self._background_executor = concurrent.futures.ThreadPoolExecutor(1, "background_compile")
    context = contextvars.copy_context()
    self._background[key] = self._background_executor.submit(_background_compile, context, build)

  def _collect(self) -> None:
    """Pools the background compiles that have finished (on the caller's thread). One that
    failed is dropped: a later `get` compiles it in the foreground, where the error shows."""
    for key in [k for k, f in self._background.items() if f.done()]:
      future = self._background.pop(key)
      if future.exception() is not None:
        continue
      compiled, seconds, maps = future.result()
      self.background_compiles += 1
      self.background_seconds += seconds
      self._add(key, compiled, seconds, maps, waited=False)

  @property
  def background_busy(self) -> bool:
    """A background compile is still running (finished ones are pooled first)."""
    self._collect()
    return bool(self._background)

  def _add(
    self, key: Hashable, compiled: Any, seconds: float, maps: int, waited: bool = True
  ) -> CompiledEntry:
    temp = arg = None
    try:
      mem = compiled.memory_analysis()
      temp = int(mem.temp_size_in_bytes)
      arg = int(mem.argument_size_in_bytes)
    except Exception:  # noqa: BLE001 - memory stats are best effort per backend.
      pass
    entry = CompiledEntry(compiled, seconds, temp, arg, mappings=maps)
    self._compiles += 1
    if waited:  # a background compile's seconds are not a caller's
      self._compile_seconds += seconds
    while self._entries and (
      len(self._entries) >= self.max_executables or self.mappings + maps > self.max_mappings
    ):
      del self._entries[next(iter(self._entries))]  # least recently used
      self.evictions += 1
    self._entries[key] = entry
    return entry

  @contextlib.contextmanager
  def compiling_ahead(self, workers: int | None = None):
    """Within: misses compile on `workers` threads (default: `default_compile_workers`)
    and `get` returns stand-ins that run nothing; on leaving, every compile is waited for
    and pooled. With one worker this is a no-op (misses compile in `get`, as outside).

    For single-device programs: a stand-in's zeros sit on the default device, so a
    program they feed would be lowered for that placement, not its own.
    """
    workers = default_compile_workers() if workers is None else workers
    if workers <= 1 or self._ahead is not None:
      yield self
      return
    self._ahead = {}
    self._executor = concurrent.futures.ThreadPoolExecutor(workers, "compile")
    before = _mappings()
    try:
      yield self
    finally:
      ahead, self._ahead = self._ahead, None
      executor, self._executor = self._executor, None
      results = [(key, future.result()) for key, (_, future) in ahead.items()]
      executor.shutdown()
      after = _mappings()
      # Compiles overlapped: their mappings are known only together (shared evenly).
      maps = max(after - before, 0) // max(len(results), 1) if before and after else 0
      for key, (compiled, seconds) in results:
        self._add(key, compiled, seconds, maps)

  @property
  def deferring(self) -> bool:
    """Inside `compiling_ahead` with workers: misses answer with stand-ins."""
    return self._ahead is not None

  def __contains__(self, key: Hashable) -> bool:
    """Whether a program for `key` (as given to `get`), traced under the current
    globals, is held (for any placement and argument tree)."""
    self._collect()
    now = _trace_globals()
    return any(k[0] == key and k[3] == now for k in self._entries)

  @property
  def compiles(self) -> int:
    """Programs compiled so far, in the background too (recompiles after an eviction
    count again)."""
    return self._compiles

  @property
  def compile_seconds(self) -> float:
    """Seconds callers waited for compiles (background ones: `background_seconds`)."""
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

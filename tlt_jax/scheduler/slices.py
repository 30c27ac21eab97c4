"""Host-side scheduler that fits drafter updates into idle device slices.

Three kinds of slice:
- multi-device: when compaction puts the long tail on fewer devices of the
  rollout mesh, the devices it frees (`BatchPlacement.free_devices`) form the
  drafter's sub-mesh and get one asynchronously dispatched update per chunk
  boundary until the last straggler finishes (the engine does not touch those
  devices, and nothing is dispatched after the rollout ends, so they are back
  for the next phase at step granularity). The sub-meshes, the policy's part
  the drafter reads on each (its embedding and head in the compute dtype, not
  its layers: views of one copy on the rollout's devices) and the update
  compiled for each are prepared in `begin_rollout`, for every device set the
  engine's batch buckets can free, never inside a rollout;
- windows where the device would sit idle while the host works: reward scoring
  after the old log-probs are done, checkpoint writes. `fill(window, busy)`
  runs drafter updates back to back while `busy()` holds (at most
  `max_window_updates`), and records the seconds reclaimed per window;
- the rollout's long tail: at a chunk boundary whose batch bucket is at most
  `long_tail_batch` (few rows: spare capacity), `on_chunk` runs one update on
  the rollout's own devices, synchronously (it would serialise with the
  rollout's chunks anyway), and pushes its params to the engine right away.

The rollout's budget is measured, not estimated: everything the drafter costs
the rollout is timed and charged against `rollout_budget` x the rollout's
elapsed time, by kind (records `rollout_charged_<kind>_s`):
- `update`: the measured wall time of each long-tail update;
- `host`: the rest of the host time spent in `on_chunk` (sampling a batch and
  dispatching a freed-device update: those updates themselves run on other
  devices, concurrently, and cost the rollout nothing more);
- `rebuild`: the drafter-cache rebuild a pushed version forces in the engine
  (its cache was built by the old drafter), measured by the engine and reported
  at the next `on_chunk` call (the protocol: `on_chunk(batch, rebuild_s)`, with
  `batch == 0` for a last report after the final chunk).
A long-tail update runs only when its estimate (the running mean of measured
updates, plus that of the rebuilds its push will force) fits the budget left,
so the charged seconds exceed the budget by at most one update's and one
rebuild's misestimate, plus host time (`rollout_overrun_s`: the largest excess
seen during a rollout). The rebuilds that freed-device versions force are
charged too, though the budget does not gate those updates.

The engine swaps drafter params only at chunk boundaries, so a chunk always
runs one drafter version (a stale or fresh drafter never affects exactness:
verification is lossless whatever it proposes).

The slices above depend on the step's shape (how long the host scores, how much
budget the long tail leaves); on one busy device they can give no update for many
steps, and the drafter falls behind the policy. So every step gets a guaranteed
minimum (`min_step_updates`), paid in the step's own time:
- `between_calls` (between two engine calls of one step): the updates the step
  still owes its minimum run there, so the next call drafts with them, plus one
  more when the previous call left enough of its budget unspent;
- `finish_step` (after the step's update): blocking updates until the step has
  had its minimum (`step_min_updates`, `step_min_s`: the trainer's time/drafter).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx

from tlt_jax.drafter.online import OnlineDrafter
from tlt_jax.parallel.meshes import BatchPlacement, data_mesh, replicated

# What the rollout is charged for (records rollout_charged_<kind>_s): see the docstring.
CHARGES = ("update", "host", "rebuild")


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
  """Attributes:
  rollout_budget: fraction of a rollout's wall time the drafter may cost it (long-tail
    updates, host time in `on_chunk`, rebuilds forced by pushes: measured and charged),
    in [0, 1) (0: no long-tail update; freed devices still train).
  long_tail_batch: chunk boundaries at batch buckets <= this run long-tail updates.
  max_window_updates: updates per idle window at most (the reference's 200).
  min_step_updates: updates every RL step gets at least: what the slices leave short
    runs blocking, between engine calls or at the step's end (0: the slices only).
  """

  rollout_budget: float = 0.05
  long_tail_batch: int = 8
  max_window_updates: int = 200
  min_step_updates: int = 1

  def __post_init__(self):
    if not 0 <= self.rollout_budget < 1:
      raise ValueError(
        f"SchedulerConfig.rollout_budget must be in [0, 1), got {self.rollout_budget}"
      )
    for name in ("long_tail_batch", "max_window_updates", "min_step_updates"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 0:
        raise ValueError(f"SchedulerConfig.{name} must be an int >= 0, got {v!r}")


class SliceScheduler:
  """Feeds `drafter` updates into idle windows and the rollout's long tail."""

  def __init__(
    self,
    drafter: OnlineDrafter,
    config: SchedulerConfig = SchedulerConfig(),
    clock: Callable[[], float] = time.perf_counter,
    placement: BatchPlacement | None = None,
    batch_buckets: Sequence[int] | None = None,
  ):
    """`placement`: the rollout engine's (`engine.placement`) when it runs on a mesh;
    then freed devices train the drafter. `batch_buckets`: the engine's
    (`engine.config.batch_buckets`), so only the device sets those buckets free are
    prepared (default: every set a power-of-two sub-mesh can free)."""
    self.drafter, self.config, self.clock = drafter, config, clock
    self.placement = placement
    self.batch_buckets = tuple(batch_buckets) if batch_buckets else None
    # On a mesh, windows and the budgeted long tail train on all rollout devices.
    self._all_devices = placement.mesh if placement is not None else None
    # Per freed device set (device ids): its mesh and whether the update is compiled for
    # it, built once; the policy's part the drafter reads on it (a view of the rollout
    # devices' copy), refreshed per rollout.
    self._free_meshes: dict[tuple[int, ...], Any] = {}
    self._free_compiled: set[tuple[int, ...]] = set()
    self._free_targets: dict[tuple[int, ...], Any] = {}
    self.update_seconds = 0.0  # running mean of a blocking update's wall time (0: unknown)
    self._sampled = drafter.sample_seconds  # the drafter's batch-building seconds reported
    self.rebuild_seconds = 0.0  # running mean of a push-forced drafter-cache rebuild
    self._timed = 0  # blocking updates measured by this scheduler
    self._target: nnx.State | None = None
    self._rollout_start = 0.0
    self._charged = 0.0
    self._overrun = 0.0
    self._in_flight: dict[str, jax.Array] | None = None
    self._pushed_version = drafter.version
    self._unspent = 0.0  # budget seconds the last rollout left (between_calls may use them)
    # The params the drafter starts from (its warm start), the frozen baseline a drafter
    # evaluation compares with. The same arrays, no copy: updates make new ones (params
    # are not donated) and a resume replaces the leaves of the drafter's own State only.
    self.initial_params = jax.tree.map(lambda x: x, drafter.params)
    self.reset_records()

  # ------------------------------------------------------------------ records
  def reset_records(self) -> None:
    self.records: dict[str, float] = {
      "updates": 0,
      "long_tail_updates": 0,
      "pushes": 0,
      "rollout_charged_s": 0.0,
      **{f"rollout_charged_{kind}_s": 0.0 for kind in CHARGES},
      "rollout_budget_s": 0.0,
      "rollout_overrun_s": 0.0,
      "update_s": 0.0,
      "step_min_updates": 0,
      "step_min_s": 0.0,
      "between_calls_updates": 0,
      "between_calls_s": 0.0,
    }

  def _add(self, key: str, value: float) -> None:
    self.records[key] = self.records.get(key, 0.0) + value

  def step_records(self) -> dict[str, float]:
    """This step's counters (drafter/...), then resets them."""
    out = {f"drafter/{k}": v for k, v in self.records.items()}
    out["drafter/version"] = self.drafter.version
    out["drafter/buffer_rows"] = len(self.drafter.buffer)
    out["drafter/update_seconds"] = self.update_seconds
    out["drafter/rebuild_seconds"] = self.rebuild_seconds
    # Host seconds its updates (and dry runs) spent building batches this step.
    out["drafter/sample_s"] = self.drafter.sample_seconds - self._sampled
    self._sampled = self.drafter.sample_seconds
    if self.drafter.last_metrics:
      m = jax.device_get(self.drafter.last_metrics)
      out["drafter/loss"] = float(m["loss"])
      out["drafter/top1_agreement"] = float(m["top1_agreement"])
    out["drafter/reclaimed_s"] = sum(
      v for k, v in self.records.items() if k.startswith("reclaimed_")
    )
    self.reset_records()
    return out

  def _measure(self, run: Callable[[], Any]) -> float:
    """Wall seconds of `run()` to completion; feeds the running mean of an update's cost."""
    t = self.clock()
    jax.block_until_ready(run())
    dt = self.clock() - t
    self._timed += 1
    if self._timed > 1:  # the first call compiles: not an estimate of the next ones
      self.update_seconds = dt if not self.update_seconds else 0.8 * self.update_seconds + 0.2 * dt
    return dt

  def _timed_update(self, target_params: nnx.State) -> float:
    dt = self._measure(lambda: self.drafter.update(target_params, mesh=self._all_devices))
    self.records["updates"] += 1
    self.records["update_s"] += dt  # blocking updates only: freed-device ones overlap
    return dt

  # ------------------------------------------------------------------ windows
  def fill(self, window: str, busy: Callable[[], bool], target_params: nnx.State) -> int:
    """Runs updates while `busy()` (the host still working, the device free); returns how many.

    The last update may end after `busy()` turns false: that overshoot is recorded
    (`overshoot_<window>_s`), the rest as reclaimed idle time (`reclaimed_<window>_s`).
    """
    done = 0
    while self.drafter.ready() and busy() and done < self.config.max_window_updates:
      t = self.clock()
      self._timed_update(target_params)
      end = self.clock()
      done += 1
      if busy():
        self._add(f"reclaimed_{window}_s", end - t)
      else:
        # The window closed during this update: count the part before as reclaimed,
        # unknown split, so all of it is overshoot (conservative).
        self._add(f"overshoot_{window}_s", end - t)
    return done

  # ------------------------------------------------------------------ rollout
  def free_device_sets(self) -> dict[tuple[int, ...], list[jax.Device]]:
    """Every device set a batch bucket can leave idle (device ids -> devices)."""
    if self.placement is None:
      return {}
    n = len(self.placement.devices)
    buckets = self.batch_buckets or [2**j for j in range(n.bit_length())]
    sets = {}
    for b in buckets:
      free = self.placement.free_devices(b)
      if free:
        sets[tuple(d.id for d in free)] = free
    return sets

  def begin_rollout(self, target_params: nnx.State) -> nnx.State:
    """Call before a rollout; returns the drafter params it should start with.

    Compiles and times the update before the rollout, never inside it (the first call
    compiles: seconds, which would blow the long tail's budget), on the
    rollout's devices and on every freed device set, with dry runs that leave the
    drafter unchanged (a resumed run primes again, from the checkpointed state)."""
    t = self.clock()
    self._target = target_params
    if self.drafter.ready():
      # What the updates read of the policy (its embedding and head in the compute dtype, not
      # its layers): one copy on every rollout device, of which each freed set's is a view
      # (their buffers), and cast once, not at every update.
      self._target = head = self.drafter.target_reads(target_params)
      if self._all_devices is not None:
        head = self._target = jax.device_put(head, replicated(self._all_devices))
      while self._timed < 2:
        self._measure(lambda: self.drafter.dry_run(head, mesh=self._all_devices))
      for ids, devices in self.free_device_sets().items():
        if ids not in self._free_meshes:
          self._free_meshes[ids] = data_mesh(devices)
        mesh = self._free_meshes[ids]
        self._free_targets[ids] = jax.device_put(head, replicated(mesh))
        if ids not in self._free_compiled:
          jax.block_until_ready(self.drafter.dry_run(self._free_targets[ids], mesh=mesh))
          self._free_compiled.add(ids)
    self._add("prime_s", self.clock() - t)
    self._rollout_start = self.clock()
    self._charged = self._overrun = 0.0
    self._pushed_version = self.drafter.version
    self._in_flight = None
    return self.drafter.params

  def on_chunk(self, batch: int, rebuild_s: float = 0.0) -> nnx.State | None:
    """Engine hook at a chunk boundary; returns new drafter params to use, or None.

    `batch`: the bucket of the next chunk (0: the rollout has ended, this call only
    reports); `rebuild_s`: seconds the engine spent since the previous call rebuilding
    the drafter cache because of a pushed version. Everything is charged (module
    docstring): the rebuild, a long-tail update's measured time, the host time here."""
    start = self.clock()
    if rebuild_s > 0:
      self._charge("rebuild", rebuild_s)
      r = self.rebuild_seconds
      self.rebuild_seconds = rebuild_s if not r else 0.8 * r + 0.2 * rebuild_s
    push, update_s = None, 0.0
    if batch > 0 and self._target is not None:
      if self._in_flight is not None and all(x.is_ready() for x in self._in_flight.values()):
        self._in_flight = None
      if self._in_flight is None:
        push = self._push()  # a finished freed-device version
        if not self._dispatch_on_freed_devices(batch):
          ran = self._long_tail_update(batch)
          if ran is not None:
            update_s, push = ran, self._push()
    self.records["pushes"] += push is not None
    self._charge("update", update_s)
    self._charge("host", self.clock() - start - update_s)
    return push

  def _push(self) -> nnx.State | None:
    """The drafter's params when they are a version the engine has not been given."""
    if self.drafter.version == self._pushed_version:
      return None
    self._pushed_version = self.drafter.version
    return self.drafter.params

  def _long_tail_update(self, batch: int) -> float | None:
    """One update on the rollout's devices when its estimated cost (update, and the rebuild
    its push forces) fits the budget left; returns its measured seconds (None: none ran)."""
    if (
      batch > self.config.long_tail_batch
      or self.config.rollout_budget <= 0
      or not self.update_seconds
      or not self.drafter.ready()
    ):
      return None
    if self.update_seconds + self.rebuild_seconds > self._budget_left():
      return None
    self.records["long_tail_updates"] += 1
    return self._timed_update(self._target)

  def _dispatch_on_freed_devices(self, batch: int) -> bool:
    """One async update on the devices the bucket leaves idle; False when there are none
    (or, which `begin_rollout` prevents, their mesh is not prepared: nothing is built or
    compiled inside a rollout)."""
    if self.placement is None or not self.drafter.ready():
      return False
    free = self.placement.free_devices(batch)
    if not free:
      return False
    ids = tuple(d.id for d in free)
    if ids not in self._free_compiled or ids not in self._free_targets:
      self._add("unprepared_free_sets", 1)
      return False
    mesh = self._free_meshes[ids]
    self._in_flight = self.drafter.update(self._free_targets[ids], mesh=mesh)
    self.records["updates"] += 1
    self._add("freed_device_updates", 1)
    return True

  def _charge(self, kind: str, seconds: float) -> None:
    self._charged += seconds
    self._add(f"rollout_charged_{kind}_s", seconds)
    elapsed = self.clock() - self._rollout_start
    self._overrun = max(self._overrun, self._charged - self.config.rollout_budget * elapsed)

  def _budget_left(self) -> float:
    elapsed = self.clock() - self._rollout_start
    return self.config.rollout_budget * elapsed - self._charged

  def end_rollout(self) -> None:
    elapsed = self.clock() - self._rollout_start
    self._add("rollout_charged_s", self._charged)
    self._add("rollout_budget_s", self.config.rollout_budget * elapsed)
    self.records["rollout_overrun_s"] = max(self.records["rollout_overrun_s"], self._overrun)
    self._unspent = self.config.rollout_budget * elapsed - self._charged
    self._target = None
    self._free_targets.clear()  # the head's views: free the devices for the next phase

  # ------------------------------------------------------------------ per-step minimum
  def _owed(self) -> int:
    """Updates this step still owes its minimum (every update so far counts, freed-device
    ones at dispatch)."""
    return max(0, self.config.min_step_updates - int(self.records["updates"]))

  def _run_owed(self, target_params: nnx.State) -> float:
    """The owed updates, blocking; returns their measured seconds."""
    spent = 0.0
    while self._owed() and self.drafter.ready():
      spent += self._timed_update(target_params)
      self.records["step_min_updates"] += 1
    self.records["step_min_s"] += spent
    return spent

  def between_calls(self, target_params: nnx.State) -> float:
    """Call between two engine calls of one RL step (after `end_rollout` and `observe`
    of the first, before `begin_rollout` of the next); returns the seconds it spent.

    Runs, blocking, the updates the step still owes `min_step_updates` (they would run at
    the step's end otherwise: here the next call drafts with them, on this step's rows),
    then one more when the call just ended left unspent at least an update's estimated
    cost of its rollout budget (`between_calls_updates`, `between_calls_s`; not charged
    to any rollout: the engine did not time them). The next `begin_rollout` hands the new
    version to the engine."""
    spent = self._run_owed(target_params)
    if (
      self.drafter.ready()
      and self.config.rollout_budget > 0
      and self.update_seconds
      and self.update_seconds <= self._unspent
    ):
      dt = self._timed_update(target_params)
      self._unspent -= dt
      self.records["between_calls_updates"] += 1
      self.records["between_calls_s"] += dt
      spent += dt
    return spent

  def finish_step(self, target_params: nnx.State) -> float:
    """Call once per RL step, after its policy update and before its checkpoint: runs,
    blocking, as many updates as bring the step's count to `min_step_updates`
    (`step_min_updates`; none with an empty buffer); returns their seconds."""
    self._unspent = 0.0  # a rollout's budget is not carried into the next step
    return self._run_owed(target_params)

  # ------------------------------------------------------------------ checkpoints
  def state_dict(self) -> dict[str, Any]:
    """The cost estimates the budget decides with (JSON; the drafter's state is its own,
    `OnlineDrafter.state_dict`)."""
    return {"update_seconds": self.update_seconds, "rebuild_seconds": self.rebuild_seconds}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self.update_seconds = float(state.get("update_seconds", 0.0))
    self.rebuild_seconds = float(state.get("rebuild_seconds", 0.0))

"""Host-side scheduler that fits drafter updates into idle device slices (single device).

Three kinds of slice:
- multi-device: when compaction puts the long tail on fewer devices of the
  rollout mesh, the devices it frees (`BatchPlacement.free_devices`) form the
  drafter's sub-mesh and get one asynchronously dispatched update per chunk
  boundary until the last straggler finishes (the rollout never waits: the
  engine does not touch those devices, and nothing is dispatched after the
  rollout ends, so they are back for the next phase at step granularity);
- windows where the device would sit idle while the host works: reward scoring
  after the old log-probs are done, checkpoint writes. `fill(window, busy)`
  runs drafter updates back to back while `busy()` holds (at most
  `max_window_updates`), and records the seconds reclaimed per window;
- the rollout's long tail: at a chunk boundary whose batch bucket is at most
  `long_tail_batch` (few rows: spare capacity), `on_chunk` dispatches one
  update asynchronously and pushes its params to the engine at a later
  boundary, once they are ready. Each dispatch is charged its estimated cost
  (a running mean of measured update times), and a dispatch happens only while
  the charges stay within `rollout_budget` x the rollout's elapsed time: the
  rollout never gives more than its budget to drafter training.

The engine swaps drafter params only at chunk boundaries, so a chunk always
runs one drafter version (a stale or fresh drafter never affects exactness:
verification is lossless whatever it proposes).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from tlt_jax.drafter.online import OnlineDrafter
from tlt_jax.parallel.meshes import BatchPlacement, data_mesh, replicated


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
  """Attributes:
  rollout_budget: fraction of a rollout's wall time its long-tail chunks may give
    to drafter updates, in [0, 1) (0: none in the rollout).
  long_tail_batch: chunk boundaries at batch buckets <= this dispatch updates.
  max_window_updates: updates per idle window at most (the reference's 200).
  """

  rollout_budget: float = 0.05
  long_tail_batch: int = 8
  max_window_updates: int = 200

  def __post_init__(self):
    if not 0 <= self.rollout_budget < 1:
      raise ValueError(
        f"SchedulerConfig.rollout_budget must be in [0, 1), got {self.rollout_budget}"
      )
    for name in ("long_tail_batch", "max_window_updates"):
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
  ):
    """`placement`: the rollout engine's (`engine.placement`) when it runs on a mesh;
    then freed devices train the drafter."""
    self.drafter, self.config, self.clock = drafter, config, clock
    self.placement = placement
    # On a mesh, windows and the budgeted long tail train on all rollout devices.
    self._all_devices = placement.mesh if placement is not None else None
    self._free_meshes: dict[tuple[int, ...], Any] = {}
    self._free_targets: dict[tuple[int, ...], Any] = {}
    self.update_seconds = 0.0  # running mean of a blocking update's wall time (0: unknown)
    self._timed = 0  # blocking updates measured by this scheduler
    self._target: nnx.State | None = None
    self._rollout_start = 0.0
    self._charged = 0.0
    self._in_flight: dict[str, jax.Array] | None = None
    self._pushed_version = drafter.version
    self.reset_records()

  # ------------------------------------------------------------------ records
  def reset_records(self) -> None:
    self.records: dict[str, float] = {
      "updates": 0,
      "long_tail_updates": 0,
      "pushes": 0,
      "rollout_charged_s": 0.0,
    }

  def _add(self, key: str, value: float) -> None:
    self.records[key] = self.records.get(key, 0.0) + value

  def step_records(self) -> dict[str, float]:
    """This step's counters (drafter/...), then resets them."""
    out = {f"drafter/{k}": v for k, v in self.records.items()}
    out["drafter/version"] = self.drafter.version
    out["drafter/buffer_rows"] = len(self.drafter.buffer)
    out["drafter/update_seconds"] = self.update_seconds
    if self.drafter.last_metrics:
      m = jax.device_get(self.drafter.last_metrics)
      out["drafter/loss"] = float(m["loss"])
      out["drafter/top1_agreement"] = float(m["top1_agreement"])
    out["drafter/reclaimed_s"] = sum(
      v for k, v in self.records.items() if k.startswith("reclaimed_")
    )
    self.reset_records()
    return out

  def _timed_update(self, target_params: nnx.State) -> float:
    t = self.clock()
    jax.block_until_ready(self.drafter.update(target_params, mesh=self._all_devices))
    dt = self.clock() - t
    self.records["updates"] += 1
    self._timed += 1
    if self._timed > 1:  # the first call compiles: not an estimate of the next ones
      self.update_seconds = dt if not self.update_seconds else 0.8 * self.update_seconds + 0.2 * dt
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
  def begin_rollout(self, target_params: nnx.State) -> nnx.State:
    """Call before a rollout; returns the drafter params it should start with."""
    if self._timed < 2 and self.drafter.ready():
      # Compile and time the update before the rollout, never inside it: the first call
      # compiles (seconds), which would blow the long tail's budget (measured: 4.6 s).
      t = self.clock()
      while self._timed < 2:
        self._timed_update(target_params)
      self._add("prime_s", self.clock() - t)
    self._target = target_params
    self._rollout_start = self.clock()
    self._charged = 0.0
    self._pushed_version = self.drafter.version
    self._in_flight = None
    self._free_targets.clear()
    return self.drafter.params

  def on_chunk(self, batch: int) -> nnx.State | None:
    """Engine hook at a chunk boundary; returns new drafter params to use, or None."""
    push = None
    if self._in_flight is not None and all(x.is_ready() for x in self._in_flight.values()):
      self._in_flight = None
    if self._in_flight is None and self.drafter.version != self._pushed_version:
      self._pushed_version = self.drafter.version
      self.records["pushes"] += 1
      push = self.drafter.params
    if self._in_flight is None and self._dispatch_on_freed_devices(batch):
      return push
    if (
      self._in_flight is None
      and batch <= self.config.long_tail_batch
      and self.drafter.ready()
      and self._target is not None
      and self.config.rollout_budget > 0
    ):
      cost = self.update_seconds
      if cost and cost <= self._budget_left():
        self._charged += cost
        self._in_flight = self.drafter.update(self._target, mesh=self._all_devices)
        self.records["updates"] += 1
        self.records["long_tail_updates"] += 1
    return push

  def _dispatch_on_freed_devices(self, batch: int) -> bool:
    """One async update on the devices the bucket leaves idle; False when there are none."""
    if self.placement is None or self._target is None or not self.drafter.ready():
      return False
    free = self.placement.free_devices(batch)
    if not free:
      return False
    ids = tuple(d.id for d in free)
    if ids not in self._free_meshes:
      self._free_meshes[ids] = data_mesh(free)
    mesh = self._free_meshes[ids]
    if ids not in self._free_targets:  # the policy, copied once per rollout per device set
      self._free_targets[ids] = jax.device_put(self._target, replicated(mesh))
    self._in_flight = self.drafter.update(self._free_targets[ids], mesh=mesh)
    self.records["updates"] += 1
    self._add("freed_device_updates", 1)
    return True

  def _budget_left(self) -> float:
    elapsed = self.clock() - self._rollout_start
    return self.config.rollout_budget * elapsed - self._charged

  def end_rollout(self) -> None:
    self._add("rollout_charged_s", self._charged)
    self._target = None

  # ------------------------------------------------------------------ checkpoints
  def state(self) -> dict[str, Any]:
    return {"version": self.drafter.version, "update_seconds": self.update_seconds}

  def load_state(self, state: dict[str, Any]) -> None:
    self.update_seconds = float(state.get("update_seconds", 0.0))

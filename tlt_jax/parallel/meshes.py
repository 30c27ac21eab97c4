"""Meshes per role and the placement of a rollout's rows on them.

The rollout and drafter training use a 1-D mesh with the axis "data": rollout rows and
drafter-update rows are split along it, parameters replicated. The policy update uses
that mesh too, or a ("data", "tensor") mesh with its parameters sharded
(`parallel.sharding`: FSDP over "data", tensor parallelism over "tensor"). The rollout's
long tail shrinks the batch bucket; `BatchPlacement` puts a bucket of B rows on the
largest power-of-two prefix of the rollout devices that divides B, and the devices it
frees form the drafter-training sub-mesh (TLT's "freed devices train the drafter").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "data"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh over `devices` (default: all devices of all processes) with axis "data"."""
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("a mesh needs at least one device")
  return Mesh(np.asarray(devices), (AXIS,))


def rows_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (row) axis split over "data", the rest replicated."""
  return NamedSharding(mesh, P(AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


class BatchPlacement:
  """Places a batch bucket's per-row arrays and its replicated inputs on a sub-mesh."""

  def __init__(self, mesh: Mesh):
    if mesh.axis_names != (AXIS,):
      raise ValueError(
        f"the rollout mesh must have the single axis {AXIS!r}, got {mesh.axis_names}"
      )
    self.mesh = mesh
    self.devices = list(mesh.devices.flat)
    self._meshes: dict[int, Mesh] = {}
    self._replicas: dict[tuple[int, int], tuple[Any, Any]] = {}

  def num_devices(self, batch: int) -> int:
    """Devices for `batch` rows: the largest power of two <= #devices dividing batch."""
    k = 1
    while 2 * k <= len(self.devices) and batch % (2 * k) == 0:
      k *= 2
    return k

  def submesh(self, batch: int) -> Mesh:
    k = self.num_devices(batch)
    if k not in self._meshes:
      self._meshes[k] = data_mesh(self.devices[:k])
    return self._meshes[k]

  def free_devices(self, batch: int) -> list[jax.Device]:
    """The devices a `batch`-row bucket leaves idle: the drafter's sub-mesh."""
    return self.devices[self.num_devices(batch) :]

  def rows(self, tree: Any, batch: int) -> Any:
    """Per-row arrays, split over the bucket's devices (a no-op when already there)."""
    return jax.device_put(tree, rows_sharding(self.submesh(batch)))

  def replicate(self, tree: Any, batch: int) -> Any:
    """A copy of `tree` on every device of the bucket's sub-mesh, cached per tree until
    `clear` (params are placed once per rollout, not per chunk)."""
    k = self.num_devices(batch)
    hit = self._replicas.get((id(tree), k))
    if hit is not None and hit[0] is tree:
      return hit[1]
    placed = jax.device_put(tree, replicated(self.submesh(batch)))
    self._replicas[(id(tree), k)] = (tree, placed)
    return placed

  def clear(self) -> None:
    self._replicas.clear()

"""Meshes per role and the placement of a rollout's rows on them.

The rollout uses a 1-D mesh with the axis "data" (rows split along it, weights whole on
every device) or a ("data", "tensor") mesh (rows over "data", each row group's weights
split over its "tensor" devices by `sharding.ROLLOUT_RULES`: heads, MLP width and
vocabulary). Drafter training uses a 1-D "data" mesh. The policy update uses the
rollout's mesh too, or a ("data", "tensor") mesh with its parameters sharded
(`parallel.sharding`: FSDP over "data", tensor parallelism over "tensor"). The rollout's
long tail shrinks the batch bucket; `BatchPlacement` puts a bucket of B rows on the
largest power-of-two prefix of the row groups that divides B, and the devices it frees
form the drafter-training sub-mesh (TLT's "freed devices train the drafter").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tlt_jax.models.transformer import KVCache
from tlt_jax.parallel.sharding import ROLLOUT_RULES, TENSOR, place

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
  """Places a batch bucket's per-row arrays, its weights and its replicated inputs on a
  sub-mesh: the first k row groups of the rollout mesh (a group is one device on a 1-D
  mesh, a tensor group of `tensor` devices on a ("data", "tensor") mesh)."""

  def __init__(self, mesh: Mesh):
    if mesh.axis_names not in ((AXIS,), (AXIS, TENSOR)):
      raise ValueError(
        f"the rollout mesh must have the axes ({AXIS!r},) or ({AXIS!r}, {TENSOR!r}), got "
        f"{mesh.axis_names}"
      )
    self.mesh = mesh
    self.devices = list(mesh.devices.flat)
    self._grid = mesh.devices.reshape(mesh.devices.shape[0], -1)  # [groups, tensor]
    self.tensor = self._grid.shape[1]
    self._meshes: dict[int, Mesh] = {}
    self._replicas: dict[tuple[int, int, str], tuple[Any, Any]] = {}

  def num_devices(self, batch: int) -> int:
    """Row groups (data shards) for `batch` rows: the largest power of two <= #groups
    dividing batch (devices, on a 1-D mesh)."""
    k = 1
    while 2 * k <= self._grid.shape[0] and batch % (2 * k) == 0:
      k *= 2
    return k

  def submesh(self, batch: int) -> Mesh:
    k = self.num_devices(batch)
    if k not in self._meshes:
      if self.mesh.devices.ndim == 1:
        self._meshes[k] = data_mesh(self.devices[:k])
      else:
        self._meshes[k] = Mesh(self._grid[:k], (AXIS, TENSOR))
    return self._meshes[k]

  def free_devices(self, batch: int) -> list[jax.Device]:
    """The devices a `batch`-row bucket leaves idle: the drafter's sub-mesh."""
    return list(self._grid[self.num_devices(batch) :].flat)

  def rows(self, tree: Any, batch: int) -> Any:
    """Per-row arrays, split over the bucket's row groups (a no-op when already there);
    on a ("data", "tensor") mesh KV caches also split their kv heads over the tensor
    group, as the weights that read them are."""
    sub = self.submesh(batch)
    flat = rows_sharding(sub)
    if self.tensor == 1:
      return jax.device_put(tree, flat)
    heads = NamedSharding(sub, P(AXIS, TENSOR))  # [B, K, S, E]: rows, then kv heads

    def layout(x):
      if isinstance(x, KVCache):
        return jax.tree.map(lambda a: heads if a.shape[1] % self.tensor == 0 else flat, x)
      return flat

    is_cache = lambda x: isinstance(x, KVCache)
    return jax.device_put(tree, jax.tree.map(layout, tree, is_leaf=is_cache))

  def replicate(self, tree: Any, batch: int) -> Any:
    """A copy of `tree` on every device of the bucket's sub-mesh, cached per tree until
    `clear` (params are placed once per rollout, not per chunk)."""
    return self._cached(tree, batch, "replicated")

  def weights(self, tree: Any, batch: int) -> Any:
    """Model parameters (policy or drafter) for the bucket: replicated on a 1-D mesh;
    on a ("data", "tensor") mesh whole on every row group and split within it by
    `ROLLOUT_RULES`. Cached like `replicate`."""
    return self._cached(tree, batch, "weights" if self.tensor > 1 else "replicated")

  def _cached(self, tree: Any, batch: int, layout: str) -> Any:
    k = self.num_devices(batch)
    hit = self._replicas.get((id(tree), k, layout))
    if hit is not None and hit[0] is tree:
      return hit[1]
    sub = self.submesh(batch)
    if layout == "weights":
      placed = place(tree, sub, ROLLOUT_RULES)
    else:
      placed = jax.device_put(tree, replicated(sub))
    self._replicas[(id(tree), k, layout)] = (tree, placed)
    return placed

  def clear(self) -> None:
    self._replicas.clear()

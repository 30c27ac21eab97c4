"""Parameter sharding: logical axis names on every parameter, mesh axes per role.

Each parameter of the policy (and of the drafter) has logical axis names, found from its
path (`logical_axes`): "vocab", "embed", "heads", "kv_heads", "mlp", "norm", "head_dim".
A role maps logical names to mesh axes (`TRAIN_RULES`, `ROLLOUT_RULES`); a dimension whose
size the mesh axis does not divide stays replicated (so any mesh is valid, if not always
the cheapest). The policy update runs on a 2-D mesh ("data", "tensor"): rows split over
"data", parameters and optimizer state split over it too (FSDP: each device holds 1 /
data of every matrix, gathered layer by layer by XLA's partitioner) and the heads and MLP
width over "tensor". The rollout reads them replicated or split over "tensor" only.
Moving parameters between the layouts is a `jax.device_put` between shardings: device to
device, no host copy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tlt_jax.utils.trees import path_name

DATA, TENSOR = "data", "tensor"

# Logical axis names by parameter path (the first pattern that matches, re.search).
LOGICAL_AXES: tuple[tuple[str, tuple[str, ...]], ...] = (
  (r"embed/embedding$", ("vocab", "embed")),
  (r"lm_head/kernel$", ("embed", "vocab")),
  (r"q_proj/kernel$", ("embed", "heads")),
  (r"(k_proj|v_proj)/kernel$", ("embed", "kv_heads")),
  (r"q_proj/bias$", ("heads",)),
  (r"(k_proj|v_proj)/bias$", ("kv_heads",)),
  (r"o_proj/kernel$", ("heads", "embed")),
  (r"(gate_proj|up_proj)/kernel$", ("embed", "mlp")),
  (r"down_proj/kernel$", ("mlp", "embed")),
  (r"(q_norm|k_norm)/scale$", ("head_dim",)),
  (r"norm/scale$", ("norm",)),
  (r"(^|/)fc/kernel$", ("embed", "embed_out")),  # the drafter's [2D, D] input projection
)

# Policy update: FSDP over "data", tensor parallelism over "tensor".
TRAIN_RULES: Mapping[str, str] = {
  "embed": DATA,
  "vocab": TENSOR,
  "heads": TENSOR,
  "kv_heads": TENSOR,
  "mlp": TENSOR,
  "embed_out": TENSOR,
}
# Rollout: weights whole on every data replica (a decode step reads them all), the wide
# dimensions split over "tensor" when the mesh has one.
ROLLOUT_RULES: Mapping[str, str] = {
  "vocab": TENSOR,
  "heads": TENSOR,
  "kv_heads": TENSOR,
  "mlp": TENSOR,
  "embed_out": TENSOR,
}


def training_mesh(devices: Sequence[jax.Device] | None = None, tensor: int = 1) -> Mesh:
  """A 2-D ("data", "tensor") mesh over `devices` (default: all), `tensor` devices per
  tensor-parallel group (adjacent devices: on a GPU node, the fastest links)."""
  devices = list(jax.devices() if devices is None else devices)
  if not isinstance(tensor, int) or tensor < 1 or len(devices) % tensor:
    raise ValueError(f"tensor={tensor!r} must be a positive int dividing {len(devices)} devices")
  return Mesh(np.asarray(devices).reshape(-1, tensor), (DATA, TENSOR))


def logical_axes(params: Any) -> Any:
  """A pytree like `params` of tuples of logical axis names, one per dimension."""

  def names(path, x):
    name = path_name(path)
    for pattern, axes in LOGICAL_AXES:
      if re.search(pattern, name):
        if len(axes) != np.ndim(x):
          raise ValueError(f"{name}: {np.ndim(x)} dimensions, logical axes {axes}")
        return axes
    raise ValueError(f"no logical axes for parameter {name!r} (tlt_jax.parallel.sharding)")

  return jax.tree_util.tree_map_with_path(names, params)


def partition_specs(params: Any, mesh: Mesh, rules: Mapping[str, str]) -> Any:
  """PartitionSpecs of `params` on `mesh` under `rules` (logical name -> mesh axis): a
  dimension is split over its axis when the mesh has that axis (of size > 1), the axis
  divides it, and no earlier dimension of the same parameter took the axis."""

  def spec(axes, x):
    used, out = set(), []
    for dim, name in zip(np.shape(x), axes, strict=True):
      axis = rules.get(name)
      size = mesh.shape.get(axis, 1) if axis else 1
      if axis and size > 1 and dim % size == 0 and axis not in used:
        used.add(axis)
        out.append(axis)
      else:
        out.append(None)
    return P(*out)

  axes = logical_axes(params)
  return jax.tree.map(spec, axes, params, is_leaf=lambda a: isinstance(a, tuple))


def param_shardings(params: Any, mesh: Mesh, rules: Mapping[str, str]) -> Any:
  """NamedShardings of `params` on `mesh` under `rules` (see `partition_specs`)."""
  specs = partition_specs(params, mesh, rules)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))


def place(params: Any, mesh: Mesh, rules: Mapping[str, str]) -> Any:
  """`params` moved to their layout under `rules` (device to device when already placed)."""
  return jax.device_put(params, param_shardings(params, mesh, rules))

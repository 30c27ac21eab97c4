"""Meshes per role, named shardings, and multi-process start-up."""

from tlt_jax.parallel.meshes import (
  AXIS,
  BatchPlacement,
  data_mesh,
  replicated,
  rows_sharding,
)
from tlt_jax.parallel.sharding import (
  ROLLOUT_RULES,
  TRAIN_RULES,
  logical_axes,
  param_shardings,
  partition_specs,
  place,
  training_mesh,
)

__all__ = [
  "AXIS",
  "ROLLOUT_RULES",
  "TRAIN_RULES",
  "BatchPlacement",
  "data_mesh",
  "logical_axes",
  "param_shardings",
  "partition_specs",
  "place",
  "replicated",
  "rows_sharding",
  "training_mesh",
]

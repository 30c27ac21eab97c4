"""Meshes per role, named shardings, and multi-process start-up."""

from tlt_jax.parallel.meshes import (
  AXIS,
  BatchPlacement,
  RoleMeshes,
  data_mesh,
  replicated,
  rows_sharding,
)

__all__ = ["AXIS", "BatchPlacement", "RoleMeshes", "data_mesh", "replicated", "rows_sharding"]

"""Meshes per role, named shardings, and multi-process start-up."""

from tlt_jax.parallel.meshes import (
  AXIS,
  BatchPlacement,
  data_mesh,
  replicated,
  rows_sharding,
)

__all__ = ["AXIS", "BatchPlacement", "data_mesh", "replicated", "rows_sharding"]

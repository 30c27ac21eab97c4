"""Parameter checkpoints with orbax (the warm-started policy, exported pieces)."""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp
from flax import nnx

from tlt_jax.utils.trees import path_name


def save_params(path: str | os.PathLike, params: nnx.State) -> None:
  """Writes params as a pure pytree; the write is atomic (orbax finalises a tmp dir)."""
  path = os.path.abspath(os.fspath(path))
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(path, nnx.to_pure_dict(params), force=True)


def _shapes(tree) -> dict[str, tuple[int, ...]]:
  # Orbax stores integer keys (layer indices) as strings: compare by text.
  return {path_name(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def restore_params(path: str | os.PathLike, like: nnx.State) -> nnx.State:
  """Restores params saved by `save_params` into the structure and dtypes of `like`."""
  path = os.path.abspath(os.fspath(path))
  if not os.path.isdir(path):
    raise FileNotFoundError(f"no checkpoint at {path}")
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.to_pure_dict(like))
  with ocp.StandardCheckpointer() as ckpt:
    saved = ckpt.metadata(path).item_metadata
    want, have = _shapes(target), _shapes(saved)
    if want != have:
      diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
      raise ValueError(
        f"checkpoint at {path} does not match the model: "
        + "; ".join(f"{k}: checkpoint {have.get(k)}, model {want.get(k)}" for k in diff[:8])
      )
    restored = ckpt.restore(path, target)
  params = jax.tree.map(lambda x: x, like)
  nnx.replace_by_pure_dict(params, restored)
  return params

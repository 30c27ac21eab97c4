"""Draft trees for speculative decoding: the format shared by drafter and verifier.

A draft for one batch row is N nodes, N static for a compiled program:

* `tokens[b, i]`: node i's token. Node 0 is the root: the last committed token, already
  sampled but not yet run through the target.
* `parents[b, i]`: node i's parent. `parents[b, 0] == -1` and `0 <= parents[b, i] < i` for
  i > 0 (topological order). Trees may differ per row (EAGLE-2 builds them per context).
* Siblings (nodes with one parent) are ranked by index: the lower index is the higher-ranked
  draft and is tried first.
* `valid[b, i]` (optional, all True by default): False marks padding, never accepted.

The target scores all N nodes in one forward pass, with `ancestor_mask` as the attention mask
among the new tokens; node i sits at position `base_pos + depth(i)`, and the target's logits at
node i are those of the token that follows the path root..i.

Device functions here are pure jnp with no Python control flow on values (they jit and vmap);
`validate_parents` is the host-side check for arrays that come from outside.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Bool, Int


def tree_depths(parents: Int[Array, "B N"]) -> Int[Array, "B N"]:
  """Depth of every node; the root has depth 0."""
  parents = jnp.asarray(parents, jnp.int32)

  # Topological order: a node's parent is final before the node is visited.
  def visit(i, depth):
    parent = jnp.maximum(parents[:, i], 0)
    parent_depth = jnp.take_along_axis(depth, parent[:, None], axis=1)[:, 0]
    return depth.at[:, i].set(parent_depth + 1)

  return lax.fori_loop(1, parents.shape[1], visit, jnp.zeros_like(parents))


def ancestor_mask(parents: Int[Array, "B N"]) -> Bool[Array, "B N N"]:
  """`mask[b, i, j]`: node j is node i or one of its ancestors.

  This is the attention mask among the draft's tokens: node i may attend to the nodes on its
  own path from the root, and to nothing in other branches.
  """
  parents = jnp.asarray(parents, jnp.int32)
  batch, n = parents.shape
  eye = jnp.eye(n, dtype=bool)

  def visit(i, mask):
    parent = jnp.maximum(parents[:, i], 0)
    parent_row = jnp.take_along_axis(mask, parent[:, None, None], axis=1)[:, 0]
    return mask.at[:, i].set(parent_row | eye[i])

  return lax.fori_loop(1, n, visit, jnp.broadcast_to(eye, (batch, n, n)))


def node_positions(parents: Int[Array, "B N"], base_pos: Int[Array, " B"]) -> Int[Array, "B N"]:
  """Absolute position of every node: the root's position plus the node's depth."""
  return jnp.asarray(base_pos, jnp.int32)[:, None] + tree_depths(parents)


def chain_parents(depth: int) -> np.ndarray:
  """Parents of a single path root -> 1 -> ... -> depth: `[-1, 0, 1, ..., depth - 1]`."""
  if not isinstance(depth, int | np.integer) or depth < 0:
    raise ValueError(f"depth must be an int >= 0, got {depth!r}")
  return np.arange(-1, depth, dtype=np.int32)


def validate_parents(parents, valid=None) -> np.ndarray:
  """Checks a parents array (host side) and returns it as int32 `[B, N]`.

  A 1-D array is one row. With `valid`, also checks that roots are valid (the root is the
  committed token) and that every valid node's parent is valid (a node under padding could
  never be reached, which is almost surely a drafter bug).

  Raises:
    ValueError: on a wrong rank or dtype, an empty tree, a root whose parent is not -1, or a
      node whose parent is not an earlier node.
  """
  arr = np.asarray(parents)
  if arr.ndim == 1:
    arr = arr[None]
  if arr.ndim != 2:
    raise ValueError(f"parents must be [N] or [B, N], got shape {np.shape(parents)}")
  if not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"parents must hold integers, got dtype {arr.dtype}")
  if arr.shape[1] == 0:
    raise ValueError("a tree needs at least the root node (N >= 1)")
  bad_root = np.flatnonzero(arr[:, 0] != -1)
  if bad_root.size:
    b = bad_root[0]
    raise ValueError(f"row {b}: the root's parent must be -1, got {arr[b, 0]}")
  index = np.arange(arr.shape[1])
  bad = (arr[:, 1:] < 0) | (arr[:, 1:] >= index[None, 1:])
  if bad.any():
    b, i = np.argwhere(bad)[0]
    raise ValueError(
      f"row {b}, node {i + 1}: parent must be in [0, {i + 1}) (topological order), "
      f"got {arr[b, i + 1]}"
    )
  if valid is not None:
    mask = np.asarray(valid)
    if mask.ndim == 1:
      mask = mask[None]
    if mask.shape != arr.shape or mask.dtype != np.bool_:
      raise ValueError(
        f"valid must be a bool array shaped like parents {arr.shape}, got {mask.dtype} "
        f"{np.shape(valid)}"
      )
    if not mask[:, 0].all():
      raise ValueError(f"row {np.flatnonzero(~mask[:, 0])[0]}: the root must be valid")
    parent_valid = np.take_along_axis(mask, np.maximum(arr, 0), axis=1)
    orphan = mask & ~parent_valid
    if orphan.any():
      b, i = np.argwhere(orphan)[0]
      raise ValueError(f"row {b}, node {i}: valid node under invalid parent {arr[b, i]}")
  return arr.astype(np.int32)

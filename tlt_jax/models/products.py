"""The layers' matrix products (`layer_dot_general`, every `nnx.Linear` of the policy and the
drafter): a product whose activation side is a single row runs as a two-row product on GPUs.

XLA's GPU compiler rewrites a product whose one side is a single row, below some size, into
an elementwise product and a reduction, and often cannot fuse the two: the elementwise
kernel writes a weight-sized matrix that the reduction reads back (at Qwen3-8B's width the
4096 x 1024 key and value projections, not the 4096 x 4096 query; at the 50M policy's every
projection but the MLP's gate and up; experiments/RESULTS.md, 2026-12-06, "a one-row
product runs as two rows"). A drafter's step at one row is such a product in every layer.
Broadcast to two rows, the same product is a matrix product (a Triton GEMM, both copies
read from one operand) whose first row is taken: the weights are read once, nothing of
their size is written. `one_row_products` scopes the choice; "auto" pairs on a GPU only
(`platform_row_products`), elsewhere the one-row product is kept.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from tlt_jax.utils.scoped import scoped

# How a one-row product runs: "auto" (`platform_row_products`), "single" (as it is) or
# "paired" (broadcast to two rows, the first taken).
ROW_PRODUCTS = ("auto", "single", "paired")
_ROWS = contextvars.ContextVar("one_row_products", default="auto")


@contextlib.contextmanager
def one_row_products(kind: str) -> Iterator[None]:
  """Within: `layer_dot_general` runs one-row products as `kind` (one of ROW_PRODUCTS)
  says. Read when a program is traced (`rollout.pool.ExecutablePool` keys its programs by
  it): for tests and experiments that run one platform's choice on another."""
  if kind not in ROW_PRODUCTS:
    raise ValueError(f"one-row products must be one of {ROW_PRODUCTS}, got {kind!r}")
  with scoped(_ROWS, kind):
    yield


def current_row_products() -> str:
  """The `one_row_products` in force ("auto" outside one)."""
  return _ROWS.get()


def platform_row_products(platform: str) -> str:
  """What "auto" takes on `platform` (a JAX backend name): "paired" on a GPU (the module
  docstring), "single" elsewhere: XLA's CPU compiler keeps a one-row product one kernel."""
  return "paired" if platform == "gpu" else "single"


def layer_dot_general(
  lhs: jax.Array,
  rhs: jax.Array,
  dimension_numbers: Any,
  precision: Any = None,
  preferred_element_type: Any = None,
  out_sharding: Any = None,
) -> jax.Array:
  """`jax.lax.dot_general`, for `nnx.Linear(dot_general=...)`: where `lhs` (activations
  [..., K], contracted on K) holds one row and one-row products are paired, the product of
  two copies of the row, the first taken: the same values up to the GEMM's summation
  order."""
  kind = current_row_products()
  if kind == "auto":
    kind = platform_row_products(jax.default_backend())
  (lhs_contract, rhs_contract), (lhs_batch, _) = dimension_numbers
  paired = (
    kind == "paired"
    and out_sharding is None
    and not lhs_batch
    and tuple(lhs_contract) == (lhs.ndim - 1,)
    and math.prod(lhs.shape[:-1]) == 1
  )
  if not paired:
    return jax.lax.dot_general(
      lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding=out_sharding
    )
  width = lhs.shape[-1]
  rows = jnp.broadcast_to(lhs.reshape(1, width), (2, width))
  numbers = (((1,), tuple(rhs_contract)), ((), ()))
  out = jax.lax.dot_general(rows, rhs, numbers, precision, preferred_element_type)
  return out[:1].reshape(*lhs.shape[:-1], *out.shape[1:])

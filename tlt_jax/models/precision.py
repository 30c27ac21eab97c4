"""Mixed precision: parameters stored in `ModelConfig.param_dtype` (the master weights the
optimizer updates), read by every forward in the compute `dtype`.

Every forward of the policy and the drafter, in the rollout and in the update, goes through
`compute_params`, so the rollout's log-probs and the trainer's are of the same rounded
weights; gradients flow back through the cast to the master weights. The head's product
(`head_product`) sums in float32 whatever the compute dtype.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tlt_jax.models.config import ModelConfig
from tlt_jax.utils.scoped import scoped


def cast_floating(tree: Any, dtype: Any) -> Any:
  """`tree` with every floating-point leaf cast to `dtype` (others, and leaves already of
  that dtype, unchanged: no copy)."""
  dtype = jnp.dtype(dtype)

  def cast(x):
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
      return x.astype(dtype)
    return x

  return jax.tree.map(cast, tree)


def compute_params(params: Any, config: ModelConfig) -> Any:
  """The parameters as a forward reads them: floating leaves in the compute dtype."""
  return cast_floating(params, config.jnp_dtype)


def compute_model(graphdef: nnx.GraphDef, params: nnx.State) -> nnx.Module:
  """The module of `graphdef` over its parameters cast to the module's compute dtype (the
  policy `Transformer` and the `Drafter` keep their `ModelConfig` as `.config`)."""
  config = nnx.merge(graphdef, params).config
  return nnx.merge(graphdef, compute_params(params, config))


# How `head_product` multiplies: "auto" (`platform_head_precision`), "compute" (in the compute
# dtype, summed in float32) or "float32" (both sides cast to float32 first).
HEAD_PRECISIONS = ("auto", "compute", "float32")
_HEAD = contextvars.ContextVar("head_precision", default="auto")


@contextlib.contextmanager
def head_precision(kind: str) -> Iterator[None]:
  """Within: `head_product` multiplies as `kind` (one of HEAD_PRECISIONS) says. Read when a
  program is traced (`rollout.pool.ExecutablePool` keys its programs by it): for tests and
  experiments that run one platform's choice on another."""
  if kind not in HEAD_PRECISIONS:
    raise ValueError(f"head precision must be one of {HEAD_PRECISIONS}, got {kind!r}")
  with scoped(_HEAD, kind):
    yield


def current_head_precision() -> str:
  """The `head_precision` in force ("auto" outside one)."""
  return _HEAD.get()


def platform_head_precision(platform: str) -> str:
  """What "auto" takes on `platform` (a JAX backend name): float32 on a CPU, where XLA's
  bfloat16 matrix-vector product is the slower (a Qwen2.5-1.5B decode step at one row
  1.57x; experiments/RESULTS.md, 2026-12-06, "a bfloat16 policy's head"); elsewhere the
  compute dtype, as the layers' products: on a GPU a float32 head runs on the float32 path
  (TF32, or off the tensor cores at the rollout's "highest") from a float32 copy of its
  weights."""
  return "float32" if platform == "cpu" else "compute"


def head_product(hidden: jax.Array, weights: jax.Array, tied: bool, dtype: Any) -> jax.Array:
  """Float32 logits `hidden @ weights` (`weights` [V, D] when `tied`, else [D, V]) of a model
  computing in `dtype`, as `current_head_precision()` says (resolved by platform).

  "compute" multiplies in `dtype` and sums in float32: for bfloat16 values the float32
  product of the same values (bfloat16 products are exact in float32), summed in another
  order. Its backward takes the float32 cotangent with both sides in float32, as the float32
  head's does: the same gradients, and a pass over vocabulary chunks (`rl.logprobs`) sums
  each chunk's in its float32 hidden state rather than rounding each to bfloat16."""
  kind = current_head_precision()
  if kind == "auto":
    kind = platform_head_precision(jax.default_backend())
  dtype = jnp.dtype(dtype)
  if kind == "float32" or dtype == jnp.float32:
    return _head_einsum(hidden.astype(jnp.float32), weights.astype(jnp.float32), tied)
  return _low_precision_head(hidden, weights, tied, dtype)


def _head_einsum(h, w, tied):
  eq = "...d,vd->...v" if tied else "...d,dv->...v"
  return jnp.einsum(eq, h, w, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _low_precision_head(hidden, weights, tied, dtype):
  return _head_einsum(hidden.astype(dtype), weights.astype(dtype), tied)


def _low_precision_head_fwd(hidden, weights, tied, dtype):
  return _low_precision_head(hidden, weights, tied, dtype), (hidden, weights)


def _low_precision_head_bwd(tied, dtype, residuals, cotangent):
  hidden, weights = residuals
  h, w, g = hidden.astype(jnp.float32), weights.astype(jnp.float32), cotangent
  if tied:  # w [V, D]
    dh = jnp.einsum("...v,vd->...d", g, w)
    dw = jnp.einsum("...v,...d->vd", g, h)
  else:  # w [D, V]
    dh = jnp.einsum("...v,dv->...d", g, w)
    dw = jnp.einsum("...d,...v->dv", h, g)
  return dh.astype(hidden.dtype), dw.astype(weights.dtype)


_low_precision_head.defvjp(_low_precision_head_fwd, _low_precision_head_bwd)

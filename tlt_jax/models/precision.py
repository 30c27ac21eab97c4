"""Mixed precision: parameters stored in `ModelConfig.param_dtype` (the master weights the
optimizer updates), read by every forward in the compute `dtype`.

Every forward of the policy and the drafter, in the rollout and in the update, goes through
`compute_params`, so the rollout's log-probs and the trainer's are of the same rounded
weights; gradients flow back through the cast to the master weights.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tlt_jax.models.config import ModelConfig


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

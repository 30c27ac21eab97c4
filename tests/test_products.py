"""The layers' one-row products (`models.products`): paired on GPUs, the same values."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import TINY_UNTIED

from tlt_jax.models.drafter import drafter_forward, init_drafter, init_drafter_cache
from tlt_jax.models.products import (
  current_row_products,
  layer_dot_general,
  one_row_products,
  platform_row_products,
)
from tlt_jax.models.transformer import KVCache, init_model


def _dot_lhs_rows(fn, *args) -> list[int]:
  """The activation rows of every product without batch dimensions `fn` traces (each
  dot_general's left side, its dimensions before the last multiplied out), in order:
  projections and heads, not attention's products."""
  rows = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general" and not eqn.params["dimension_numbers"][1][0]:
        rows.append(int(np.prod(eqn.invars[0].aval.shape[:-1])))
    for sub in jax.extend.core.subjaxprs(jaxpr):
      walk(sub)

  walk(jax.make_jaxpr(lambda *a: fn(*a))(*args).jaxpr)  # traced anew: JAX caches by function
  return rows


def test_a_one_row_product_runs_as_two_rows_only_where_paired():
  """Paired, a one-row product multiplies two copies of the row and keeps the first: the
  product's value up to summation order; a product of more rows, or one under "single",
  is left as it is."""
  linear = nnx.Linear(48, 24, use_bias=True, dot_general=layer_dot_general, rngs=nnx.Rngs(0))
  nnx.update(linear, jax.tree.map(lambda x: x + 0.1, nnx.state(linear)))  # a bias that counts
  one = jax.random.normal(jax.random.key(1), (1, 1, 48))
  many = jax.random.normal(jax.random.key(2), (2, 3, 48))
  plain = lambda x: x @ linear.kernel[...] + linear.bias[...]
  for kind, paired_rows in (("paired", [2]), ("single", [1])):
    with one_row_products(kind):
      assert _dot_lhs_rows(linear, one) == paired_rows
      assert _dot_lhs_rows(linear, many) == [6]
      out = jax.jit(lambda x: linear(x))(one)
      assert out.shape == (1, 1, 24)
      np.testing.assert_allclose(out, plain(one), rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(linear(many), plain(many), rtol=1e-6, atol=1e-6)


def test_auto_pairs_on_gpus_only():
  assert platform_row_products("gpu") == "paired"
  assert platform_row_products("cpu") == platform_row_products("tpu") == "single"
  assert current_row_products() == "auto"
  with one_row_products("single"):
    assert current_row_products() == "single"
  assert current_row_products() == "auto"
  with pytest.raises(ValueError, match="one-row products"), one_row_products("twice"):
    pass
  # "auto" on this CPU: as "single".
  linear = nnx.Linear(8, 4, dot_general=layer_dot_general, rngs=nnx.Rngs(0))
  assert _dot_lhs_rows(linear, jnp.ones((1, 8))) == [1]


def test_the_policys_and_drafters_one_row_steps_pair_every_layer_product():
  """At one row and one token every projection of the policy's layers and of the drafter
  (its fc and layer) runs as two rows when paired; the head's product is the head's own
  (`precision.head_product`). The step's logits and hidden states are the unpaired
  step's, up to summation order."""
  cfg = TINY_UNTIED
  model, drafter = init_model(cfg, seed=0), init_drafter(cfg, seed=1)
  graphdef, params = nnx.split(model)
  dgraph, dparams = nnx.split(drafter)
  tokens, positions = jnp.array([[5]]), jnp.array([[3]])
  cache, dcache = KVCache.zeros(cfg, 1, 8), init_drafter_cache(cfg, 1, 8)
  length = jnp.array([3])

  def policy(params):
    m = nnx.merge(graphdef, params)
    h, _, _ = m(tokens, positions, cache=cache, cache_len=length, view_len=8)
    return h, m.logits(h)

  def draft(dparams):
    feature = jnp.ones((1, 1, cfg.d_model))
    h, _ = drafter_forward(
      dgraph,
      dparams,
      graphdef,
      params,
      tokens,
      feature,
      positions,
      cache=dcache,
      cache_len=length,
      view_len=8,
    )
    return h

  layers = 7 * cfg.num_layers  # q, k, v, o, gate, up, down
  out = {}
  for kind, rows in (("single", 1), ("paired", 2)):
    with one_row_products(kind):
      assert _dot_lhs_rows(policy, params) == [rows] * layers + [1]  # the head last
      assert _dot_lhs_rows(draft, dparams) == [rows] * 8  # fc and the layer's seven
      out[kind] = (jax.jit(lambda p: policy(p))(params), jax.jit(lambda p: draft(p))(dparams))
  for a, b in zip(jax.tree.leaves(out["single"]), jax.tree.leaves(out["paired"]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

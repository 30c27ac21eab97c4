"""XLA:CPU's library fusions chosen per program (`utils.cpu_fusions`)."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.utils.cpu_fusions import CPU_FUSIONS, checked_cpu_fusions, compiler_options


def _ynn_roots(setting: str) -> list[str]:
  """The root op of every YNNPACK fusion in a small program (a product, then a softmax and
  a norm's reductions) compiled under `setting`."""

  def program(x, w):
    y = jax.nn.softmax(x @ w, axis=-1)
    return y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + 1e-6)

  x = jnp.ones((64, 128))
  w = jnp.ones((128, 256))
  text = jax.jit(program, compiler_options=compiler_options(setting)).lower(x, w).compile()
  text = text.as_text()
  called = re.findall(r"calls=%([\w.\-]+),[^\n]*__ynn_fusion", text)
  roots = []
  for name in called:
    body = re.search(rf"^%{re.escape(name)} .*?^}}", text, re.M | re.S).group(0)
    roots.append(re.search(r"ROOT \S+ = \S+ ([\w\-]+)\(", body).group(1))
  return roots


def test_dots_setting_hands_only_the_products_to_the_library():
  """Under "dots" every YNNPACK fusion is a product (XLA emits the softmax and the norm);
  under "xla" nothing is passed, so XLA's default list applies."""
  assert compiler_options("xla") == {}
  assert compiler_options("dots")  # this jaxlib knows the option
  roots = _ynn_roots("dots")
  assert roots and set(roots) == {"dot"}, roots


def test_settings_are_checked():
  assert all(checked_cpu_fusions(s) == s for s in CPU_FUSIONS)
  with pytest.raises(ValueError, match="cpu_fusions must be one of"):
    compiler_options("dot")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_single_row_decode_fusions_keep_the_tokens(temperature):
  """A one-row rollout whose plain decode chunk compiles with YNNPACK for its products only
  (EngineConfig.single_row_fusions "dots", the default) samples the tokens XLA's default
  fusions do, with the same log-probs up to float rounding."""
  model = ModelConfig(
    vocab_size=40, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64
  )
  graphdef, params = nnx.split(init_model(model, seed=3))
  base = EngineConfig(
    max_prompt_len=6,
    max_new_tokens=24,
    max_batch=1,
    chunk_steps=8,
    min_cache_bucket=32,
    min_prompt_bucket=8,
    capture_hidden=False,
  )
  sampling = SamplingConfig(temperature=temperature)
  out = {}
  for setting in CPU_FUSIONS:
    cfg = dataclasses.replace(base, single_row_fusions=setting)
    engine = RolloutEngine(graphdef, model, cfg, sampling)
    out[setting] = engine.generate(params, [[1, 2, 3]], num_samples=1, key=5)
  np.testing.assert_array_equal(out["dots"].tokens, out["xla"].tokens)
  np.testing.assert_allclose(out["dots"].logprobs, out["xla"].logprobs, atol=1e-5)
  assert int(out["dots"].length[0]) > 10  # it decoded
  with pytest.raises(ValueError, match="cpu_fusions"):
    dataclasses.replace(base, single_row_fusions="reduce")

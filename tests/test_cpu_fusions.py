"""XLA:CPU's library fusions chosen per program (`utils.cpu_fusions`)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

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

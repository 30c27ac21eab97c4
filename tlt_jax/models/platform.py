"""A platform's trace-time choices in one scope: what "auto" takes on a GPU, a TPU or a CPU
for attention's form (`attention.platform_form`), the head's precision
(`precision.platform_head_precision`) and the layers' one-row products
(`products.platform_row_products`), whichever backend traces. For tracing one platform's
programs on another: a GPU's compiled on a CPU host (experiments/deviceless.py), or run
there by a test. The engine's one-row step is an engine setting (`EngineConfig.one_row_step`),
named on the engine instead."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tlt_jax.models.attention import attention_form, platform_form
from tlt_jax.models.precision import head_precision, platform_head_precision
from tlt_jax.models.products import one_row_products, platform_row_products


@contextlib.contextmanager
def platform_choices(platform: str) -> Iterator[None]:
  """Within: programs trace what "auto" takes on `platform` (a JAX backend name)."""
  with (
    attention_form(platform_form(platform)),
    head_precision(platform_head_precision(platform)),
    one_row_products(platform_row_products(platform)),
  ):
    yield

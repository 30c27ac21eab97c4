"""ExecutablePool: programs are keyed by what they were traced under."""

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.models import transformer
from tlt_jax.models.transformer import cache_mask
from tlt_jax.rollout.pool import ExecutablePool


def test_attention_form_switch_recompiles(monkeypatch):
  # transformer._ATTENTION_FORM is read at trace time: a program compiled under one form
  # must not be handed back under another.
  b, t, h, kv, s, e = 2, 3, 4, 2, 16, 8
  ks = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(ks[0], (b, t, h, e), jnp.bfloat16)
  k, v = (jax.random.normal(x, (b, kv, s, e), jnp.bfloat16) for x in ks[1:])
  args = (q, k, v, cache_mask(jnp.array([4, 11]), t, s))
  dots = np.asarray(jax.jit(transformer._attend_dots)(*args), np.float32)
  reduce = np.asarray(jax.jit(transformer._attend_reduce)(*args), np.float32)
  assert not np.array_equal(dots, reduce)  # bf16: the forms' results tell them apart

  pool = ExecutablePool()
  monkeypatch.setattr(transformer, "_ATTENTION_FORM", "dots")
  exe = pool.get(("attend",), transformer.attend, args)
  np.testing.assert_array_equal(np.asarray(exe(*args), np.float32), dots)
  assert pool.get(("attend",), transformer.attend, args) is exe  # same form: reused
  assert pool.compiles == 1 and ("attend",) in pool

  monkeypatch.setattr(transformer, "_ATTENTION_FORM", "reduce")
  seconds = pool.compile_seconds
  exe2 = pool.get(("attend",), transformer.attend, args)
  assert pool.compiles == 2 and pool.compile_seconds > seconds and len(pool) == 2
  # Traced anew: JAX's own trace cache (keyed by the function) must not serve the dots.
  np.testing.assert_array_equal(np.asarray(exe2(*args), np.float32), reduce)
  assert ("attend",) in pool
  assert {r["attention_form"] for r in pool.summary()} == {"dots", "reduce"}

  # Switching back hands back the first program, uncompiled.
  monkeypatch.setattr(transformer, "_ATTENTION_FORM", "dots")
  assert pool.get(("attend",), transformer.attend, args) is exe and pool.compiles == 2

"""ExecutablePool: programs are keyed by what they were traced under."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tlt_jax.models import attention
from tlt_jax.models.attention import cache_mask
from tlt_jax.models.precision import head_precision, head_product
from tlt_jax.models.products import layer_dot_general, one_row_products
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.utils.cpu_fusions import compiler_options


def test_attention_form_switch_recompiles():
  # attention.attention_form is read at trace time: a program compiled under one form
  # must not be handed back under another.
  b, t, h, kv, s, e = 2, 3, 4, 2, 16, 8
  ks = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(ks[0], (b, t, h, e), jnp.bfloat16)
  k, v = (jax.random.normal(x, (b, kv, s, e), jnp.bfloat16) for x in ks[1:])
  args = (q, k, v, cache_mask(jnp.array([4, 11]), t, s))
  dots = np.asarray(jax.jit(attention.attend_dots)(*args), np.float32)
  reduce = np.asarray(jax.jit(attention.attend_reduce)(*args), np.float32)
  assert not np.array_equal(dots, reduce)  # bf16: the forms' results tell them apart

  pool = ExecutablePool()
  with attention.attention_form("dots"):
    exe = pool.get(("attend",), attention.attend, args)
    np.testing.assert_array_equal(np.asarray(exe(*args), np.float32), dots)
    assert pool.get(("attend",), attention.attend, args) is exe  # same form: reused
    assert pool.compiles == 1 and ("attend",) in pool

  with attention.attention_form("reduce"):
    seconds = pool.compile_seconds
    exe2 = pool.get(("attend",), attention.attend, args)
    assert pool.compiles == 2 and pool.compile_seconds > seconds and len(pool) == 2
    # Traced anew: JAX's own trace cache (keyed by the function) must not serve the dots.
    np.testing.assert_array_equal(np.asarray(exe2(*args), np.float32), reduce)
    assert ("attend",) in pool
  assert {r["attention_form"] for r in pool.summary()} == {"dots", "reduce"}

  # Switching back hands back the first program, uncompiled.
  with attention.attention_form("dots"):
    assert pool.get(("attend",), attention.attend, args) is exe and pool.compiles == 2


def test_head_precision_switch_recompiles():
  """`precision.head_precision` is read at trace time too: a program traced under one is
  never handed back under another, and switching back reuses the first."""
  h = jnp.ones((3, 16), jnp.bfloat16)
  w = jnp.ones((16, 40), jnp.bfloat16)
  args = (h, w)
  head = lambda h, w: head_product(h, w, False, jnp.bfloat16)
  pool = ExecutablePool()
  with head_precision("float32"):
    exe = pool.get(("head",), head, args)
  with head_precision("compute"):
    exe2 = pool.get(("head",), head, args)
    assert exe2 is not exe and pool.compiles == 2
  with head_precision("float32"):
    assert pool.get(("head",), head, args) is exe and pool.compiles == 2


def test_one_row_products_switch_recompiles():
  """`products.one_row_products` is read at trace time too: the paired program is never
  handed back unpaired."""
  linear = nnx.Linear(16, 8, dot_general=layer_dot_general, rngs=nnx.Rngs(0))
  args = (nnx.state(linear), jnp.ones((1, 16)))
  graphdef = nnx.graphdef(linear)
  project = lambda state, x: nnx.merge(graphdef, state)(x)
  pool = ExecutablePool()
  with one_row_products("single"):
    exe = pool.get(("project",), project, args)
    assert "2,16" not in exe.as_text()
  with one_row_products("paired"):
    exe2 = pool.get(("project",), project, args)
    assert exe2 is not exe and pool.compiles == 2 and "2,16" in exe2.as_text()
  with one_row_products("single"):
    assert pool.get(("project",), project, args) is exe and pool.compiles == 2


def test_compiling_ahead_overlaps_compiles_and_pools_them():
  # Inside: a miss answers at once with a stand-in (zeros of the outputs' shapes, keys
  # too) that a later lowering can take; on leaving, every program is compiled and pooled.
  def step(x, key):
    return x * 2 + 1, jax.random.split(key)[0]

  def double(x):
    return x * 2

  pool = ExecutablePool()
  x, key = jnp.arange(6.0).reshape(2, 3), jax.random.key(1)
  with pool.compiling_ahead(workers=2):
    stand_in = pool.get(("step",), step, (x, key))
    y, k2 = stand_in(x, key)
    assert pool.compiles == 0 and len(pool) == 0  # nothing pooled yet
    assert y.shape == (2, 3) and not y.any() and k2.dtype == key.dtype
    assert pool.get(("step",), step, (x, key)) is stand_in  # one compile per key
    pool.get(("double",), double, (y,))  # fed by the stand-in's outputs
  assert pool.compiles == 2 and len(pool) == 2 and pool.compile_seconds > 0
  exe = pool.get(("step",), step, (x, key))
  out, _ = exe(x, key)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 2 + 1)
  assert pool.compiles == 2  # handed back, not compiled again
  np.testing.assert_array_equal(np.asarray(pool.get(("double",), double, (x,))(x)), x * 2)

  # One worker: an ordinary pool (misses compile in `get`).
  with pool.compiling_ahead(workers=1):
    exe3 = pool.get(("triple",), lambda v: v * 3, (x,))
    assert pool.compiles == 3
    np.testing.assert_array_equal(np.asarray(exe3(x)), np.asarray(x) * 3)


def test_programs_are_keyed_by_argument_dtypes():
  # As jax.jit does: the same key over bfloat16 and float32 arguments is two programs (an
  # executable refuses arguments of other types than it was compiled for).
  pool = ExecutablePool()
  f32 = jnp.arange(4.0)
  bf16 = f32.astype(jnp.bfloat16)
  a = pool.get(("double",), lambda v: v * 2, (f32,))
  b = pool.get(("double",), lambda v: v * 2, (bf16,))
  assert a is not b and pool.compiles == 2
  assert b(bf16).dtype == jnp.bfloat16 and a(f32).dtype == jnp.float32
  assert pool.get(("double",), lambda v: v * 2, (f32 + 1,)) is a  # same types: reused


def test_programs_are_keyed_by_compiler_options():
  # A program compiled under other XLA options (utils.cpu_fusions) is another executable,
  # compiled with them.
  pool = ExecutablePool()
  x = jnp.ones((64, 128))
  fn = lambda v: jax.nn.softmax(v @ v.T, axis=-1)  # noqa: E731
  plain = pool.get(("softmax",), fn, (x,))
  dots = pool.get(("softmax",), fn, (x,), compiler_options=compiler_options("dots"))
  assert plain is not dots and pool.compiles == 2
  assert pool.get(("softmax",), fn, (x,), compiler_options=compiler_options("dots")) is dots
  np.testing.assert_allclose(np.asarray(dots(x)), np.asarray(plain(x)), rtol=1e-5)
  assert "__ynn_fusion" in dots.as_text()  # the products still go to YNNPACK


def test_first_runs_count_each_executables_first_call_and_no_background_ask():
  """`first_runs`: one per executable handed out for its first call (a recompile after an
  eviction counts again); asking for a held program with `on_miss="background"` runs
  nothing and counts no call."""
  x = jnp.ones((4,), jnp.float32)
  double, square = (lambda v: 2 * v), (lambda v: v * v)
  pool = ExecutablePool(max_executables=1)
  pool.get(("double",), double, (x,))
  assert pool.first_runs == 1
  pool.get(("double",), double, (x,))
  assert pool.first_runs == 1  # its second call
  assert pool.get(("double",), double, (x,), on_miss="background") is not None
  assert pool.first_runs == 1 and pool.summary()[0]["calls"] == 2
  pool.get(("square",), square, (x,))  # evicts double (one executable at most)
  pool.get(("double",), double, (x,))  # compiled again: a first run again
  assert pool.first_runs == 3 and pool.evictions == 2

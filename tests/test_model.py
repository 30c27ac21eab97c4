"""Policy model: cached decode equals the full forward, in every mode."""

import contextlib
import functools
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cudnn_standin import documented_cudnn
from flax import nnx

from tlt_jax.models.attention import (
  attend,
  attend_causal,
  cache_mask,
  full_mask,
  key_window,
  key_windows,
  rematerialised_blocks,
)
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import KVCache, init_model

BASE = dict(
  vocab_size=61, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48
)


class _Jitted:
  """The model with its forward compiled whole: op-by-op eager calls cost ~10 s each here."""

  def __init__(self, model):
    graphdef, self.state = nnx.split(model)
    self.logits = model.logits
    self.fn = jax.jit(
      lambda state, *a, **k: nnx.merge(graphdef, state)(*a, **k),
      static_argnames=("view_len", "return_layers", "remat", "scan"),
    )

  def __call__(self, *args, **kwargs):
    return self.fn(self.state, *args, **kwargs)


def _model(cfg, seed=0):
  return _Jitted(init_model(cfg, seed=seed))


def _full_logits(model, tokens):
  b, t = tokens.shape
  hidden, _, _ = model(tokens, jnp.broadcast_to(jnp.arange(t), (b, t)))
  return model.logits(hidden), hidden


@pytest.mark.parametrize(
  "extra",
  [
    {},
    {"qkv_bias": True},
    {"tie_embeddings": False},
    {"num_kv_heads": 4},
    {"num_kv_heads": 1, "rope_theta": 1e6},
    {"qk_norm": True, "rope_type": "llama3", "rope_factor": 8.0, "rope_original_max_position": 8},
  ],
)
@pytest.mark.parametrize("rows", [3, 1])  # one row writes its cache without a scatter
def test_cached_prefill_decode_and_extend_match_full_forward(extra, rows):
  cfg = ModelConfig(**{**BASE, **extra})
  model = _model(cfg, seed=1)
  tokens = jax.random.randint(jax.random.key(0), (3, 12), 0, cfg.vocab_size)[:rows]
  full, full_hidden = _full_logits(model, tokens)
  # Rows start at different lengths: prefill 5, then decode 1 token at a time
  # for row-specific offsets, then a 3-token extend.
  cache = KVCache.zeros(cfg, rows, 16)
  pos = jnp.broadcast_to(jnp.arange(5), (rows, 5))
  h, cache, _ = model(tokens[:, :5], pos, cache=cache, cache_len=jnp.zeros(rows, jnp.int32))
  np.testing.assert_allclose(model.logits(h), full[:, :5], atol=1e-5)
  np.testing.assert_allclose(h, full_hidden[:, :5], atol=1e-5)
  for t in range(5, 9):
    h, cache, _ = model(
      tokens[:, t : t + 1],
      jnp.full((rows, 1), t),
      cache=cache,
      cache_len=jnp.full((rows,), t, jnp.int32),
      view_len=12,
    )
    np.testing.assert_allclose(model.logits(h)[:, 0], full[:, t], atol=1e-5)
  h, cache, _ = model(
    tokens[:, 9:12],
    jnp.broadcast_to(jnp.arange(9, 12), (rows, 3)),
    cache=cache,
    cache_len=jnp.full((rows,), 9, jnp.int32),
  )
  np.testing.assert_allclose(model.logits(h), full[:, 9:12], atol=1e-5)


def test_per_row_cache_lengths_are_independent():
  cfg = ModelConfig(**BASE)
  model = _model(cfg)
  a = jax.random.randint(jax.random.key(1), (1, 9), 0, cfg.vocab_size)
  b = jax.random.randint(jax.random.key(2), (1, 4), 0, cfg.vocab_size)
  full_a, _ = _full_logits(model, a)
  full_b, _ = _full_logits(model, b)
  cache = KVCache.zeros(cfg, 2, 16)
  # Prefill row 0 with 8 tokens and row 1 with 3 (right-padded), then decode
  # one token per row at its own length.
  prompts = jnp.zeros((2, 8), jnp.int32).at[0].set(a[0, :8]).at[1, :3].set(b[0, :3])
  _, cache, _ = model(
    prompts, jnp.broadcast_to(jnp.arange(8), (2, 8)), cache=cache, cache_len=jnp.zeros(2, jnp.int32)
  )
  step = jnp.array([[a[0, 8]], [b[0, 3]]])
  lens = jnp.array([8, 3])
  h, _, _ = model(step, lens[:, None], cache=cache, cache_len=lens)
  logits = model.logits(h)[:, 0]
  np.testing.assert_allclose(logits[0], full_a[0, 8], atol=1e-5)
  np.testing.assert_allclose(logits[1], full_b[0, 3], atol=1e-5)


def test_packed_segments_do_not_attend_to_each_other():
  cfg = ModelConfig(**BASE)
  model = _model(cfg)
  a = jax.random.randint(jax.random.key(3), (1, 5), 0, cfg.vocab_size)
  b = jax.random.randint(jax.random.key(4), (1, 6), 0, cfg.vocab_size)
  packed = jnp.concatenate([a, b], axis=1)
  positions = jnp.concatenate([jnp.arange(5), jnp.arange(6)])[None]
  seg = jnp.array([[1] * 5 + [2] * 6])
  h, _, _ = model(packed, positions, segment_ids=seg)
  np.testing.assert_allclose(model.logits(h)[:, :5], _full_logits(model, a)[0], atol=1e-5)
  np.testing.assert_allclose(model.logits(h)[:, 5:], _full_logits(model, b)[0], atol=1e-5)


def test_blocked_causal_attention_matches_dense_in_values_and_gradients():
  # 300 tokens: two full query blocks and a partial one; packed segments and right padding.
  b, t, h, kv, e = 2, 300, 4, 2, 8
  ks = jax.random.split(jax.random.key(5), 4)
  q = jax.random.normal(ks[0], (b, t, h, e))
  k, v = (jax.random.normal(x, (b, kv, t, e)) for x in ks[1:3])
  seg = jnp.cumsum(jax.random.bernoulli(ks[3], 0.02, (b, t)), axis=1) + 1
  valid = jnp.arange(t)[None] < jnp.array([[t], [t - 37]])
  mask = full_mask(valid, seg)
  w = valid[:, :, None, None]  # padded query rows are garbage in both

  @jax.jit
  def outputs_and_grads(q, k, v):
    def run(fn):
      f = lambda q, k, v: jnp.where(w, fn(q, k, v, mask), 0.0)
      return f(q, k, v), jax.grad(lambda *a: jnp.sum(f(*a) ** 2), (0, 1, 2))(q, k, v)

    return run(attend), run(attend_causal)

  (dense, g_dense), (blocked, g_block) = outputs_and_grads(q, k, v)
  np.testing.assert_allclose(blocked, dense, atol=1e-5)
  for gd, gb in zip(g_dense, g_block, strict=True):
    np.testing.assert_allclose(gb, gd, atol=1e-4)


def test_rematerialised_blocks_keep_values_and_gradients():
  """Under `rematerialised_blocks` each query block of the causal path is one
  rematerialised call (its scores recomputed in the backward pass, not kept: what that
  saves is XLA's to say, for a GPU in experiments/deviceless.py), and the output and
  gradients are unchanged."""
  b, t, h, kv, e = 2, 512, 4, 2, 16
  ks = jax.random.split(jax.random.key(9), 3)
  q = jax.random.normal(ks[0], (b, t, h, e))
  k, v = (jax.random.normal(x, (b, kv, t, e)) for x in ks[1:])
  mask = full_mask(jnp.ones((b, t), bool), jnp.ones((b, t), jnp.int32))

  def grads(remat: bool):
    loss = lambda q, k, v: jnp.sum(jnp.sin(attend_causal(q, k, v, mask, block=32)))  # noqa: E731
    with rematerialised_blocks() if remat else contextlib.nullcontext():
      calls = [x.primitive.name for x in jax.make_jaxpr(loss)(q, k, v).eqns]
      fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
      return fn(q, k, v), sum(name in ("remat2", "checkpoint") for name in calls)

  (lp, gp), plain = grads(False)
  (lr, gr), remat = grads(True)
  assert (plain, remat) == (0, t // 32)
  np.testing.assert_allclose(lr, lp, rtol=1e-6)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), gr, gp)


def test_causal_block_is_a_parameter_or_a_scoped_setting():
  from tlt_jax.models import attention

  b, t, h, kv, e = 1, 40, 2, 1, 8
  ks = jax.random.split(jax.random.key(6), 3)
  q = jax.random.normal(ks[0], (b, t, h, e))
  k, v = (jax.random.normal(x, (b, kv, t, e)) for x in ks[1:])
  mask = full_mask(jnp.ones((b, t), bool), jnp.ones((b, t), jnp.int32))
  dense = attend(q, k, v, mask)
  np.testing.assert_allclose(attend_causal(q, k, v, mask, block=16), dense, atol=1e-5)
  with attention.causal_block(8):
    assert attention.current_causal_block() == 8
    np.testing.assert_allclose(attend_causal(q, k, v, mask), dense, atol=1e-5)
  assert attention.current_causal_block() == 128
  with pytest.raises(ValueError, match="causal block"), attention.causal_block(0):
    pass


def _packed_segments(lengths, width):
  """[1, width] segment ids of samples of `lengths` side by side, then padding (0)."""
  seg = np.zeros((1, width), np.int32)
  start = 0
  for n, length in enumerate(lengths):
    seg[0, start : start + length] = n + 1
    start += length
  return jnp.asarray(seg)


def test_padding_sees_only_itself_and_samples_only_their_own_segment():
  seg = _packed_segments([3, 2], 8)  # columns 5-7 are padding
  mask = np.asarray(full_mask(jnp.ones((1, 8), bool), seg))[0]
  assert mask[4].tolist() == [False] * 3 + [True, True] + [False] * 3
  for i in range(5, 8):
    assert mask[i].tolist() == [j == i for j in range(8)]


def test_key_window_is_the_narrowest_span_holding_every_visible_key():
  mask = full_mask(jnp.ones((1, 64), bool), _packed_segments([40, 10, 5], 64))
  # Queries 48-63 (the 10-token sample from 40, the 5 from 50, padding): keys from 40 on.
  block = mask[:, 48:64, :64]
  assert int(key_window(block, [8, 16, 24, 32])) == 2  # 24 = 64 - 40
  assert int(key_window(block, [8, 16])) == 2  # none holds them: all 64 keys
  # Queries 32-47 sit in the 40-token sample from 0: only all 48 keys hold them.
  assert int(key_window(mask[:, 32:48, :48], [16, 32])) == 2
  # A query that sees no key does not count.
  blind = block.at[:, 0].set(False)
  assert int(key_window(blind, [8, 16, 24])) == 2
  # Blind to 48-51: the 5-token sample from 50 reaches furthest back (14 keys), then padding
  # (each column sees only itself).
  assert int(key_window(block.at[:, :4].set(False), [8, 16, 24])) == 1
  assert int(key_window(block.at[:, :10].set(False), [8, 16, 24])) == 0


def test_key_windows_match_dense_attention_in_values_and_gradients():
  # 300 columns of short samples around two long ones, then padding: query blocks of 32
  # take every branch, from the narrowest window to all keys.
  lengths = [90, 7, 30, 12, 5, 41, 3, 64, 20]
  b, t, h, kv, e = 1, 300, 4, 2, 8
  ks = jax.random.split(jax.random.key(7), 3)
  q = jax.random.normal(ks[0], (b, t, h, e))
  k, v = (jax.random.normal(x, (b, kv, t, e)) for x in ks[1:3])
  seg = _packed_segments(lengths, t)
  mask = full_mask(jnp.ones((b, t), bool), seg)
  w = (seg > 0)[:, :, None, None]  # padding outputs are never read

  def run(fn):
    f = lambda q, k, v: jnp.where(w, fn(q, k, v, mask), 0.0)
    return f(q, k, v), jax.grad(lambda *a: jnp.sum(f(*a) ** 2), (0, 1, 2))(q, k, v)

  def windowed(*args):
    with key_windows([32, 64, 128]):
      return attend_causal(*args, block=32)

  dense, g_dense = jax.jit(lambda: run(attend))()
  got, g_got = jax.jit(lambda: run(windowed))()
  np.testing.assert_allclose(got, dense, atol=1e-5)
  for gd, gg in zip(g_dense, g_got, strict=True):
    np.testing.assert_allclose(gg, gd, atol=1e-4)
  taken = set()  # the keys each block read, as attend_causal picks them
  for s in range(0, t, 32):
    end = min(s + 32, t)
    widths = [w for w in (32, 64, 128) if end - s <= w < end]
    i = int(key_window(mask[:, s:end, :end], widths)) if widths else 0
    taken.add(widths[i] if i < len(widths) else "all")
  assert taken == {32, 64, 128, "all"}


def test_key_windows_are_a_scoped_setting_of_positive_ints():
  from tlt_jax.models import attention

  assert attention.current_key_windows() == ()
  with key_windows([512, 256, 256]):
    assert attention.current_key_windows() == (256, 512)
  assert attention.current_key_windows() == ()
  for bad in ([0], [1.5], "256", 256):
    with pytest.raises(ValueError, match="key_windows"), key_windows(bad):
      pass


def _reference_attention(q, k, v, mask):
  """Per (row, token, head) softmax attention in float64 numpy: the forms' common truth."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, t, h, e = q.shape
  g = h // k.shape[1]
  out = np.zeros_like(q)
  for i, j, hh in np.ndindex(b, t, h):
    scores = k[i, hh // g] @ q[i, j, hh] / np.sqrt(e)
    scores = np.where(mask[i, j], scores, -np.inf)
    p = np.exp(scores - scores.max())
    out[i, j, hh] = (p / p.sum()) @ v[i, hh // g]
  return out


@pytest.mark.parametrize("form", ["attend_dots", "attend_reduce", "attend_cudnn"])
@pytest.mark.parametrize("t", [1, 5])
def test_attention_forms_match_a_reference(form, t):
  # Decode / verification shapes with per-row visible prefixes, grouped query heads, f32 and
  # a bf16 cache; cuDNN's call as its module documents it (`cudnn_standin`).
  from tlt_jax.models import attention

  b, h, kv, s, e = 4, 8, 2, 40, 16
  ks = jax.random.split(jax.random.key(7), 3)
  q = jax.random.normal(ks[0], (b, t, h, e))
  k, v = (jax.random.normal(x, (b, kv, s, e)) for x in ks[1:])
  mask = cache_mask(jnp.array([0, 9, 17, 30]), t, s)
  fn = jax.jit(getattr(attention, form))
  if form == "attend_cudnn":
    fn = jax.jit(functools.partial(attention.attend_cudnn, cudnn=documented_cudnn()))
  for dtype, atol in ((jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)):
    args = (q.astype(dtype), k.astype(dtype), v.astype(dtype))
    got = fn(*args, mask)
    assert got.dtype == dtype
    want = _reference_attention(*(np.asarray(x, np.float32) for x in args), np.asarray(mask))
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=atol)
  # Row 0's first token sees one slot: its output is that slot's value row, for every head
  # of the group.
  np.testing.assert_allclose(got[0, 0, :2].astype(jnp.float32), v[0, 0, :1].repeat(2, 0), atol=3e-2)


def test_attention_form_rule():
  from tlt_jax.models.attention import reduces

  # Multiply-reduce: one token over many rows, a few tokens over two or more.
  assert reduces(16, 1) and reduces(128, 1) and reduces(2, 5) and reduces(32, 31)
  # Dots: one token over few rows, any few tokens of one row, and full sequences (SFT,
  # log-probs, prefill).
  assert not reduces(1, 1) and not reduces(8, 1) and not reduces(1, 17)
  assert not reduces(16, 32) and not reduces(16, 448)


def test_auto_attention_on_a_gpu_takes_the_dots(monkeypatch):
  from tlt_jax.models import attention

  assert attention.platform_form("gpu") == "dots"
  assert attention.platform_form("cpu") == attention.platform_form("tpu") == "auto"
  monkeypatch.setattr(attention.jax, "default_backend", lambda: "gpu")
  assert not any(attention.reduces(b, t) for b in (1, 2, 16, 128) for t in (1, 5, 31))
  with attention.attention_form("reduce"):  # a set form still wins
    assert attention.reduces(2, 5)


def test_unknown_attention_form_is_an_error():
  from tlt_jax.models import attention

  # A typo must not time the dots.
  with pytest.raises(ValueError, match="attention form"), attention.attention_form("dot"):
    pass
  with pytest.raises(ValueError, match="attention form"):
    attention.reduces(1, 1, form="dot")
  assert attention.current_attention_form() == "auto"
  with attention.attention_form("reduce"):
    assert attention.reduces(1, 1) and attention.current_attention_form() == "reduce"
  assert attention.current_attention_form() == "auto" and not attention.reduces(1, 1)


def test_fused_attention_runs_cudnn_where_the_program_runs_on_a_gpu(monkeypatch):
  """Under "fused", `attend` calls cuDNN in a program lowered for CUDA and runs the dots in
  one lowered for a CPU: the same values and gradients as the dots here. Float32 operands
  and shapes cuDNN refuses take the dots everywhere, and so does a JAX that cannot reach
  cuDNN (no CUDA plugin: this project's own environment)."""
  from tlt_jax.models import attention

  calls = []
  monkeypatch.setattr(attention, "cudnn_module", lambda: documented_cudnn(calls))
  ks = jax.random.split(jax.random.key(3), 3)
  q = jax.random.normal(ks[0], (2, 5, 8, 16), jnp.bfloat16)
  k, v = (jax.random.normal(x, (2, 2, 24, 16), jnp.bfloat16) for x in ks[1:])
  mask = cache_mask(jnp.array([3, 12]), 5, 24)
  # A fresh function each time: jax reuses a traced function's program.
  fused = lambda: lambda q, k, v: attention.attend(q, k, v, mask, form="fused")
  dots = lambda q, k, v: attention.attend_dots(q, k, v, mask)
  np.testing.assert_array_equal(jax.jit(fused())(q, k, v), jax.jit(dots)(q, k, v))
  # Traced (for cuDNN's checks and the CUDA branch) with the queries as [B, N, T, H].
  assert calls and set(calls) == {(2, 8, 5, 16)}
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) ** 2)
  grads = jax.grad(loss(fused()), argnums=(0, 1, 2))(q, k, v)
  for got, want in zip(grads, jax.grad(loss(dots), argnums=(0, 1, 2))(q, k, v), strict=True):
    np.testing.assert_array_equal(got, want)

  # Which branch a lowering keeps: a marker stands in for cuDNN's kernel.
  marker = types.SimpleNamespace(
    dot_product_attention=lambda query, *_, **__: jnp.cos(query),
    MaskType=documented_cudnn().MaskType,
  )
  monkeypatch.setattr(attention, "cudnn_module", lambda: marker)
  lowered = lambda *args, on: jax.jit(fused()).trace(*args).lower(lowering_platforms=(on,))
  assert "cosine" in lowered(q, k, v, on="cuda").as_text()
  assert "cosine" not in lowered(q, k, v, on="cpu").as_text()
  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  assert "cosine" not in lowered(*f32, on="cuda").as_text()

  def refuses(*_, **__):
    raise NotImplementedError("head dim")

  refusing = types.SimpleNamespace(dot_product_attention=refuses, MaskType=marker.MaskType)
  for module in (refusing, None):
    monkeypatch.setattr(attention, "cudnn_module", lambda module=module: module)
    np.testing.assert_array_equal(jax.jit(fused())(q, k, v), jax.jit(dots)(q, k, v))


@pytest.mark.parametrize("remat", [False, True])
def test_scanned_layers_compute_the_unrolled_forward_and_gradient(remat):
  """`scan=True` runs the layers as scans over their stacked weights (one scan per run of
  layers between requested outputs): the same hidden states, requested residuals and
  gradients as the unrolled loop, for packed rows too."""
  cfg = ModelConfig(**{**BASE, "num_layers": 4})
  graphdef, params = nnx.split(init_model(cfg, seed=3))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12)), jnp.int32)
  positions = jnp.asarray(np.r_[np.arange(5), np.arange(7)][None].repeat(2, 0), jnp.int32)
  segments = jnp.asarray(np.r_[np.ones(5), 2 * np.ones(7)][None].repeat(2, 0), jnp.int32)

  def loss(params, scan):
    model = nnx.merge(graphdef, params)
    hidden, _, feats = model(
      tokens, positions, segment_ids=segments, return_layers=(0, 2), remat=remat, scan=scan
    )
    return jnp.mean(hidden**2) + sum(jnp.mean(f**3) for f in feats), (hidden, feats)

  # One program a form: the forward's outputs and the gradient together.
  run = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  unrolled, scanned = (run(params, scan) for scan in (False, True))
  # The two programs sum in different orders: on an AMD host (G) an embedding gradient of
  # -0.0104 (of entries up to ~3) came out 2.3e-6 apart.
  chex.assert_trees_all_close(scanned, unrolled, rtol=1e-4, atol=1e-5)
  (_, (hidden, feats)), _ = scanned
  assert hidden.shape == (2, 12, cfg.d_model) and len(feats) == 2


def test_return_layers_and_tree_mask():
  cfg = ModelConfig(**BASE)
  model = _model(cfg)
  tokens = jnp.array([[3, 4, 5, 6]])
  _, _, layers = model(tokens, jnp.arange(4)[None], return_layers=(0, 1))
  assert len(layers) == 2 and layers[0].shape == (1, 4, cfg.d_model)
  # A tree of two siblings after the root: node 2 sees node 0 but not node 1.
  tree = jnp.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
  mask = cache_mask(jnp.array([2]), 3, 6, tree)
  np.testing.assert_array_equal(
    mask[0], np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0]], bool)
  )
  # The sibling path computes the same as the same tokens decoded as a chain.
  cache = KVCache.zeros(cfg, 1, 8)
  _, cache, _ = model(
    tokens[:, :2], jnp.arange(2)[None], cache=cache, cache_len=jnp.zeros(1, jnp.int32)
  )
  h_tree, _, _ = model(
    jnp.array([[7, 8, 9]]),
    jnp.array([[2, 3, 3]]),
    cache=cache,
    cache_len=jnp.array([2]),
    new_mask=tree,
  )
  chain, _ = _full_logits(model, jnp.array([[3, 4, 7, 9]]))
  np.testing.assert_allclose(model.logits(h_tree)[0, 2], chain[0, 3], atol=1e-5)


def test_config_validation_and_param_count():
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    ModelConfig(**{**BASE, "num_kv_heads": 3})
  with pytest.raises(ValueError, match="vocab_size"):
    ModelConfig(**{**BASE, "vocab_size": 0})
  with pytest.raises(ValueError, match="unknown ModelConfig fields"):
    ModelConfig.from_dict({**BASE, "hidden": 3})
  for extra in ({}, {"tie_embeddings": False, "qkv_bias": True}):
    cfg = ModelConfig(**{**BASE, **extra})
    _, params = nnx.split(init_model(cfg))
    assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params


def test_explicit_per_row_mask_matches_shared_tree_mask():
  cfg = ModelConfig(**BASE)
  model = _model(cfg)
  cache = KVCache.zeros(cfg, 2, 8)
  _, cache, _ = model(
    jnp.array([[3, 4], [5, 6]]),
    jnp.broadcast_to(jnp.arange(2), (2, 2)),
    cache=cache,
    cache_len=jnp.zeros(2, jnp.int32),
  )
  tree = jnp.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
  toks, pos, lens = jnp.array([[7, 8, 9]] * 2), jnp.array([[2, 3, 3]] * 2), jnp.array([2, 2])
  shared, _, _ = model(toks, pos, cache=cache, cache_len=lens, new_mask=tree)
  explicit, _, _ = model(toks, pos, cache=cache, cache_len=lens, mask=cache_mask(lens, 3, 8, tree))
  np.testing.assert_allclose(shared, explicit, atol=1e-6)
  with pytest.raises(ValueError, match="mask shape"):
    model(toks, pos, cache=cache, cache_len=lens, mask=jnp.ones((2, 3, 5), bool))

"""Llama / Qwen2 / Qwen3-family decoder in Flax NNX, used functionally.

One module serves every device program of the project:
- full-sequence forward (training, log-probs, packed samples via segment ids);
- prefill / decode / multi-token extend against a KV cache with per-sequence
  lengths, optionally with a custom mask among the new tokens (tree drafts).

The module returns the last layer's post-norm hidden states (the features the
EAGLE drafter consumes) and, on request, the residual stream after chosen
layers; `logits(hidden)` applies the LM head separately so callers compute
logits only where they need them (prefill needs one position per row).

Shape letters: B batch, T new tokens, S cache slots, D model width, H query
heads, K kv heads, G = H // K, E head dim, V vocabulary, F mlp width.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from tlt_jax.models.config import ModelConfig

_NEG_INF = -1e30


@flax.struct.dataclass
class KVCache:
  """Per-layer key/value buffers; lengths live with the caller's state.

  Attributes:
    k: one [B, K, S, E] array per layer (slots next to head dim: attention reads
      each head's keys contiguously, with no transpose per step).
    v: one [B, K, S, E] array per layer.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]

  @classmethod
  def zeros(cls, config: ModelConfig, batch: int, slots: int) -> KVCache:
    shape = (batch, config.num_kv_heads, slots, config.head_dim)
    make = lambda: tuple(jnp.zeros(shape, config.jnp_dtype) for _ in range(config.num_layers))
    return cls(k=make(), v=make())

  @property
  def batch(self) -> int:
    return self.k[0].shape[0]

  @property
  def slots(self) -> int:
    return self.k[0].shape[2]

  def take_rows(self, rows: Int[Array, " B2"]) -> KVCache:
    """Gathers rows (compaction, prefix broadcast)."""
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), self)


class RMSNorm(nnx.Module):
  def __init__(self, dim: int, eps: float, dtype):
    self.scale = nnx.Param(jnp.ones((dim,), dtype))
    self.eps = eps

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> Float[Array, " E2"]:
  """RoPE's E/2 angular frequencies, with the config's scaling (the formulas of Hugging
  Face's rope_type "linear" and "llama3", in float32 as there)."""
  e = config.head_dim
  inv = 1.0 / (config.rope_theta ** (jnp.arange(0, e, 2, dtype=jnp.float32) / e))
  factor = config.rope_factor
  if config.rope_type == "linear":
    return inv / factor
  if config.rope_type == "llama3":
    low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
    old = config.rope_original_max_position
    wavelen = 2 * jnp.pi / inv
    # Long wavelengths (past old / low) are stretched by the factor, short ones (under
    # old / high) kept, and the band between blended linearly in old / wavelen.
    scaled = jnp.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return jnp.where(medium, blended, scaled)
  return inv


def rope_tables(positions: Int[Array, "B T"], config: ModelConfig):
  """(cos, sin), each [B, T, 1, E]: computed once per forward, shared by all layers."""
  angles = positions.astype(jnp.float32)[..., None] * rope_inv_freq(config)  # [B, T, E/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: Float[Array, "B T N E"], tables) -> Float[Array, "B T N E"]:
  """Rotary embedding in the rotate-half convention used by HF Llama/Qwen2."""
  cos, sin = tables
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x32 * cos + rotated * sin).astype(x.dtype)


@contextlib.contextmanager
def _scoped(var: contextvars.ContextVar, value) -> Iterator[None]:
  """`var` set to `value` within, restored after (the scoped settings below)."""
  token = var.set(value)
  try:
    yield
  finally:
    var.reset(token)


# The forms `attend` takes: "auto" (`reduces` decides), or always "dots" or "reduce".
ATTENTION_FORMS = ("auto", "dots", "reduce")
_FORM = contextvars.ContextVar("attention_form", default="auto")


def _checked_form(form: str) -> str:
  if form not in ATTENTION_FORMS:
    raise ValueError(f"attention form must be one of {ATTENTION_FORMS}, got {form!r}")
  return form


@contextlib.contextmanager
def attention_form(form: str) -> Iterator[None]:
  """Within: `attend` takes `form` (one of ATTENTION_FORMS) wherever its caller passes
  none, so experiments/bench_decode_attention.py can time whole programs under each form.
  Read when a program is traced: `rollout.pool.ExecutablePool` keys its programs by
  `current_attention_form()`, so a program traced under another form is never reused."""
  with _scoped(_FORM, _checked_form(form)):
    yield


def current_attention_form() -> str:
  """The form `attend` takes where its caller passes none ("auto" outside `attention_form`)."""
  return _FORM.get()


def reduces(batch: int, new_tokens: int, form: str | None = None) -> bool:
  """Whether `attend` takes the multiply-reduce form (else the dots) under `form` (default:
  `current_attention_form()`). "auto": one new token over at
  least 16 rows (decode of a larger batch), or 2-31 new tokens over at least 2 rows (draft
  verification, extends). Measured on XLA:CPU, 50M bench policy shapes, 512 cache slots, all
  16 layers (`experiments/bench_decode_attention.py --parts=attention`), ms per step, dots ->
  reduce: 1 token, batch 1 1.0 -> 1.7, 8 13.0 -> 18.4, 16 32.7 -> 22.4, 64 464 -> 108;
  5 tokens, batch 1 3.0 -> 7.6, 2 7.0 -> 4.8; 17 tokens, batch 1 6.4 -> 12.2, 2 13.2 -> 8.6."""
  form = _checked_form(current_attention_form() if form is None else form)
  if form != "auto":
    return form == "reduce"
  if new_tokens == 1:
    return batch >= 16
  return batch >= 2 and new_tokens < 32


def attend(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K S E"],
  v: Float[Array, "B K S E"],
  mask: Bool[Array, "B T S"],
  form: str | None = None,
) -> Float[Array, "B T H E"]:
  """Grouped-query attention with a boolean visibility mask, softmax in float32, in the
  form `reduces` picks under `form` (default: `current_attention_form()`)."""
  if reduces(q.shape[0], q.shape[1], form):
    return attend_reduce(q, k, v, mask)
  return attend_dots(q, k, v, mask)


def attend_dots(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K S E"],
  v: Float[Array, "B K S E"],
  mask: Bool[Array, "B T S"],
) -> Float[Array, "B T H E"]:
  """`attend` as two batched matrix products per (row, kv head).

  The query rows of one kv head (its G heads x T tokens) are merged into one matrix
  dimension first: with (G, T) left as two free dimensions of the einsum, XLA:CPU ran the
  products slower (experiments/RESULTS.md has the measurements).
  """
  b, t, h, e = q.shape
  kv = k.shape[1]
  g = h // kv
  q = q.reshape(b, t, kv, g, e).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, e)
  scores = jnp.einsum("bkqe,bkse->bkqs", q, k, preferred_element_type=jnp.float32)
  scores = scores.reshape(b, kv, g, t, -1) * (e**-0.5)
  scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kv, g * t, -1)
  out = jnp.einsum("bkqs,bkse->bkqe", probs, v).reshape(b, kv, g, t, e)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, e)


def attend_reduce(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K S E"],
  v: Float[Array, "B K S E"],
  mask: Bool[Array, "B T S"],
) -> Float[Array, "B T H E"]:
  """`attend` as multiply-reduce, for a few new tokens per row.

  With few query rows per (batch, kv head), the dots are thousands of [G T, E] x [E, S]
  products, which XLA:CPU runs as tiny batched GEMMs well below the cache-read bound; a
  multiply fused into a reduction streams the cache instead. Same math, summed in another
  order (float rounding).
  """
  b, t, h, e = q.shape
  kv, dtype = k.shape[1], v.dtype
  prec = jnp.promote_types(k.dtype, jnp.float32)
  q = q.reshape(b, t, kv, h // kv, e).transpose(0, 2, 3, 1, 4).astype(prec)  # [B, K, G, T, E]
  k = k[:, :, None, None, :, :].astype(prec)  # [B, K, 1, 1, S, E]
  scores = jnp.sum(q[:, :, :, :, None, :] * k, axis=-1) * (e**-0.5)  # [B, K, G, T, S]
  scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1)
  v = v[:, :, None, None, :, :].astype(prec)
  out = jnp.sum(probs[..., None] * v, axis=-2)  # [B, K, G, T, E]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, e).astype(dtype)


# Query block of the causal path: a block attends only to keys up to its own end.
_CAUSAL_BLOCK = contextvars.ContextVar("causal_block", default=128)


@contextlib.contextmanager
def causal_block(block: int) -> Iterator[None]:
  """Within: `attend_causal` takes query blocks of `block` tokens (default 128) wherever its
  caller passes none, so experiments/bench_attention.py can time block sizes. Read when a
  program is traced (the executable pool keys programs by `current_causal_block()`)."""
  if not isinstance(block, int) or block < 1:
    raise ValueError(f"causal block must be a positive int, got {block!r}")
  with _scoped(_CAUSAL_BLOCK, block):
    yield


def current_causal_block() -> int:
  """The query block `attend_causal` takes where its caller passes none."""
  return _CAUSAL_BLOCK.get()


# Key windows of the causal path, in tokens: () is off (see `key_windows`).
_KEY_WINDOWS = contextvars.ContextVar("key_windows", default=())


def checked_key_windows(windows: Any) -> tuple[int, ...]:
  """`windows` (a list or tuple of positive ints, tokens) as a sorted tuple, or ValueError."""
  if isinstance(windows, str | bytes) or not hasattr(windows, "__iter__"):
    raise ValueError(f"key_windows must be a tuple of positive ints, got {windows!r}")
  windows = tuple(windows)
  if not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in windows):
    raise ValueError(f"key_windows must be positive ints, got {windows!r}")
  return tuple(sorted(set(windows)))


@contextlib.contextmanager
def key_windows(windows: Sequence[int]) -> Iterator[None]:
  """Within: `attend_causal` lets a query block read only the last w keys up to its end,
  for the smallest w of `windows` that holds every key its queries see (picked on the
  device from the mask, `lax.switch`), else all of them. Rows packed with short samples
  (segment ids) then pay attention by their samples' lengths, not the row's width. Read
  when a program is traced (a program keeps the setting it was traced under); () is off.
  """
  with _scoped(_KEY_WINDOWS, checked_key_windows(windows)):
    yield


def current_key_windows() -> tuple[int, ...]:
  """The key windows `attend_causal` may take (() outside `key_windows`: off)."""
  return _KEY_WINDOWS.get()


def key_window(mask: Bool[Array, "B T S"], widths: Sequence[int]) -> Int[Array, ""]:
  """Which of `widths` (ascending, each < S), as an index, is the narrowest span of last
  keys holding every key any query of `mask` sees; len(widths) when none is (all S keys).
  Queries that see no key do not count."""
  s = mask.shape[-1]
  seen = jnp.any(mask, axis=-1)
  first = jnp.min(jnp.where(seen, jnp.argmax(mask, axis=-1), s))
  return jnp.sum(jnp.asarray(widths) < s - first)


def _attend_last_keys(q, k, v, mask, widths: Sequence[int]):
  """`attend` reading only the last `widths[key_window(...)]` keys (all of them when none
  holds the mask's visible keys): the same result up to float rounding, since the keys
  left out are masked for every query.

  The backward pass picks its branch again and recomputes that branch's forward: JAX's own
  derivative of `lax.switch` carries every branch's residuals out of whichever ran (zeros
  for the rest), which cost the windows their whole gain in the backward pass.
  """
  s = k.shape[2]

  def last(w):
    return lambda q, k, v, m: attend(q, k[:, :, s - w :], v[:, :, s - w :], m[:, :, s - w :])

  branches = [last(w) for w in widths] + [last(s)]

  def pullback(branch):
    def grads(q, k, v, mask, g):
      return jax.vjp(lambda q, k, v: branch(q, k, v, mask), q, k, v)[1](g)

    return grads

  def run(q, k, v, mask):
    return jax.lax.switch(key_window(mask, widths), branches, q, k, v, mask)

  windowed = jax.custom_vjp(run)

  def forward(q, k, v, mask):
    return run(q, k, v, mask), (q, k, v, mask)

  def backward(res, g):
    q, k, v, mask = res
    pullbacks = [pullback(b) for b in branches]
    return (*jax.lax.switch(key_window(mask, widths), pullbacks, q, k, v, mask, g), None)

  windowed.defvjp(forward, backward)
  return windowed(q, k, v, mask)


def attend_causal(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K T E"],
  v: Float[Array, "B K T E"],
  mask: Bool[Array, "B T T"],
  block: int | None = None,
) -> Float[Array, "B T H E"]:
  """`attend` over one causal sequence (mask[:, i, j] is False for j > i), in query blocks.

  Query block [s, s + n) reads keys [0, s + n) only: the keys after it are masked anyway, so
  the result is `attend`'s up to float rounding, at ~(nb + 1) / (2 nb) of its score work for
  nb blocks (SFT rows of 448 tokens: 4 blocks, 10/16). Rows with no visible key (padding)
  differ. Smaller blocks cost more than they save on CPU (experiments/bench_attention.py).
  Under `key_windows`, a block whose queries all see keys within the last w of [0, s + n)
  reads only those (packed short samples). `block`: the query block (default:
  `current_causal_block()`).
  """
  t, block = q.shape[1], current_causal_block() if block is None else block
  if t <= block:
    return attend(q, k, v, mask)
  windows = current_key_windows()
  outs = []
  for s in range(0, t, block):
    e = min(s + block, t)
    args = (q[:, s:e], k[:, :, :e], v[:, :, :e], mask[:, s:e, :e])
    widths = [w for w in windows if e - s <= w < e]
    outs.append(_attend_last_keys(*args, widths) if widths else attend(*args))
  return jnp.concatenate(outs, axis=1)


def _write_rows(
  buf: Float[Array, "B K S E"], new: Float[Array, "B T K E"], start: Int[Array, " B"]
) -> Float[Array, "B K S E"]:
  # Each row writes at its own length. The caller guarantees start + T <= S:
  # dynamic_update_slice would otherwise clamp the index and overwrite history.
  new = jnp.swapaxes(new, 1, 2)  # [B, K, T, E]
  return jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (0, i, 0)))(buf, new, start)


class Attention(nnx.Module):
  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    c = config
    dt, pt = c.jnp_dtype, c.jnp_param_dtype
    lin = lambda i, o, bias: nnx.Linear(i, o, use_bias=bias, dtype=dt, param_dtype=pt, rngs=rngs)
    self.q_proj = lin(c.d_model, c.num_heads * c.head_dim, c.qkv_bias)
    self.k_proj = lin(c.d_model, c.num_kv_heads * c.head_dim, c.qkv_bias)
    self.v_proj = lin(c.d_model, c.num_kv_heads * c.head_dim, c.qkv_bias)
    self.o_proj = lin(c.num_heads * c.head_dim, c.d_model, False)
    # Qwen3: each head's queries and keys are RMS-normalised (one scale over the head dim).
    self.q_norm = RMSNorm(c.head_dim, c.rms_eps, pt) if c.qk_norm else None
    self.k_norm = RMSNorm(c.head_dim, c.rms_eps, pt) if c.qk_norm else None
    self.config = config

  def __call__(self, x, rope_cs, mask, cache_kv=None, cache_len=None, view_len=None):
    c = self.config
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, c.num_heads, c.head_dim)
    k = self.k_proj(x).reshape(b, t, c.num_kv_heads, c.head_dim)
    v = self.v_proj(x).reshape(b, t, c.num_kv_heads, c.head_dim)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q = apply_rope(q, rope_cs)
    k = apply_rope(k, rope_cs)
    if cache_kv is None:
      out = attend_causal(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), mask)
      new_kv = None
    else:
      ck, cv = cache_kv
      ck = _write_rows(ck, k, cache_len)
      cv = _write_rows(cv, v, cache_len)
      # Read only the first view_len slots: the cache-length bucket.
      out = attend(q, ck[:, :, :view_len], cv[:, :, :view_len], mask)
      new_kv = (ck, cv)
    return self.o_proj(out.reshape(b, t, -1)), new_kv


class MLP(nnx.Module):
  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    dt, pt = config.jnp_dtype, config.jnp_param_dtype
    lin = lambda i, o: nnx.Linear(i, o, use_bias=False, dtype=dt, param_dtype=pt, rngs=rngs)
    self.gate_proj = lin(config.d_model, config.mlp_dim)
    self.up_proj = lin(config.d_model, config.mlp_dim)
    self.down_proj = lin(config.mlp_dim, config.d_model)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
  """Pre-norm decoder layer. `identity_input_norm` is for the EAGLE drafter."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, identity_input_norm: bool = False):
    pt = config.jnp_param_dtype
    self.input_norm = None if identity_input_norm else RMSNorm(config.d_model, config.rms_eps, pt)
    self.attn = Attention(config, rngs)
    self.post_attn_norm = RMSNorm(config.d_model, config.rms_eps, pt)
    self.mlp = MLP(config, rngs)

  def __call__(self, x, rope_cs, mask, cache_kv=None, cache_len=None, view_len=None):
    h = x if self.input_norm is None else self.input_norm(x)
    a, new_kv = self.attn(h, rope_cs, mask, cache_kv, cache_len, view_len)
    x = x + a
    x = x + self.mlp(self.post_attn_norm(x))
    return x, new_kv


def full_mask(
  positions_valid: Bool[Array, "B T"], segment_ids: Int[Array, "B T"] | None
) -> Bool[Array, "B T T"]:
  """Causal mask over one sequence; packed samples (segment ids) do not see each other, and
  padding (segment 0) sees only itself: its outputs are never read, and a padding run
  that saw itself whole would make `key_windows` read back to the run's start."""
  t = positions_valid.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))[None]
  mask = causal & positions_valid[:, None, :]
  if segment_ids is not None:
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    mask = mask & same & ((segment_ids[:, :, None] > 0) | jnp.eye(t, dtype=bool)[None])
  return mask


def cache_mask(
  cache_len: Int[Array, " B"],
  num_new: int,
  view_len: int,
  new_mask: Bool[Array, "T T"] | None = None,
) -> Bool[Array, "B T S"]:
  """Visibility for T new tokens written at slots [len, len + T) of a cache view.

  Old slots (< len) are visible to every new token; among the new tokens the
  mask is causal by default or `new_mask` (a tree's ancestor mask).
  """
  slots = jnp.arange(view_len)
  if new_mask is None and num_new == 1:  # plain decode: the cheap special case
    return (slots[None, :] <= cache_len[:, None])[:, None, :]
  if new_mask is None:
    new_mask = jnp.tril(jnp.ones((num_new, num_new), bool))
  rel = slots[None, :] - cache_len[:, None]  # [B, S]
  in_new = (rel >= 0) & (rel < num_new)
  new_vis = new_mask[:, jnp.clip(rel, 0, num_new - 1)]  # [T, B, S]
  new_vis = jnp.transpose(new_vis, (1, 0, 2)) & in_new[:, None, :]
  return (rel < 0)[:, None, :] | new_vis


def tree_cache_mask(
  cache_len: Int[Array, " B"], visible: Bool[Array, "B T R"], view_len: int
) -> Bool[Array, "B T S"]:
  """Per-row tree visibility over a cache view: committed slots (< cache_len) plus, in
  the tree region [cache_len, cache_len + R), the slots `visible` lets each new node see
  (its ancestors and itself). `cache_mask` with `new_mask` is the one-tree-for-all-rows
  case."""
  r = visible.shape[2]
  rel = jnp.arange(view_len)[None, :] - cache_len[:, None]  # [B, S]
  idx = jnp.broadcast_to(jnp.clip(rel, 0, r - 1)[:, None, :], visible.shape[:2] + (view_len,))
  in_tree = jnp.take_along_axis(visible, idx, axis=2) & ((rel >= 0) & (rel < r))[:, None, :]
  return (rel < 0)[:, None, :] | in_tree


class Transformer(nnx.Module):
  """Decoder-only LM. See the module docstring for the entry points."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    dt, pt = config.jnp_dtype, config.jnp_param_dtype
    self.embed = nnx.Embed(
      config.vocab_size,
      config.d_model,
      dtype=dt,
      param_dtype=pt,
      embedding_init=nnx.initializers.normal(0.02),
      rngs=rngs,
    )
    self.layers = nnx.List([DecoderLayer(config, rngs) for _ in range(config.num_layers)])
    self.final_norm = RMSNorm(config.d_model, config.rms_eps, pt)
    if not config.tie_embeddings:
      self.lm_head = nnx.Linear(
        config.d_model,
        config.vocab_size,
        use_bias=False,
        dtype=dt,
        param_dtype=pt,
        kernel_init=nnx.initializers.normal(0.02),
        rngs=rngs,
      )

  def embed_tokens(self, tokens: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    return self.embed(tokens)

  def logits(self, hidden: Float[Array, "... D"]) -> Float[Array, "... V"]:
    """LM head in float32 (tied to the embedding or separate)."""
    return self.head_logits(hidden, 0, self.config.vocab_size)

  def head_logits(self, hidden: Float[Array, "... D"], start, size: int) -> Float[Array, "... V"]:
    """Float32 logits of the `size` vocabulary entries from `start` (may be traced; clamped
    to [0, vocab_size - size], as lax.dynamic_slice does): a slice of the head, so a
    log-prob pass can run over the vocabulary in chunks."""
    h = hidden.astype(jnp.float32)
    if self.config.tie_embeddings:
      w = jax.lax.dynamic_slice_in_dim(self.embed.embedding[...], start, size, axis=0)
      return jnp.einsum("...d,vd->...v", h, w.astype(jnp.float32))
    w = jax.lax.dynamic_slice_in_dim(self.lm_head.kernel[...], start, size, axis=1)
    return jnp.einsum("...d,dv->...v", h, w.astype(jnp.float32))

  def __call__(
    self,
    tokens: Int[Array, "B T"],
    positions: Int[Array, "B T"],
    *,
    cache: KVCache | None = None,
    cache_len: Int[Array, " B"] | None = None,
    view_len: int | None = None,
    new_mask: Bool[Array, "T T"] | None = None,
    valid: Bool[Array, "B T"] | None = None,
    segment_ids: Int[Array, "B T"] | None = None,
    mask: Bool[Array, "B T S"] | None = None,
    return_layers: Sequence[int] = (),
    remat: bool = False,
  ) -> tuple[Float[Array, "B T D"], KVCache | None, tuple[jax.Array, ...]]:
    """Runs the decoder.

    Without `cache`: a full-sequence causal forward (`valid` masks padding keys,
    `segment_ids` separates packed samples). With `cache`: the T tokens are
    written at slots [cache_len, cache_len + T) of every row and attend to the
    first `view_len` slots (default: all), by `cache_mask` or, when given, an
    explicit per-row `mask` [B, T, view_len] (per-row draft trees).

    `remat` (full forwards only): each layer's activations are recomputed in the backward
    pass instead of saved, so a gradient holds one layer's activations and every layer's
    input, not every layer's activations (training long rows).

    Returns:
      hidden: last layer's output after the final norm, [B, T, D].
      cache: the updated cache (None without one).
      layers: residual stream after each layer index in `return_layers`.
    """
    x = self.embed_tokens(tokens)
    b, t = tokens.shape
    if cache is None:
      mask = full_mask(jnp.ones((b, t), bool) if valid is None else valid, segment_ids)
    else:
      if cache_len is None:
        raise ValueError("cache_len is required with a cache")
      view_len = cache.slots if view_len is None else view_len
      if mask is None:
        mask = cache_mask(cache_len, t, view_len, new_mask)
      elif mask.shape != (b, t, view_len):
        raise ValueError(
          f"mask shape {mask.shape} != (batch, new tokens, view_len) {(b, t, view_len)}"
        )
    rope_cs = rope_tables(positions, self.config)
    new_k, new_v, feats = [], [], []
    for i, layer in enumerate(self.layers):
      kv = None if cache is None else (cache.k[i], cache.v[i])
      if remat and cache is None:
        x, kv = _remat_layer(layer, x, rope_cs, mask), None
      else:
        x, kv = layer(x, rope_cs, mask, kv, cache_len, view_len)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
      if i in return_layers:
        feats.append(x)
    hidden = self.final_norm(x)
    new_cache = None if cache is None else KVCache(k=tuple(new_k), v=tuple(new_v))
    return hidden, new_cache, tuple(feats)


@nnx.remat
def _remat_layer(layer: DecoderLayer, x, rope_cs, mask):
  """A decoder layer of a full forward whose activations the backward pass recomputes."""
  return layer(x, rope_cs, mask)[0]


def run_init_on_host(program: Callable[..., Any], *args: Any) -> Any:
  """Runs a jitted parameter initialiser on the host CPU when the default device is an
  accelerator, and puts its result on that device.

  XLA's GPU compile of an initialiser (one random-number fusion per parameter, unrolled
  over layers) can take minutes; the CPU compiles and runs it in seconds. Without a CPU
  backend (JAX_PLATFORMS names the accelerator alone) it runs where it is.
  """
  device = jax.devices()[0]
  if device.platform == "cpu":
    return program(*args)
  try:
    cpu = jax.devices("cpu")[0]
  except RuntimeError:
    return program(*args)
  with jax.default_device(cpu):
    out = program(*args)
  # Through host memory, so the arrays land on the default device uncommitted, as a program
  # run there would leave them: committed parameters beside uncommitted optimizer state give
  # a jitted step other argument shardings on its second call than on its first, and so a
  # second compile.
  return jax.device_put(jax.device_get(out))


def init_model(config: ModelConfig, seed: int = 0) -> Transformer:
  """A randomly initialised model; initialisation runs as one compiled program
  (eager NNX init dispatches op by op and takes seconds even for tiny models), on the
  host CPU where the default device is an accelerator (`run_init_on_host`)."""
  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, _ = nnx.split(abstract)
  init = jax.jit(lambda: nnx.split(Transformer(config, rngs=nnx.Rngs(seed)))[1])
  return nnx.merge(graphdef, run_init_on_host(init))


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params): the static structure and the parameter pytree."""
  return nnx.split(model)

"""Llama / Qwen2 / Qwen3-family decoder in Flax NNX, used functionally.

One module serves every device program of the project:
- full-sequence forward (training, log-probs, packed samples via segment ids);
- prefill / decode / multi-token extend against a KV cache with per-sequence
  lengths, optionally with a custom mask among the new tokens (tree drafts).

The module returns the last layer's post-norm hidden states (the features the
EAGLE drafter consumes) and, on request, the residual stream after chosen
layers; `logits(hidden)` applies the LM head separately so callers compute
logits only where they need them (prefill needs one position per row). How a
layer attends (the masks, the attention forms, causal query blocks and key
windows) lives in `models.attention`.

Shape letters: B batch, T new tokens, S cache slots, D model width, H query
heads, K kv heads, G = H // K, E head dim, V vocabulary, F mlp width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from tlt_jax.models.attention import attend, attend_causal, cache_mask, full_mask
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.precision import head_product
from tlt_jax.models.products import layer_dot_general


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


def scatter_rows(
  buf: Float[Array, "B K S E"], new: Float[Array, "B T K E"], start: Int[Array, " B"]
) -> Float[Array, "B K S E"]:
  """buf[b, :, start[b] : start[b] + T] = new[b] for every row b: each row writes at its
  own length. The caller guarantees start + T <= S: dynamic_update_slice would otherwise
  clamp the index and overwrite history."""
  new = jnp.swapaxes(new, 1, 2)  # [B, K, T, E]
  return jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (0, i, 0)))(buf, new, start)


def write_rows(
  buf: Float[Array, "B K S E"], new: Float[Array, "B T K E"], start: Int[Array, " B"]
) -> Float[Array, "B K S E"]:
  """`scatter_rows`, written as one in-place update where the batch is one row. The
  batched form is a scatter, whose skip-out-of-bounds rule makes XLA read the old slots
  before writing: on a GPU a kernel of its own per write (experiments/deviceless.py)."""
  if buf.shape[0] == 1:
    return jax.lax.dynamic_update_slice(buf, jnp.swapaxes(new, 1, 2), (0, 0, start[0], 0))
  return scatter_rows(buf, new, start)


def layer_linear(inputs: int, outputs: int, bias: bool, dtype, param_dtype, rngs) -> nnx.Linear:
  """A layer's projection: its product through `models.products.layer_dot_general`."""
  return nnx.Linear(
    inputs,
    outputs,
    use_bias=bias,
    dtype=dtype,
    param_dtype=param_dtype,
    dot_general=layer_dot_general,
    rngs=rngs,
  )


class Attention(nnx.Module):
  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    c = config
    dt, pt = c.jnp_dtype, c.jnp_param_dtype
    lin = lambda i, o, bias: layer_linear(i, o, bias, dt, pt, rngs)
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
      ck = write_rows(ck, k, cache_len)
      cv = write_rows(cv, v, cache_len)
      # Read only the first view_len slots: the cache-length bucket.
      out = attend(q, ck[:, :, :view_len], cv[:, :, :view_len], mask)
      new_kv = (ck, cv)
    return self.o_proj(out.reshape(b, t, -1)), new_kv


class MLP(nnx.Module):
  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    dt, pt = config.jnp_dtype, config.jnp_param_dtype
    lin = lambda i, o: layer_linear(i, o, False, dt, pt, rngs)
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


class Transformer(nnx.Module):
  """Decoder-only LM. See the module docstring for the entry points.

  `head_only`: the embedding, final norm and head without the layers (whose params are then
  absent): the part of a target that its drafter reads
  (`models.drafter.target_head_graphdef`)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, head_only: bool = False):
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
    layers = 0 if head_only else config.num_layers
    self.layers = nnx.List([DecoderLayer(config, rngs) for _ in range(layers)])
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
    log-prob pass can run over the vocabulary in chunks.

    The product: `models.precision.head_product` (in the compute dtype on accelerators, with
    float32 sums and gradients)."""
    dtype = self.config.jnp_dtype
    if self.config.tie_embeddings:
      w = jax.lax.dynamic_slice_in_dim(self.embed.embedding[...], start, size, axis=0)
      return head_product(hidden, w, True, dtype)
    w = jax.lax.dynamic_slice_in_dim(self.lm_head.kernel[...], start, size, axis=1)
    return head_product(hidden, w, False, dtype)

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
    scan: bool = False,
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

    `scan` (full forwards only): the layers run as one `lax.scan` over their stacked
    weights, so a program holds one layer's body instead of num_layers copies (less to
    trace and compile for deep policies; the stacking copies the weights once a call). The
    parameters stay stored per layer.

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
    if scan and cache is None:
      x, feats = _scanned_layers(self.layers, x, rope_cs, mask, remat, return_layers)
      return self.final_norm(x), None, feats
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


def _scanned_layers(layers, x, rope_cs, mask, remat: bool, return_layers: Sequence[int]):
  """The full forward's layers as scans over their stacked weights, one scan per run of
  layers between two requested outputs (`return_layers`), so each requested residual is a
  scan's final carry, not one of num_layers stacked outputs."""
  graphdef = nnx.graphdef(layers[0])
  states = [nnx.state(layer) for layer in layers]

  def body(x, state):
    return nnx.merge(graphdef, state)(x, rope_cs, mask)[0], None

  if remat:
    body = jax.checkpoint(body)
  ends = sorted({i + 1 for i in return_layers if 0 <= i < len(layers)} | {len(layers)})
  start, feats = 0, []
  for end in ends:
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states[start:end])
    x, _ = jax.lax.scan(body, x, stacked)
    if end - 1 in return_layers:
      feats.append(x)
    start = end
  return x, tuple(feats)


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

"""EAGLE-style draft model: one decoder layer over (next-token embedding, target feature).

The drafter (EAGLE-1/2, as used by TLT) reads the target's last-layer post-norm
hidden state f_t together with the embedding of the NEXT token, e(x_{t+1}):

  x = fc(concat(e(x_{t+1}), f_t))        fc: 2D -> D, no bias
  h = DecoderLayer(x)                    input norm = identity, no final norm

and h is trained to predict f_{t+1}; draft logits are the target's LM head
applied to h. Drafter position t therefore consumes the pair (x_{t+1}, f_t) and
sits at RoPE position t.

The embedding table and the LM head belong to the target and are shared by
reference: they are never part of the drafter's params. Every function here
takes the target's (graphdef, params) and applies `stop_gradient` to them, so
drafter training cannot move the policy. Those need not be the whole target:
`target_head_graphdef` / `target_head_params` are the part a drafter reads (no
layers: a tenth of an 8B policy's bytes), all a drafter update on other devices
needs copied there.

Shape letters: B batch, T new tokens, S cache slots, D model width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from tlt_jax.models.attention import cache_mask, full_mask
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import (
  DecoderLayer,
  KVCache,
  Transformer,
  layer_linear,
  rope_tables,
  run_init_on_host,
)
from tlt_jax.utils.trees import path_name


class Drafter(nnx.Module):
  """fc(concat(embedding, feature)) followed by one identity-input-norm decoder layer.

  `config` is the TARGET's config: the drafter layer has the target's width,
  heads, head dim and MLP width (its num_layers is irrelevant).
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    d = config.d_model
    self.fc = layer_linear(2 * d, d, False, config.jnp_dtype, config.jnp_param_dtype, rngs)
    self.layer = DecoderLayer(config, rngs, identity_input_norm=True)

  def __call__(
    self,
    embeds: Float[Array, "B T D"],
    features: Float[Array, "B T D"],
    positions: Int[Array, "B T"],
    *,
    cache: KVCache | None = None,
    cache_len: Int[Array, " B"] | None = None,
    view_len: int | None = None,
    new_mask: Bool[Array, "T T"] | None = None,
    segment_ids: Int[Array, "B T"] | None = None,
    mask: Bool[Array, "B T S"] | None = None,
  ) -> tuple[Float[Array, "B T D"], KVCache | None]:
    """Runs the drafter on already-embedded next tokens; see `drafter_forward`."""
    b, t, _ = embeds.shape
    x = self.fc(jnp.concatenate([embeds.astype(features.dtype), features], axis=-1))
    if cache is None:
      attn_mask = full_mask(jnp.ones((b, t), bool), segment_ids) if mask is None else mask
      kv = None
    else:
      if cache_len is None:
        raise ValueError("cache_len is required with a cache")
      if len(cache.k) != 1:
        raise ValueError(f"the drafter cache has one layer, got {len(cache.k)}")
      view_len = cache.slots if view_len is None else view_len
      attn_mask = cache_mask(cache_len, t, view_len, new_mask) if mask is None else mask
      kv = (cache.k[0], cache.v[0])
    rope_cs = rope_tables(positions, self.config)
    h, kv = self.layer(x, rope_cs, attn_mask, kv, cache_len, view_len)
    new_cache = None if kv is None else KVCache(k=(kv[0],), v=(kv[1],))
    return h, new_cache


@functools.lru_cache(maxsize=16)
def _init_program(config: ModelConfig):
  # One compiled initialiser per config: eager NNX init runs op by op (slow).
  return jax.jit(lambda key: nnx.split(Drafter(config, rngs=nnx.Rngs(key)))[1])


def init_drafter(target_config: ModelConfig, seed: int = 0) -> Drafter:
  """A randomly initialised drafter for `target_config` (the target's config)."""
  abstract = nnx.eval_shape(lambda: Drafter(target_config, rngs=nnx.Rngs(0)))
  graphdef, _ = nnx.split(abstract)
  state = run_init_on_host(_init_program(target_config), jax.random.key(seed))
  return nnx.merge(graphdef, state)


def init_drafter_cache(config: ModelConfig, batch: int, slots: int) -> KVCache:
  """An empty one-layer KV cache for the drafter of a target with `config`."""
  return KVCache.zeros(dataclasses.replace(config, num_layers=1), batch, slots)


@functools.lru_cache(maxsize=16)
def target_head_graphdef(config: ModelConfig) -> nnx.GraphDef:
  """The graphdef of the part of a target of `config` that its drafter reads: the
  embedding, final norm and head (`Transformer(head_only=True)`); its params are
  `target_head_params`'. Every function here takes the two in place of the target's."""
  return nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0), head_only=True)))[0]


def target_head_params(target_params: nnx.State) -> nnx.State:
  """The target's params outside its layers: the same arrays, no copy (a whole target's
  params, or these already)."""
  return nnx.State({k: v for k, v in target_params.items() if k != "layers"})


def _frozen_target(target_graphdef: nnx.GraphDef, target_params: nnx.State) -> Transformer:
  # The shared embedding / head must never receive gradients from the drafter.
  return nnx.merge(target_graphdef, jax.lax.stop_gradient(target_params))


def drafter_forward(
  drafter_graphdef: nnx.GraphDef,
  drafter_params: nnx.State,
  target_graphdef: nnx.GraphDef,
  target_params: nnx.State,
  tokens: Int[Array, "B T"],
  features: Float[Array, "B T D"],
  positions: Int[Array, "B T"],
  *,
  cache: KVCache | None = None,
  cache_len: Int[Array, " B"] | None = None,
  view_len: int | None = None,
  new_mask: Bool[Array, "T T"] | None = None,
  segment_ids: Int[Array, "B T"] | None = None,
  mask: Bool[Array, "B T S"] | None = None,
) -> tuple[Float[Array, "B T D"], KVCache | None]:
  """The drafter on pairs (tokens[:, i], features[:, i]) = (x_{t+1}, f_t).

  Without `cache`: a causal forward over the T pairs (`segment_ids` keeps
  packed samples apart). With `cache` (one layer, see `init_drafter_cache`):
  the T entries are written at slots [cache_len, cache_len + T) of each row and
  attend to the first `view_len` slots; visibility is `cache_mask(cache_len,
  T, view_len, new_mask)` unless an explicit [B, T, view_len] `mask` is given
  (tree drafting).

  Returns:
    h: [B, T, D], the predicted next target features f_{t+1}.
    cache: the updated cache (None without one).
  """
  drafter: Drafter = nnx.merge(drafter_graphdef, drafter_params)
  target = _frozen_target(target_graphdef, target_params)
  check_drafter_matches(drafter.config, target.config)
  embeds = target.embed_tokens(tokens)
  return drafter(
    embeds,
    features,
    positions,
    cache=cache,
    cache_len=cache_len,
    view_len=view_len,
    new_mask=new_mask,
    segment_ids=segment_ids,
    mask=mask,
  )


def draft_logits(
  target_graphdef: nnx.GraphDef, target_params: nnx.State, h: Float[Array, "... D"]
) -> Float[Array, "... V"]:
  """Draft logits: the target's (frozen) LM head applied to drafter outputs, float32."""
  return _frozen_target(target_graphdef, target_params).logits(h)


def _shape_fields(config: ModelConfig) -> dict[str, Any]:
  return {
    "vocab_size": config.vocab_size,
    "d_model": config.d_model,
    "num_heads": config.num_heads,
    "num_kv_heads": config.num_kv_heads,
    "head_dim": config.head_dim,
    "mlp_dim": config.mlp_dim,
    "qkv_bias": config.qkv_bias,
    "qk_norm": config.qk_norm,
  }


def _param_shapes(params: Any) -> dict[str, tuple[int, ...]]:
  """'fc/kernel'-style names -> shapes for an nnx.State or a nested dict of arrays."""
  if isinstance(params, nnx.State):
    params = nnx.to_pure_dict(params)
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    out[path_name(path)] = tuple(leaf.shape)
  return out


def check_drafter_matches(
  drafter_config_or_params: ModelConfig | Drafter | nnx.State | dict, target_config: ModelConfig
) -> None:
  """Raises ValueError if a drafter cannot run on top of a target with `target_config`.

  Accepts the drafter's config (or the module, whose config is used), or its
  params (shapes are checked: fc, attention and MLP widths, qkv bias).
  """
  what = drafter_config_or_params
  if isinstance(what, Drafter):
    what = what.config
  if isinstance(what, ModelConfig):
    mine, theirs = _shape_fields(what), _shape_fields(target_config)
    for name, value in mine.items():
      if value != theirs[name]:
        raise ValueError(f"drafter {name} {value} != target {name} {theirs[name]}")
    return

  c = target_config
  shapes = _param_shapes(what)
  for name in shapes:
    if "embed" in name or "lm_head" in name:
      raise ValueError(f"drafter params must not hold the target's embedding or head: {name}")
  need = ("fc/kernel", "layer/attn/q_proj/kernel", "layer/attn/k_proj/kernel")
  for name in (*need, "layer/mlp/gate_proj/kernel"):
    if name not in shapes:
      raise ValueError(f"drafter params lack {name}: not a drafter's params")
  # Name the mismatching dimension first: clearer than a raw shape diff.
  found = {
    "d_model": (shapes["fc/kernel"][1], c.d_model),
    "num_heads * head_dim": (shapes["layer/attn/q_proj/kernel"][1], c.num_heads * c.head_dim),
    "num_kv_heads * head_dim": (
      shapes["layer/attn/k_proj/kernel"][1],
      c.num_kv_heads * c.head_dim,
    ),
    "mlp_dim": (shapes["layer/mlp/gate_proj/kernel"][1], c.mlp_dim),
    "qkv_bias": ("layer/attn/q_proj/bias" in shapes, c.qkv_bias),
    "qk_norm": ("layer/attn/q_norm/scale" in shapes, c.qk_norm),
  }
  for name, (mine, theirs) in found.items():
    if mine != theirs:
      raise ValueError(f"drafter {name} {mine} != target {name} {theirs}")
  d, q, kv, f = c.d_model, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.mlp_dim
  hd = c.head_dim
  expected = {
    "fc/kernel": (2 * d, d),
    "layer/attn/q_proj/kernel": (d, q),
    "layer/attn/k_proj/kernel": (d, kv),
    "layer/attn/v_proj/kernel": (d, kv),
    "layer/attn/o_proj/kernel": (q, d),
    "layer/mlp/gate_proj/kernel": (d, f),
    "layer/mlp/up_proj/kernel": (d, f),
    "layer/mlp/down_proj/kernel": (f, d),
    "layer/post_attn_norm/scale": (d,),
  }
  if c.qkv_bias:
    expected.update(
      {
        "layer/attn/q_proj/bias": (q,),
        "layer/attn/k_proj/bias": (kv,),
        "layer/attn/v_proj/bias": (kv,),
      }
    )
  if c.qk_norm:
    expected.update({"layer/attn/q_norm/scale": (hd,), "layer/attn/k_norm/scale": (hd,)})
  for name, shape in expected.items():
    if shapes.get(name) != shape:
      raise ValueError(
        f"drafter {name} shape {shapes.get(name)} != expected {shape} for the target"
      )
  extra = sorted(set(shapes) - set(expected))
  if extra:
    raise ValueError(f"drafter params hold arrays the target config does not expect: {extra}")

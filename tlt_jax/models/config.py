"""Static description of a Llama / Qwen2 / Qwen3-family decoder.

A frozen, hashable dataclass so it can be a static argument of jitted functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

# RoPE frequency schemes (Hugging Face's `rope_type` names): "default" (theta only), "linear"
# (positions divided by `rope_factor`), "llama3" (Llama 3.1's low-frequency stretch).
ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer (Llama / Qwen2 / Qwen3 family).

  `qk_norm` (Qwen3) RMS-normalises each head's queries and keys before RoPE. The `rope_*`
  fields beyond theta describe Hugging Face's RoPE scaling (`rope_type` in ROPE_TYPES):
  "linear" divides positions by `rope_factor`; "llama3" divides the low frequencies by
  `rope_factor`, keeps the high ones and blends between, by `rope_low_freq_factor`,
  `rope_high_freq_factor` and `rope_original_max_position`.

  Precision: `dtype` is the compute dtype (activations, the KV cache, and the weights as
  every forward reads them: `models.precision.compute_params`); `param_dtype` is how the
  parameters are stored and updated (the master weights, and so the optimizer state).
  bfloat16 compute over float32 masters keeps small updates (lr ~1e-6) that bfloat16
  weights would round away. Logits and log-probs are always float32.
  """

  vocab_size: int
  num_layers: int
  d_model: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  rms_eps: float = 1e-6
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  max_position: int = 4096
  rope_type: str = "default"
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position: int = 8192

  def __post_init__(self):
    for name in (
      "vocab_size",
      "num_layers",
      "d_model",
      "num_heads",
      "num_kv_heads",
      "head_dim",
      "mlp_dim",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
    if self.rope_theta <= 0:
      raise ValueError(f"rope_theta must be positive, got {self.rope_theta}")
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
    if self.rope_factor <= 0:
      raise ValueError(f"rope_factor must be positive, got {self.rope_factor}")
    if self.rope_type == "llama3" and not (
      0 < self.rope_low_freq_factor < self.rope_high_freq_factor
      and self.rope_original_max_position > 0
    ):
      raise ValueError(
        "llama3 RoPE needs 0 < rope_low_freq_factor < rope_high_freq_factor and "
        f"rope_original_max_position > 0, got {self.rope_low_freq_factor}, "
        f"{self.rope_high_freq_factor}, {self.rope_original_max_position}"
      )
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}")

  @property
  def jnp_dtype(self) -> Any:
    """The compute dtype."""
    return jnp.dtype(self.dtype)

  @property
  def jnp_param_dtype(self) -> Any:
    """The stored (master) parameters' dtype."""
    return jnp.dtype(self.param_dtype)

  @property
  def num_params(self) -> int:
    """Parameter count (the tied head counted once)."""
    d, h, kv, hd = self.d_model, self.num_heads, self.num_kv_heads, self.head_dim
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d
    if self.qkv_bias:
      attn += h * hd + 2 * kv * hd
    if self.qk_norm:
      attn += 2 * hd
    layer = attn + 3 * d * self.mlp_dim + 2 * d
    head = 0 if self.tie_embeddings else self.vocab_size * d
    return self.num_layers * layer + self.vocab_size * d + head + d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
      raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}; valid: {sorted(names)}")
    return cls(**d)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

"""The policy and its drafter: `ModelConfig`, the Llama / Qwen2 / Qwen3-family decoder (Flax
NNX, used functionally), the EAGLE drafter, mixed precision, the layers' products and HF
safetensors import/export."""

from tlt_jax.models.attention import (
  ATTENTION_FORMS,
  attend,
  attention_form,
  cache_mask,
  causal_block,
  current_attention_form,
  current_causal_block,
  current_key_windows,
  key_windows,
)
from tlt_jax.models.config import DTYPES, ROPE_TYPES, ModelConfig
from tlt_jax.models.drafter import Drafter, check_drafter_matches, init_drafter
from tlt_jax.models.hf_io import (
  config_from_hf,
  config_to_hf,
  load_hf_checkpoint,
  save_generation_config,
  save_hf_checkpoint,
)
from tlt_jax.models.platform import platform_choices
from tlt_jax.models.precision import (
  HEAD_PRECISIONS,
  cast_floating,
  compute_model,
  compute_params,
  current_head_precision,
  head_precision,
)
from tlt_jax.models.products import ROW_PRODUCTS, current_row_products, one_row_products
from tlt_jax.models.transformer import KVCache, Transformer, init_model, split_model

__all__ = [
  "ATTENTION_FORMS",
  "DTYPES",
  "HEAD_PRECISIONS",
  "ROPE_TYPES",
  "ROW_PRODUCTS",
  "Drafter",
  "KVCache",
  "ModelConfig",
  "Transformer",
  "attend",
  "attention_form",
  "cache_mask",
  "cast_floating",
  "causal_block",
  "check_drafter_matches",
  "compute_model",
  "compute_params",
  "config_from_hf",
  "config_to_hf",
  "current_attention_form",
  "current_causal_block",
  "current_head_precision",
  "current_key_windows",
  "current_row_products",
  "head_precision",
  "init_drafter",
  "init_model",
  "key_windows",
  "load_hf_checkpoint",
  "one_row_products",
  "platform_choices",
  "save_generation_config",
  "save_hf_checkpoint",
  "split_model",
]

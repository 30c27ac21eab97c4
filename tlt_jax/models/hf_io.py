"""Hugging Face checkpoint import/export for Llama / Qwen2 / Qwen3 decoders.

A checkpoint is a local directory with `config.json` and safetensors weights,
either one `model.safetensors` or shards listed in `model.safetensors.index.json`.
Torch `nn.Linear` stores weights as [out, in]; our `nnx.Linear` kernels are
[in, out], so projection and LM-head matrices are transposed on the way in and out.

Public API:
  config_from_hf(hf_config, dtype, param_dtype) -> ModelConfig
  config_to_hf(config, model_type, ...) -> dict
  load_hf_checkpoint(path, dtype, param_dtype) -> (ModelConfig, Transformer)
  save_hf_checkpoint(model_or_state, config, path, model_type, ...)
  save_generation_config(path, eos_token_id, ...)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from tlt_jax.models.config import ROPE_TYPES, ModelConfig
from tlt_jax.models.transformer import Transformer

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
SINGLE_WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"

_ARCHITECTURES = {
  "llama": "LlamaForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
}
# config.json fields the loader understands (read, checked, or metadata that changes nothing
# in the forward); any other field is an error rather than a silently ignored feature.
_KNOWN_FIELDS = frozenset(
  {
    "_name_or_path",
    "architectures",
    "attention_bias",
    "attention_dropout",
    "bos_token_id",
    "dtype",
    "eos_token_id",
    "head_dim",
    "hidden_act",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "layer_types",
    "max_position_embeddings",
    "max_window_layers",
    "mlp_bias",
    "model_type",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "pad_token_id",
    "pretraining_tp",
    "rms_norm_eps",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "sliding_window",
    "tie_word_embeddings",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "use_mrope",
    "use_sliding_window",
    "vocab_size",
  }
)
# RoPE settings, in either format: transformers 4 (top-level rope_theta, a rope_scaling dict
# with "type" or "rope_type") or transformers 5 (one rope_parameters dict with all of them).
_ROPE_FIELDS = {
  "rope_theta": "rope_theta",
  "rope_type": "rope_type",
  "type": "rope_type",
  "factor": "rope_factor",
  "low_freq_factor": "rope_low_freq_factor",
  "high_freq_factor": "rope_high_freq_factor",
  "original_max_position_embeddings": "rope_original_max_position",
  "partial_rotary_factor": "partial_rotary_factor",
}
# The fields each rope_type needs (besides theta); no others may be set.
_ROPE_NEEDS = {
  "default": (),
  "linear": ("rope_factor",),
  "llama3": (
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_position",
  ),
}
# Buffers some exporters write that carry no learned state (we recompute RoPE).
IGNORED_BUFFERS = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_SHARD_NAME = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
_TOKENIZER_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "added_tokens.json",
  "vocab.json",
  "merges.txt",
  "tokenizer.model",
  "chat_template.jinja",
)
# Cap the number of problems listed in one error so huge mismatches stay readable.
_MAX_LISTED = 20

Key = str | int
PathT = tuple[Key, ...]


# ----------------------------------------------------------------------------- config


def _require(hf: Mapping[str, Any], key: str) -> Any:
  if hf.get(key) is None:
    raise ValueError(f"HF config is missing required field {key!r}")
  return hf[key]


def _rope_config(hf: Mapping[str, Any]) -> dict[str, Any]:
  """The `ModelConfig` RoPE fields of a config.json, from either format.

  Every source (top-level rope_theta, rope_scaling, rope_parameters) is read; a field given
  twice must agree, a field not understood is an error, and a theta given nowhere is the
  Hugging Face classes' default (10000).
  """
  found: dict[str, tuple[str, Any]] = {}

  def put(source: str, key: str, value: Any) -> None:
    field = _ROPE_FIELDS.get(key)
    if field is None:
      raise ValueError(
        f"{source}.{key}={value!r} is not understood (RoPE fields: {sorted(_ROPE_FIELDS)})"
      )
    if field in found and found[field][1] != value:
      raise ValueError(f"{source}.{key}={value!r} disagrees with {found[field][0]}")
    found[field] = (f"{source}.{key}", value)

  if hf.get("rope_theta") is not None:
    put("config", "rope_theta", hf["rope_theta"])
  for source in ("rope_scaling", "rope_parameters"):
    block = hf.get(source)
    if block is None:
      continue
    if not isinstance(block, Mapping):
      raise ValueError(f"{source}={block!r} must be a dict or null")
    for key, value in block.items():
      put(source, key, value)
  values = {field: value for field, (_, value) in found.items()}
  partial = values.pop("partial_rotary_factor", 1.0)
  if partial != 1.0:
    raise ValueError(f"partial_rotary_factor={partial!r} is not supported (RoPE on every dim)")
  kind = values.setdefault("rope_type", "default")
  if kind not in ROPE_TYPES:
    raise ValueError(f"rope_type {kind!r} is not supported; supported: {list(ROPE_TYPES)}")
  given = set(values) - {"rope_type", "rope_theta"}
  need = set(_ROPE_NEEDS[kind])
  if given != need:
    raise ValueError(
      f"rope_type {kind!r} takes {sorted(need) or 'no scaling fields'}, the config gives "
      f"{sorted(given) or 'none'}"
    )
  values["rope_theta"] = float(values.get("rope_theta", 10_000.0))
  if "rope_factor" in values:
    values["rope_factor"] = float(values["rope_factor"])
  for key in ("rope_low_freq_factor", "rope_high_freq_factor"):
    if key in values:
      values[key] = float(values[key])
  if "rope_original_max_position" in values:
    values["rope_original_max_position"] = int(values["rope_original_max_position"])
  return values


def _rope_to_hf(config: ModelConfig) -> dict[str, Any] | None:
  """The transformers-4 rope_scaling dict (read by transformers 4 and 5) of a config."""
  if config.rope_type == "default":
    return None
  out: dict[str, Any] = {"rope_type": config.rope_type, "factor": config.rope_factor}
  if config.rope_type == "llama3":
    out.update(
      low_freq_factor=config.rope_low_freq_factor,
      high_freq_factor=config.rope_high_freq_factor,
      original_max_position_embeddings=config.rope_original_max_position,
    )
  return out


def config_from_hf(
  hf: Mapping[str, Any], dtype: str = "float32", param_dtype: str = "float32"
) -> ModelConfig:
  """Maps a Hugging Face Llama / Qwen2 / Qwen3 `config.json` dict onto a `ModelConfig`.

  Args:
    hf: the parsed config.json.
    dtype: compute dtype of the resulting model (independent of the checkpoint's stored
      dtype).
    param_dtype: dtype its parameters are stored and updated in (weights are cast on load).

  Returns:
    The equivalent ModelConfig.

  Raises:
    ValueError: unknown model type, a field the loader does not understand, or a feature
      the model does not implement (MLP bias, RoPE types other than default / linear /
      llama3, sliding-window attention, non-SiLU activation).
  """
  model_type = hf.get("model_type")
  if model_type not in _ARCHITECTURES:
    raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(_ARCHITECTURES)}")
  unknown = sorted(set(hf) - _KNOWN_FIELDS)
  if unknown:
    raise ValueError(
      f"config.json fields not understood: {unknown} (a feature the model may not implement; "
      "remove them from config.json if they are only metadata)"
    )
  rope = _rope_config(hf)
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"hidden_act={act!r} is not supported (only 'silu')")
  if hf.get("mlp_bias", False):
    raise ValueError(f"{model_type} config has mlp_bias=True, which the model does not support")
  if model_type == "qwen2":
    qkv_bias = True  # Qwen2 attention always has q/k/v biases, whatever the config says
  else:
    qkv_bias = bool(hf.get("attention_bias", False))
  if hf.get("use_mrope", False):
    raise ValueError(f"{model_type} config has use_mrope=True (multimodal RoPE): not supported")
  if hf.get("use_sliding_window", False):
    raise ValueError(
      f"{model_type} config has use_sliding_window=True, which the model does not support"
    )
  layer_kinds = set(hf.get("layer_types") or ()) - {"full_attention"}
  if layer_kinds:
    raise ValueError(f"layer_types {sorted(layer_kinds)} are not supported (full attention only)")

  d_model = int(_require(hf, "hidden_size"))
  num_heads = int(_require(hf, "num_attention_heads"))
  num_kv_heads = hf.get("num_key_value_heads")
  head_dim = hf.get("head_dim")
  if head_dim is None:
    if d_model % num_heads:
      raise ValueError(
        f"hidden_size {d_model} is not a multiple of num_attention_heads "
        f"{num_heads} and head_dim is not set"
      )
    head_dim = d_model // num_heads
  return ModelConfig(
    vocab_size=int(_require(hf, "vocab_size")),
    num_layers=int(_require(hf, "num_hidden_layers")),
    d_model=d_model,
    num_heads=num_heads,
    num_kv_heads=num_heads if num_kv_heads is None else int(num_kv_heads),
    head_dim=int(head_dim),
    mlp_dim=int(_require(hf, "intermediate_size")),
    rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
    qkv_bias=qkv_bias,
    qk_norm=model_type == "qwen3",
    # Both HF config classes default to untied when the field is absent.
    tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    dtype=dtype,
    param_dtype=param_dtype,
    max_position=int(hf.get("max_position_embeddings", ModelConfig.max_position)),
    **rope,
  )


def config_to_hf(
  config: ModelConfig,
  model_type: str = "llama",
  bos_token_id: int | None = None,
  eos_token_id: int | Sequence[int] | None = None,
) -> dict[str, Any]:
  """Builds the `config.json` dict that `transformers` needs to rebuild the model.

  Raises:
    ValueError: unknown model type, Qwen2 requested without q/k/v biases, or q/k norms
      (Qwen3's) with another model type or the reverse.
  """
  if model_type not in _ARCHITECTURES:
    raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(_ARCHITECTURES)}")
  if model_type == "qwen2" and not config.qkv_bias:
    raise ValueError(
      "qwen2 export needs qkv_bias=True (Qwen2 attention always has q/k/v biases); "
      "use model_type='llama' for a bias-free model"
    )
  if config.qk_norm != (model_type == "qwen3"):
    raise ValueError(
      f"{model_type} export of a model with qk_norm={config.qk_norm}: q/k norms are "
      "Qwen3's (model_type='qwen3' exactly when qk_norm=True)"
    )
  hf: dict[str, Any] = {
    "architectures": [_ARCHITECTURES[model_type]],
    "model_type": model_type,
    # Older transformers read `torch_dtype`, newer ones `dtype`.
    "torch_dtype": config.dtype,
    "dtype": config.dtype,
    "vocab_size": config.vocab_size,
    "hidden_size": config.d_model,
    "intermediate_size": config.mlp_dim,
    "num_hidden_layers": config.num_layers,
    "num_attention_heads": config.num_heads,
    "num_key_value_heads": config.num_kv_heads,
    "head_dim": config.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": config.max_position,
    "rms_norm_eps": config.rms_eps,
    "rope_theta": config.rope_theta,
    "rope_scaling": _rope_to_hf(config),
    "tie_word_embeddings": config.tie_embeddings,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
  }
  if model_type == "llama":
    hf.update(attention_bias=config.qkv_bias, mlp_bias=False, pretraining_tp=1)
  else:
    hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.num_layers)
  if model_type == "qwen3":
    hf.update(attention_bias=config.qkv_bias)
  if bos_token_id is not None:
    hf["bos_token_id"] = int(bos_token_id)
  if eos_token_id is not None:
    hf["eos_token_id"] = (
      int(eos_token_id)
      if isinstance(eos_token_id, int | np.integer)
      else [int(t) for t in eos_token_id]
    )
  return hf


# ----------------------------------------------------------------------------- name mapping


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One HF tensor and where it lives in our state.

  Attributes:
    hf_name: the safetensors key.
    path: our state path, or None for an HF-only tensor that must be all zeros.
    shape: our shape (HF's is reversed for transposed kernels).
    transpose: whether this is a torch [out, in] weight of an [in, out] kernel.
  """

  hf_name: str
  path: PathT | None
  shape: tuple[int, ...]
  transpose: bool

  @property
  def hf_shape(self) -> tuple[int, ...]:
    return self.shape[::-1] if self.transpose else self.shape


def checkpoint_entries(config: ModelConfig, model_type: str) -> list[_Entry]:
  """Every tensor of the HF checkpoint for `config`, in HF's canonical order."""
  c = config
  d, q_dim, kv_dim = c.d_model, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  out = [_Entry("model.embed_tokens.weight", ("embed", "embedding"), (c.vocab_size, d), False)]
  for i in range(c.num_layers):
    hf, ours = f"model.layers.{i}", ("layers", i)
    out.append(_Entry(f"{hf}.input_layernorm.weight", (*ours, "input_norm", "scale"), (d,), False))
    for name, width in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)):
      path = (*ours, "attn", name)
      out.append(_Entry(f"{hf}.self_attn.{name}.weight", (*path, "kernel"), (d, width), True))
      if c.qkv_bias:
        out.append(_Entry(f"{hf}.self_attn.{name}.bias", (*path, "bias"), (width,), False))
    out.append(
      _Entry(f"{hf}.self_attn.o_proj.weight", (*ours, "attn", "o_proj", "kernel"), (q_dim, d), True)
    )
    if model_type != "qwen2" and c.qkv_bias:
      # HF Llama's and Qwen3's attention_bias also biases o_proj; ours has none: must be zero.
      out.append(_Entry(f"{hf}.self_attn.o_proj.bias", None, (d,), False))
    if c.qk_norm:
      for name in ("q_norm", "k_norm"):
        path = (*ours, "attn", name, "scale")
        out.append(_Entry(f"{hf}.self_attn.{name}.weight", path, (c.head_dim,), False))
    out.append(
      _Entry(
        f"{hf}.post_attention_layernorm.weight", (*ours, "post_attn_norm", "scale"), (d,), False
      )
    )
    for name, shape in (
      ("gate_proj", (d, c.mlp_dim)),
      ("up_proj", (d, c.mlp_dim)),
      ("down_proj", (c.mlp_dim, d)),
    ):
      out.append(_Entry(f"{hf}.mlp.{name}.weight", (*ours, "mlp", name, "kernel"), shape, True))
  out.append(_Entry("model.norm.weight", ("final_norm", "scale"), (d,), False))
  if not c.tie_embeddings:
    out.append(_Entry("lm_head.weight", ("lm_head", "kernel"), (d, c.vocab_size), True))
  return out


def _fmt_path(path: PathT) -> str:
  return ".".join(str(k) for k in path)


def _raise_problems(what: str, problems: list[str]) -> None:
  if not problems:
    return
  listed = problems[:_MAX_LISTED]
  more = len(problems) - len(listed)
  tail = f"\n  ... and {more} more" if more else ""
  raise ValueError(f"{what}:\n  " + "\n  ".join(listed) + tail)


# ----------------------------------------------------------------------------- loading


def weight_files(directory: Path) -> list[Path]:
  """The safetensors files of a checkpoint, following transformers' precedence."""
  single = directory / SINGLE_WEIGHTS_NAME
  if single.is_file():
    return [single]
  index = directory / INDEX_NAME
  if index.is_file():
    with index.open() as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise ValueError(f"{index} has no 'weight_map'")
    files = [directory / name for name in sorted(set(weight_map.values()))]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
      raise FileNotFoundError(f"shards listed in {index} do not exist: {missing}")
    return files
  files = sorted(directory.glob("*.safetensors"))
  if not files:
    raise FileNotFoundError(
      f"no safetensors weights in {directory} (expected {SINGLE_WEIGHTS_NAME} or {INDEX_NAME})"
    )
  return files


def _cast(array: np.ndarray, dtype: str) -> np.ndarray:
  # numpy knows bfloat16 through ml_dtypes (a jax dependency); jnp.dtype resolves it.
  return array.astype(jnp.dtype(dtype), copy=False)


def load_hf_checkpoint(
  path: str | os.PathLike, dtype: str = "float32", param_dtype: str = "float32"
) -> tuple[ModelConfig, Transformer]:
  """Loads a local Hugging Face Llama / Qwen2 / Qwen3 checkpoint into a `Transformer`.

  Args:
    path: directory with config.json and model.safetensors (or shards + index).
    dtype: the model's compute dtype.
    param_dtype: dtype of the resulting parameters; stored tensors (fp32/bf16/fp16) are cast.

  Returns:
    (config, model).

  Raises:
    FileNotFoundError: the directory, config.json or the weights are missing.
    ValueError: unsupported config, or missing / unexpected / wrongly shaped tensors
      (the message names each tensor with the expected and found shapes).
  """
  directory = Path(path)
  if not directory.is_dir():
    raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
  config_file = directory / CONFIG_NAME
  if not config_file.is_file():
    raise FileNotFoundError(f"no {CONFIG_NAME} in checkpoint directory {directory}")
  with config_file.open() as f:
    hf_config = json.load(f)
  config = config_from_hf(hf_config, dtype, param_dtype)
  files = weight_files(directory)
  entries = {e.hf_name: e for e in checkpoint_entries(config, hf_config["model_type"])}

  # Pass 1: check names and shapes from the headers only, so errors come before any big read.
  location: dict[str, Path] = {}
  tied_head: Path | None = None
  problems: list[str] = []
  for file in files:
    with safe_open(file, framework="numpy") as f:
      for name in f.keys():  # noqa: SIM118 (safe_open handles are not iterable)
        if name in location:
          problems.append(f"{name}: present in both {location[name].name} and {file.name}")
          continue
        entry = entries.get(name)
        if entry is None:
          if name == "lm_head.weight" and config.tie_embeddings:
            tied_head = file  # Allowed only if it equals the embedding, checked below.
          elif not IGNORED_BUFFERS.search(name):
            problems.append(f"{name}: unexpected tensor in {file.name}")
          continue
        found = tuple(f.get_slice(name).get_shape())
        if found != entry.hf_shape:
          problems.append(f"{name}: expected shape {entry.hf_shape}, found {found}")
        location[name] = file
  problems.extend(
    f"{name}: missing (expected shape {e.hf_shape})"
    for name, e in entries.items()
    if name not in location
  )
  _raise_problems(f"checkpoint {directory} does not match its config", problems)

  # Pass 2: read each tensor once, in file order, straight into its state slot.
  values: dict[PathT, jax.Array] = {}
  by_file: dict[Path, list[_Entry]] = {}
  for name, file in location.items():
    by_file.setdefault(file, []).append(entries[name])
  for file, file_entries in by_file.items():
    with safe_open(file, framework="numpy") as f:
      for entry in file_entries:
        array = f.get_tensor(entry.hf_name)
        if entry.path is None:
          if np.any(array):
            problems.append(f"{entry.hf_name}: nonzero, but the model has no such bias")
          continue
        if entry.transpose:
          array = array.T
        values[entry.path] = jnp.asarray(_cast(array, param_dtype))
  _raise_problems(f"checkpoint {directory} cannot be represented by the model", problems)
  if tied_head is not None:
    with safe_open(tied_head, framework="numpy") as f:
      head = f.get_tensor("lm_head.weight")
    embed = values[("embed", "embedding")]
    if head.shape != embed.shape or not np.array_equal(_cast(head, param_dtype), np.asarray(embed)):
      raise ValueError(
        f"checkpoint {directory} has tie_word_embeddings=true but an lm_head.weight "
        "that differs from model.embed_tokens.weight"
      )
  return config, _build_model(config, values)


def _build_model(config: ModelConfig, values: Mapping[PathT, jax.Array]) -> Transformer:
  """Creates the model without random init and fills every parameter from `values`."""
  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  flat = dict(nnx.to_flat_state(state))
  # Guards against the model gaining/renaming parameters without this mapping following.
  if set(flat) != set(values):
    raise RuntimeError(
      "hf_io name mapping is out of sync with Transformer: unmapped model params "
      f"{sorted(map(_fmt_path, set(flat) - set(values)))}, mapped but absent "
      f"{sorted(map(_fmt_path, set(values) - set(flat)))}"
    )
  pure: dict[Key, Any] = {}
  for path, value in values.items():
    expected = flat[path]
    if tuple(expected.shape) != tuple(value.shape):
      raise RuntimeError(f"{_fmt_path(path)}: model expects {expected.shape}, got {value.shape}")
    node = pure
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  nnx.replace_by_pure_dict(state, pure)
  return nnx.merge(graphdef, state)


# ----------------------------------------------------------------------------- saving


def _flatten(tree: Any, prefix: PathT = ()) -> Iterator[tuple[PathT, Any]]:
  if isinstance(tree, Mapping):
    for key, sub in tree.items():
      # Checkpoint restores may turn list indices into strings; normalise to ints.
      if isinstance(key, str) and key.isdigit():
        key = int(key)
      yield from _flatten(sub, (*prefix, key))
  else:
    yield prefix, tree


def _param_arrays(model_or_state: nnx.Module | nnx.State | Mapping[str, Any]) -> dict[PathT, Any]:
  if isinstance(model_or_state, nnx.Module):
    tree = nnx.to_pure_dict(nnx.state(model_or_state, nnx.Param))
  elif isinstance(model_or_state, nnx.State):
    tree = nnx.to_pure_dict(model_or_state)
  elif isinstance(model_or_state, Mapping):
    tree = model_or_state
  else:
    raise TypeError(
      f"expected an nnx.Module, nnx.State or dict of params, got {type(model_or_state).__name__}"
    )
  out = {}
  for path, leaf in _flatten(tree):
    out[path] = leaf[...] if isinstance(leaf, nnx.Variable) else leaf
  return out


def _remove_stale_weights(directory: Path) -> None:
  # A leftover model.safetensors would shadow new shards (transformers prefers it), and
  # leftover shards would confuse readers that glob; drop every weight file we could have written.
  for file in directory.iterdir():
    if file.name in (SINGLE_WEIGHTS_NAME, INDEX_NAME) or _SHARD_NAME.match(file.name):
      file.unlink()


def save_hf_checkpoint(
  model_or_state: nnx.Module | nnx.State | Mapping[str, Any],
  config: ModelConfig,
  path: str | os.PathLike,
  model_type: str = "llama",
  tokenizer_dir: str | os.PathLike | None = None,
  max_shard_bytes: int | None = None,
  bos_token_id: int | None = None,
  eos_token_id: int | Sequence[int] | None = None,
  dtype: str | None = None,
  pad_token_id: int | None = None,
) -> list[Path]:
  """Writes a checkpoint that `transformers.AutoModelForCausalLM.from_pretrained` loads.

  Args:
    model_or_state: a `Transformer`, its `nnx.State` (e.g. from `nnx.split`), or the
      equivalent nested dict of arrays (`nnx.to_pure_dict`).
    config: the model's config; tensors are checked against it and saved in `dtype`.
    path: output directory (created if needed). Weight files previously written
      there are replaced; other files are left alone.
    model_type: "llama" or "qwen2" (the latter needs `config.qkv_bias`).
    tokenizer_dir: if given, tokenizer files found there (tokenizer.json,
      tokenizer_config.json, ...) are copied next to the weights.
    max_shard_bytes: if the weights exceed this, write `model-XXXXX-of-YYYYY.safetensors`
      shards plus `model.safetensors.index.json`; a tensor larger than the limit gets
      a shard of its own.
    bos_token_id: recorded in config.json when given.
    eos_token_id: recorded in config.json when given (an id or a list of ids).
    dtype: the stored tensors' dtype ("float32", "bfloat16", "float16"), also recorded in
      config.json; None: `config.dtype` (the compute dtype). Export trained float32 master
      weights as "float32" to keep every update (`tlt_jax.export`).
    pad_token_id: recorded in config.json when given.

  Returns:
    The written files.

  Raises:
    ValueError: bad model type, Qwen2 without biases, or params that do not match `config`.
    FileNotFoundError: `tokenizer_dir` holds no tokenizer file.
  """
  if dtype is not None:
    config = dataclasses.replace(config, dtype=dtype)  # validated by ModelConfig
  hf_config = config_to_hf(config, model_type, bos_token_id, eos_token_id)
  if pad_token_id is not None:
    hf_config["pad_token_id"] = int(pad_token_id)
  if max_shard_bytes is not None and max_shard_bytes <= 0:
    raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
  params = _param_arrays(model_or_state)
  all_entries = checkpoint_entries(config, model_type)
  _check_params(params, [e for e in all_entries if e.path is not None])

  tokenizer_files: list[Path] = []
  if tokenizer_dir is not None:
    tokenizer_files = [Path(tokenizer_dir) / n for n in _TOKENIZER_FILES]
    tokenizer_files = [p for p in tokenizer_files if p.is_file()]
    if not tokenizer_files:
      raise FileNotFoundError(
        f"no tokenizer files ({', '.join(_TOKENIZER_FILES)}) in {tokenizer_dir}"
      )

  tensors: dict[str, np.ndarray] = {}
  for e in all_entries:
    if e.path is None:
      tensors[e.hf_name] = np.zeros(e.hf_shape, jnp.dtype(config.dtype))
      continue
    array = _cast(np.asarray(jax.device_get(params[e.path])), config.dtype)
    # safetensors needs C-contiguous buffers; the transpose is a view.
    tensors[e.hf_name] = np.ascontiguousarray(array.T if e.transpose else array)

  directory = Path(path)
  directory.mkdir(parents=True, exist_ok=True)
  _remove_stale_weights(directory)
  written = _write_weights(directory, tensors, max_shard_bytes)
  file = directory / CONFIG_NAME
  file.write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
  written.append(file)
  for src in tokenizer_files:
    dst = directory / src.name
    if src.resolve() != dst.resolve():
      shutil.copyfile(src, dst)
    written.append(dst)
  return written


def _check_params(params: Mapping[tuple[str, ...], Any], entries: Sequence[Any]) -> None:
  """Raises with every path missing, misshapen or unknown to the config's entries."""
  expected_paths = {e.path for e in entries}
  problems = [
    f"{_fmt_path(e.path)}: missing (expected shape {e.shape})"
    for e in entries
    if e.path not in params
  ]
  problems += [
    f"{_fmt_path(e.path)}: expected shape {e.shape}, found {tuple(np.shape(params[e.path]))}"
    for e in entries
    if e.path in params and tuple(np.shape(params[e.path])) != e.shape
  ]
  problems += [
    f"{_fmt_path(p)}: not a parameter of this config" for p in params if p not in expected_paths
  ]
  _raise_problems("params do not match the config", problems)


def _write_weights(
  directory: Path, tensors: dict[str, np.ndarray], max_shard_bytes: int | None
) -> list[Path]:
  """One safetensors file, or shards of at most `max_shard_bytes` and their index."""
  # Greedy packing in canonical order keeps each layer's tensors together.
  shards: list[dict[str, np.ndarray]] = [{}]
  shard_bytes = 0
  for name, array in tensors.items():
    if max_shard_bytes is not None and shards[-1] and shard_bytes + array.nbytes > max_shard_bytes:
      shards.append({})
      shard_bytes = 0
    shards[-1][name] = array
    shard_bytes += array.nbytes
  # Declares torch layout; transformers sends "tf"/"flax" files through its converters.
  metadata = {"format": "pt"}
  if len(shards) == 1:
    file = directory / SINGLE_WEIGHTS_NAME
    save_file(shards[0], str(file), metadata=metadata)
    return [file]
  written, weight_map = [], {}
  for i, shard in enumerate(shards):
    file = directory / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, str(file), metadata=metadata)
    written.append(file)
    weight_map.update(dict.fromkeys(shard, file.name))
  index = {
    "metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
    "weight_map": weight_map,
  }
  file = directory / INDEX_NAME
  file.write_text(json.dumps(index, indent=2) + "\n")
  return [*written, file]


def save_generation_config(
  path: str | os.PathLike,
  eos_token_id: int | Sequence[int],
  *,
  bos_token_id: int | None = None,
  pad_token_id: int | None = None,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  max_new_tokens: int | None = None,
) -> Path:
  """Writes generation_config.json: the stop ids and the sampling a policy was trained at.

  transformers' `generate` reads it; top_k is written even when 0 (no truncation), since
  transformers' own default is 50. temperature 0 writes greedy decoding (do_sample false).

  Returns:
    The written file.
  """
  if not (temperature >= 0 and np.isfinite(temperature)):
    raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
  eos = (
    int(eos_token_id)
    if isinstance(eos_token_id, int | np.integer)
    else [int(t) for t in eos_token_id]
  )
  gen: dict[str, Any] = {"eos_token_id": eos, "do_sample": temperature > 0}
  if temperature > 0:
    gen.update(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
  if bos_token_id is not None:
    gen["bos_token_id"] = int(bos_token_id)
  if pad_token_id is not None:
    gen["pad_token_id"] = int(pad_token_id)
  if max_new_tokens is not None:
    gen["max_new_tokens"] = int(max_new_tokens)
  directory = Path(path)
  directory.mkdir(parents=True, exist_ok=True)
  file = directory / GENERATION_CONFIG_NAME
  file.write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
  return file

"""Hugging Face import/export checked against `transformers` on tiny fp32 models (CPU)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from tlt_jax.models.config import ModelConfig
from tlt_jax.models.hf_io import (
  INDEX_NAME,
  SINGLE_WEIGHTS_NAME,
  config_from_hf,
  config_to_hf,
  load_hf_checkpoint,
  save_generation_config,
  save_hf_checkpoint,
)
from tlt_jax.models.transformer import Transformer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
VOCAB, LAYERS, HIDDEN, HEADS, KV_HEADS, MLP = 128, 2, 64, 4, 2, 128
VARIANTS = [
  ("llama", False),
  ("llama", True),
  ("qwen2", False),
  ("qwen2", True),
  ("qwen3", False),
  ("qwen3", True),
]
_HF_CLASSES = {
  "llama": ("LlamaConfig", "LlamaForCausalLM"),
  "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
  "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}
# Llama 3.1's RoPE scaling, with an original context short enough that the tiny head's
# frequencies fall in all three bands (kept, blended, stretched).
LLAMA3_ROPE = {
  "rope_type": "llama3",
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 32,
}


def _tokens(batch: int = 2, length: int = 12, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, VOCAB, (batch, length), dtype=np.int32)


def _our_logits(model: Transformer, tokens: np.ndarray) -> np.ndarray:
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  hidden, _, _ = model(jnp.asarray(tokens), positions)
  return np.asarray(model.logits(hidden))


def _hf_logits(model, tokens: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
  assert a.shape == b.shape, (a.shape, b.shape)
  return float(np.max(np.abs(a - b)))


def _make_hf_model(model_type: str, tied: bool, seed: int = 0, **overrides):
  """A random fp32 HF model; every weight (norms and biases too) is randomised."""
  config_cls, model_cls = (getattr(transformers, n) for n in _HF_CLASSES[model_type])
  if model_type == "qwen3":
    overrides.setdefault("head_dim", HIDDEN // HEADS)  # Qwen3Config's default is 128
  config = config_cls(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=MLP,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=5000.0,
    tie_word_embeddings=tied,
    attn_implementation="eager",
    **overrides,
  )
  torch.manual_seed(seed)
  model = model_cls(config).float().eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      # Default init leaves norms at 1 and biases at 0, which would hide mapping mistakes.
      p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
  return model


def _our_config(
  model_type: str, tied: bool, dtype: str = "float32", param_dtype: str = "float32"
) -> ModelConfig:
  return ModelConfig(
    vocab_size=VOCAB,
    num_layers=LAYERS,
    d_model=HIDDEN,
    num_heads=HEADS,
    num_kv_heads=KV_HEADS,
    head_dim=HIDDEN // HEADS,
    mlp_dim=MLP,
    rope_theta=5000.0,
    rms_eps=1e-5,
    qkv_bias=model_type == "qwen2",
    qk_norm=model_type == "qwen3",
    tie_embeddings=tied,
    dtype=dtype,
    param_dtype=param_dtype,
    max_position=256,
  )


def _random_model(config: ModelConfig, seed: int = 0) -> Transformer:
  """Our model with every parameter random (norms near 1).

  Built from an abstract model and numpy draws rather than `init_model`, whose first
  call compiles the random initialisers (seconds on CPU).
  """
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
  rng = np.random.default_rng(seed)
  draw = lambda x: jnp.asarray((0.1 * rng.standard_normal(x.shape) + (x.ndim == 1)).astype(x.dtype))
  nnx.replace_by_pure_dict(state, jax.tree.map(draw, nnx.to_pure_dict(state)))
  return nnx.merge(graphdef, state)


def _params(model: Transformer) -> dict:
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _assert_same_params(a: Transformer, b: Transformer) -> None:
  pa, pb = _params(a), _params(b)
  assert jax.tree.structure(pa) == jax.tree.structure(pb)
  for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _load_hf(path: Path):
  model, info = transformers.AutoModelForCausalLM.from_pretrained(
    path, attn_implementation="eager", dtype=torch.float32, output_loading_info=True
  )
  # transformers only warns about weights it had to initialise itself; make that a failure.
  assert not any(info.values()), info
  return model.eval()


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory) -> dict:
  """(model_type, tied) -> (directory, HF model) written by `save_pretrained`."""
  out = {}
  for model_type, tied in VARIANTS:
    model = _make_hf_model(model_type, tied)
    path = tmp_path_factory.mktemp(f"hf_{model_type}_{'tied' if tied else 'untied'}")
    model.save_pretrained(path, safe_serialization=True)
    out[(model_type, tied)] = (path, model)
  return out


@pytest.fixture
def llama_ckpt(hf_checkpoints, tmp_path) -> Path:
  """A private, editable copy of the untied Llama checkpoint."""
  return Path(shutil.copytree(hf_checkpoints[("llama", False)][0], tmp_path / "ckpt"))


def _edit_config(path: Path, **updates) -> None:
  config_file = path / "config.json"
  hf = json.loads(config_file.read_text())
  hf.update(updates)
  config_file.write_text(json.dumps(hf))


# ----------------------------------------------------------------------------- import


@pytest.mark.parametrize(("model_type", "tied"), VARIANTS)
def test_import_matches_transformers(hf_checkpoints, model_type, tied):
  path, hf_model = hf_checkpoints[(model_type, tied)]
  config, model = load_hf_checkpoint(path)
  assert config == _our_config(model_type, tied)
  tokens = _tokens()
  diff = _max_diff(_our_logits(model, tokens), _hf_logits(hf_model, tokens))
  print(f"import {model_type} tied={tied}: max |logit diff| = {diff:.2e}")
  assert diff < TOL


def test_import_bf16_checkpoint(hf_checkpoints, tmp_path):
  _, hf_model = hf_checkpoints[("qwen2", False)]
  copy.deepcopy(hf_model).to(torch.bfloat16).save_pretrained(tmp_path, safe_serialization=True)
  for dtype, param_dtype in (("float32", "float32"), ("bfloat16", "bfloat16")):
    config, model = load_hf_checkpoint(tmp_path, dtype=dtype, param_dtype=param_dtype)
    assert (config.dtype, config.param_dtype) == (dtype, param_dtype)
    embed = model.embed.embedding[...]
    assert embed.dtype == jnp.dtype(param_dtype)
    expected = hf_model.model.embed_tokens.weight.detach().to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(np.asarray(embed, np.float32), expected)


# ----------------------------------------------------------------------------- export


@pytest.mark.parametrize(
  ("model_type", "tied", "bias"),
  [
    ("llama", False, False),
    ("llama", True, False),
    ("llama", False, True),
    ("qwen2", False, True),
    ("qwen2", True, True),
    ("qwen3", False, False),
    ("qwen3", True, True),
  ],
)
def test_export_loads_in_transformers(tmp_path, model_type, tied, bias):
  config = ModelConfig(**{**_our_config(model_type, tied).to_dict(), "qkv_bias": bias})
  model = _random_model(config, seed=3)
  save_hf_checkpoint(
    model, config, tmp_path, model_type=model_type, bos_token_id=1, eos_token_id=[2, 3]
  )
  hf_config = json.loads((tmp_path / "config.json").read_text())
  assert hf_config["model_type"] == model_type
  assert hf_config["torch_dtype"] == "float32"
  assert hf_config["bos_token_id"] == 1 and hf_config["eos_token_id"] == [2, 3]
  if model_type != "qwen2":
    assert hf_config["attention_bias"] is bias
  hf_model = _load_hf(tmp_path)
  assert type(hf_model).__name__ == _HF_CLASSES[model_type][1]
  tokens = _tokens(seed=1)
  diff = _max_diff(_our_logits(model, tokens), _hf_logits(hf_model, tokens))
  print(f"export {model_type} tied={tied} bias={bias}: max |logit diff| = {diff:.2e}")
  assert diff < TOL


@pytest.mark.parametrize(("model_type", "tied"), VARIANTS)
def test_round_trip_is_exact(tmp_path, model_type, tied):
  config = _our_config(model_type, tied)
  model = _random_model(config, seed=5)
  # An nnx.State input is accepted as well as the module.
  save_hf_checkpoint(nnx.split(model)[1], config, tmp_path, model_type=model_type)
  loaded_config, loaded = load_hf_checkpoint(tmp_path)
  assert loaded_config == config
  _assert_same_params(model, loaded)


def test_round_trip_bf16(tmp_path):
  config = _our_config("qwen2", False, dtype="bfloat16", param_dtype="bfloat16")
  model = _random_model(config, seed=6)
  save_hf_checkpoint(model, config, tmp_path, model_type="qwen2")
  assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
  loaded_config, loaded = load_hf_checkpoint(tmp_path, dtype="bfloat16", param_dtype="bfloat16")
  assert loaded_config == config
  _assert_same_params(model, loaded)
  # bfloat16 compute over float32 masters (the default param_dtype): the same bf16 values,
  # stored in float32.
  master_config, master = load_hf_checkpoint(tmp_path, dtype="bfloat16")
  assert master_config.param_dtype == "float32"
  assert master.embed.embedding[...].dtype == jnp.float32
  np.testing.assert_array_equal(
    np.asarray(master.embed.embedding[...]), np.asarray(loaded.embed.embedding[...], np.float32)
  )


@pytest.mark.parametrize(("model_type", "tied"), [("llama", True), ("qwen2", False)])
def test_sharded_export(tmp_path, model_type, tied):
  config = _our_config(model_type, tied)
  model = _random_model(config, seed=7)
  # Leftover weights from an earlier unsharded save must not shadow the shards.
  save_hf_checkpoint(model, config, tmp_path, model_type=model_type)
  written = save_hf_checkpoint(
    model, config, tmp_path, model_type=model_type, max_shard_bytes=40_000
  )
  shards = sorted(tmp_path.glob("model-*-of-*.safetensors"))
  assert len(shards) > 2
  assert not (tmp_path / SINGLE_WEIGHTS_NAME).exists()
  assert set(shards) <= set(written)
  index = json.loads((tmp_path / INDEX_NAME).read_text())
  assert set(index["weight_map"].values()) == {p.name for p in shards}
  assert index["metadata"]["total_size"] == config.num_params * 4
  for shard in shards[:-1]:
    # Only a single over-limit tensor may exceed the budget (embedding: 32 KB here).
    assert shard.stat().st_size < 40_000 + 4096

  _, loaded = load_hf_checkpoint(tmp_path)
  _assert_same_params(model, loaded)
  tokens = _tokens(seed=2)
  diff = _max_diff(_our_logits(model, tokens), _hf_logits(_load_hf(tmp_path), tokens))
  print(f"sharded {model_type} tied={tied}: max |logit diff| = {diff:.2e}")
  assert diff < TOL

  # Saving unsharded again removes the shards and the index.
  save_hf_checkpoint(model, config, tmp_path, model_type=model_type)
  assert not list(tmp_path.glob("model-*-of-*.safetensors"))
  assert not (tmp_path / INDEX_NAME).exists()


def test_export_copies_tokenizer(tmp_path):
  tokenizers = pytest.importorskip("tokenizers")
  tok_dir = tmp_path / "tok"
  tok_dir.mkdir()
  vocab = {f"w{i}": i for i in range(VOCAB)}
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tokenizer.save(str(tok_dir / "tokenizer.json"))
  (tok_dir / "tokenizer_config.json").write_text(
    json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "w2"})
  )
  config = _our_config("llama", True)
  out = tmp_path / "out"
  save_hf_checkpoint(_random_model(config), config, out, tokenizer_dir=tok_dir)
  assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
  hf_tok = transformers.AutoTokenizer.from_pretrained(out)
  assert hf_tok("w5 w7")["input_ids"] == [5, 7]


def test_export_dtype_pad_id_and_generation_config(tmp_path):
  """`dtype` stores float32 master weights in another dtype (config.json says which) and
  transformers loads them; `save_generation_config` writes what `generate` reads, top_k 0
  spelled out (transformers' own default is 50)."""
  config = _our_config("llama", True)  # float32 compute and params
  model = _random_model(config, seed=8)
  save_hf_checkpoint(model, config, tmp_path, dtype="bfloat16", eos_token_id=[2, 3], pad_token_id=0)
  hf_config = json.loads((tmp_path / "config.json").read_text())
  assert (hf_config["dtype"], hf_config["torch_dtype"], hf_config["pad_token_id"]) == (
    "bfloat16",
    "bfloat16",
    0,
  )
  stored = {str(v.dtype) for v in load_file(str(tmp_path / SINGLE_WEIGHTS_NAME)).values()}
  assert stored == {"bfloat16"}
  _, loaded = load_hf_checkpoint(tmp_path)
  np.testing.assert_array_equal(  # the float32 weights rounded to bfloat16
    np.asarray(loaded.embed.embedding[...]),
    np.asarray(model.embed.embedding[...]).astype(jnp.bfloat16).astype(np.float32),
  )
  hf_model = _load_hf(tmp_path)
  diff = _max_diff(_our_logits(loaded, _tokens()), _hf_logits(hf_model, _tokens()))
  assert diff < TOL
  with pytest.raises(ValueError, match="dtype must be one of"):
    save_hf_checkpoint(model, config, tmp_path, dtype="int8")

  save_generation_config(
    tmp_path, [2, 3], bos_token_id=1, pad_token_id=0, temperature=0.7, max_new_tokens=64
  )
  gen = transformers.GenerationConfig.from_pretrained(tmp_path)
  assert gen.eos_token_id == [2, 3] and (gen.bos_token_id, gen.pad_token_id) == (1, 0)
  assert gen.do_sample and gen.temperature == 0.7 and gen.top_k == 0 and gen.top_p == 1.0
  assert gen.max_new_tokens == 64
  save_generation_config(tmp_path, 2, temperature=0.0)
  greedy = json.loads((tmp_path / "generation_config.json").read_text())
  assert greedy == {"eos_token_id": 2, "do_sample": False}
  with pytest.raises(ValueError, match="temperature"):
    save_generation_config(tmp_path, 2, temperature=float("nan"))


# ----------------------------------------------------------------------------- errors


def test_missing_config_json(llama_ckpt):
  (llama_ckpt / "config.json").unlink()
  with pytest.raises(FileNotFoundError, match=r"config\.json.*ckpt"):
    load_hf_checkpoint(llama_ckpt)


def test_missing_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope"):
    load_hf_checkpoint(tmp_path / "nope")


def test_missing_weight_file(llama_ckpt):
  (llama_ckpt / SINGLE_WEIGHTS_NAME).unlink()
  with pytest.raises(FileNotFoundError, match=r"no safetensors weights in .*ckpt"):
    load_hf_checkpoint(llama_ckpt)


def test_missing_shard(tmp_path):
  config = _our_config("llama", False)
  save_hf_checkpoint(_random_model(config), config, tmp_path, max_shard_bytes=40_000)
  shard = sorted(tmp_path.glob("model-*-of-*.safetensors"))[1]
  shard.unlink()
  with pytest.raises(FileNotFoundError, match=shard.name):
    load_hf_checkpoint(tmp_path)


def _rewrite_weights(path: Path, edit) -> None:
  file = path / SINGLE_WEIGHTS_NAME
  tensors = load_file(str(file))
  edit(tensors)
  save_file(tensors, str(file), metadata={"format": "pt"})


def test_wrong_shape(llama_ckpt):
  name = "model.layers.1.self_attn.k_proj.weight"
  _rewrite_weights(llama_ckpt, lambda t: t.update({name: np.zeros((16, HIDDEN), np.float32)}))
  with pytest.raises(ValueError, match=rf"{name}: expected shape \(32, 64\), found \(16, 64\)"):
    load_hf_checkpoint(llama_ckpt)


def test_missing_tensor(llama_ckpt):
  _rewrite_weights(llama_ckpt, lambda t: t.pop("model.norm.weight"))
  with pytest.raises(ValueError, match=r"model\.norm\.weight: missing \(expected shape \(64,\)\)"):
    load_hf_checkpoint(llama_ckpt)


def test_unexpected_tensor(llama_ckpt):
  _rewrite_weights(llama_ckpt, lambda t: t.update({"model.extra.weight": np.zeros(3, np.float32)}))
  with pytest.raises(ValueError, match=r"model\.extra\.weight: unexpected"):
    load_hf_checkpoint(llama_ckpt)


def test_inv_freq_is_ignored(llama_ckpt):
  name = "model.layers.0.self_attn.rotary_emb.inv_freq"
  _rewrite_weights(llama_ckpt, lambda t: t.update({name: np.zeros(8, np.float32)}))
  config, _ = load_hf_checkpoint(llama_ckpt)
  assert config.num_layers == LAYERS


def test_tied_checkpoint_with_differing_head(hf_checkpoints, tmp_path):
  path = Path(shutil.copytree(hf_checkpoints[("qwen2", True)][0], tmp_path / "ckpt"))
  # A redundant copy of the embedding is fine; a different matrix is not.
  _rewrite_weights(path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"]}))
  load_hf_checkpoint(path)
  _rewrite_weights(path, lambda t: t.update({"lm_head.weight": t["lm_head.weight"] + 1}))
  with pytest.raises(ValueError, match="differs from model.embed_tokens.weight"):
    load_hf_checkpoint(path)


def test_llama_attention_bias_import(hf_checkpoints, tmp_path):
  """HF Llama's attention_bias also adds an o_proj bias: accepted only when it is zero."""
  hf_model = _make_hf_model("llama", False, attention_bias=True)
  with torch.no_grad():
    for layer in hf_model.model.layers:
      layer.self_attn.o_proj.bias.zero_()
  hf_model.save_pretrained(tmp_path, safe_serialization=True)
  config, model = load_hf_checkpoint(tmp_path)
  assert config.qkv_bias
  tokens = _tokens()
  assert _max_diff(_our_logits(model, tokens), _hf_logits(hf_model, tokens)) < TOL
  name = "model.layers.1.self_attn.o_proj.bias"
  _rewrite_weights(tmp_path, lambda t: t.update({name: t[name] + 0.5}))
  with pytest.raises(ValueError, match=rf"{name}: nonzero"):
    load_hf_checkpoint(tmp_path)


@pytest.mark.parametrize(
  ("updates", "message"),
  [
    ({"model_type": "mistral"}, "unsupported model_type 'mistral'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_type 'yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_type 'llama3' takes"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0, "beta": 1}}, "rope_scaling.beta"),
    ({"rope_parameters": {"rope_theta": 1e6}}, "rope_parameters.rope_theta=.*disagrees"),
    ({"rope_parameters": {"partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ({"quantization_config": {"bits": 4}}, r"not understood: \['quantization_config'\]"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
  ],
)
def test_unsupported_config(llama_ckpt, updates, message):
  _as_transformers4(llama_ckpt)  # the cases above are edits of transformers 4's layout
  _edit_config(llama_ckpt, **updates)
  with pytest.raises(ValueError, match=message):
    load_hf_checkpoint(llama_ckpt)


def _as_transformers5(path: Path) -> None:
  """Rewrites config.json the way transformers 5 writes it: every RoPE setting in one
  rope_parameters dict, no top-level rope_theta or rope_scaling."""
  _as_transformers4(path)
  config_file = path / "config.json"
  hf = json.loads(config_file.read_text())
  rope = {"rope_theta": hf.pop("rope_theta"), "rope_type": "default"}
  rope.update(hf.pop("rope_scaling", None) or {})
  rope.pop("type", None)
  config_file.write_text(json.dumps({**hf, "rope_parameters": rope}))


def _as_transformers4(path: Path) -> None:
  """Rewrites config.json the way transformers 4 writes it (a top-level rope_theta, and
  rope_scaling only for a scaled RoPE), whichever version saved it."""
  config_file = path / "config.json"
  hf = json.loads(config_file.read_text())
  rope = dict(hf.pop("rope_parameters", None) or {})
  if rope:
    hf["rope_theta"] = rope.pop("rope_theta")
    if rope.get("rope_type", "default") != "default":
      hf["rope_scaling"] = rope
  config_file.write_text(json.dumps(hf))


@pytest.mark.parametrize(
  "rope_scaling", [None, {"rope_type": "linear", "factor": 4.0}, LLAMA3_ROPE]
)
def test_rope_scaling_and_both_config_formats_match_transformers(tmp_path, rope_scaling):
  """Llama with plain, linear and Llama-3.1 RoPE: the import matches transformers' logits
  (positions past the original context), and the same checkpoint with its config.json in
  transformers 5's format (rope_parameters) loads to the same config."""
  hf_model = _make_hf_model("llama", False, seed=4, rope_scaling=rope_scaling)
  hf_model.save_pretrained(tmp_path, safe_serialization=True)
  config, model = load_hf_checkpoint(tmp_path)
  assert config.rope_type == (rope_scaling or {}).get("rope_type", "default")
  assert config.rope_theta == 5000.0
  tokens = _tokens(length=80, seed=3)
  diff = _max_diff(_our_logits(model, tokens), _hf_logits(hf_model, tokens))
  print(f"import llama rope {config.rope_type}: max |logit diff| = {diff:.2e}")
  assert diff < TOL
  _as_transformers5(tmp_path)
  assert "rope_theta" not in json.loads((tmp_path / "config.json").read_text())
  config5, _ = load_hf_checkpoint(tmp_path)
  assert config5 == config


def test_rope_theta_only_in_rope_parameters_is_read():
  """transformers 5 writes theta only inside rope_parameters: it must not fall back to
  10000 (the silent error this test guards against)."""
  hf = {
    "model_type": "qwen2",
    "vocab_size": 8,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"},
  }
  assert config_from_hf(hf).rope_theta == 1_000_000.0
  assert config_from_hf({**hf, "rope_theta": 1_000_000.0}).rope_theta == 1_000_000.0


@pytest.mark.parametrize("rope_scaling", [{"rope_type": "linear", "factor": 4.0}, LLAMA3_ROPE])
def test_rope_scaling_round_trips_through_export(tmp_path, rope_scaling):
  base = _our_config("llama", False)
  config = config_from_hf({**config_to_hf(base), "rope_scaling": rope_scaling})
  assert config.rope_type == rope_scaling["rope_type"]
  model = _random_model(config, seed=8)
  save_hf_checkpoint(model, config, tmp_path)
  loaded_config, loaded = load_hf_checkpoint(tmp_path)
  assert loaded_config == config
  _assert_same_params(model, loaded)
  tokens = _tokens(length=80, seed=4)
  diff = _max_diff(_our_logits(model, tokens), _hf_logits(_load_hf(tmp_path), tokens))
  assert diff < TOL


def test_default_rope_scaling_accepted():
  base = {
    "model_type": "llama",
    "vocab_size": 8,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
  }
  for rope_scaling in (None, {"rope_type": "default"}, {"type": "default"}):
    config = config_from_hf({**base, "rope_scaling": rope_scaling})
    # Defaults: kv heads = heads, head_dim = hidden / heads, untied, no bias.
    assert (config.num_kv_heads, config.head_dim) == (2, 8)
    assert not config.tie_embeddings and not config.qkv_bias
  assert config_from_hf({**base, "model_type": "qwen2"}).qkv_bias


def test_export_errors(tmp_path):
  config = _our_config("llama", False)
  model = _random_model(config)
  with pytest.raises(ValueError, match="qwen2 export needs qkv_bias=True"):
    save_hf_checkpoint(model, config, tmp_path, model_type="qwen2")
  with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
    save_hf_checkpoint(model, config, tmp_path, model_type="gpt2")
  with pytest.raises(ValueError, match="qk_norm=False: q/k norms are Qwen3's"):
    save_hf_checkpoint(model, config, tmp_path, model_type="qwen3")
  tied = ModelConfig(**{**config.to_dict(), "tie_embeddings": True})
  with pytest.raises(ValueError, match=r"lm_head\.kernel: not a parameter"):
    save_hf_checkpoint(model, tied, tmp_path)
  wider = ModelConfig(**{**config.to_dict(), "mlp_dim": 2 * MLP})
  with pytest.raises(ValueError, match=r"layers\.0\.mlp\.up_proj\.kernel: expected shape"):
    save_hf_checkpoint(model, wider, tmp_path)
  with pytest.raises(FileNotFoundError, match="no tokenizer files"):
    save_hf_checkpoint(model, config, tmp_path, tokenizer_dir=tmp_path)
  assert not list(tmp_path.iterdir())

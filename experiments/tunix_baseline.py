"""google-tunix sampler baseline for the decoding benchmarks.

Runs tunix's built-in sampler on the same decoder configuration (and, when
given, the same weights) as `tlt_jax.models.transformer.Transformer`, so our
benchmarks can compare decode throughput and long-tail wall time against it in
one process. Tunix is an optional extra (`pip install -e .[bench]`); it is
imported lazily, so importing this module does not need it.

Public API:
  build_tunix_model(config, state=None, seed=0) -> (model, info)
  IdTokenizer(eos_id=None); ids_to_text(ids)
  make_tunix_sampler(model, config, cache_size, eos_id=None) -> tunix Sampler
  tunix_generate(sampler, prompts, new_tokens) -> list of generated-id arrays
  tunix_decode_throughput(model, config, batch, prompt_len, new_tokens, cache_size)
  tunix_longtail_wall(model, config, prompts, lengths, cache_size)

What tunix 0.1.7 offers, and what this module relies on:

Model class. `tunix.models.qwen2.model.Qwen2(ModelConfig(num_layers, vocab_size,
embed_dim, hidden_dim, num_heads, head_dim, num_kv_heads, rope_theta, norm_eps,
use_tied_embedding, dtype, param_dtype), rngs=nnx.Rngs(seed))` is the match:
pre-norm RMSNorm, rotate-half RoPE with a configurable theta, GQA, SwiGLU, tied
or untied head, q/k/v biases, no qk-norm, `dtype`/`param_dtype` honoured. Its
q/k/v biases always exist; for a config without qkv bias they are left at zero,
so the function is identical and the only differences are (H + 2K) * E zero
parameters per layer and three bias adds per layer per step. The other
candidates do not match: `qwen3.Qwen3` applies RMSNorm to q and k per head
(qk-norm, not an identity even with unit weights); `llama3.Llama3` has no
biases but ignores `ModelConfig.rope_theta` (its attention calls `apply_rope`
without it, so theta is always 1e6) and has no dtype settings.

Parameter layout of Qwen2 (ours -> tunix): `embed.embedding` [V, D] ->
`embedder.input_embedding` [V, D]; `attn.{q,k,v}_proj.kernel` [D, N*E] ->
`attn.{q,k,v}_proj.w` [D, N, E]; `attn.{q,k,v}_proj.bias` [N*E] ->
`attn.{q,k,v}_bias` [N*E]; `attn.o_proj.kernel` [H*E, D] -> `attn.o_proj.w`
[H, E, D]; `mlp.{gate,up,down}_proj.kernel` -> same names (nnx.Linear, [in,
out]); `input_norm.scale` -> `input_layernorm.w`; `post_attn_norm.scale` ->
`post_attention_layernorm.w`; `final_norm.scale` -> `final_norm.w`;
`lm_head.kernel` [D, V] -> `lm_head.w` [D, V]. Copied weights give the same
function up to float rounding (RoPE angles via a HIGHEST-precision einsum,
RMSNorm as x / sqrt(.) instead of x * rsqrt(.)); the test checks that greedy
tokens agree. In bf16/fp16 tunix also computes the LM head in that dtype
(ours: float32), so logits may differ slightly more there.

Sampler. `tunix.generate.sampler.Sampler(transformer, tokenizer,
CacheConfig(cache_size, num_layers, num_kv_heads, head_dim))`, called as
`sampler(input_strings, max_generation_steps, max_prompt_length=None,
echo=False, return_logits=False, eos_tokens=None, temperature=0.0, top_p=None,
top_k=None, beam_size=None, seed=None, pad_output=False)` -> `SamplerOutput`
(`.tokens`: one host numpy array of generated ids per row, cut at the first
eos; `.text`). Greedy is the default mode (no top_p, no beam_size).
Quirks worth knowing:
- It takes text only. The tokenizer may be any object with `encode`, `decode`,
  `bos_id`, `eos_id`, `pad_id` (wrapped in its `TokenizerAdapter`). A truthy
  `bos_id()` is prepended to every prompt, so `IdTokenizer` returns None.
- Prompts are left-padded with `pad_id` to `max_prompt_length`; when that is
  None it becomes the next power of two of the longest prompt, so we always
  pass it. Every token equal to `pad_id`, generated ones included, is masked
  out of attention, so the pad id must be one the model never emits: we use -1
  (the prefill embeds it as row V-1 through negative indexing, then masks it).
- `prompt + max_generation_steps` must be <= `cache_size`; the KV cache is
  [B, cache_size, K, E] per layer and every decode step attends over all of
  it, so cache_size is part of the cost.
- Decoding is one jitted `lax.while_loop` that runs until all rows are done
  (each row's first eos in `eos_tokens`, default `[tokenizer.eos_id()]`) or
  `max_generation_steps` are reached; finished rows keep decoding. With eos -1
  no row ever stops, so every row decodes exactly the requested count. The
  loop makes one extra (discarded) decode step after the last token.
- Each call does host work around the two jitted programs (tokenizing text,
  building the sampling state, a device_get and text decode of the outputs);
  timings here include it, as for any caller of the sampler.
- The sampler jits its prefill/decode per instance: build one sampler and
  reuse it; a new prompt length or batch size recompiles.
- No mesh is needed on a single CPU/GPU device: the models' `shard()` is a
  no-op on CPU or without a mesh. If a mesh is wanted, build it with
  `jax.sharding.Mesh(devices, ("fsdp", "tp"))`; `jax.make_mesh` in jax 0.10
  makes explicit axes and the embedding lookup then raises ShardingTypeError.
- Importing tunix's model modules sets the global flax flag
  `flax_always_shard_variable = False` for the whole process.
- Models without `init_cache` (Qwen2) make the sampler emit a
  DeprecationWarning each call; it is silenced here.
"""

from __future__ import annotations

import importlib.metadata
import statistics
import time
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tlt_jax.models.config import ModelConfig

# Never a valid id: used as pad (masked everywhere) and as "no eos".
NO_TOKEN = -1


def ids_to_text(ids: Sequence[int]) -> str:
  """Token ids as the text `IdTokenizer.encode` reads back ("3 17 5")."""
  return " ".join(str(int(i)) for i in ids)


class IdTokenizer:
  """Tokenizer shim over integer ids for tunix's sampler.

  Text is the decimal ids separated by spaces. There is no bos; the pad id is
  -1; the eos id is `eos_id`, or -1 (never produced, so generation runs for the
  requested number of tokens) when None.
  """

  def __init__(self, eos_id: int | None = None):
    self._eos_id = NO_TOKEN if eos_id is None else int(eos_id)

  def encode(self, text: str, **unused_kwargs) -> list[int]:
    return [int(t) for t in text.split()]

  def decode(self, ids: Sequence[int], **unused_kwargs) -> str:
    return ids_to_text(ids)

  def bos_id(self) -> None:
    return None

  def eos_id(self) -> int:
    return self._eos_id

  def pad_id(self) -> int:
    return NO_TOKEN


def _tunix_qwen2():
  from tunix.models.qwen2 import model as qwen2_model

  return qwen2_model


def _tunix_sampler_lib():
  from tunix.generate import sampler as sampler_lib

  return sampler_lib


def tunix_model_config(config: ModelConfig) -> Any:
  """The tunix Qwen2 `ModelConfig` with our shapes and numerics."""
  if config.qk_norm or config.rope_type != "default":
    raise ValueError("the tunix Qwen2 baseline has no q/k norms and plain RoPE only")
  qwen2 = _tunix_qwen2()
  dtype = config.jnp_dtype
  return qwen2.ModelConfig(
    num_layers=config.num_layers,
    vocab_size=config.vocab_size,
    embed_dim=config.d_model,
    hidden_dim=config.mlp_dim,
    num_heads=config.num_heads,
    head_dim=config.head_dim,
    num_kv_heads=config.num_kv_heads,
    rope_theta=config.rope_theta,
    norm_eps=config.rms_eps,
    use_tied_embedding=config.tie_embeddings,
    dtype=dtype,
    param_dtype=dtype,
  )


def _set(variable: nnx.Variable, value: Any) -> None:
  """Replaces a (possibly abstract) tunix parameter, checking its shape.

  Conversions run in numpy: eager jnp ops would each compile on first use.
  """
  current = variable.get_value()
  value = np.asarray(value)
  if value.shape != current.shape:
    raise ValueError(f"shape mismatch: ours {value.shape}, tunix {current.shape}")
  variable.set_value(jnp.asarray(value.astype(current.dtype)))


def _copy_weights(config: ModelConfig, state: nnx.State, model: Any) -> None:
  """Writes our parameters into the tunix Qwen2 `model` in place."""
  c = config
  p = nnx.to_pure_dict(state)
  _set(model.embedder.input_embedding, p["embed"]["embedding"])
  for i in range(c.num_layers):
    ours, theirs = p["layers"][i], model.layers[i]
    attn = ours["attn"]
    for name, heads in (("q", c.num_heads), ("k", c.num_kv_heads), ("v", c.num_kv_heads)):
      proj = attn[f"{name}_proj"]
      _set(
        getattr(theirs.attn, f"{name}_proj").w,
        np.reshape(proj["kernel"], (c.d_model, heads, c.head_dim)),
      )
      bias = getattr(theirs.attn, f"{name}_bias")
      _set(bias, proj["bias"] if c.qkv_bias else np.zeros(bias.get_value().shape))
    _set(
      theirs.attn.o_proj.w,
      np.reshape(attn["o_proj"]["kernel"], (c.num_heads, c.head_dim, c.d_model)),
    )
    for name in ("gate_proj", "up_proj", "down_proj"):
      _set(getattr(theirs.mlp, name).kernel, ours["mlp"][name]["kernel"])
    _set(theirs.input_layernorm.w, ours["input_norm"]["scale"])
    _set(theirs.post_attention_layernorm.w, ours["post_attn_norm"]["scale"])
  _set(model.final_norm.w, p["final_norm"]["scale"])
  if not c.tie_embeddings:
    _set(model.lm_head.w, p["lm_head"]["kernel"])


def build_tunix_model(
  config: ModelConfig, state: nnx.State | None = None, seed: int = 0
) -> tuple[Any, dict[str, Any]]:
  """Builds tunix's Qwen2 model with our configuration.

  Args:
    config: our model configuration.
    state: our parameters (`nnx.split(model)[1]` or `nnx.state(model)`); when
      given they are copied so both models compute the same function. Without
      it the tunix model keeps its own random initialisation.
    seed: tunix's init seed (irrelevant when `state` is given).

  Returns:
    (model, info): the tunix model and a metadata dict: the tunix class and
    version, whether the architecture matches exactly, parameter counts (ours
    and tunix's, whose extra ones are the zero q/k/v biases) and a note.
  """
  qwen2 = _tunix_qwen2()
  make = lambda: qwen2.Qwen2(tunix_model_config(config), rngs=nnx.Rngs(seed))
  if state is None:
    model = make()
  else:
    # Abstract construction: tunix's eager random init compiles op by op (~10 s
    # cold on CPU) and would be overwritten anyway.
    model = nnx.eval_shape(make)
    _copy_weights(config, state, model)
    missing = [
      path
      for path, x in nnx.to_flat_state(nnx.state(model))
      if isinstance(x.get_value(), jax.ShapeDtypeStruct)
    ]
    if missing:
      raise RuntimeError(f"tunix parameters not copied from our state: {missing}")
  tunix_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  extra = tunix_params - config.num_params
  if config.qkv_bias:
    note = "tunix Qwen2: same architecture and parameters."
  else:
    note = (
      f"tunix Qwen2 always has q/k/v biases; ours has none, so they are set to zero "
      f"({extra} zero parameters, same function). Llama3 (no biases) was not used: "
      "tunix 0.1.7 ignores its rope_theta (always 1e6) and it has no dtype settings."
    )
  info = {
    "tunix_class": f"{qwen2.Qwen2.__module__}.{qwen2.Qwen2.__name__}",
    "tunix_version": importlib.metadata.version("google-tunix"),
    "exact_architecture": config.qkv_bias,
    "same_function": True,
    "weights_copied": state is not None,
    "num_params": config.num_params,
    "tunix_num_params": tunix_params,
    "tunix_extra_zero_params": extra,
    "note": note,
  }
  return model, info


def make_tunix_sampler(
  tunix_model: Any, config: ModelConfig, cache_size: int, eos_id: int | None = None
) -> Any:
  """tunix's `Sampler` over `tunix_model` with an `IdTokenizer`."""
  sampler_lib = _tunix_sampler_lib()
  cache_config = sampler_lib.CacheConfig(
    cache_size=cache_size,
    num_layers=config.num_layers,
    num_kv_heads=config.num_kv_heads,
    head_dim=config.head_dim,
  )
  return sampler_lib.Sampler(tunix_model, IdTokenizer(eos_id), cache_config)


def tunix_generate(
  sampler: Any, prompts: Sequence[Sequence[int]], new_tokens: int
) -> list[np.ndarray]:
  """Greedy-decodes `new_tokens` after each prompt; returns generated ids per row.

  Rows are cut at the sampler's eos (none with the default `IdTokenizer`).
  Prompts of different lengths are left-padded to the longest.
  """
  if not prompts or min(len(p) for p in prompts) == 0:
    raise ValueError("need at least one non-empty prompt")
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*deprecated _init_cache.*")
    out = sampler(
      [ids_to_text(p) for p in prompts],
      max_generation_steps=new_tokens,
      max_prompt_length=max(len(p) for p in prompts),
      echo=False,
      temperature=0.0,
    )
  return jax.block_until_ready([np.asarray(t) for t in out.tokens])


def _check_cache(prompt_len: int, new_tokens: int, cache_size: int) -> None:
  if prompt_len + new_tokens > cache_size:
    raise ValueError(
      f"prompt ({prompt_len}) + new tokens ({new_tokens}) exceeds "
      f"cache_size ({cache_size}); tunix requires it to fit"
    )


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def _warm_up(fn) -> float:
  """Runs `fn` twice; returns the first (compiling) call's time.

  On CPU the first call after compilation was still measured ~2x slower than
  steady state (25 -> 60 ms for a 256-token batch-1 run), so it is not timed.
  """
  first = _timed(fn)
  fn()
  return first


def tunix_decode_throughput(
  tunix_model: Any,
  config: ModelConfig,
  batch: int,
  prompt_len: int,
  new_tokens: int,
  cache_size: int,
  repeats: int = 2,
  seed: int = 0,
) -> dict[str, Any]:
  """Tokens/s of tunix's greedy sampler on a batch of random prompts.

  Two warm-up calls with the same shapes run first (the compiling one's time
  is reported as `warmup_s`, not counted). Each timed call decodes exactly `new_tokens` per
  row (no eos), and includes the sampler's host work (see module docstring).

  Returns:
    A dict with `tokens_per_s` (median over `repeats` of batch * new_tokens /
    wall time), the per-repeat `wall_s`, `warmup_s` and the arguments.
  """
  _check_cache(prompt_len, new_tokens, cache_size)
  sampler = make_tunix_sampler(tunix_model, config, cache_size)
  rng = np.random.default_rng(seed)
  make = lambda: rng.integers(0, config.vocab_size, (batch, prompt_len)).tolist()
  warmup_prompts = make()
  warmup_s = _warm_up(lambda: tunix_generate(sampler, warmup_prompts, new_tokens))
  walls = []
  for _ in range(repeats):
    prompts = make()
    start = time.perf_counter()
    out = tunix_generate(sampler, prompts, new_tokens)
    walls.append(time.perf_counter() - start)
    if any(len(t) != new_tokens for t in out):
      raise RuntimeError("tunix stopped a row early; expected no eos")
  generated = batch * new_tokens
  return {
    "engine": "tunix",
    "batch": batch,
    "prompt_len": prompt_len,
    "new_tokens": new_tokens,
    "cache_size": cache_size,
    "generated_tokens": generated,
    "wall_s": walls,
    "warmup_s": warmup_s,
    "tokens_per_s": statistics.median(generated / w for w in walls),
  }


def tunix_longtail_wall(
  tunix_model: Any,
  config: ModelConfig,
  prompts: list[list[int]],
  lengths: list[int],
  cache_size: int,
  repeats: int = 1,
) -> dict[str, Any]:
  """Wall time of tunix decoding a long-tail batch in one call.

  Row r wants `lengths[r]` tokens, but tunix cannot stop rows individually
  without an eos, so the whole batch decodes `max(lengths)` tokens per row:
  the baseline behaviour our long-tail benchmark contrasts with.

  Args:
    tunix_model: from `build_tunix_model`.
    config: our model configuration.
    prompts: one prompt per row, or G prompts when len(lengths) = G * k: each
      prompt then fills k consecutive rows (G prompts x k samples).
    lengths: useful generated tokens per row.
    cache_size: KV cache slots; >= longest prompt + max(lengths).
    repeats: timed calls after two warm-up calls (same shapes, the first one
      compiles); wall_s is their median.

  Returns:
    A dict with `wall_s`, `warmup_s`, `rows`, `decoded_tokens` (rows *
    max(lengths)), `useful_tokens` (sum(lengths)), `useful_tokens_per_s` and
    `useful_fraction`.
  """
  if not prompts or not lengths or len(lengths) % len(prompts):
    raise ValueError(
      f"len(lengths) ({len(lengths)}) must be a positive multiple of len(prompts) ({len(prompts)})"
    )
  samples = len(lengths) // len(prompts)
  rows = [list(p) for p in prompts for _ in range(samples)]
  max_len = max(lengths)
  prompt_len = max(len(p) for p in rows)
  _check_cache(prompt_len, max_len, cache_size)
  sampler = make_tunix_sampler(tunix_model, config, cache_size)
  warmup_s = _warm_up(lambda: tunix_generate(sampler, rows, max_len))
  walls = [_timed(lambda: tunix_generate(sampler, rows, max_len)) for _ in range(repeats)]
  wall = statistics.median(walls)
  useful = int(sum(lengths))
  decoded = len(rows) * max_len
  return {
    "engine": "tunix",
    "rows": len(rows),
    "prompt_len": prompt_len,
    "max_len": max_len,
    "cache_size": cache_size,
    "wall_s": wall,
    "wall_s_all": walls,
    "warmup_s": warmup_s,
    "decoded_tokens": decoded,
    "useful_tokens": useful,
    "useful_tokens_per_s": useful / wall,
    "useful_fraction": useful / decoded,
  }

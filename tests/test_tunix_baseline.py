"""Tests for the google-tunix sampler baseline (experiments/tunix_baseline.py)."""

import pathlib
import sys

import pytest

pytest.importorskip("tunix")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from tlt_jax.models.config import ModelConfig  # noqa: E402
from tlt_jax.models.transformer import init_model  # noqa: E402

# experiments/ is not an installed package: import it from the repository root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from experiments import tunix_baseline as tb  # noqa: E402

TINY = dict(
  vocab_size=64, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=128
)


def _reference_greedy(model, prompts, new_tokens):
  """Greedy tokens from a full forward per step (positions = arange).

  Rows sit right-padded in one fixed-size buffer; causal attention keeps the
  padding after a row's end from affecting its last position, so one compiled
  shape serves every step and row length.
  """
  lengths = np.array([len(p) for p in prompts])
  width = lengths.max() + new_tokens
  buf = np.zeros((len(prompts), width), np.int32)
  for r, p in enumerate(prompts):
    buf[r, : len(p)] = p
  positions = jnp.broadcast_to(jnp.arange(width), buf.shape)

  @nnx.jit
  def next_tokens(model, tokens, last):
    hidden, _, _ = model(tokens, positions)
    hidden = jnp.take_along_axis(hidden, last[:, None, None], axis=1)
    return model.logits(hidden)[:, -1].argmax(-1)

  rows = np.arange(len(prompts))
  out = np.zeros((len(prompts), new_tokens), np.int32)
  for step in range(new_tokens):
    cur = lengths + step
    out[:, step] = np.asarray(next_tokens(model, jnp.asarray(buf), jnp.asarray(cur - 1)))
    buf[rows, cur] = out[:, step]
  return out


@pytest.mark.parametrize(
  "variant",
  [
    dict(),  # tied head, no qkv bias: tunix Qwen2 with zero biases
    dict(qkv_bias=True, tie_embeddings=False, rope_theta=1e6),  # exact Qwen2
  ],
)
def test_greedy_tokens_match_our_model(variant):
  config = ModelConfig(**TINY, **variant)
  model = init_model(config, seed=1)
  if config.qkv_bias:  # non-zero biases, so copying them is checked
    keys = iter(jax.random.split(jax.random.key(7), 3 * config.num_layers))
    for layer in model.layers:
      for proj in (layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj):
        proj.bias[...] = 0.5 * jax.random.normal(next(keys), proj.bias.shape)
  _, state = nnx.split(model)
  tunix_model, info = tb.build_tunix_model(config, state)
  assert info["weights_copied"] and info["same_function"]
  assert info["tunix_class"] == "tunix.models.qwen2.model.Qwen2"
  assert info["exact_architecture"] == config.qkv_bias
  bias_params = config.num_layers * (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
  assert info["tunix_extra_zero_params"] == (0 if config.qkv_bias else bias_params)

  rng = np.random.default_rng(0)
  # Uneven lengths exercise tunix's left padding (pad id -1).
  prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in (8, 8, 6, 7)]
  sampler = tb.make_tunix_sampler(tunix_model, config, cache_size=32)
  got = np.stack(tb.tunix_generate(sampler, prompts, new_tokens=16))
  want = _reference_greedy(model, prompts, new_tokens=16)
  np.testing.assert_array_equal(got, want)


def test_id_tokenizer_round_trip():
  tok = tb.IdTokenizer()
  assert tok.encode(tb.ids_to_text([3, 0, 17])) == [3, 0, 17]
  assert tok.decode([5, 6]) == "5 6"
  assert tok.bos_id() is None
  assert tok.eos_id() == tok.pad_id() == tb.NO_TOKEN
  assert tb.IdTokenizer(eos_id=2).eos_id() == 2


def test_throughput_and_longtail_report():
  config = ModelConfig(**TINY)
  tunix_model, info = tb.build_tunix_model(config)
  assert not info["weights_copied"]

  res = tb.tunix_decode_throughput(
    tunix_model, config, batch=2, prompt_len=8, new_tokens=8, cache_size=16, repeats=2
  )
  assert res["generated_tokens"] == 16 and len(res["wall_s"]) == 2
  # The median over repeats of the generated tokens per wall second.
  assert res["tokens_per_s"] == pytest.approx(np.median([16 / w for w in res["wall_s"]]))

  lengths = [3, 8, 5, 1]  # 2 prompts x 2 samples
  res = tb.tunix_longtail_wall(
    tunix_model, config, [[1, 2, 3], [4, 5, 6, 7]], lengths, cache_size=16
  )
  assert res["rows"] == 4 and res["max_len"] == 8 and res["prompt_len"] == 4
  assert res["decoded_tokens"] == 32 and res["useful_tokens"] == 17
  assert res["wall_s"] > 0 and res["useful_fraction"] == pytest.approx(17 / 32)

  with pytest.raises(ValueError, match="cache_size"):
    tb.tunix_longtail_wall(tunix_model, config, [[1, 2, 3]], [14], cache_size=16)
  with pytest.raises(ValueError, match="multiple"):
    tb.tunix_longtail_wall(tunix_model, config, [[1], [2]], [3, 4, 5], cache_size=16)

"""Tiny byte-level BPE tokenizers built inside the tests (no download): every string
round-trips exactly, and the special tokens are whole tokens."""

from __future__ import annotations

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers


def train_bpe(
  texts: list[str], special_tokens: list[str], vocab_size: int = 400
) -> tokenizers.Tokenizer:
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=special_tokens,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(texts, trainer=trainer)
  return tok


# A ChatML chat template, as Qwen's tokenizers ship it (the parts the tests render).
CHATML = (
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_qwen3_checkpoint(path, seed: int = 0, rope_theta: float = 1e6):
  """A tiny random Qwen3-layout checkpoint (q/k norms, tied embeddings) with a ChatML BPE
  tokenizer (eos <|im_end|>, no BOS) in `path`, as transformers would save one."""
  import json

  from tlt_jax.models.config import ModelConfig
  from tlt_jax.models.hf_io import save_hf_checkpoint
  from tlt_jax.models.transformer import init_model

  path.mkdir(parents=True, exist_ok=True)
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  tok = train_bpe(["What is 3 plus 4? 3+4=7. #### 7"] * 8, specials, 320)
  tok.save(str(path / "tokenizer.json"))
  (path / "tokenizer_config.json").write_text(
    json.dumps({"bos_token": None, "eos_token": "<|im_end|>", "chat_template": CHATML})
  )
  config = ModelConfig(
    vocab_size=tok.get_vocab_size(),
    num_layers=1,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    qk_norm=True,
    tie_embeddings=True,
    rope_theta=rope_theta,
  )
  save_hf_checkpoint(init_model(config, seed=seed), config, path, model_type="qwen3")
  return path

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

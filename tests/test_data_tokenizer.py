"""Tests for tlt_jax.data.tokenizer."""

import json
import string

import numpy as np
import pytest
import tokenizers
from bpe_helpers import train_bpe

from tlt_jax.data import tasks
from tlt_jax.data.tokenizer import (
  CharTokenizer,
  HFTokenizer,
  Tokenizer,
  get_tokenizer,
  text_ends,
)

_SENTENCES = [
  "Natalia sold clips to 48 of her friends in April.",
  "Then she sold half as many clips in May.",
  "How many clips did Natalia sell altogether in April and May?",
  "The answer is 72.",
] * 4


def _train_bpe(special_tokens: list[str]) -> tokenizers.Tokenizer:
  return train_bpe(_SENTENCES, special_tokens)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("hf_tok")
  _train_bpe(["<pad>", "<s>", "</s>", "<|im_end|>"]).save(str(path / "tokenizer.json"))
  return path


# ------------------------------------------------------------------------------------------------
# CharTokenizer.
# ------------------------------------------------------------------------------------------------


def test_char_specials_and_small_vocab():
  tok = CharTokenizer()
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  assert tok.vocab_size < 128
  assert tok.vocab_size == 3 + len(tok.alphabet)
  assert isinstance(tok, Tokenizer)


def test_char_ids_are_fixed():
  # Ids are part of the format trained models depend on: pin a few.
  tok = CharTokenizer()
  assert tok.encode("0+a#") == [3, 13, 26, 23]
  assert tok.encode("9;\n") == [12, 21, 25]


def test_char_alphabet_is_printable_ascii():
  assert set(CharTokenizer().alphabet) == set(string.printable) - set("\r\x0b\x0c")


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_char_round_trips_task_text(task):
  tok = CharTokenizer()
  for example in tasks.TASKS[task].generate(3, 50):
    text = tasks.format_prompt(example) + tasks.format_target(example)
    ids = tok.encode(text)
    assert all(3 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_char_bos_and_special_decoding():
  tok = CharTokenizer()
  ids = tok.encode("12=", add_bos=True)
  assert ids[0] == tok.bos_id
  assert tok.decode([*ids, tok.eos_id, tok.pad_id]) == "12="
  assert tok.decode([*ids, tok.eos_id], skip_special=False) == "<s>12=</s>"


def test_char_decode_accepts_arrays():
  tok = CharTokenizer()
  ids = np.asarray(tok.encode("7-3=4"), dtype=np.int32)
  assert tok.decode(ids) == "7-3=4"


def test_char_unknown_character_raises():
  with pytest.raises(ValueError, match="'é'"):
    CharTokenizer().encode("café")


def test_char_drops_ids_outside_the_vocab():
  # A model with a padded embedding table can sample them; they have no text.
  tok = CharTokenizer()
  assert tok.decode([tok.vocab_size, 3, -1, 200], skip_special=False) == "0"


# ------------------------------------------------------------------------------------------------
# HFTokenizer.
# ------------------------------------------------------------------------------------------------


def test_hf_reads_specials_from_tokenizer_config(hf_dir, tmp_path):
  (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps(
      {
        "bos_token": {"content": "<s>", "special": True},
        "eos_token": "<|im_end|>",
        "pad_token": "<pad>",
      }
    )
  )
  tok = HFTokenizer.from_dir(tmp_path)
  raw = tok.hf_tokenizer
  assert tok.bos_id == raw.token_to_id("<s>")
  assert tok.eos_id == raw.token_to_id("<|im_end|>")
  assert tok.pad_id == raw.token_to_id("<pad>")
  assert tok.vocab_size == raw.get_vocab_size(with_added_tokens=True)
  assert isinstance(tok, Tokenizer)


def test_hf_falls_back_to_vocab_specials(hf_dir):
  tok = HFTokenizer.from_dir(hf_dir)
  raw = tok.hf_tokenizer
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (
    raw.token_to_id("<pad>"),
    raw.token_to_id("<s>"),
    raw.token_to_id("</s>"),
  )


def test_hf_reads_ids_from_model_configs(hf_dir, tmp_path):
  (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
  (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 2]}))
  tok = HFTokenizer.from_dir(tmp_path)
  assert tok.bos_id == 1
  assert tok.eos_id == 3  # generation_config.json is read before config.json.
  assert tok.eos_ids == (3, 2)


def test_hf_pad_falls_back_to_eos(tmp_path):
  _train_bpe(["<s>", "</s>"]).save(str(tmp_path / "tokenizer.json"))
  tok = HFTokenizer.from_dir(tmp_path)
  assert tok.pad_id == tok.eos_id == tok.hf_tokenizer.token_to_id("</s>")


def test_hf_without_eos_raises(tmp_path):
  _train_bpe(["<unk>"]).save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(ValueError, match="end-of-sequence"):
    HFTokenizer.from_dir(tmp_path)


def test_hf_missing_tokenizer_json_raises(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    HFTokenizer.from_dir(tmp_path)


def test_hf_round_trip(hf_dir):
  tok = HFTokenizer.from_dir(hf_dir)
  text = "How many clips did Natalia sell? 48 + 24 = 72, café!"
  ids = tok.encode(text)
  assert tok.bos_id not in ids
  assert tok.decode(ids) == text
  with_bos = tok.encode(text, add_bos=True)
  assert with_bos == [tok.bos_id, *ids]
  assert tok.decode(np.asarray([*with_bos, tok.eos_id])) == text
  assert "</s>" in tok.decode([*ids, tok.eos_id], skip_special=False)
  assert tok.decode([*ids, tok.vocab_size + 5]) == text


@pytest.mark.parametrize("kind", ["char", "hf"])
def test_text_ends_locate_each_token_in_the_decoded_text(kind, hf_dir):
  tok = CharTokenizer() if kind == "char" else HFTokenizer.from_dir(hf_dir)
  ids = [*tok.encode("48 + 24 = 72;#72"), tok.eos_id]
  ends = text_ends(tok, ids)
  assert ends == [len(tok.decode(ids[: i + 1])) for i in range(len(ids))]
  assert ends[-1] == ends[-2] == len(tok.decode(ids))  # the special token adds nothing


def test_get_tokenizer(hf_dir, tmp_path):
  assert isinstance(get_tokenizer("char"), CharTokenizer)
  assert isinstance(get_tokenizer(hf_dir), HFTokenizer)
  with pytest.raises(ValueError, match="Unknown tokenizer"):
    get_tokenizer(tmp_path / "missing")

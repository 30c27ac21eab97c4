"""Tokenizers behind one small interface.

`CharTokenizer` is the built-in character-level tokenizer for the synthetic tasks; `HFTokenizer`
wraps a local Hugging Face `tokenizer.json` for real models. Both give ids as plain Python ints;
neither appends an end-of-sequence token on its own (the caller decides where sequences end).
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import tokenizers

__all__ = ["CharTokenizer", "HFTokenizer", "Tokenizer", "get_tokenizer", "text_ends"]


@runtime_checkable
class Tokenizer(Protocol):
  """What the rest of the library needs from a tokenizer."""

  vocab_size: int
  pad_id: int
  bos_id: int
  eos_id: int

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    """Returns the ids of `text`, with `bos_id` in front when `add_bos` and the tokenizer
    starts sequences with one."""
    ...

  def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
    """Returns the text of `ids`; special tokens are dropped when `skip_special`.

    Ids outside [0, vocab_size) have no text and are dropped: a model whose embedding table is
    padded past the tokenizer's vocabulary can sample them.
    """
    ...


def _as_int_list(ids: Iterable[Any]) -> list[int]:
  # Accepts lists, numpy and jax arrays alike; int() on a 0-d array gives the Python int.
  return [int(i) for i in ids]


# The order is part of the format: a model trained with this tokenizer depends on it, so new
# characters may only ever be appended.
_CHAR_ALPHABET = (
  string.digits
  + "+-*/=(),;:# \n"
  + string.ascii_lowercase
  + ".?!'\"_<>[]{}|^%$&@~`\\"
  + string.ascii_uppercase
  + "\t"
)


class CharTokenizer:
  """Character-level tokenizer with a fixed alphabet (printable ASCII).

  Ids 0, 1 and 2 are pad, bos and eos; each character of the alphabet follows in a fixed order,
  so ids never depend on data.
  """

  PAD, BOS, EOS = "<pad>", "<s>", "</s>"

  def __init__(self) -> None:
    specials = (self.PAD, self.BOS, self.EOS)
    self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
    self._id_to_piece: tuple[str, ...] = specials + tuple(_CHAR_ALPHABET)
    self._char_to_id = {c: i + len(specials) for i, c in enumerate(_CHAR_ALPHABET)}
    self.vocab_size: int = len(self._id_to_piece)
    self._num_special = len(specials)

  @property
  def alphabet(self) -> str:
    """The characters this tokenizer can encode, in id order."""
    return _CHAR_ALPHABET

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    ids = [self.bos_id] if add_bos else []
    for pos, char in enumerate(text):
      token = self._char_to_id.get(char)
      if token is None:
        raise ValueError(
          f"CharTokenizer cannot encode character {char!r} (code point {ord(char)}) at "
          f"position {pos} of the text; it only knows printable ASCII."
        )
      ids.append(token)
    return ids

  def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
    first = self._num_special if skip_special else 0
    return "".join(self._id_to_piece[t] for t in _as_int_list(ids) if first <= t < self.vocab_size)

  def __repr__(self) -> str:
    return f"CharTokenizer(vocab_size={self.vocab_size})"


# Used only when no config file names the special tokens; first match in the vocab wins.
_BOS_CANDIDATES = ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]", "<|im_start|>")
_EOS_CANDIDATES = ("</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "[SEP]")
_PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not valid JSON: {e}") from e
  return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
  # tokenizer_config.json writes special tokens either as a string or as a serialised AddedToken.
  if isinstance(value, str):
    return value
  if isinstance(value, Mapping) and isinstance(value.get("content"), str):
    return value["content"]
  return None


def _chat_template(path: str, tok_cfg: Mapping[str, Any]) -> str | None:
  template = tok_cfg.get("chat_template")
  if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
    template = named.get("default")
  if isinstance(template, str):
    return template
  jinja_file = os.path.join(path, "chat_template.jinja")
  if os.path.isfile(jinja_file):
    with open(jinja_file, encoding="utf-8") as f:
      return f.read()
  return None


def _as_id_list(value: Any) -> list[int]:
  # config.json / generation_config.json hold an int, a list of ints (several eos) or null.
  if isinstance(value, bool):
    return []
  if isinstance(value, int):
    return [value]
  if isinstance(value, list):
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
  return []


class HFTokenizer:
  """A Hugging Face `tokenizers.Tokenizer` behind the `Tokenizer` interface.

  Attributes:
    vocab_size: Size of the tokenizer's vocabulary including added tokens. A model's embedding
      table may be larger (padded); that size belongs to the model config.
    pad_id, bos_id, eos_id: Special token ids.
    eos_ids: Every id that ends generation (`eos_id` first), e.g. the several ids listed in a
      chat model's `generation_config.json`.
    uses_bos: whether sequences start with `bos_id` (`encode(add_bos=True)` adds it only
      then): Llama's do, Qwen's (no bos_token in tokenizer_config.json) do not.
    chat_template: the Jinja chat template of tokenizer_config.json (or chat_template.jinja),
      None without one; `special_text` the bos / eos token strings it may print.
  """

  def __init__(
    self,
    tokenizer: tokenizers.Tokenizer,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int | None = None,
    eos_ids: Iterable[int] = (),
    uses_bos: bool = True,
    chat_template: str | None = None,
  ) -> None:
    self._tok = tokenizer
    self.uses_bos = bool(uses_bos)
    self.chat_template = chat_template
    self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
    self.bos_id = int(bos_id)
    self.eos_id = int(eos_id)
    self.pad_id = self.eos_id if pad_id is None else int(pad_id)
    self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys([self.eos_id, *map(int, eos_ids)]))
    for name, token in (("bos", self.bos_id), ("eos", self.eos_id), ("pad", self.pad_id)):
      if not 0 <= token < self.vocab_size:
        raise ValueError(f"{name}_id {token} is outside the vocabulary [0, {self.vocab_size}).")
    self.special_text = {
      "bos_token": tokenizer.id_to_token(self.bos_id) if self.uses_bos else "",
      "eos_token": tokenizer.id_to_token(self.eos_id),
    }

  @classmethod
  def from_dir(cls, path: str | os.PathLike[str]) -> HFTokenizer:
    """Loads `tokenizer.json` from a local model directory.

    Special tokens come from `tokenizer_config.json`, then `generation_config.json`, then
    `config.json`, whichever names them first; failing those, from well-known special tokens
    present in the vocabulary. pad falls back to eos and bos (as in GPT-2) to eos. Sequences
    start with bos unless tokenizer_config.json says otherwise (`add_bos_token: false`, or
    `bos_token: null` as Qwen's does). The chat template is tokenizer_config.json's
    `chat_template` (a string, or the entry named "default" of a list) or chat_template.jinja.

    Args:
      path: A directory holding at least `tokenizer.json`.

    Returns:
      The tokenizer.

    Raises:
      FileNotFoundError: If `path/tokenizer.json` does not exist.
      ValueError: If no end-of-sequence token can be found.
    """
    path = os.fspath(path)
    tok_file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tok_file):
      raise FileNotFoundError(
        f"No tokenizer.json in {path!r}: HFTokenizer needs a fast-tokenizer file (save one with "
        "`AutoTokenizer.from_pretrained(...).save_pretrained(dir)` or `Tokenizer.save`)."
      )
    tok = tokenizers.Tokenizer.from_file(tok_file)
    tok_cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
    gen_cfg = _read_json(os.path.join(path, "generation_config.json"))
    model_cfg = _read_json(os.path.join(path, "config.json"))

    def resolve(kind: str, candidates: tuple[str, ...]) -> tuple[int | None, list[int]]:
      content = _token_content(tok_cfg.get(f"{kind}_token"))
      if content is not None and tok.token_to_id(content) is not None:
        return tok.token_to_id(content), []
      for cfg in (gen_cfg, model_cfg):
        ids = [i for i in _as_id_list(cfg.get(f"{kind}_token_id")) if i >= 0]
        if ids:
          return ids[0], ids[1:]
      for candidate in candidates:
        token = tok.token_to_id(candidate)
        if token is not None:
          return token, []
      return None, []

    eos_id, _ = resolve("eos", _EOS_CANDIDATES)
    if eos_id is None:
      raise ValueError(
        f"Cannot find an end-of-sequence token for the tokenizer in {path!r}: none is named in "
        "tokenizer_config.json, generation_config.json or config.json, and none of "
        f"{list(_EOS_CANDIDATES)} is in the vocabulary."
      )
    if "add_bos_token" in tok_cfg:
      uses_bos = bool(tok_cfg["add_bos_token"])
    else:  # a tokenizer_config.json that names no bos_token (null) has none
      uses_bos = "bos_token" not in tok_cfg or tok_cfg["bos_token"] is not None
    bos_id, _ = resolve("bos", _BOS_CANDIDATES)
    pad_id, _ = resolve("pad", _PAD_CANDIDATES)
    # Chat models list several stop ids in generation_config.json; keep them all for stopping.
    extra_eos = _as_id_list(gen_cfg.get("eos_token_id")) + _as_id_list(
      model_cfg.get("eos_token_id")
    )
    return cls(
      tok,
      bos_id=eos_id if bos_id is None else bos_id,
      eos_id=eos_id,
      pad_id=pad_id,
      eos_ids=[i for i in extra_eos if 0 <= i < tok.get_vocab_size(with_added_tokens=True)],
      uses_bos=uses_bos,
      chat_template=_chat_template(path, tok_cfg),
    )

  @property
  def hf_tokenizer(self) -> tokenizers.Tokenizer:
    """The wrapped `tokenizers.Tokenizer`."""
    return self._tok

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    # add_special_tokens=False: the post-processor of some tokenizers would add bos/eos on its
    # own, and this interface makes bos explicit.
    ids = self._tok.encode(text, add_special_tokens=False).ids
    return [self.bos_id, *ids] if add_bos and self.uses_bos else list(ids)

  def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
    ids = [t for t in _as_int_list(ids) if 0 <= t < self.vocab_size]
    return self._tok.decode(ids, skip_special_tokens=skip_special)

  def __repr__(self) -> str:
    return (
      f"HFTokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id}, "
      f"pad_id={self.pad_id})"
    )


def get_tokenizer(name_or_dir: str | os.PathLike[str]) -> CharTokenizer | HFTokenizer:
  """Returns the tokenizer named `"char"` or the one stored in a local model directory."""
  name = os.fspath(name_or_dir)
  if name == "char":
    return CharTokenizer()
  if os.path.isdir(name):
    return HFTokenizer.from_dir(name)
  raise ValueError(
    f"Unknown tokenizer {name!r}: expected 'char' or an existing directory holding tokenizer.json."
  )


def text_ends(tokenizer: Tokenizer, ids: Iterable[int]) -> list[int]:
  """For each id, the length of `decode(ids[: i + 1])`: where its text ends in the decoded
  string (special tokens add nothing), to map character spans (e.g. reasoning steps) to
  tokens. Linear for `CharTokenizer`; a prefix decode per token otherwise (merges and
  byte-level pieces make per-token lengths unreliable)."""
  ids = _as_int_list(ids)
  if isinstance(tokenizer, CharTokenizer):
    ends, n = [], 0
    for t in ids:
      n += len(tokenizer.decode([t]))
      ends.append(n)
    return ends
  return [len(tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]

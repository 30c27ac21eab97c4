"""Host-side text of group drafts: each prompt's earlier rollouts and this rollout's finished rows.

`PromptHistory` keeps, per prompt (keyed by its token ids), the completions of its last
`max_rollouts` rollouts: in multi-epoch RL (DAPO-style runs over a small set) a prompt comes
back, and its new samples repeat its old ones. The engine turns it, plus the rows of the
current rollout that already finished and left the batch, into each row's reference line
(`decode.group_drafts.GroupCorpus.reference`). It goes into RL checkpoints, so a resumed run
drafts from the same history as an uninterrupted one.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tlt_jax.decode.group_drafts import NO_TOKEN

_STATE_VERSION = 1


def _key(prompt: Sequence[int] | np.ndarray) -> bytes:
  return np.asarray(prompt, np.int32).tobytes()


def reference_line(pieces: Iterable[np.ndarray], length: int) -> np.ndarray:
  """`pieces` (oldest first) joined by NO_TOKEN separators into a `length`-token line,
  right-aligned: when they do not fit, the oldest tokens are dropped; the start is padded."""
  line = np.full((length,), NO_TOKEN, np.int32)
  end = length
  for piece in reversed(list(pieces)):
    if end <= 0:
      break
    end -= 1  # separator after the piece
    take = min(len(piece), end)
    if take:
      line[end - take : end] = np.asarray(piece, np.int32)[len(piece) - take :]
    end -= take
  return line


class PromptHistory:
  """Completions of each prompt's last `max_rollouts` rollouts.

  Each completion is stored with the last `context` prompt tokens before it, so that a row
  at the very start of its answer (whose suffix is the prompt's end) finds the earlier
  answers' beginnings.
  """

  def __init__(self, max_rollouts: int = 4, context: int = 8):
    if isinstance(max_rollouts, bool) or not isinstance(max_rollouts, int) or max_rollouts < 0:
      raise ValueError(f"max_rollouts must be an int >= 0, got {max_rollouts!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
      raise ValueError(f"context must be an int >= 0, got {context!r}")
    self.max_rollouts = max_rollouts
    self.context = context
    self._rollouts: dict[bytes, collections.deque[list[np.ndarray]]] = {}

  def __len__(self) -> int:
    """Prompts with at least one stored rollout."""
    return len(self._rollouts)

  def with_context(self, prompt: Sequence[int], completion: np.ndarray) -> np.ndarray:
    tail = np.asarray(prompt, np.int32)[len(prompt) - min(self.context, len(prompt)) :]
    return np.concatenate([tail, np.asarray(completion, np.int32)])

  def add(self, prompt: Sequence[int], completions: Sequence[np.ndarray]) -> None:
    """Records one rollout of `prompt` (its G completions); the oldest beyond
    `max_rollouts` is forgotten."""
    if self.max_rollouts == 0:
      return
    key = _key(prompt)
    group = [self.with_context(prompt, c) for c in completions]
    self._rollouts.setdefault(key, collections.deque(maxlen=self.max_rollouts)).append(group)

  def clear(self) -> None:
    self._rollouts = {}

  def pieces(self, prompt: Sequence[int]) -> list[np.ndarray]:
    """The stored texts of `prompt`, oldest rollout first."""
    return [c for group in self._rollouts.get(_key(prompt), ()) for c in group]

  # ------------------------------------------------------------ checkpointing
  def state_dict(self) -> dict[str, Any]:
    """Flat int32 arrays (orbax-friendly): every stored text concatenated, with per-text
    lengths, per-rollout text counts, per-prompt rollout counts and prompts."""
    prompts, n_rollouts, n_texts, lengths, texts = [], [], [], [], []
    for key, groups in self._rollouts.items():
      prompts.append(np.frombuffer(key, np.int32))
      n_rollouts.append(len(groups))
      for group in groups:
        n_texts.append(len(group))
        for t in group:
          lengths.append(len(t))
          texts.append(t)
    cat = lambda xs: np.concatenate(xs).astype(np.int32) if xs else np.zeros((0,), np.int32)
    return {
      # Never empty (orbax and numpy round trips of empty arrays are fragile): a header.
      "header": np.asarray([_STATE_VERSION, self.max_rollouts, self.context], np.int32),
      "prompt_lengths": np.asarray([len(p) for p in prompts] + [0], np.int32),
      "prompts": cat(prompts + [np.zeros((1,), np.int32)]),
      "rollouts": np.asarray(n_rollouts + [0], np.int32),
      "texts": np.asarray(n_texts + [0], np.int32),
      "text_lengths": np.asarray(lengths + [0], np.int32),
      "tokens": cat(texts + [np.zeros((1,), np.int32)]),
    }

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores `state_dict()`'s output (the stored rollouts; this object's limits stay)."""
    header = np.asarray(state["header"]).tolist()
    if header[0] != _STATE_VERSION:
      raise ValueError(f"prompt history state version {header[0]}, expected {_STATE_VERSION}")
    plen = np.asarray(state["prompt_lengths"])[:-1]
    prompts = np.asarray(state["prompts"], np.int32)
    rollouts = np.asarray(state["rollouts"])[:-1]
    texts = np.asarray(state["texts"])[:-1]
    tlen = np.asarray(state["text_lengths"])[:-1]
    tokens = np.asarray(state["tokens"], np.int32)
    if len(rollouts) != len(plen) or rollouts.sum() != len(texts) or texts.sum() != len(tlen):
      raise ValueError("prompt history state is inconsistent (counts do not add up)")
    self._rollouts = {}
    p_off = t_off = g = n = 0
    for i, length in enumerate(plen):
      key = _key(prompts[p_off : p_off + length])
      p_off += length
      groups = collections.deque(maxlen=self.max_rollouts or None)
      for _ in range(rollouts[i]):
        group = []
        for _ in range(texts[g]):
          group.append(tokens[t_off : t_off + tlen[n]].copy())
          t_off += tlen[n]
          n += 1
        g += 1
        groups.append(group)
      if self.max_rollouts:
        self._rollouts[key] = groups

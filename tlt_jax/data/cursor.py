"""The training examples in a seeded shuffled order, read a batch at a time: the RL job's
data position, which a resume restores."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


class DataCursor:
  """Examples in the order `np.random.default_rng(seed).permutation`, cycled: the i-th
  example read (from 0) is `examples[order[i % len(examples)]]`, so a run's data order is
  fixed by its seed and a position."""

  def __init__(self, examples: Sequence[Mapping[str, str]], seed: int):
    if not examples:
      raise ValueError("no training examples")
    self.examples = list(examples)
    self.order = np.random.default_rng(seed).permutation(len(self.examples))
    self.position = 0  # examples read so far

  def at(self, start: int, n: int) -> list[Mapping[str, str]]:
    """The n examples read from position `start` (any position: it cycles)."""
    size = len(self.order)
    return [self.examples[int(self.order[(start + i) % size])] for i in range(n)]

  def next(self, n: int) -> list[Mapping[str, str]]:
    """The next n examples; the position moves past them."""
    out = self.at(self.position, n)
    self.position += n
    return out

  @property
  def epoch(self) -> int:
    """Which pass over the examples the next read starts in (0 first)."""
    return self.position // len(self.order)

  def state_dict(self) -> dict[str, Any]:
    return {"position": self.position}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.position = int(state["position"])

"""Per-slot device state of a rollout and the bucket arithmetic around it."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import flax.struct
import jax
import numpy as np

from tlt_jax.models.transformer import KVCache


@flax.struct.dataclass
class RolloutState:
  """Everything a batch of sequences carries between decode chunks.

  Row b holds one sequence. `tokens[b, :length[b]]` is prompt + generated text;
  the last of those tokens has been sampled but not yet run through the model,
  so the cache holds `length - 1` positions. Per-position outputs are indexed by
  absolute position t:
    logprobs[b, t]: log p(tokens[b, t] | tokens[b, :t]) for generated t;
    hidden[b, t]:   last-layer post-norm hidden state after token t, which
                    predicts token t + 1 (the EAGLE drafter's feature f_t).

  Attributes:
    cache: KV cache, [B, S, K, E] per layer.
    tokens: [B, S] int32.
    logprobs: [B, S] float32.
    hidden: [B, S, D] (shape [B, 0, D] when capture is off).
    length: [B] int32, tokens so far (prompt + generated).
    prompt_len: [B] int32.
    max_len: [B] int32, prompt_len + this sequence's max new tokens.
    done: [B] bool; padding rows start done.
    seq_id: [B] int32, the sequence's global id (keys its randomness); -1 pads.
  """

  cache: KVCache
  tokens: jax.Array
  logprobs: jax.Array
  hidden: jax.Array
  length: jax.Array
  prompt_len: jax.Array
  max_len: jax.Array
  done: jax.Array
  seq_id: jax.Array

  @property
  def batch(self) -> int:
    return self.tokens.shape[0]

  @property
  def slots(self) -> int:
    return self.tokens.shape[1]


def plain_reach(length, max_len, steps: int):
  """The last cache slot a plain chunk of `steps` steps may write for rows at `length`
  (capped by their `max_len`): the chunk's cache view must cover it."""
  return np.minimum(length + steps - 1, max_len)


def spec_reach(length, max_len, rounds: int, max_emit: int, nodes: int):
  """The same for `rounds` speculative rounds: a row starting a round at length L writes
  its draft's `nodes` at slots [L - 1, L - 1 + nodes), and stops at `max_len`."""
  return np.minimum(length + (rounds - 1) * max_emit, max_len - 1) - 1 + nodes


def round_up(n: int, buckets: Sequence[int]) -> int:
  """Smallest bucket >= n; raises if n exceeds the largest bucket."""
  i = bisect.bisect_left(buckets, n)
  if i == len(buckets):
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]} of {tuple(buckets)}")
  return buckets[i]


def power_of_two_buckets(lo: int, hi: int) -> tuple[int, ...]:
  """lo, 2lo, 4lo, ... capped by hi, always ending with hi itself."""
  if lo <= 0 or hi < lo:
    raise ValueError(f"need 0 < lo <= hi, got lo={lo}, hi={hi}")
  out = []
  b = lo
  while b < hi:
    out.append(b)
    b *= 2
  out.append(hi)
  return tuple(out)

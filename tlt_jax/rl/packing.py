"""Packing rollout samples into dense rows for the trainer's forward passes.

Rollout lengths are long-tailed: a [samples, longest] batch is mostly padding
(default job: ~128 samples of median ~60 tokens under a longest row of ~300, so
~80% of a padded batch is padding). The trainer instead packs samples first-fit
decreasing into rows of `width` columns; segment ids keep packed samples from
attending to each other and positions restart at 0 per sample, so every token's
log-prob is the one it has alone (causal attention within its segment).

The loss stays exact under packing because the aggregation is folded into a
per-token weight (`token_weights`): "token-mean" weighs each counted token by
1 / (counted tokens), the per-sequence means by 1 / (samples x its tokens) or
1 / samples. The loss is then a plain weighted sum, so any split of rows into
micro-batches sums to the full-batch gradient.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tlt_jax.rl.loss import AGGREGATIONS


@dataclasses.dataclass(frozen=True)
class Packing:
  """Where each sample lives in a packed batch: sample n is row[n], columns
  [col[n], col[n] + length[n])."""

  row: np.ndarray  # [N] int
  col: np.ndarray  # [N] int
  length: np.ndarray  # [N] int
  num_rows: int
  width: int

  def pack(self, per_sample: np.ndarray, fill=0) -> np.ndarray:
    """[N, >= max length, ...] per-sample rows -> [num_rows, width, ...] packed."""
    out = np.full((self.num_rows, self.width, *per_sample.shape[2:]), fill, per_sample.dtype)
    r, c, s, t = self._index()
    out[r, c] = per_sample[s, t]
    return out

  def unpack(self, packed: np.ndarray, columns: int, fill=0) -> np.ndarray:
    """[num_rows, width, ...] packed -> [N, columns, ...] per-sample rows (tails `fill`)."""
    n = len(self.row)
    out = np.full((n, columns, *packed.shape[2:]), fill, packed.dtype)
    r, c, s, t = self._index()
    out[s, t] = packed[r, c]
    return out

  def layout(self) -> tuple[np.ndarray, np.ndarray]:
    """Packed positions (restarting at 0 per sample) and segment ids (sample + 1, 0 on
    padding), both [num_rows, width] int32."""
    positions = np.zeros((self.num_rows, self.width), np.int32)
    segment_ids = np.zeros_like(positions)
    r, c, s, t = self._index()
    positions[r, c], segment_ids[r, c] = t, s + 1
    return positions, segment_ids

  def _index(self):
    """(packed row, packed column, sample, sample column) of every sample token."""
    s = np.repeat(np.arange(len(self.row)), self.length)
    t = np.arange(s.size) - np.repeat(np.cumsum(self.length) - self.length, self.length)
    return self.row[s], self.col[s] + t, s, t


def plan_packing(
  lengths: np.ndarray,
  width: int,
  row_multiple: int = 1,
  pow2_rows: bool = False,
  min_rows: int = 0,
) -> Packing:
  """First-fit decreasing bin packing of samples into rows of `width` columns.

  Rows are padded up to a multiple of `row_multiple` (micro-batch and mesh
  divisibility), with `pow2_rows` to `row_multiple` times a power of two: every
  new row count is a new program to compile, and powers of two bound them to a
  handful per width, for at most twice the rows (padding rows weigh 0). `min_rows`:
  at least this many rows, so every batch that fits them shares one program.
  Deterministic: ties keep sample order.
  """
  lengths = np.asarray(lengths, np.int64)
  if lengths.ndim != 1 or lengths.size == 0:
    raise ValueError(f"lengths must be a non-empty 1-D array, got shape {lengths.shape}")
  if width <= 0 or row_multiple <= 0:
    raise ValueError(f"width and row_multiple must be > 0, got {width}, {row_multiple}")
  if lengths.min() < 1 or lengths.max() > width:
    raise ValueError(
      f"every sample needs 1..{width} columns; got lengths in [{lengths.min()}, {lengths.max()}]"
    )
  row = np.zeros(lengths.size, np.int64)
  col = np.zeros(lengths.size, np.int64)
  used: list[int] = []  # filled columns per open row
  for n in np.argsort(-lengths, kind="stable"):
    size = int(lengths[n])
    r = next((i for i, fill in enumerate(used) if fill + size <= width), len(used))
    if r == len(used):
      used.append(0)
    row[n], col[n] = r, used[r]
    used[r] += size
  blocks = max(-(-len(used) // row_multiple), -(-min_rows // row_multiple))
  if pow2_rows:
    blocks = 1 << (blocks - 1).bit_length()
  return Packing(row, col, lengths, blocks * row_multiple, width)


def token_weights(mask: np.ndarray, aggregation: str) -> np.ndarray:
  """Per-token loss weights [N, T] of per-sample masks [N, T] for `aggregation`
  (see loss.AGGREGATIONS): sum(weights * token_loss) equals the aggregated loss."""
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
  m = mask.astype(np.float32)
  n = m.shape[0]
  if aggregation == "token-mean":
    return m / max(float(m.sum()), 1.0)
  if aggregation == "seq-mean-token-mean":
    return m / (n * np.maximum(m.sum(axis=1, keepdims=True), 1.0))
  return m / n  # seq-mean-token-sum


def pack_policy_batch(
  tokens: np.ndarray,
  length: np.ndarray,
  mask: np.ndarray,
  old_logp: np.ndarray | None,
  advantages: np.ndarray,
  aggregation: str,
  width: int,
  row_multiple: int = 1,
  pow2_rows: bool = False,
  rollout_logp: np.ndarray | None = None,
  min_rows: int = 0,
) -> tuple[dict[str, np.ndarray], Packing]:
  """Per-sample rollout arrays ([N, T] rows; advantages [N], or [N, T] per token) -> a
  packed policy batch.

  Returns (batch, packing): batch holds tokens, positions, segment_ids (0 on
  padding), mask, old_logp, advantages (per token) and weights, all
  [num_rows, width], the layout `make_policy_update` takes. old_logp None (an
  on-policy update, which needs none) leaves it out; `rollout_logp` (the engine's
  log-probs, for the update's rollout-vs-trainer check) is packed when given.
  """
  p = plan_packing(length, width, row_multiple, pow2_rows, min_rows)
  n, t = tokens.shape
  adv = advantages.astype(np.float32)
  adv = adv[:, None] if adv.ndim == 1 else adv
  positions, segment_ids = p.layout()
  batch = {
    "tokens": p.pack(tokens.astype(np.int32)),
    "positions": positions,
    "segment_ids": segment_ids,
    "mask": p.pack(mask.astype(np.float32)),
    "advantages": p.pack(np.broadcast_to(adv, (n, t)).copy()),
    "weights": p.pack(token_weights(mask, aggregation)),
  }
  for key, value in (("old_logp", old_logp), ("rollout_logp", rollout_logp)):
    if value is not None:
      batch[key] = p.pack(value.astype(np.float32))
  return batch, p

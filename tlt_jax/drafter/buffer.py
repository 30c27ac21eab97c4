"""Recent rollouts' tokens and target features, kept for online drafter training.

A ring of preallocated numpy arrays ([capacity, S] tokens, [capacity, S, D]
features): `add` copies a rollout's rows in with one fancy-index assignment per
array (no per-token Python objects, unlike the reference's lists), and rows
older than `keep_steps` RL steps stop being sampled, so the drafter follows the
current policy (the reference keeps the last 2 steps). `sample` packs a random
subset into a fixed-shape batch with the EAGLE alignment and per-sample masks
of `make_training_batch`, so the jitted update never recompiles.
"""

from __future__ import annotations

import numpy as np

from tlt_jax.drafter.training import make_training_batch


class DrafterBuffer:
  """Ring buffer of (tokens, features, prompt_len, length, step) rows.

  Args:
    capacity: rows held; the oldest are overwritten first.
    slots: columns per row (the engine's cache slots; shorter rollouts are padded).
    feature_dim: the target's hidden size D.
    keep_steps: only rows from the newest `keep_steps` RL steps are sampled.
    dtype: storage dtype of the features.
  """

  def __init__(
    self, capacity: int, slots: int, feature_dim: int, keep_steps: int = 2, dtype=np.float32
  ):
    for name, v in (("capacity", capacity), ("slots", slots), ("feature_dim", feature_dim)):
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"DrafterBuffer {name} must be a positive int, got {v!r}")
    if not isinstance(keep_steps, int) or keep_steps < 1:
      raise ValueError(f"DrafterBuffer keep_steps must be a positive int, got {keep_steps!r}")
    self.capacity, self.slots, self.keep_steps = capacity, slots, keep_steps
    self.tokens = np.zeros((capacity, slots), np.int32)
    self.features = np.zeros((capacity, slots, feature_dim), dtype)
    self.prompt_len = np.ones((capacity,), np.int32)
    self.length = np.ones((capacity,), np.int32)
    self.step = np.full((capacity,), -1, np.int64)  # -1: empty
    self._next = 0
    self.rows_added = 0

  @property
  def newest_step(self) -> int:
    return int(self.step.max())

  def valid(self) -> np.ndarray:
    """Rows that may be sampled: filled, and from the newest keep_steps steps."""
    newest = self.newest_step
    return (self.step >= 0) & (self.step > newest - self.keep_steps)

  def __len__(self) -> int:
    return int(self.valid().sum())

  def add(
    self,
    tokens: np.ndarray,
    hidden: np.ndarray | None,
    prompt_len: np.ndarray,
    length: np.ndarray,
    step: int,
  ) -> int:
    """Copies the rows that have a response pair (length - 2 >= prompt_len); returns how many.

    `tokens` [N, W], `hidden` [N, W', D] with W' <= W <= slots (a RolloutResult's arrays:
    the engine copies hidden states only as wide as the rows reach).
    """
    if hidden is None:
      raise ValueError("the rollout has no hidden states: build the engine with capture_hidden")
    tokens, hidden = np.asarray(tokens), np.asarray(hidden)
    prompt_len, length = np.asarray(prompt_len), np.asarray(length)
    n, w = tokens.shape
    if w > self.slots:
      raise ValueError(f"rollout rows have {w} columns, more than the buffer's {self.slots}")
    wh = hidden.shape[1]
    if hidden.shape[0] != n or wh > w or hidden.shape[2] != self.features.shape[2]:
      raise ValueError(
        f"hidden {hidden.shape} does not match tokens {tokens.shape} and feature dim "
        f"{self.features.shape[2]}"
      )
    if step < self.newest_step:
      raise ValueError(f"step {step} is older than the buffer's newest step {self.newest_step}")
    keep = np.nonzero(length - 2 >= prompt_len)[0][-self.capacity :]
    k = keep.size
    if k == 0:
      return 0
    dst = (self._next + np.arange(k)) % self.capacity
    self.tokens[dst] = 0
    self.tokens[dst, :w] = tokens[keep]
    self.features[dst, :wh] = hidden[keep]
    self.features[dst, wh:] = 0
    self.prompt_len[dst] = prompt_len[keep]
    self.length[dst] = length[keep]
    self.step[dst] = step
    self._next = int((self._next + k) % self.capacity)
    self.rows_added += k
    return k

  # ---------------------------------------------------------------- checkpoints
  def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """What a checkpoint needs to resume sampling exactly: (arrays, meta), all copies.

    Only the rows `sample` can still draw (`valid()`: rows of older steps never become
    valid again, since steps only grow) and only their used columns (up to the longest
    valid row: `sample` reads no further) are saved, not the dense [capacity, slots, D]
    ring; the per-row metadata (step, lengths) is saved whole (capacity ints), with the
    ring position and counters in `meta`. No array is empty (orbax refuses those): an
    empty buffer has no `rows` / `tokens` / `features`.
    """
    arrays = {"step": self.step.copy(), "prompt_len": self.prompt_len.copy()}
    arrays["length"] = self.length.copy()
    rows = np.nonzero(self.valid())[0]
    width = int(self.length[rows].max()) if rows.size else 0
    if rows.size:
      arrays["rows"] = rows.astype(np.int64)
      arrays["tokens"] = self.tokens[rows, :width]  # fancy indexing: copies
      arrays["features"] = self.features[rows, :width]
    meta = {
      "capacity": self.capacity,
      "slots": self.slots,
      "feature_dim": int(self.features.shape[2]),
      "keep_steps": self.keep_steps,
      "next": self._next,
      "rows_added": self.rows_added,
      "rows": int(rows.size),
      "width": width,
    }
    return arrays, meta

  def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict[str, int]) -> None:
    """Restores `state_dict()`'s output into this (same-shaped) buffer: the rows `sample`
    can draw, their metadata and the ring position equal the saved buffer's, so the same
    rng draws the same batches, and later `add`s fill the same ring slots."""
    want = {
      "capacity": self.capacity,
      "slots": self.slots,
      "feature_dim": int(self.features.shape[2]),
      "keep_steps": self.keep_steps,
    }
    got = {k: int(meta[k]) for k in want}
    if got != want:
      raise ValueError(f"the saved drafter buffer has shape {got}, this buffer {want}")
    self.tokens[:] = 0
    self.features[:] = 0
    self.step[:] = np.asarray(arrays["step"])
    self.prompt_len[:] = np.asarray(arrays["prompt_len"])
    self.length[:] = np.asarray(arrays["length"])
    if int(meta["rows"]):
      rows, width = np.asarray(arrays["rows"]), int(meta["width"])
      self.tokens[rows, :width] = np.asarray(arrays["tokens"])
      self.features[rows, :width] = np.asarray(arrays["features"])
    self._next, self.rows_added = int(meta["next"]), int(meta["rows_added"])

  def sample(self, rng: np.random.Generator, num_rows: int, row_len: int) -> dict[str, np.ndarray]:
    """A packed [num_rows, row_len] training batch from random valid rows.

    Samples are drawn without replacement until their pairs would overfill the
    batch; those that do not fit the packing are left out.

    Raises:
      ValueError: the buffer holds no valid row (never train on an empty buffer).
    """
    idx = np.nonzero(self.valid())[0]
    if idx.size == 0:
      raise ValueError("the drafter buffer is empty: add rollouts before sampling")
    idx = rng.permutation(idx)
    pairs = np.maximum(self.length[idx] - 2, 0)
    take = idx[np.cumsum(pairs) <= num_rows * row_len]
    if take.size == 0:
      take = idx[:1]  # one sample longer than the batch: let the packer skip it cleanly
    width = int(self.length[take].max())
    return make_training_batch(
      self.tokens[take, :width],
      self.features[take, :width],
      self.prompt_len[take],
      self.length[take],
      row_len=row_len,
      num_rows=num_rows,
      skip_overflow=True,
    )

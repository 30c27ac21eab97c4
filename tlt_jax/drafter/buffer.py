"""Recent rollouts' tokens and target features, kept for online drafter training.

Rows' tokens sit in a ring of preallocated [capacity, S] numpy arrays; their features are
packed: each row's own positions (the f_t with t <= length - 2 that training reads) end to
end in a preallocated [positions, D] ring, so a row costs its length, not the cache's S
slots (at a real model's width a dense [capacity, S, D] ring holding a few dozen rows
fills host memory: a 4096-wide bfloat16 feature over 8,192 slots is 64 MiB a row). `add`
copies a rollout's rows in with no per-token Python objects; rows older than `keep_steps`
RL steps stop being sampled, so the drafter follows the current policy (the reference
keeps the last 2 steps), and the oldest rows are dropped first when the ring needs their
room (row slots or positions). `sample` packs a random subset into a fixed-shape batch with
the EAGLE alignment and per-sample masks of `make_training_batch`, so the jitted update
never recompiles.
"""

from __future__ import annotations

import numpy as np

from tlt_jax.drafter.training import make_training_batch, sample_columns


class DrafterBuffer:
  """Ring buffer of (tokens, features, prompt_len, length, step) rows.

  Args:
    capacity: rows held; the oldest are overwritten first.
    slots: columns per row (the engine's cache slots; shorter rollouts are padded).
    feature_dim: the target's hidden size D.
    keep_steps: only rows from the newest `keep_steps` RL steps are sampled.
    dtype: storage dtype of the features.
    positions: feature positions held, all rows together, at least `slots`; at most (and
      by default) `capacity` + 2 full rows, which no mix of rows outgrows (only the row ring
      drops rows). With fewer, a row that does not fit drops the oldest rows whose
      positions it needs.
  """

  def __init__(
    self,
    capacity: int,
    slots: int,
    feature_dim: int,
    keep_steps: int = 2,
    dtype=np.float32,
    positions: int | None = None,
  ):
    for name, v in (("capacity", capacity), ("slots", slots), ("feature_dim", feature_dim)):
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"DrafterBuffer {name} must be a positive int, got {v!r}")
    if not isinstance(keep_steps, int) or keep_steps < 1:
      raise ValueError(f"DrafterBuffer keep_steps must be a positive int, got {keep_steps!r}")
    if positions is not None and (not isinstance(positions, int) or positions < slots):
      raise ValueError(
        f"DrafterBuffer positions must be an int >= slots ({slots}): one full row; got "
        f"{positions!r}"
      )
    full = (capacity + 2) * slots  # what no mix of `capacity` rows outgrows
    positions = full if positions is None else min(positions, full)
    self.capacity, self.slots, self.keep_steps = capacity, slots, keep_steps
    self.tokens = np.zeros((capacity, slots), np.int32)
    self.features = np.zeros((positions, feature_dim), dtype)  # packed rows
    self.start = np.zeros((capacity,), np.int64)  # a row's first position in `features`
    self.prompt_len = np.ones((capacity,), np.int32)
    self.length = np.ones((capacity,), np.int32)
    self.step = np.full((capacity,), -1, np.int64)  # -1: empty (or dropped for room)
    self._next = 0  # the next row slot
    self._at = 0  # the next free position
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

  def held(self, rows: np.ndarray | int) -> np.ndarray:
    """Feature positions a row keeps: f_0 .. f_{length - 2}."""
    return np.maximum(self.length[rows] - 1, 0)

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
    the engine copies hidden states only as far as the rows reach; positions past W' are
    stored as zeros).
    """
    if hidden is None:
      raise ValueError("the rollout has no hidden states: build the engine with capture_hidden")
    tokens, hidden = np.asarray(tokens), np.asarray(hidden)
    prompt_len, length = np.asarray(prompt_len), np.asarray(length)
    n, w = tokens.shape
    if w > self.slots:
      raise ValueError(f"rollout rows have {w} columns, more than the buffer's {self.slots}")
    wh = hidden.shape[1]
    if hidden.shape[0] != n or wh > w or hidden.shape[2] != self.features.shape[1]:
      raise ValueError(
        f"hidden {hidden.shape} does not match tokens {tokens.shape} and feature dim "
        f"{self.features.shape[1]}"
      )
    if step < self.newest_step:
      raise ValueError(f"step {step} is older than the buffer's newest step {self.newest_step}")
    keep = np.nonzero(length - 2 >= prompt_len)[0][-self.capacity :]
    for i in keep:
      self._put(tokens[i], hidden[i], int(prompt_len[i]), int(length[i]), step)
    return int(keep.size)

  def _put(self, tokens, hidden, prompt_len: int, length: int, step: int) -> None:
    """One row into the next row slot and the next run of free positions (from position 0
    when the ring's end is too near), dropping the rows that held them."""
    r = self._next
    self.step[r] = -1  # the slot's old row goes first: its positions are free
    held = length - 1
    if self._at + held > self.features.shape[0]:
      self._at = 0
    a, b = self._at, self._at + held
    ends = self.start + self.held(np.arange(self.capacity))
    self.step[(self.step >= 0) & (self.start < b) & (ends > a)] = -1
    self.tokens[r] = 0
    self.tokens[r, : tokens.shape[0]] = tokens
    copied = min(held, hidden.shape[0])
    self.features[a : a + copied] = hidden[:copied]
    self.features[a + copied : b] = 0
    self.start[r], self.prompt_len[r], self.length[r], self.step[r] = a, prompt_len, length, step
    self._next, self._at = (r + 1) % self.capacity, b
    self.rows_added += 1

  def row_features(self, row: int) -> np.ndarray:
    """The features a row keeps, [length - 1, D]: a view of the packed ring."""
    return self.features[self.start[row] : self.start[row] + self.held(row)]

  # ---------------------------------------------------------------- checkpoints
  def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """What a checkpoint needs to resume sampling exactly: (arrays, meta), all copies.

    Only the rows `sample` can still draw (`valid()`: rows of older steps never become
    valid again, since steps only grow) are saved: their tokens up to the longest of them
    (`sample` reads no further) and their packed features, one after another; the per-row
    metadata (step, lengths, first positions) is saved whole (capacity ints), with the ring
    positions and counters in `meta`. No array is empty (orbax refuses those): an empty
    buffer has no `rows` / `tokens` / `features`.
    """
    arrays = {"step": self.step.copy(), "prompt_len": self.prompt_len.copy()}
    arrays["length"] = self.length.copy()
    arrays["start"] = self.start.copy()
    rows = np.nonzero(self.valid())[0]
    width = int(self.length[rows].max()) if rows.size else 0
    if rows.size:
      arrays["rows"] = rows.astype(np.int64)
      arrays["tokens"] = self.tokens[rows, :width]  # fancy indexing: copies
      arrays["features"] = np.concatenate([self.row_features(r) for r in rows])
    meta = {
      "capacity": self.capacity,
      "slots": self.slots,
      "feature_dim": int(self.features.shape[1]),
      "positions": int(self.features.shape[0]),
      "keep_steps": self.keep_steps,
      "next": self._next,
      "at": self._at,
      "rows_added": self.rows_added,
      "rows": int(rows.size),
      "width": width,
    }
    return arrays, meta

  def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict[str, int]) -> None:
    """Restores `state_dict()`'s output into this (same-shaped) buffer: the rows `sample`
    can draw, their metadata and the ring positions equal the saved buffer's, so the same
    rng draws the same batches, and later `add`s fill the same row slots and positions."""
    if "positions" not in meta:
      raise ValueError(
        "the saved drafter buffer holds whole rows of features (an older layout): this "
        "buffer packs each row's own positions; start the drafter's buffer afresh"
      )
    want = {
      "capacity": self.capacity,
      "slots": self.slots,
      "feature_dim": int(self.features.shape[1]),
      "positions": int(self.features.shape[0]),
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
    self.start[:] = np.asarray(arrays["start"])
    if int(meta["rows"]):
      rows, width = np.asarray(arrays["rows"]), int(meta["width"])
      self.tokens[rows, :width] = np.asarray(arrays["tokens"])
      features, at = np.asarray(arrays["features"]), 0
      for r in rows:
        held = int(self.held(r))
        self.features[self.start[r] : self.start[r] + held] = features[at : at + held]
        at += held
    self._next, self._at = int(meta["next"]), int(meta["at"])
    self.rows_added = int(meta["rows_added"])

  def sample(
    self,
    rng: np.random.Generator,
    num_rows: int,
    row_len: int,
    out: dict[str, np.ndarray] | None = None,
  ) -> dict[str, np.ndarray]:
    """A packed [num_rows, row_len] training batch from random valid rows (written into
    `out`, an earlier batch of the same shapes, when given).

    Samples are drawn without replacement until their columns would overfill the
    batch; those that do not fit the packing are left out.

    Raises:
      ValueError: the buffer holds no valid row (never train on an empty buffer).
    """
    idx = np.nonzero(self.valid())[0]
    if idx.size == 0:
      raise ValueError("the drafter buffer is empty: add rollouts before sampling")
    idx = rng.permutation(idx)
    take = idx[np.cumsum(sample_columns(self.length[idx])) <= num_rows * row_len]
    if take.size == 0:
      take = idx[:1]  # one sample longer than the batch: let the packer skip it cleanly
    width = int(self.length[take].max())
    return make_training_batch(
      self.tokens[take, :width],
      [self.row_features(r) for r in take],  # views: no [rows, width, D] copy
      self.prompt_len[take],
      self.length[take],
      row_len=row_len,
      num_rows=num_rows,
      skip_overflow=True,
      out=out,
    )

"""tlt_jax.compare's tables from hand-written step rows."""

import json

import pytest

from tlt_jax import compare


def _row(mode, step, chunks, accept):
  return {
    "mode": mode,
    "step": step,
    "arm_chunks": json.dumps(chunks),
    "arm_accept": json.dumps(accept),
  }


def test_arms_by_epoch_sums_chunks_and_weights_accept_by_chunks():
  rows = [
    _row("tlt", 0, {"plain": 2, "group8": 1}, {"group8": 1.5}),
    _row("tlt", 1, {"group8": 3, "chain4": 1}, {"group8": 2.5, "chain4": 4.0}),
    _row("tlt", 2, {"group8": 2}, {"group8": 3.0}),
    _row("baseline", 0, {"plain": 5}, {}),
  ]
  epochs = compare.arms_by_epoch(rows, steps_per_epoch=2)
  got = {(e["mode"], e["epoch"]): e for e in epochs}
  assert set(got) == {("tlt", 0), ("tlt", 1), ("baseline", 0)}
  first = got[("tlt", 0)]
  assert first["chunks"] == {"plain": 2, "group8": 4, "chain4": 1}
  assert first["accept_length"]["group8"] == pytest.approx((1.5 * 1 + 2.5 * 3) / 4)
  assert first["accept_length"]["chain4"] == 4.0 and "plain" not in first["accept_length"]
  assert got[("tlt", 1)]["accept_length"] == {"group8": 3.0}
  table = compare.arms_markdown(epochs).splitlines()
  assert table[0] == "| run | epoch | chain4 | group8 | plain |"
  assert "| tlt | 0 | 1 (4.00) | 4 (2.25) | 2 |" in table
  with pytest.raises(ValueError, match="steps_per_epoch"):
    compare.arms_by_epoch(rows, 0)


def test_arms_by_epoch_reads_the_trainers_epoch_and_weights_accept_by_row_rounds():
  # A local data file of any size: the trainer records each step's pass over it.
  rows = [
    {**_row("tlt", 0, {"group8": 1}, {"group8": 1.5}), "data_epoch": 0},
    {**_row("tlt", 1, {"group8": 1}, {"group8": 3.0}), "data_epoch": 0},
    {**_row("tlt", 2, {"group8": 2}, {"group8": 2.0}), "data_epoch": 1},
  ]
  rows[0]["arm_row_rounds"] = json.dumps({"group8": 30})  # a chunk of 30 row-rounds
  rows[1]["arm_row_rounds"] = json.dumps({"group8": 10})
  got = {e["epoch"]: e for e in compare.arms_by_epoch(rows, steps_per_epoch=100)}
  assert set(got) == {0, 1}
  assert got[0]["chunks"] == {"group8": 2}
  assert got[0]["accept_length"]["group8"] == pytest.approx((1.5 * 30 + 3.0 * 10) / 40)
  assert got[1]["accept_length"] == {"group8": 2.0}  # no row-rounds recorded: by chunks

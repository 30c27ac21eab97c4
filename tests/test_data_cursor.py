"""The RL job's data order: seeded, cycled, resumable by its position."""

import numpy as np
import pytest

from tlt_jax.data.cursor import DataCursor

EXAMPLES = [{"question": str(i), "answer": str(i)} for i in range(5)]


def test_reads_a_seeded_permutation_cycling_and_resumes_from_its_position():
  a = DataCursor(EXAMPLES, seed=3)
  order = np.random.default_rng(3).permutation(5)
  first = a.next(3) + a.next(4)  # the second read wraps into the next pass
  assert [x["question"] for x in first] == [str(order[i % 5]) for i in range(7)]
  assert a.position == 7 and a.epoch == 1
  assert a.at(5, 2) == first[5:7]  # any position, without moving
  b = DataCursor(EXAMPLES, seed=3)
  b.load_state_dict(a.state_dict())
  assert b.next(4) == a.next(4)
  assert DataCursor(EXAMPLES, seed=4).next(5) != DataCursor(EXAMPLES, seed=3).next(5)


def test_refuses_no_examples():
  with pytest.raises(ValueError, match="no training examples"):
    DataCursor([], seed=0)

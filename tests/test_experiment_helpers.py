"""Helpers the experiment scripts share (experiments/common.py)."""

import os
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import call_phases_ms  # noqa: E402


def test_call_phases_ms_splits_each_call_into_its_phases_and_host_time():
  def call(wall, *phases):
    return SimpleNamespace(wall_seconds=wall, timeline=[{"phase": p, "dt": dt} for p, dt in phases])

  plain = call(1.0, ("prefill", 0.1), ("decode", 0.5), ("decode", 0.38))
  spec = call(0.5, ("prefill", 0.1), ("drafter_prefill", 0.01), ("spec", 0.37))
  got = call_phases_ms([plain, spec])
  # Means over the two calls, in ms; a phase one call lacks counts as 0 there.
  assert got == pytest.approx(
    {"prefill": 100.0, "decode": 440.0, "drafter_prefill": 5.0, "spec": 185.0, "outside": 20.0}
  )
  assert sum(got.values()) == pytest.approx(750.0)  # the calls' mean wall time
  with pytest.raises(ValueError, match="at least one"):
    call_phases_ms([])

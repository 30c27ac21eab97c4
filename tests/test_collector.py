"""The cycle collector's settings for a JAX process (`tlt_jax.utils.collector`)."""

import gc

from tlt_jax.utils import collector


def test_settle_heap_freezes_what_is_alive_and_raises_the_young_threshold(monkeypatch):
  before = gc.get_threshold()
  try:
    gc.set_threshold(700, 10, 10)
    kept = [[i] for i in range(1000)]  # tracked containers alive at the call
    frozen = gc.get_freeze_count()
    monkeypatch.setenv(collector.ENV, "default")
    assert not collector.settle_heap()
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == frozen
    monkeypatch.delenv(collector.ENV)
    assert collector.settle_heap()
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() >= frozen + len(kept)
  finally:
    gc.set_threshold(*before)


def test_cycles_made_after_settling_are_still_collected():
  class Node:
    pass

  before = gc.get_threshold()
  try:
    collector.settle_heap()
    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2  # frozen objects are skipped, new garbage is not
  finally:
    gc.set_threshold(*before)

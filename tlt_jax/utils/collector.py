"""Python's cycle collector set for a JAX process: its start-up heap frozen, young
collections rarer.

Tracing and lowering allocate many short-lived containers, so CPython's default threshold
(a young collection every 700 net allocations, a full one every 100 young ones once the heap
has grown a quarter) runs full collections over everything a JAX process holds: the imported
modules, and then its caches of traces, jaxprs and compiled programs, which stay alive to
the end. Those collections find next to nothing and stop the host meanwhile, and on an
accelerator the host loop that feeds the rollout's chunks is on the critical path.
`gc.freeze()` takes what is alive at start-up out of every later collection, and a young
threshold of 50,000 (the older generations keep theirs) makes collections of every
generation rarer by that ratio. Collection stays on: cycles made later are still found.
Serving engines whose host loops stalled on full collections do the same (sglang's
`freeze_gc`). Measured in experiments/RESULTS.md ("the cycle collector").
"""

from __future__ import annotations

import gc
import os

# Net container allocations between young collections (CPython's default is 700).
YOUNG_THRESHOLD = 50_000
# TLT_GC=default keeps CPython's settings: for a run that compares the two.
ENV = "TLT_GC"


def settle_heap(young_threshold: int = YOUNG_THRESHOLD) -> bool:
  """Collects once, freezes what is alive out of later collections and raises the young
  generation's threshold; returns False (and changes nothing) under TLT_GC=default.

  Call it once the process has imported what it runs and before its long-running part;
  what it freezes is never collected, so anything built to be thrown away should not
  exist yet."""
  if os.environ.get(ENV, "") == "default":
    return False
  gc.collect()
  gc.freeze()
  _, middle, oldest = gc.get_threshold()
  gc.set_threshold(young_threshold, middle, oldest)
  return True

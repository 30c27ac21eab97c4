"""Records every cycle collection of a Python process (`experiments/bench_gc.py`).

Python imports `sitecustomize` at start-up from the first folder on its path that has one;
bench_gc.py puts this folder first on PYTHONPATH, so the processes a command starts (pytest's
workers, a CLI's subprocesses) are recorded too. With GC_TRACE_DIR set, each process writes
`<pid>.json` there at exit: its command line, and per collection the seconds since start,
the generation, the pause and the objects collected. Without it, nothing happens.
"""

import atexit
import gc
import json
import os
import sys
import time

_DIR = os.environ.get("GC_TRACE_DIR")
if _DIR:
  _start = time.perf_counter()
  _began = [0.0]
  _events: list[tuple[float, int, float, int]] = []

  def _record(phase, info):
    now = time.perf_counter()
    if phase == "start":
      _began[0] = now
    else:
      _events.append((now - _start, info["generation"], now - _began[0], info["collected"]))

  def _write():
    record = {
      "argv": sys.argv,
      "seconds_alive": time.perf_counter() - _start,
      "threshold": gc.get_threshold(),
      "frozen": gc.get_freeze_count(),
      "events": _events,
    }
    with open(os.path.join(_DIR, f"{os.getpid()}.json"), "w") as f:
      json.dump(record, f)

  gc.callbacks.append(_record)
  atexit.register(_write)

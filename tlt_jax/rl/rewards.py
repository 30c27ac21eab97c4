"""Rewards on the host: checkers run in worker threads, failures never kill the run.

A reward function is `(completion, answer) -> float`. It runs in a thread pool
while the device does other work (the caller submits, then collects). A
function that raises, returns a non-finite value, or exceeds the timeout gives
that sample a reward of 0 and is counted; the run goes on. (A timed-out thread
cannot be killed in Python: it finishes in the background and its result is
ignored, so checkers should still bound their own work, as the built-in ones do.)
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

RewardFn = Callable[[str, str], float]


def with_format_reward(
  check: RewardFn, extract: Callable[[str], str | None], weight: float
) -> RewardFn:
  """`check` plus `weight` when `extract` finds an answer in the completion at all
  (a well-formed response: e.g. "#### 42", "\\boxed{42}" or the synthetic tasks' "#42").

  weight in [0, 0.5): a correct answer (>= 1) still outscores every wrong one, and
  "reward > 0.5" still means "correct" in the trainer's accuracy metric.
  """
  if not 0.0 <= weight < 0.5:
    raise ValueError(f"format reward weight must be in [0, 0.5), got {weight!r}")
  if weight == 0.0:
    return check

  def reward(completion: str, answer: str) -> float:
    return check(completion, answer) + (weight if extract(completion) is not None else 0.0)

  return reward


@dataclasses.dataclass
class RewardResult:
  rewards: np.ndarray  # [N] float32
  errors: int  # samples whose reward function raised or returned a non-number
  timeouts: int  # samples whose reward function ran past the timeout
  seconds: float


class RewardPool:
  """Scores completions with `fn` in `workers` threads; `submit` returns at once."""

  def __init__(self, fn: RewardFn, *, workers: int = 4, timeout_s: float = 5.0):
    if workers < 1:
      raise ValueError(f"workers must be >= 1, got {workers}")
    if not timeout_s > 0:
      raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    self.fn = fn
    self.timeout_s = timeout_s
    self.workers = workers
    self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reward")

  def _safe(self, completion: str, answer: str) -> tuple[float, bool]:
    try:
      r = float(self.fn(completion, answer))
    except Exception:  # noqa: BLE001 - any checker failure is a zero reward, counted.
      return 0.0, False
    return (r, True) if math.isfinite(r) else (0.0, False)

  def submit(
    self, completions: Sequence[str], answers: Sequence[str]
  ) -> Callable[[], RewardResult]:
    """Starts scoring; returns a function that waits for and returns the result."""
    if len(completions) != len(answers):
      raise ValueError(f"{len(completions)} completions but {len(answers)} answers")
    start = time.perf_counter()
    futures = [self._pool.submit(self._safe, c, a) for c, a in zip(completions, answers)]

    # Each sample gets timeout_s of a worker: the batch's deadline budgets the queue.
    waves = -(-len(futures) // self.workers)

    def collect() -> RewardResult:
      rewards = np.zeros(len(futures), np.float32)
      errors = timeouts = 0
      deadline = start + self.timeout_s * max(waves, 1)
      for i, fut in enumerate(futures):
        try:
          value, ok = fut.result(timeout=max(deadline - time.perf_counter(), 0.0))
        except cf.TimeoutError:
          timeouts += 1
          continue
        rewards[i] = value
        errors += not ok
      return RewardResult(rewards, errors, timeouts, time.perf_counter() - start)

    collect.done = lambda: all(f.done() for f in futures)  # type: ignore[attr-defined]
    return collect

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)

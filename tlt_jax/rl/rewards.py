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
from typing import Any

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


def weighted_rewards(terms: Sequence[tuple[RewardFn, float]]) -> RewardFn:
  """One reward function: sum_i weight_i * fn_i(completion, answer).

  A term that raises makes the whole reward raise (the `RewardPool` scores that sample 0
  and counts it), so a broken checker is never silently worth nothing.
  """
  terms = [(fn, float(w)) for fn, w in terms]
  if not terms:
    raise ValueError("weighted_rewards needs at least one (function, weight) term")
  for fn, w in terms:
    if not callable(fn):
      raise ValueError(f"reward term {fn!r} is not callable")
    if not math.isfinite(w):
      raise ValueError(f"reward weight must be finite, got {w!r}")
  if len(terms) == 1 and terms[0][1] == 1.0:
    return terms[0][0]

  def reward(completion: str, answer: str) -> float:
    return sum(w * float(fn(completion, answer)) for fn, w in terms)

  return reward


def format_reward(extract: Callable[[str], str | None]) -> RewardFn:
  """1 when `extract` finds an answer in the completion at all (a well-formed response),
  else 0; the answer itself is not judged."""
  return lambda completion, answer: float(extract(completion) is not None)


# Answer formats a "format" reward term can require ("format:<name>"; "format" = "marked").
FORMATS = ("marked", "gsm8k", "math")


def parse_reward_spec(spec: str | Sequence[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
  """(name, weight) pairs of a reward spec: "task=1,format=0.1" or [("task", 1.0), ...].

  "" or an empty sequence: no terms. Raises ValueError for an entry that is not
  "name=weight", a weight that is not a finite number, or a name given twice.
  """
  if isinstance(spec, str):
    pairs = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
      name, sep, weight = item.rpartition("=")
      if not sep or not name.strip():
        raise ValueError(f"{item!r} is not 'name=weight' (e.g. 'task=1,format=0.1')")
      pairs.append((name.strip(), weight))
  else:
    pairs = [tuple(p) for p in spec]
  out = []
  for pair in pairs:
    if len(pair) != 2:
      raise ValueError(f"{pair!r} is not a (name, weight) pair")
    name, weight = pair
    try:
      w = float(weight)
    except (TypeError, ValueError):
      w = math.nan
    if not math.isfinite(w):
      raise ValueError(f"the weight of {name!r} must be a finite number, got {weight!r}")
    if name in (n for n, _ in out):
      raise ValueError(f"reward {name!r} is given twice")
    out.append((str(name), w))
  return tuple(out)


def rewards_from_spec(spec: str | Sequence[tuple[str, float]], task_check: RewardFn) -> RewardFn:
  """The weighted sum of the named reward functions of `spec` (`parse_reward_spec`).

  Names: "task" (the job's own checker, `task_check`); "format" or "format:<fmt>" (1 when
  the completion holds an answer in that format at all, `FORMATS`: "marked" the synthetic
  tasks' final "#answer", "gsm8k" "#### answer", "math" \\boxed{}); any checker name of
  `data.tasks.CHECKERS` ("gsm8k", "math", "exact", ...) or "package.module:function".

  Raises:
    ValueError: an empty spec, a bad entry or weight, or a name that names no reward.
  """
  # Imported here: the data package is not needed to score with plain functions.
  from tlt_jax.data import checkers
  from tlt_jax.data.tasks import resolve_checker

  extractors = {
    "marked": checkers.extract_marked_answer,
    "gsm8k": checkers.extract_gsm8k_answer,
    "math": checkers.extract_boxed_answer,
  }
  terms = []
  for name, weight in parse_reward_spec(spec):
    if name == "task":
      fn = task_check
    elif name == "format" or name.startswith("format:"):
      fmt = name.partition(":")[2] or "marked"
      if fmt not in extractors:
        raise ValueError(f"{name!r}: the answer formats are {list(FORMATS)}")
      fn = format_reward(extractors[fmt])
    else:
      fn = resolve_checker(name)
    terms.append((fn, weight))
  if not terms:
    raise ValueError("no reward terms (e.g. 'task=1,format=0.1')")
  return weighted_rewards(terms)


def job_reward(rl: Any, task_check: RewardFn) -> RewardFn:
  """A job's reward function from its `rl` config section: the weighted terms of
  `rl.rewards` when set (`rewards_from_spec`), else the task's checker plus the
  `rl.format_reward` bonus for a final "#answer" (`with_format_reward`). A bad entry is a
  `configuration.ConfigError` naming the field."""
  from tlt_jax.configuration import ConfigError  # here: configuration imports the trainer
  from tlt_jax.data.checkers import extract_marked_answer

  spec, bonus = rl.get("rewards", ""), float(rl.get("format_reward", 0.0))
  try:
    if not spec:
      return with_format_reward(task_check, extract_marked_answer, bonus)
    if bonus:
      raise ValueError(
        "rl.format_reward is set too: give the format term here instead ('task=1,format=0.1')"
      )
    return rewards_from_spec(spec, task_check)
  except ValueError as e:
    raise ConfigError(f"config.rl.{'rewards' if spec else 'format_reward'}: {e}") from None


@dataclasses.dataclass
class RewardResult:
  rewards: np.ndarray  # [N] float32
  errors: int  # samples whose reward function raised or returned a non-number
  timeouts: int  # samples whose reward function ran past the timeout
  seconds: float  # from the batch's creation (its first rows' scoring) to the result


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

  def batch(self, answers: Sequence[str]) -> RewardBatch:
    """A batch of len(answers) samples, each scored from the moment it is `add`ed: a
    rollout adds its rows as the engine harvests them, so the threads score the finished
    rows while the device decodes the long tail."""
    return RewardBatch(self, answers)

  def submit(self, completions: Sequence[str], answers: Sequence[str]) -> RewardBatch:
    """Starts scoring every sample; the returned batch, called, waits for the result."""
    if len(completions) != len(answers):
      raise ValueError(f"{len(completions)} completions but {len(answers)} answers")
    batch = self.batch(answers)
    for i, c in enumerate(completions):
      batch.add(i, c)
    return batch

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)


class RewardBatch:
  """Samples of one batch, scored as they are added; calling it waits for all of them.

  Each sample gets `timeout_s` of a worker: the deadline counts the waves of the queue from
  the last `add` (when the batch was complete), so a sample added early is not cut short by
  the rows still decoding.
  """

  def __init__(self, pool: RewardPool, answers: Sequence[str]):
    self._pool, self._answers = pool, list(answers)
    self._futures: list[cf.Future | None] = [None] * len(self._answers)
    self._start = self._last_add = time.perf_counter()

  def add(self, i: int, completion: str) -> None:
    """Starts scoring sample i (once)."""
    if self._futures[i] is not None:
      raise ValueError(f"sample {i} was already added to this reward batch")
    self._futures[i] = self._pool._pool.submit(self._pool._safe, completion, self._answers[i])
    self._last_add = time.perf_counter()

  def missing(self) -> list[int]:
    """The samples not added yet."""
    return [i for i, f in enumerate(self._futures) if f is None]

  def done(self) -> bool:
    """Every sample added and scored."""
    return all(f is not None and f.done() for f in self._futures)

  def __call__(self) -> RewardResult:
    if missing := self.missing():
      raise ValueError(f"reward batch collected with samples {missing[:8]} never added")
    rewards = np.zeros(len(self._futures), np.float32)
    errors = timeouts = 0
    waves = -(-len(self._futures) // self._pool.workers)
    deadline = self._last_add + self._pool.timeout_s * max(waves, 1)
    for i, fut in enumerate(self._futures):
      try:
        value, ok = fut.result(timeout=max(deadline - time.perf_counter(), 0.0))
      except cf.TimeoutError:
        timeouts += 1
        continue
      rewards[i] = value
      errors += not ok
    return RewardResult(rewards, errors, timeouts, time.perf_counter() - self._start)

"""Synthetic reasoning tasks with verifiable answers and long-tailed solution lengths.

Each example is `{"question", "solution", "answer"}`: `solution` is the full text the model should
write after the question (a worked scratchpad ending in `#<answer>`) and `answer` is what the
task's checker compares against. Lengths are long-tailed on purpose, like reasoning-RL rollouts:
most solutions are short and a few are ten or more times the median.

Generation is deterministic: example `i` of a seed depends only on (task, seed, i), so
`generate(seed, n)` is a prefix of `generate(seed, m)` for n <= m.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import math
import random
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tlt_jax.data import checkers

__all__ = [
  "CHECKERS",
  "TASKS",
  "Example",
  "TaskSpec",
  "format_prompt",
  "format_target",
  "generate_arithmetic",
  "generate_countdown",
  "generate_stride",
  "get_task",
  "local_task",
  "make_split",
  "resolve_checker",
  "split_seed",
]

Example = dict[str, str]


def _rng(task: str, seed: int, index: int) -> random.Random:
  # Seeding from a string goes through SHA-512 in CPython, so every (task, seed, index) gets its
  # own well-mixed stream and examples can be produced in any order.
  return random.Random(f"{task}/{seed}/{index}")


def _lognormal_int(rng: random.Random, median: float, sigma: float, cap: int) -> int:
  """A log-normal draw rounded to an integer in [1, cap]."""
  return max(1, min(cap, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


# ---------------------------------------------------------------------------------------------
# arithmetic: "23+7+41-5=" -> "23+7=30;30+41=71;71-5=66;#66".
# ---------------------------------------------------------------------------------------------


_STEP_LABELS = string.ascii_lowercase + string.ascii_uppercase
_MAX_LABELLED_STEPS = len(_STEP_LABELS) * (1 + len(_STEP_LABELS))


def _step_label(i: int) -> str:
  """The i-th operation's label: a..z, A..Z, then two letters (aa, ab, ..., ZZ)."""
  n = len(_STEP_LABELS)
  return _STEP_LABELS[i] if i < n else _STEP_LABELS[(i - n) // n] + _STEP_LABELS[(i - n) % n]


def _arithmetic_example(
  rng: random.Random,
  max_steps: int,
  median_steps: float,
  steps_sigma: float,
  max_operand: int,
  max_value: int,
  style: str,
  slip: random.Random | None = None,
  slip_rate: float = 0.0,
  effort: random.Random | None = None,
  hasty_fraction: float = 0.0,
  hasty_ops: int = 4,
) -> Example:
  steps = _lognormal_int(rng, median_steps, steps_sigma, max_steps)
  value = rng.randint(1, max_operand)
  # `shown` is the demonstrator's running value: `value` plus the `offset` its slips add.
  shown, offset = value, 0
  question = [str(value)]
  lines = [] if style == "chain" else [f"{value};"]
  labels = [_step_label(i) if style == "labelled" else "" for i in range(steps)]
  for _ in range(steps):
    operand = rng.randint(1, max_operand)
    # Pick the sign at random unless that would leave [0, max_value].
    can_add, can_sub = value + operand <= max_value, value - operand >= 0
    op = rng.choice("+-") if can_add and can_sub else ("+" if can_add else "-")
    new_value = value + operand if op == "+" else value - operand
    label = labels[len(lines) - 1]
    question.append(f",{label}{op}{operand}" if label else f"{op}{operand}")
    # "chain" restates both operands; "running" keeps only the running value,
    # so each line copies the next operation of the question in order (easy
    # for a small model to learn) and does one local addition.
    # "labelled" names each operation (a, b, c, ...) in the question and the
    # scratchpad: finding the next operation is a lookup by label.
    prefix = str(shown) if style == "chain" else label
    if slip is not None and slip.random() < slip_rate:
      # The demonstrator miscomputes this line by 1 or 2 and carries on from its own result.
      offset += slip.choice([d for d in (-2, -1, 1, 2) if new_value + offset + d >= 0] or [1, 2])
    shown_new = new_value + offset
    lines.append(f"{prefix}{op}{operand}={shown_new};")
    value, shown = new_value, shown_new
  if effort is not None:
    # The demonstrator announces its effort: "~" careful (the lines above), or, with
    # probability hasty_fraction, "!" hasty: `hasty_ops` operations to a line, their
    # result summed in the head (what a small model gets wrong far more often).
    if effort.random() < hasty_fraction:
      ops = [line.split("=")[0] for line in lines[1:]]
      values = [line.split("=")[1] for line in lines[1:]]
      lines = [lines[0]] + [
        "".join(ops[i : i + hasty_ops]) + "=" + values[min(i + hasty_ops, len(ops)) - 1]
        for i in range(0, len(ops), hasty_ops)
      ]
      lines[0] = checkers.HASTY + lines[0]
    else:
      lines[0] = checkers.CAREFUL + lines[0]
  return {
    "question": "".join(question) + "=",
    "solution": "".join(lines) + f"{checkers.MARKER}{shown}",
    "answer": str(value),
  }


def generate_arithmetic(
  seed: int,
  num: int,
  *,
  start: int = 0,
  max_steps: int = 40,
  median_steps: float = 3.5,
  steps_sigma: float = 1.0,
  max_operand: int = 99,
  max_value: int = 999,
  style: str = "chain",
  slip_rate: float = 0.0,
  hasty_fraction: float = -1.0,
  hasty_ops: int = 4,
) -> list[Example]:
  """Multi-step addition/subtraction with a worked scratchpad.

  Styles: "chain" writes `23+7=30;30+41=71;...;#66`; "running" writes the
  running value only, `23;+7=30;+41=71;...;#66`; "labelled" names the
  operations, question `23,a+7,b+41=` and solution `23;a+7=30;b+41=71;#71`
  (labels a-z, A-Z, then two letters from the 53rd operation: aa, ab, ...).

  Args:
    seed: Seed of the example stream.
    num: Number of examples.
    start: Index of the first example in the stream.
    max_steps: Cap on the number of operations (and scratchpad lines).
    median_steps: Median number of steps; the number of steps is log-normal around it.
    steps_sigma: Log-space spread of the number of steps; larger means a longer tail.
    max_operand: Operands are drawn from [1, max_operand].
    max_value: Running values stay in [0, max_value].
    style: "chain", "running" or "labelled" (see above).
    slip_rate: Probability that a scratchpad line of the solution is off by 1 or 2, the
      following lines continuing from the wrong value (an imperfect demonstrator for the
      warm start; `answer` stays the true result, so a checker scores such a trace wrong).
      Slips come from their own random stream: questions do not depend on the rate.
    hasty_fraction: < 0 (the default): solutions as above. In [0, 1] (labelled style): every
      solution opens with its effort, "~" (careful: the lines above) or, with this
      probability, "!" (hasty: `hasty_ops` operations to a line, e.g. `!6;a+8b-3=11;#11`,
      their result done in the head). A warm start trained on the mix picks an effort at
      its first token; hasty answers are shorter and wrong more often, so the reward
      teaches RL to choose care early, and accuracy and length grow together (as in
      reasoning RL). Drawn from their own stream: questions do not depend on it.
    hasty_ops: operations per line of a hasty solution (>= 2).

  Returns:
    `num` examples.
  """
  if (
    max_steps < 1
    or max_operand < 1
    or max_value < max_operand
    or median_steps <= 0
    or steps_sigma < 0
    or not 0.0 <= slip_rate <= 1.0
  ):
    raise ValueError(
      f"Bad arithmetic parameters: max_steps={max_steps}, max_operand={max_operand}, "
      f"max_value={max_value}, median_steps={median_steps}, steps_sigma={steps_sigma}, "
      f"slip_rate={slip_rate}."
    )
  if style not in ("chain", "running", "labelled"):
    raise ValueError(
      f"Unknown arithmetic style {style!r}; expected 'chain', 'running' or 'labelled'."
    )
  if style == "labelled" and max_steps > _MAX_LABELLED_STEPS:
    raise ValueError(f"style 'labelled' supports max_steps <= {_MAX_LABELLED_STEPS}")
  mixed = hasty_fraction >= 0
  if mixed and (style != "labelled" or hasty_fraction > 1 or hasty_ops < 2 or slip_rate > 0):
    raise ValueError(
      f"hasty_fraction={hasty_fraction} needs style 'labelled', no slips, a fraction <= 1 "
      f"and hasty_ops >= 2 (got style={style!r}, slip_rate={slip_rate}, hasty_ops={hasty_ops})"
    )
  return [
    _arithmetic_example(
      _rng("arithmetic", seed, i),
      max_steps,
      median_steps,
      steps_sigma,
      max_operand,
      max_value,
      style,
      _rng("arithmetic-slip", seed, i) if slip_rate > 0 else None,
      slip_rate,
      _rng("arithmetic-effort", seed, i) if mixed else None,
      hasty_fraction,
      hasty_ops,
    )
    for i in range(start, start + num)
  ]


# ---------------------------------------------------------------------------------------------
# stride: count from s in steps of k until N; how many steps?
#   "23+7>44=" -> "~1:23+7=30;2:30+7=37;3:37+7=44;#3"
#
# Every line follows from the one before it (counter + 1, the last value restated, + k), so a
# worked solution is long but each line is local: a small model learns it in far fewer examples
# than a lookup into the question. With an effort mix, a hasty solution ("!") jumps two steps a
# line and answers its last counter: right only when the count is even.
# ---------------------------------------------------------------------------------------------


def _stride_example(
  rng: random.Random,
  median_steps: float,
  steps_sigma: float,
  max_steps: int,
  max_start: int,
  max_stride: int,
  effort: random.Random | None,
  hasty_fraction: float,
  hasty_jump: int,
  clock: int,
  countdown: bool,
) -> Example:
  m = _lognormal_int(rng, median_steps, steps_sigma, max_steps)
  s, k = rng.randint(1, max_start), rng.randint(2, max_stride)
  jump, marker = 1, ""
  if effort is not None:
    hasty = effort.random() < hasty_fraction
    jump, marker = (hasty_jump, checkers.HASTY) if hasty else (1, checkers.CAREFUL)
  lines, i, v = [], 0, s
  if clock:  # m steps on a clock of `clock`: answer the last value
    while i < m:
      label = m - i if countdown else i + jump  # steps left before the line, or done after it
      lines.append(f"{label}:{v}+{jump * k}={(v + jump * k) % clock};")
      i, v = i + jump, (v + jump * k) % clock
    question, answer, final = f"{s}+{k}x{m}=", str((s + k * m) % clock), v
  else:  # until the limit: answer the step count
    n = s + k * m
    while v < n:
      lines.append(f"{i + jump}:{v}+{jump * k}={v + jump * k};")
      i, v = i + jump, v + jump * k
    question, answer, final = f"{s}+{k}>{n}=", str(m), i
  return {
    "question": question,
    "solution": marker + "".join(lines) + f"{checkers.MARKER}{final}",
    "answer": answer,
  }


def generate_stride(
  seed: int,
  num: int,
  *,
  start: int = 0,
  median_steps: float = 12,
  steps_sigma: float = 0.9,
  max_steps: int = 110,
  max_start: int = 99,
  max_stride: int = 9,
  hasty_fraction: float = -1.0,
  hasty_jump: int = 2,
  clock: int = 0,
  countdown: bool = False,
) -> list[Example]:
  """Count from a start in steps of a stride until a limit; the answer is the step count.

  Question `23+7>44=` (start 23, stride 7, limit 44 = 23 + 3 x 7); worked solution
  `1:23+7=30;2:30+7=37;3:37+7=44;#3`, one line per step (its counter, the last value plus
  the stride, the new value), stopping at the first value that reaches the limit. The
  number of steps is log-normal (long-tailed lengths, about 10 characters a line).

  Args:
    seed: Seed of the example stream.
    num: Number of examples.
    start: Index of the first example in the stream.
    median_steps, steps_sigma, max_steps: the log-normal number of steps and its cap.
    max_start: starts are drawn from [1, max_start].
    max_stride: strides are drawn from [2, max_stride].
    hasty_fraction: < 0 (the default): solutions as above. In [0, 1]: every solution opens
      with its effort, "~" (careful: a line per step) or, with this probability, "!"
      (hasty: `hasty_jump` steps a line, `2:23+14=37;`, answering its last counter, so it
      overshoots when
      the count is not a multiple of the jump). A warm start trained on the mix picks an
      effort at its first token; the reward teaches RL to choose care, and accuracy and
      length grow together. Drawn from their own stream: questions do not depend on it.
    hasty_jump: steps per line of a hasty solution (>= 2).
    clock: > 0: values wrap around this modulus (two-digit sums for 100) and the question
      gives the number of steps, `23+7x3=`; the answer is the last value, 44 (a hasty
      solution overshoots an odd count by a step, so its value is off by the stride).
    countdown: with `clock`, a line's counter is the number of steps still to go before it
      (`3:23+7=30;2:30+7=37;1:37+7=44;#44`): the first copies the question's count, each
      next one is the last minus its jump, and the solution stops after the line marked 1
      (or, hasty, 2 or 1). Knowing when to stop is then local, as each line's sum is; with
      counters that count up it is a comparison with a number far back in the question,
      which the regime's 13M policy got wrong by a line or two in half its careful answers
      (experiments/RESULTS.md, 2026-11-29).

  Returns:
    `num` examples.
  """
  if (
    clock < 0
    or max_steps < 1
    or median_steps <= 0
    or steps_sigma < 0
    or max_start < 1
    or max_stride < 2
    or hasty_fraction > 1
    or hasty_jump < 2
    or (countdown and not clock)
  ):
    raise ValueError(
      f"Bad stride parameters: median_steps={median_steps}, steps_sigma={steps_sigma}, "
      f"max_steps={max_steps}, max_start={max_start}, max_stride={max_stride}, "
      f"hasty_fraction={hasty_fraction}, hasty_jump={hasty_jump}, clock={clock}, "
      f"countdown={countdown} (countdown needs a clock)."
    )
  mixed = hasty_fraction >= 0
  return [
    _stride_example(
      _rng("stride", seed, i),
      median_steps,
      steps_sigma,
      max_steps,
      max_start,
      max_stride,
      _rng("stride-effort", seed, i) if mixed else None,
      hasty_fraction,
      hasty_jump,
      clock,
      countdown,
    )
    for i in range(start, start + num)
  ]


# ---------------------------------------------------------------------------------------------
# countdown: combine all the numbers with + - * / to reach the target, by depth-first search.
#
#   question  "7,8,9 to 65:"
#   solution  "7*9=63|8,63;8+63=71x;63-8=55x;8*63=504x;8*9=72|7,72;72-7=65!;#8*9-7"
#
# Each step combines two numbers of the current state and writes the new state after "|"; a
# step that uses up the numbers ends in "!" when it hits the target and "x" (dead end) otherwise.
# After the dead ends below a state the search backtracks, so the next step starts from an
# earlier state. Within a state, steps whose result is closest to the target go first.
# ---------------------------------------------------------------------------------------------

# Precedence of a printed sub-expression: a literal binds tightest.
_ATOM, _MUL, _ADD = 3, 2, 1


@dataclasses.dataclass(frozen=True)
class _Node:
  value: int
  text: str
  prec: int


def _combine(a: _Node, op: str, b: _Node) -> _Node:
  prec = _ADD if op in "+-" else _MUL
  left = a.text if a.prec >= prec else f"({a.text})"
  # The right side of - and / needs brackets at equal precedence: a-(b+c), a/(b*c).
  right_ok = b.prec > prec or (b.prec == prec and op in "+*")
  right = b.text if right_ok else f"({b.text})"
  return _Node(_apply(a.value, op, b.value), f"{left}{op}{right}", prec)


def _apply(a: int, op: str, b: int) -> int:
  if op == "+":
    return a + b
  if op == "-":
    return a - b
  if op == "*":
    return a * b
  return a // b


def _moves(state: Sequence[_Node], target: int, rng: random.Random) -> list[tuple[int, int, str]]:
  """Legal steps from `state` as (index of left, index of right, op), most promising first.

  Steps whose result lands closest to the target come first (a simple heuristic a model can
  learn to imitate); ties are broken at random so equal-looking puzzles get different traces.
  """
  moves = []
  for i in range(len(state)):
    for j in range(len(state)):
      if i == j:
        continue
      a, b = state[i].value, state[j].value
      # Countdown rules: intermediate results stay positive integers. Commutative ops are tried
      # once per pair, and x*1, x/1 are skipped as they change nothing.
      if i < j:
        moves.append((i, j, "+"))
        if a != 1 and b != 1:
          moves.append((i, j, "*"))
      if a > b:
        moves.append((i, j, "-"))
      if b != 1 and a % b == 0:
        moves.append((i, j, "/"))
  rng.shuffle(moves)
  moves.sort(key=lambda m: abs(_apply(state[m[0]].value, m[2], state[m[1]].value) - target))
  return moves


class _TraceTooLong(Exception):
  pass


def _search(
  state: list[_Node], target: int, rng: random.Random, trace: list[str], budget: list[int]
) -> _Node | None:
  """Depth-first search; appends each step to `trace` and returns the solving node, if any."""
  for i, j, op in _moves(state, target, rng):
    node = _combine(state[i], op, state[j])
    rest = [n for k, n in enumerate(state) if k not in (i, j)] + [node]
    step = f"{state[i].value}{op}{state[j].value}={node.value}"
    if len(rest) == 1:
      step += "!" if node.value == target else "x"
    else:
      step += "|" + ",".join(str(n.value) for n in rest)
    budget[0] -= len(step) + 1
    if budget[0] < 0:
      raise _TraceTooLong
    trace.append(step)
    if len(rest) == 1:
      if node.value == target:
        return node
    else:
      found = _search(rest, target, rng, trace, budget)
      if found is not None:
        return found
  return None


def _random_target(numbers: Sequence[int], rng: random.Random) -> int:
  """Combines the numbers in a random order with random legal ops; returns the value."""
  pool = list(numbers)
  while len(pool) > 1:
    rng.shuffle(pool)
    a, b = pool.pop(), pool.pop()
    ops = ["+", "*"]
    if a > b:
      ops.append("-")
    if b > 1 and a % b == 0:
      ops.append("/")
    pool.append(_apply(a, rng.choice(ops), b))
  return pool[0]


def _countdown_example(
  rng: random.Random,
  number_counts: Sequence[int],
  max_number: int,
  max_target: int,
  max_trace_chars: int,
) -> Example:
  # Rejection sampling: targets come from a random expression over the numbers, so every draw
  # is solvable; redraw when the target is out of range or the search would pass the cap.
  for _ in range(1000):
    numbers = [rng.randint(1, max_number) for _ in range(rng.choice(number_counts))]
    target = _random_target(numbers, rng)
    if not 1 <= target <= max_target or target in numbers:
      continue
    trace: list[str] = []
    budget = [max_trace_chars]
    try:
      found = _search([_Node(n, str(n), _ATOM) for n in numbers], target, rng, trace, budget)
    except _TraceTooLong:
      continue
    if found is None:
      continue
    solution = ";".join(trace) + f";{checkers.MARKER}{found.text}"
    if len(solution) > max_trace_chars:
      continue
    return {
      "question": ",".join(map(str, numbers)) + f" to {target}:",
      "solution": solution,
      "answer": found.text,
    }
  raise ValueError(
    f"Could not draw a countdown instance within max_trace_chars={max_trace_chars} in 1000 "
    "tries; raise the cap or use fewer numbers."
  )


def generate_countdown(
  seed: int,
  num: int,
  *,
  start: int = 0,
  number_counts: Sequence[int] = (3, 3, 4),
  max_number: int = 12,
  max_target: int = 100,
  max_trace_chars: int = 1000,
) -> list[Example]:
  """Countdown puzzles (use every number once to reach the target) solved by written-out search.

  Args:
    seed: Seed of the example stream.
    num: Number of examples.
    start: Index of the first example in the stream.
    number_counts: How many numbers a puzzle has, drawn uniformly from this sequence (repeat an
      entry to weight it). Four-number puzzles make the long tail.
    max_number: Numbers are drawn from [1, max_number].
    max_target: Targets lie in [1, max_target].
    max_trace_chars: Cap on the solution length in characters; puzzles whose search would run
      longer are redrawn.

  Returns:
    `num` solvable examples; `answer` is the expression the search found.
  """
  number_counts = tuple(int(c) for c in number_counts)
  if not number_counts or min(number_counts) < 2 or max_number < 2 or max_target < 1:
    raise ValueError(
      f"Bad countdown parameters: number_counts={number_counts} (each at least 2), "
      f"max_number={max_number}, max_target={max_target}."
    )
  if max_trace_chars < 20:
    raise ValueError(f"max_trace_chars={max_trace_chars} is too small for any trace.")
  return [
    _countdown_example(
      _rng("countdown", seed, i), number_counts, max_number, max_target, max_trace_chars
    )
    for i in range(start, start + num)
  ]


# ---------------------------------------------------------------------------------------------
# Registry, prompts and splits.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A task: synthetic (generated) or local (rows from files).

  Attributes:
    name: Registry key ("local" for file data).
    generate: `(seed, num, *, start=0, **params) -> list[Example]`, deterministic (None for
      file data).
    check: `(completion, answer) -> float` reward in {0.0, 1.0}; never raises.
    steps: `(question, completion) -> [(end, reward)]` per reasoning step, for process
      supervision (None: the task has no step checker).
  """

  name: str
  generate: Callable[..., list[Example]] | None
  check: Callable[[str, str], float]
  steps: Callable[[str, str], list[tuple[int, float]]] | None = None


TASKS: dict[str, TaskSpec] = {
  "arithmetic": TaskSpec(
    "arithmetic", generate_arithmetic, checkers.check_arithmetic, checkers.arithmetic_steps
  ),
  "countdown": TaskSpec("countdown", generate_countdown, checkers.check_countdown),
  "stride": TaskSpec("stride", generate_stride, checkers.check_stride, checkers.stride_steps),
}


def get_task(name: str) -> TaskSpec:
  """Returns the registered task `name`."""
  try:
    return TASKS[name]
  except KeyError:
    raise ValueError(f"Unknown task {name!r}; known tasks: {sorted(TASKS)}.") from None


# Answer checkers by name, for file data (and to override a synthetic task's own).
CHECKERS: dict[str, Callable[[str, str], float]] = {
  "arithmetic": checkers.check_arithmetic,
  "countdown": checkers.check_countdown,
  "exact": checkers.check_exact,
  "gsm8k": checkers.check_gsm8k,
  "marked": checkers.check_marked,
  "math": checkers.check_math,
  "stride": checkers.check_stride,
}


def resolve_checker(spec: str) -> Callable[[str, str], float]:
  """A checker by name (a key of CHECKERS) or by import path ("package.module:function", a
  module-level `(completion, answer) -> float` so that reward worker processes can load it)."""
  if spec in CHECKERS:
    return CHECKERS[spec]
  module_name, sep, attr = spec.partition(":")
  if not sep or not module_name or not attr:
    raise ValueError(
      f"Unknown checker {spec!r}: expected one of {sorted(CHECKERS)} or 'package.module:function'."
    )
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"checker {spec!r}: cannot import {module_name!r} ({e}).") from None
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise ValueError(f"checker {spec!r}: {module_name} has no function {attr!r}.")
  return fn


def local_task(checker: str) -> TaskSpec:
  """The task of file data (`builders.load_local_split`): rows are given, `checker` scores."""
  return TaskSpec("local", None, resolve_checker(checker))


def format_prompt(example: Mapping[str, str]) -> str:
  """The text the policy is conditioned on."""
  return example["question"]


def format_target(example: Mapping[str, str]) -> str:
  """The text the policy should produce after the prompt (what SFT trains on)."""
  return example["solution"]


def _answer_start(solution: str) -> int:
  """Index of the final answer marker in a solution."""
  cut = solution.rfind(checkers.MARKER)
  if cut < 0:
    raise ValueError(f"solution has no final answer marker {checkers.MARKER!r}: {solution!r}")
  return cut


def format_direct_target(example: Mapping[str, str]) -> str:
  """The solution without its scratchpad: the final marked answer alone (e.g. "#66")."""
  solution = example["solution"]
  return solution[_answer_start(solution) :]


def format_unanswered_target(example: Mapping[str, str]) -> str:
  """The solution's scratchpad without the final marked answer (e.g. "1+2=3;"): a trace
  that never states its result, which a checker scores 0."""
  solution = example["solution"]
  return solution[: _answer_start(solution)]


def sft_pairs(
  examples: Sequence[Mapping[str, str]],
  direct_fraction: float = 0.0,
  seed: int = 0,
  unanswered_fraction: float = 0.0,
  prompt: Callable[[Mapping[str, str]], str] = format_prompt,
) -> list[tuple[str, str]]:
  """(prompt(example), target) pairs for the warm start; a `direct_fraction` of the targets skip
  the scratchpad and state the answer alone, and an `unanswered_fraction` of the others
  stop after the scratchpad without stating the answer.

  A warm start that has seen both habits must choose between them (at the first response
  token for direct answers, after the last step for unanswered ones); only the reward
  tells them apart, so that choice is what RL learns first (for direct answers, responses
  get longer, as in reasoning-RL runs).
  """
  for name, value in (
    ("direct_fraction", direct_fraction),
    ("unanswered_fraction", unanswered_fraction),
  ):
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"{name} must be in [0, 1], got {value!r}")
  draw = random.Random(seed).random
  # A second stream for the unanswered habit keeps the direct-answer draws what they were.
  draw_unanswered = random.Random(f"unanswered/{seed}").random

  def target(ex: Mapping[str, str]) -> str:
    if draw() < direct_fraction:
      return format_direct_target(ex)
    if unanswered_fraction and draw_unanswered() < unanswered_fraction:
      return format_unanswered_target(ex)
    return format_target(ex)

  return [(prompt(ex), target(ex)) for ex in examples]


def split_seed(seed: int, split: str) -> int:
  """The example-stream seed of a split: `seed` itself for train, a hash-derived one otherwise."""
  if split == "train":
    return seed
  digest = hashlib.sha256(f"{seed}/{split}".encode()).digest()
  # Top bit cleared: derived seeds stay non-negative int63s, unlike any train seed in practice.
  return int.from_bytes(digest[:8], "big") >> 1


def _iter_examples(task: TaskSpec, seed: int, params: Mapping[str, Any]) -> Iterator[Example]:
  chunk, start = 256, 0
  while True:
    yield from task.generate(seed, chunk, start=start, **params)
    start += chunk


def make_split(
  task: str,
  split: str,
  seed: int = 0,
  *,
  train_size: int = 20_000,
  test_size: int = 500,
  **params: Any,
) -> list[Example]:
  """Returns the examples of one split of a task.

  Train is the first `train_size` examples of the seed's stream. Test is drawn from a separate
  stream, skipping any question that is in train or already in test, so the splits are disjoint
  and test has no repeats.

  Args:
    task: A key of `TASKS`.
    split: "train" or "test".
    seed: Dataset seed.
    train_size: Number of train examples (test is de-duplicated against all of them).
    test_size: Number of test examples.
    **params: Passed to the task's generator.

  Returns:
    The split's examples.
  """
  spec = get_task(task)
  if split == "train":
    return spec.generate(split_seed(seed, "train"), train_size, **params)
  if split != "test":
    raise ValueError(f"Unknown split {split!r}; expected 'train' or 'test'.")
  seen = {ex["question"] for ex in spec.generate(split_seed(seed, "train"), train_size, **params)}
  test: list[Example] = []
  max_draws = 100 * test_size + 10_000
  for draws, example in enumerate(_iter_examples(spec, split_seed(seed, "test"), params)):
    if len(test) == test_size:
      break
    if draws >= max_draws:
      raise ValueError(
        f"Only found {len(test)} of {test_size} test questions for {task!r} that are not in "
        f"train after {max_draws} draws; the task's question space is too small for these sizes."
      )
    if example["question"] not in seen:
      seen.add(example["question"])
      test.append(example)
  return test

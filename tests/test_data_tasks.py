"""Tests for tlt_jax.data.tasks."""

import dataclasses
import re

import numpy as np
import pytest

from tlt_jax.data import checkers, tasks

TASK_NAMES = sorted(tasks.TASKS)


@pytest.fixture(scope="module")
def train_2000():
  return {name: tasks.make_split(name, "train", 0, train_size=2000) for name in TASK_NAMES}


def test_registry():
  assert {"arithmetic", "countdown"} <= set(tasks.TASKS)
  for name, spec in tasks.TASKS.items():
    assert spec.name == name
    assert tasks.get_task(name) is spec
  with pytest.raises(dataclasses.FrozenInstanceError):
    tasks.TASKS["arithmetic"].name = "other"  # type: ignore[misc]
  with pytest.raises(ValueError, match="Unknown task"):
    tasks.get_task("sudoku")


@pytest.mark.parametrize("name", TASK_NAMES)
def test_generation_is_deterministic(name):
  spec = tasks.TASKS[name]
  first = spec.generate(7, 40)
  assert first == spec.generate(7, 40)
  assert first != spec.generate(8, 40)
  # Example i depends only on (seed, i): shorter runs are prefixes, `start` skips ahead.
  assert spec.generate(7, 10) == first[:10]
  assert spec.generate(7, 5, start=30) == first[30:35]
  for example in first:
    assert set(example) == {"question", "solution", "answer"}
    assert all(isinstance(v, str) and v for v in example.values())


@pytest.mark.parametrize("name", TASK_NAMES)
def test_splits_are_disjoint_and_deterministic(name):
  train = tasks.make_split(name, "train", 1, train_size=300, test_size=60)
  test = tasks.make_split(name, "test", 1, train_size=300, test_size=60)
  assert len(train) == 300 and len(test) == 60
  test_questions = [ex["question"] for ex in test]
  assert len(set(test_questions)) == len(test_questions)
  assert not set(test_questions) & {ex["question"] for ex in train}
  assert test == tasks.make_split(name, "test", 1, train_size=300, test_size=60)
  with pytest.raises(ValueError, match="Unknown split"):
    tasks.make_split(name, "validation", 1)


def test_test_split_fails_when_question_space_is_exhausted():
  # One step with operands in [1, 2] allows only a handful of distinct questions.
  with pytest.raises(ValueError, match="question space"):
    tasks.make_split(
      "arithmetic", "test", 0, train_size=50, test_size=20, max_steps=1, max_operand=2
    )


@pytest.mark.parametrize("name", TASK_NAMES)
def test_lengths_are_long_tailed(name, train_2000):
  lengths = np.array([len(ex["solution"]) for ex in train_2000[name]])
  median = np.median(lengths)
  assert lengths.max() >= 10 * median
  assert np.percentile(lengths, 90) >= 2.5 * median


def test_arithmetic_length_scale(train_2000):
  lengths = np.array([len(ex["solution"]) for ex in train_2000["arithmetic"]])
  assert 25 <= np.median(lengths) <= 45
  assert 300 <= lengths.max() <= 460


def test_countdown_respects_trace_cap():
  examples = tasks.generate_countdown(0, 200, max_trace_chars=150)
  assert max(len(ex["solution"]) for ex in examples) <= 150


@pytest.mark.parametrize("name", TASK_NAMES)
def test_solutions_pass_their_checker(name, train_2000):
  spec = tasks.TASKS[name]
  examples = train_2000[name][:500] + tasks.make_split(
    name, "test", 0, train_size=2000, test_size=50
  )
  for ex in examples:
    assert spec.check(ex["solution"], ex["answer"]) == 1.0, ex
    assert spec.check(tasks.format_target(ex), ex["answer"]) == 1.0
    # A completion that keeps going after its final answer has none.
    assert spec.check(ex["solution"] + ";", ex["answer"]) == 0.0
    assert spec.check(ex["solution"].rsplit("#", 1)[0], ex["answer"]) == 0.0


def test_corrupted_arithmetic_answers_fail(train_2000):
  for ex in train_2000["arithmetic"][:300]:
    wrong = ex["solution"].rsplit("#", 1)[0] + f"#{int(ex['answer']) + 1}"
    assert checkers.check_arithmetic(wrong, ex["answer"]) == 0.0


def test_corrupted_countdown_answers_fail(train_2000):
  for ex in train_2000["countdown"][:300]:
    body, expr = ex["solution"].rsplit("#", 1)
    # An extra number, a number left out, and a changed value all fail.
    assert checkers.check_countdown(f"{body}#{expr}+1", ex["answer"]) == 0.0
    assert checkers.check_countdown(f"{body}#({expr})*1", ex["answer"]) == 0.0
    literal = re.search(r"\d+", expr)
    assert checkers.check_countdown(f"{body}#{literal.group()}", ex["answer"]) == 0.0


def test_arithmetic_scratchpad_is_consistent(train_2000):
  for ex in train_2000["arithmetic"]:
    question = ex["question"]
    assert question.endswith("=")
    operands = re.findall(r"[+-]?\d+", question[:-1])
    *steps, final = ex["solution"].split(";")
    assert final == f"#{ex['answer']}"
    assert len(steps) == len(operands) - 1
    value = int(operands[0])
    assert 1 <= value <= 99
    for step, operand in zip(steps, operands[1:]):
      lhs, rhs = step.split("=")
      assert lhs == f"{value}{operand}"
      assert 1 <= abs(int(operand)) <= 99
      value += int(operand)
      assert 0 <= value <= 999
      assert int(rhs) == value
    assert ex["answer"] == str(value)


def test_countdown_trace_is_consistent(train_2000):
  step_re = re.compile(r"(\d+)([-+*/])(\d+)=(\d+)(?:\|([\d,]+)|([!x]))")
  for ex in train_2000["countdown"][:500]:
    numbers_text, target_text = re.fullmatch(r"([\d,]+) to (\d+):", ex["question"]).groups()
    numbers = sorted(int(n) for n in numbers_text.split(","))
    target = int(target_text)
    *steps, final = ex["solution"].split(";")
    for step in steps:
      a, op, b, c, _, leaf = step_re.fullmatch(step).groups()
      expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}.get(op)
      if op == "/":
        assert int(a) % int(b) == 0
        expected = int(a) // int(b)
      assert int(c) == expected > 0
      if leaf:
        assert (leaf == "!") == (int(c) == target)
    assert steps[-1].endswith("!") and all(not s.endswith("!") for s in steps[:-1])
    value, literals = checkers.evaluate_expression(final[1:])
    assert value == target
    assert sorted(literals) == numbers
    assert final[1:] == ex["answer"]


def test_prompt_and_target():
  ex = {"question": "1+2=", "solution": "1+2=3;#3", "answer": "3"}
  assert tasks.format_prompt(ex) == "1+2="
  assert tasks.format_target(ex) == "1+2=3;#3"


@pytest.mark.parametrize(
  ("name", "params"),
  [
    ("arithmetic", {"max_steps": 0}),
    ("arithmetic", {"max_value": 10, "max_operand": 20}),
    ("countdown", {"number_counts": (1, 3)}),
    ("countdown", {"max_trace_chars": 5}),
  ],
)
def test_bad_parameters_raise(name, params):
  with pytest.raises(ValueError):
    tasks.TASKS[name].generate(0, 1, **params)


def test_split_seed():
  assert tasks.split_seed(5, "train") == 5
  assert tasks.split_seed(5, "test") == tasks.split_seed(5, "test") != 5
  assert tasks.split_seed(5, "test") != tasks.split_seed(6, "test")


@pytest.mark.parametrize("style", ["chain", "running", "labelled"])
def test_arithmetic_styles_are_checkable_and_long_tailed(style):
  examples = tasks.generate_arithmetic(0, 1000, max_operand=9, max_value=99, style=style)
  check = tasks.get_task("arithmetic").check
  assert all(check(ex["solution"], ex["answer"]) == 1.0 for ex in examples)
  lengths = np.array([len(ex["solution"]) for ex in examples])
  assert lengths.max() >= 8 * np.median(lengths)
  if style == "labelled":
    ex = max(examples, key=lambda e: len(e["solution"]))
    # Every operation of the question appears, with its label, in the scratchpad.
    for op in ex["question"].rstrip("=").split(",")[1:]:
      assert f";{op}=" in ex["solution"]


def test_unknown_arithmetic_style():
  with pytest.raises(ValueError, match="style"):
    tasks.generate_arithmetic(0, 1, style="fancy")


def test_sft_pairs_mix_direct_answers():
  data = tasks.generate_arithmetic(
    0, 400, max_steps=6, max_operand=9, max_value=99, style="labelled"
  )
  assert tasks.sft_pairs(data) == [(ex["question"], tasks.format_target(ex)) for ex in data]
  mixed = tasks.sft_pairs(data, 0.5, seed=1)
  direct = [t == tasks.format_direct_target(ex) for (_, t), ex in zip(mixed, data)]
  assert 0.4 < np.mean(direct) < 0.6
  assert all(t == "#" + ex["answer"] for (_, t), ex, d in zip(mixed, data, direct) if d)
  assert mixed == tasks.sft_pairs(data, 0.5, seed=1)  # deterministic
  with pytest.raises(ValueError, match="direct_fraction"):
    tasks.sft_pairs(data, 1.5)
  with pytest.raises(ValueError, match="unanswered_fraction"):
    tasks.sft_pairs(data, unanswered_fraction=-0.1)
  with pytest.raises(ValueError, match="marker"):
    tasks.format_direct_target({"solution": "no answer here"})


def test_sft_pairs_drop_final_answers():
  data = tasks.generate_arithmetic(0, 400, max_operand=9, max_value=99, style="labelled")
  check = tasks.get_task("arithmetic").check
  pairs = tasks.sft_pairs(data, seed=2, unanswered_fraction=0.6)
  unanswered = [t == tasks.format_unanswered_target(ex) for (_, t), ex in zip(pairs, data)]
  assert 0.5 < np.mean(unanswered) < 0.7
  for (_, t), ex, u in zip(pairs, data, unanswered):
    assert t == (tasks.format_unanswered_target(ex) if u else tasks.format_target(ex))
    assert ex["solution"].startswith(t)  # the whole scratchpad, only the answer line is cut
    assert check(t, ex["answer"]) == float(not u)
  # The direct-answer draws do not depend on the unanswered habit.
  direct = tasks.sft_pairs(data, 0.3, seed=2)
  both = tasks.sft_pairs(data, 0.3, seed=2, unanswered_fraction=0.6)
  for (_, a), (_, b), ex in zip(direct, both, data):
    assert (a == tasks.format_direct_target(ex)) == (b == tasks.format_direct_target(ex))


@pytest.mark.parametrize("style", ["chain", "labelled"])
def test_slipping_demonstrator(style):
  kw = dict(max_operand=9, max_value=99, style=style)
  clean = tasks.generate_arithmetic(0, 1000, **kw)
  slipped = tasks.generate_arithmetic(0, 1000, slip_rate=0.1, **kw)
  # Same questions and answers: slips draw from their own stream and touch only solutions.
  assert [(e["question"], e["answer"]) for e in clean] == [
    (e["question"], e["answer"]) for e in slipped
  ]
  lines = wrong = 0
  check = tasks.get_task("arithmetic").check
  for ex in slipped:
    steps = ex["solution"].split(checkers.MARKER)[0].rstrip(";").split(";")
    prev = int(steps[0]) if style == "labelled" else None
    for step in steps[1:] if style == "labelled" else steps:
      lhs, rhs = step.split("=")
      m = re.fullmatch(r"(-?\d+|[a-zA-Z])([+-])(\d+)", lhs)
      if style == "chain":
        assert prev is None or int(m.group(1)) == prev  # restates what it wrote last
        prev = int(m.group(1))
      expected = prev + int(m.group(3)) if m.group(2) == "+" else prev - int(m.group(3))
      # Each line is off by at most 2 and the next line carries on from what was written.
      assert abs(int(rhs) - expected) <= 2
      lines, wrong = lines + 1, wrong + (int(rhs) != expected)
      prev = int(rhs)
    # The final answer is the trace's own last value, so a slipped trace scores 0.
    assert ex["solution"].endswith(f"{checkers.MARKER}{prev}")
    assert check(ex["solution"], ex["answer"]) == float(str(prev) == ex["answer"])
  assert 0.08 < wrong / lines < 0.12
  with pytest.raises(ValueError, match="slip_rate"):
    tasks.generate_arithmetic(0, 1, slip_rate=1.5)


def test_labelled_questions_go_past_52_operations_with_two_letter_labels():
  (ex,) = [
    e
    for e in tasks.generate_arithmetic(
      0, 400, median_steps=40, max_steps=130, max_operand=9, max_value=99, style="labelled"
    )
    if e["question"].count(",") > 60
  ][:1]
  labels = [re.match(r"[A-Za-z]+", op).group() for op in ex["question"].rstrip("=").split(",")[1:]]
  assert labels[:3] == ["a", "b", "c"] and labels[51:54] == ["Z", "aa", "ab"]
  assert len(set(labels)) == len(labels)
  for op in ex["question"].rstrip("=").split(",")[1:]:
    assert f";{op}=" in ex["solution"]
  assert tasks.get_task("arithmetic").check(ex["solution"], ex["answer"]) == 1.0
  # Process rewards read the two-letter lines too: every step of the worked solution is right.
  steps = checkers.arithmetic_steps(ex["question"], ex["solution"])
  assert len(steps) == len(labels) + 2  # the first number, each operation, the answer
  assert all(r == 1.0 for _, r in steps)
  with pytest.raises(ValueError, match="max_steps <= 2756"):
    tasks.generate_arithmetic(0, 1, max_steps=2757, style="labelled")


def test_effort_mix_opens_each_solution_with_its_effort():
  kw = dict(max_operand=9, max_value=99, style="labelled", median_steps=12, max_steps=60)
  plain = tasks.generate_arithmetic(0, 600, **kw)
  mixed = tasks.generate_arithmetic(0, 600, hasty_fraction=0.5, hasty_ops=4, **kw)
  # Same questions and answers: the effort draws have their own stream.
  assert [(e["question"], e["answer"]) for e in plain] == [
    (e["question"], e["answer"]) for e in mixed
  ]
  check = tasks.get_task("arithmetic").check
  hasty = 0
  for clean, ex in zip(plain, mixed):
    marker, body = ex["solution"][0], ex["solution"][1:]
    assert marker in (checkers.CAREFUL, checkers.HASTY)
    # Either effort states the right answer, and every line is right (process rewards).
    assert check(ex["solution"], ex["answer"]) == 1.0
    assert all(r == 1.0 for _, r in checkers.arithmetic_steps(ex["question"], ex["solution"]))
    ops = ex["question"].count(",")
    if marker == checkers.CAREFUL:
      assert body == clean["solution"]
    else:
      hasty += 1
      lines = body.split(checkers.MARKER)[0].rstrip(";").split(";")
      assert len(lines) == 1 + -(-ops // 4)  # the first number, then 4 operations a line
      assert "".join(line.split("=")[0] for line in lines[1:]) == "".join(
        op for op in ex["question"].rstrip("=").split(",")[1:]
      )
      assert len(ex["solution"]) < len(clean["solution"]) + 1 or ops < 4
  assert 0.43 < hasty / len(mixed) < 0.57
  with pytest.raises(ValueError, match="hasty_fraction"):
    tasks.generate_arithmetic(0, 1, hasty_fraction=0.5, style="chain")


def test_stride_solutions_count_steps_and_hasty_ones_overshoot():
  data = tasks.generate_stride(0, 800, median_steps=6, hasty_fraction=0.5)
  assert [(e["question"], e["answer"]) for e in data] == [
    (e["question"], e["answer"]) for e in tasks.generate_stride(0, 800, median_steps=6)
  ]
  check = tasks.get_task("stride").check
  hasty = wrong = 0
  for ex in data:
    s, rest = ex["question"].rstrip("=").split("+")
    k, n = (int(x) for x in rest.split(">"))
    m = int(ex["answer"])
    assert int(s) + m * k == n
    marker, body = ex["solution"][0], ex["solution"][1:]
    lines = body.split(checkers.MARKER)[0].rstrip(";").split(";")
    jump = 2 if marker == checkers.HASTY else 1
    # Each line: counter, the last value restated, the stride times the jump, the sum.
    value = int(s)
    for i, line in enumerate(lines, 1):
      assert line == f"{i * jump}:{value}+{jump * k}={value + jump * k}"
      value += jump * k
    assert value >= n and value - jump * k < n  # stops at the first value reaching the limit
    assert all(r == 1.0 for _, r in checkers.stride_steps(ex["question"], ex["solution"])[:-1])
    right = check(ex["solution"], ex["answer"])
    if marker == checkers.HASTY:
      hasty += 1
      wrong += right == 0.0
      assert right == float(m % 2 == 0)  # a jump of two overshoots an odd count
    else:
      assert marker == checkers.CAREFUL and right == 1.0 and len(lines) == m
  assert 0.42 < hasty / len(data) < 0.58 and 0.3 < wrong / hasty < 0.7
  with pytest.raises(ValueError, match="hasty_jump"):
    tasks.generate_stride(0, 1, hasty_jump=1)


def test_stride_on_a_clock_answers_the_last_value():
  data = tasks.generate_stride(0, 400, median_steps=6, hasty_fraction=0.5, clock=100)
  check = tasks.get_task("stride").check
  for ex in data:
    s, rest = ex["question"].rstrip("=").split("+")
    k, m = (int(x) for x in rest.split("x"))
    assert int(ex["answer"]) == (int(s) + k * m) % 100
    body = ex["solution"][1:].split(checkers.MARKER)[0].rstrip(";").split(";")
    assert all(int(line.split("=")[1]) < 100 for line in body)
    assert all(r == 1.0 for _, r in checkers.stride_steps(ex["question"], ex["solution"])[:-1])
    hasty = ex["solution"][0] == checkers.HASTY
    assert check(ex["solution"], ex["answer"]) == float(not hasty or m % 2 == 0)


def test_stride_counting_down_names_the_steps_left_and_keeps_the_questions():
  kw = dict(median_steps=6, hasty_fraction=0.5, clock=100)
  up = tasks.generate_stride(0, 300, **kw)
  down = tasks.generate_stride(0, 300, countdown=True, **kw)
  # Same questions, answers and efforts; only the counters differ.
  assert [(e["question"], e["answer"], e["solution"][0]) for e in up] == [
    (e["question"], e["answer"], e["solution"][0]) for e in down
  ]
  check = tasks.get_task("stride").check
  for ex in down:
    m = int(ex["question"].rstrip("=").split("x")[1])
    hasty = ex["solution"][0] == checkers.HASTY
    body = ex["solution"][1:].split(checkers.MARKER)[0].rstrip(";").split(";")
    assert [int(line.split(":")[0]) for line in body] == list(range(m, 0, -2 if hasty else -1))
    assert all(r == 1.0 for _, r in checkers.stride_steps(ex["question"], ex["solution"])[:-1])
    assert check(ex["solution"], ex["answer"]) == float(not hasty or m % 2 == 0)
  with pytest.raises(ValueError, match="countdown needs a clock"):
    tasks.generate_stride(0, 1, countdown=True)

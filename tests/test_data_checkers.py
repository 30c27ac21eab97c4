"""Tests for tlt_jax.data.checkers."""

import random
from fractions import Fraction

import pytest

from tlt_jax.data import checkers

# ------------------------------------------------------------------------------------------------
# Extraction.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ("completion", "expected"),
  [
    ("23+7=30;30+41=71;71-5=66;#66", "66"),
    ("#66  \n", "66"),
    ("#1;#2", "2"),
    ("a#b#(3+5)*2", "(3+5)*2"),
    ("23+7=30;#30;30+1=31", None),  # Went on after the answer.
    ("#66\n12", None),
    ("no marker", None),
    ("ends with marker #", None),
    ("", None),
  ],
)
def test_extract_marked_answer(completion, expected):
  assert checkers.extract_marked_answer(completion) == expected


@pytest.mark.parametrize(
  ("text", "expected"),
  [
    ("She sold 48/2 = 24 clips.\n#### 72", "72"),
    ("#### 1,234\nThanks!", "1,234"),
    ("first #### 1 then #### 2", "2"),
    ("####   -5.5 ", "-5.5"),
    ("no answer 72", None),
    ("#### ", None),
  ],
)
def test_extract_gsm8k_answer(text, expected):
  assert checkers.extract_gsm8k_answer(text) == expected


@pytest.mark.parametrize(
  ("text", "expected"),
  [
    (r"so $\boxed{42}$.", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"first \boxed{1}, finally \boxed{x^{2}+1}", "x^{2}+1"),
    (r"\fbox{7}", "7"),
    (r"$\boxed 5$", "5"),
    (r"\boxed{unbalanced", None),
    (r"\boxed{}", None),
    ("nothing here", None),
  ],
)
def test_extract_boxed_answer(text, expected):
  assert checkers.extract_boxed_answer(text) == expected


def test_extract_last_number():
  assert checkers.extract_last_number("3 apples and 1,200 pears.") == "1,200"
  assert checkers.extract_last_number("it is -4.5, or 7") == "7"
  assert checkers.extract_last_number("none") is None


# ------------------------------------------------------------------------------------------------
# Normalisation.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ("raw", "expected"),
  [
    (" 72 ", "72"),
    ("1,234", "1234"),
    ("42.0", "42"),
    ("42.50", "42.5"),
    ("$18", "18"),
    ("-0", "0"),
    ("3.", "3"),
    (r"\frac{1}{2}", "0.5"),
    (r"\dfrac{3}{4}", "0.75"),
    (r"\frac12", "0.5"),
    (r"\frac{1}{3}", "1/3"),
    ("2/6", "1/3"),
    (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2"),
    (r"\frac{a+b}{2}", "(a+b)/2"),
    (r"x = 5", "5"),
    (r"\text{(B)}", "(B)"),
    (r"90^\circ", "90"),
    (r"50\%", "50"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"\boxed{7}", "7"),
  ],
)
def test_normalize_answer(raw, expected):
  assert checkers.normalize_answer(raw) == expected


def test_parse_number():
  assert checkers.parse_number("1,234.5") == Fraction(2469, 2)
  assert checkers.parse_number("-3/4") == Fraction(-3, 4)
  assert checkers.parse_number("1/0") is None
  assert checkers.parse_number("12a") is None


# ------------------------------------------------------------------------------------------------
# Safe expressions.
# ------------------------------------------------------------------------------------------------


def test_evaluate_expression():
  assert checkers.evaluate_expression("2+3*4") == (14, [2, 3, 4])
  assert checkers.evaluate_expression("(2+3)*4") == (20, [2, 3, 4])
  assert checkers.evaluate_expression("8/3-1") == (Fraction(5, 3), [8, 3, 1])
  assert checkers.evaluate_expression("10-(4-1)") == (7, [10, 4, 1])
  for bad in ["1/0", "2+", "(1+2", "1+2)", "__import__('os')", "2**3", "-1", "", "1e5", "3 4"]:
    assert checkers.evaluate_expression(bad) is None, bad
  assert checkers.evaluate_expression("(" * 90 + "1" + ")" * 90) == (1, [1])
  assert checkers.evaluate_expression("9" * 20) is None


# ------------------------------------------------------------------------------------------------
# Rewards.
# ------------------------------------------------------------------------------------------------


def test_check_arithmetic():
  assert checkers.check_arithmetic("23+7=30;30-5=25;#25", "25") == 1.0
  assert checkers.check_arithmetic("#025", "25") == 1.0
  assert checkers.check_arithmetic("#26", "25") == 0.0
  assert checkers.check_arithmetic("#25;", "25") == 0.0
  assert checkers.check_arithmetic("#25.0x", "25") == 0.0


def test_check_countdown():
  answer = "9*(6+4)"  # Numbers 9, 6, 4; target 90.
  assert checkers.check_countdown("...;9*10=90!;#9*(6+4)", answer) == 1.0
  assert checkers.check_countdown("#(4+6)*9", answer) == 1.0
  assert checkers.check_countdown("#(4+6)*9=90", answer) == 1.0
  assert checkers.check_countdown("#(4+6)*9=91", answer) == 0.0
  assert checkers.check_countdown("#9*10", answer) == 0.0  # 10 is not a given number.
  assert checkers.check_countdown("#9*(6+4)+4-4", answer) == 0.0  # 4 used three times.
  assert checkers.check_countdown("#90", answer) == 0.0
  assert checkers.check_countdown("#9*(6+4)/0", answer) == 0.0
  # Any correct expression counts, intermediate fractions included: 2, 3, 6 -> 9.
  assert checkers.check_countdown("#3*6/2", "6/2*3") == 1.0
  assert checkers.check_countdown("#3/(2/6)", "6/2*3") == 1.0
  assert checkers.check_countdown("#3/2*6", "6/2*3") == 1.0
  assert checkers.check_countdown("#3*2+6/2", "6/2*3") == 0.0  # Value 9, but 2 used twice.
  assert checkers.check_countdown("#1", "not an expression") == 0.0


def test_check_gsm8k():
  solution = "Natalia sold 48/2 = 24 clips in May.\nAltogether 48+24 = 72.\n#### 72"
  assert checkers.check_gsm8k("... so the total is 72.\n#### 72", "72") == 1.0
  assert checkers.check_gsm8k("#### 72", solution) == 1.0
  assert checkers.check_gsm8k("#### 1,234.00", "1234") == 1.0
  assert checkers.check_gsm8k("#### $72", "72") == 1.0
  assert checkers.check_gsm8k("#### 71", solution) == 0.0
  assert checkers.check_gsm8k("the answer is 72", "72") == 0.0
  assert checkers.check_gsm8k("the answer is 72.", "72", strict=False) == 1.0
  assert checkers.check_gsm8k("the answer is 72 not 5", "72", strict=False) == 0.0


def test_check_math():
  assert checkers.check_math(r"Thus $\boxed{\frac{1}{2}}$.", "0.5") == 1.0
  assert checkers.check_math(r"\boxed{\dfrac12}", r"So it is $\boxed{\frac{1}{2}}$.") == 1.0
  assert checkers.check_math(r"\boxed{\frac{\sqrt{3}}{2}}", r"\sqrt{3}/2") == 1.0
  assert checkers.check_math(r"\boxed{x=5}", "5") == 1.0
  assert checkers.check_math(r"\boxed{10\%}", "10") == 1.0
  assert checkers.check_math(r"\boxed{(1,2)}", r"\left(1, 2\right)") == 1.0
  assert checkers.check_math(r"\boxed{3}", "4") == 0.0
  assert checkers.check_math("The answer is 4.", "4") == 0.0
  assert checkers.check_math(r"\boxed{", "4") == 0.0


def test_check_marked():
  assert checkers.check_marked("work;#1,000", "1000") == 1.0
  assert checkers.check_marked("work;#abc", "abc") == 1.0
  assert checkers.check_marked("work;#abd", "abc") == 0.0


_CHECKS = [
  checkers.check_arithmetic,
  checkers.check_countdown,
  checkers.check_gsm8k,
  checkers.check_marked,
  checkers.check_math,
]


def test_arithmetic_steps_judge_each_line_locally():
  q = "8,a-2,b+7,c+3="
  right = "8;a-2=6;b+7=13;c+3=16;#16"
  assert checkers.arithmetic_steps(q, right) == [(2, 1), (8, 1), (15, 1), (22, 1), (25, 1)]
  # A mis-copied operand (b+6): that line is wrong, the next one is right given 12, the
  # answer is wrong.
  slip = "8;a-2=6;b+6=12;c+3=15;#15"
  assert [r for _, r in checkers.arithmetic_steps(q, slip)] == [1, 1, 0, 1, 0]
  # The right number without every step, a wrong label, an unfinished trace.
  assert [r for _, r in checkers.arithmetic_steps(q, "8;a-2=6;#16")] == [1, 1, 0]
  assert [r for _, r in checkers.arithmetic_steps(q, "8;b-2=6;")] == [1, 0]
  assert checkers.arithmetic_steps(q, "8;a-2=") == [(2, 1.0), (6, 0.0)]
  # Unlabelled styles: "running" (value restated once) and "chain" (every line restates it).
  assert [r for _, r in checkers.arithmetic_steps("8-2+7=", "8;-2=6;+7=13;#13")] == [1] * 4
  assert [r for _, r in checkers.arithmetic_steps("8-2+7=", "8-2=6;6+7=13;#13")] == [1] * 3
  assert [r for _, r in checkers.arithmetic_steps("8-2+7=", "8-2=6;5+7=12;#12")] == [1, 0, 0]
  assert checkers.arithmetic_steps("what?", right) == []


def test_arithmetic_steps_never_raise_and_tile_the_completion():
  rng = random.Random(1)
  alphabet = "0123456789+-=;#abc"
  for _ in range(300):
    completion = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    steps = checkers.arithmetic_steps("8,a-2,b+7=", completion)
    ends = [e for e, _ in steps]
    assert ends == sorted(set(ends)) and all(r in (0.0, 1.0) for _, r in steps)
    assert (ends[-1] if ends else 0) == len(completion)
  assert checkers.arithmetic_steps(None, "#1") == []  # type: ignore[arg-type]


@pytest.mark.parametrize("check", _CHECKS)
def test_garbage_never_raises(check):
  rng = random.Random(0)
  alphabet = "0123456789+-*/=()#;{}\\$,. \nboxedfrac"
  pieces = ["#", "####", r"\boxed{", r"\frac{", "}", "(" * 50, ")" * 50, "9" * 30, "/0", "\x00"]
  answers = ["7", "3+4", r"\frac{1}{2}", "#### 7", "", "((", "1/0"]
  for _ in range(300):
    parts = [rng.choice(pieces) if rng.random() < 0.2 else rng.choice(alphabet) for _ in range(40)]
    completion = "".join(parts)
    for answer in answers:
      assert check(completion, answer) in (0.0, 1.0)
  for weird in [None, 12, b"#7", "#" + "(" * 2000 + "1"]:
    assert check(weird, "7") == 0.0  # type: ignore[arg-type]


def test_arithmetic_steps_judge_hasty_lines_of_several_operations():
  q = "8,a-2,b+7,c+3,d+1,e-4="
  hasty = "!8;a-2b+7c+3d+1=17;e-4=13;#13"
  assert [r for _, r in checkers.arithmetic_steps(q, hasty)] == [1, 1, 1, 1]
  # A wrong sum, a skipped operation and a wrong label each make that line wrong; the
  # next line is judged from the value written.
  assert [r for _, r in checkers.arithmetic_steps(q, "!8;a-2b+7c+3d+1=18;e-4=14;#14")] == [
    1,
    0,
    1,
    0,
  ]
  assert [r for _, r in checkers.arithmetic_steps(q, "!8;a-2c+3=9;d+1e-4=6;#6")][:2] == [1, 0]
  assert [r for _, r in checkers.arithmetic_steps(q, "~8;a-2b+7x+3d+1=17;e-4=13;#13")] == [
    1,
    0,
    1,
    1,
  ]


def test_stride_steps_judge_each_line_from_what_was_written():
  q = "23+7>44="
  assert [r for _, r in checkers.stride_steps(q, "~1:23+7=30;2:30+7=37;3:37+7=44;#3")] == [1] * 4
  # A wrong sum: that line is wrong, the next is judged from 38, the count is still right.
  assert [r for _, r in checkers.stride_steps(q, "1:23+7=30;2:30+7=38;3:38+7=45;#3")] == [
    1,
    0,
    1,
    1,
  ]
  # A hasty jump of two is a right line; its overshooting count is a wrong answer.
  assert [r for _, r in checkers.stride_steps(q, "!2:23+14=37;4:37+14=51;#4")] == [1, 1, 0]
  # A restated value that is not the last one, a counter going back, garbage.
  assert [r for _, r in checkers.stride_steps(q, "1:23+7=30;2:31+7=38;1:38+7=45;x;#9")] == [
    1,
    0,
    0,
    0,
    0,
  ]
  assert checkers.stride_steps("what?", "#3") == []
  # Counting down on a clock: the first counter is the question's count, each next one the
  # last minus its jump (the one written: after "1:" with a jump of one, nothing is left);
  # a counter that skips, or starts elsewhere, is a wrong line.
  q = "90+4x3="
  assert [r for _, r in checkers.stride_steps(q, "~3:90+4=94;2:94+4=98;1:98+4=2;#2")] == [1] * 4
  assert [r for _, r in checkers.stride_steps(q, "~3:90+4=94;1:94+4=98;1:98+4=2;#2")] == [
    1,
    0,
    0,
    1,
  ]
  assert [r for _, r in checkers.stride_steps(q, "!3:90+8=98;1:98+8=6;#6")] == [1, 1, 0]
  # Read as counting up (the first counter is not the count): a jump of 2 written as 4.
  assert [r for _, r in checkers.stride_steps(q, "~2:90+4=94;1:94+4=98;#98")] == [0, 0, 0]
  assert checkers.check_stride("~1:23+7=30;#3", "3") == 1.0
  assert checkers.check_stride("~1:23+7=30;#3;", "3") == 0.0

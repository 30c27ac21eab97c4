"""Verifiable rewards: 1.0 for a correct final answer, else 0.0.

Completions come from a policy being trained, so they can be any string. Every `check_*` function
returns 0.0 on anything it cannot parse and never raises; none of them calls `eval`.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = [
  "MARKER",
  "REFERENCE_FORMATS",
  "REFERENCE_READERS",
  "arithmetic_steps",
  "check_arithmetic",
  "check_countdown",
  "check_exact",
  "check_gsm8k",
  "check_marked",
  "check_math",
  "evaluate_expression",
  "extract_boxed_answer",
  "extract_gsm8k_answer",
  "extract_last_number",
  "extract_marked_answer",
  "gsm8k_reference",
  "math_reference",
  "normalize_answer",
  "parse_number",
]

# The synthetic tasks end every solution with MARKER followed by the bare answer, e.g. "...;#66".
MARKER = "#"
# Effort markers that open an arithmetic solution of the mixed demonstrator (tasks.py).
CAREFUL, HASTY = "~", "!"

# Bounds that keep a hostile completion from costing much: the longest answer worth parsing, and
# the largest integer literal an expression may hold (keeps Fraction arithmetic cheap).
_MAX_ANSWER_CHARS = 200
_MAX_LITERAL_DIGITS = 9


# ---------------------------------------------------------------------------------------------
# Extraction.
# ---------------------------------------------------------------------------------------------


def extract_marked_answer(completion: str, marker: str = MARKER) -> str | None:
  """Returns the answer written after the last `marker` if it ends the completion.

  The marked answer must be the last thing in the completion (trailing whitespace aside): a
  completion that goes on after it (another `;` step or another line) has no final answer.

  Args:
    completion: Generated text.
    marker: The string that introduces the final answer.

  Returns:
    The stripped answer, or None when there is none.
  """
  if not isinstance(completion, str) or not marker:
    return None
  pos = completion.rfind(marker)
  if pos < 0:
    return None
  answer = completion[pos + len(marker) :].strip()
  if not answer or ";" in answer or "\n" in answer or len(answer) > _MAX_ANSWER_CHARS:
    return None
  return answer


def extract_gsm8k_answer(text: str) -> str | None:
  """Returns the answer after the last `####` (GSM8K style), up to the end of its line."""
  if not isinstance(text, str):
    return None
  pos = text.rfind("####")
  if pos < 0:
    return None
  answer = text[pos + 4 :].strip().split("\n", 1)[0].strip()
  return answer or None


_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?|-?\.\d+")


def extract_last_number(text: str) -> str | None:
  """Returns the last number written in `text` (commas kept), or None."""
  if not isinstance(text, str):
    return None
  matches = _NUMBER_RE.findall(text)
  return matches[-1] if matches else None


def _braced(text: str, start: int) -> tuple[str, int] | None:
  """Returns the content of the `{...}` group opening at `text[start]`, and the index after it."""
  if start >= len(text) or text[start] != "{":
    return None
  depth = 0
  for i in range(start, len(text)):
    char = text[i]
    if char == "\\":
      continue
    if char == "{" and (i == 0 or text[i - 1] != "\\"):
      depth += 1
    elif char == "}" and (i == 0 or text[i - 1] != "\\"):
      depth -= 1
      if depth == 0:
        return text[start + 1 : i], i + 1
  return None


def extract_boxed_answer(text: str) -> str | None:
  """Returns the content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`.

  Nested braces are matched (`\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`); the brace-less form
  `\\boxed 5` gives `5`. Unbalanced braces give None.
  """
  if not isinstance(text, str):
    return None
  start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
  if start < 0:
    return None
  rest_at = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
  if text.startswith(" ", rest_at):
    # "\boxed 5$": the answer runs to the next space or dollar sign.
    match = re.match(r"\s*([^\s$]+)", text[rest_at:])
    return match.group(1) if match else None
  group = _braced(text, rest_at)
  if group is None:
    return None
  return group[0].strip() or None


# ---------------------------------------------------------------------------------------------
# Normalisation.
# ---------------------------------------------------------------------------------------------


def parse_number(text: str) -> Fraction | None:
  """Parses an integer, decimal, `a/b` fraction or percentage-free number into a Fraction.

  Thousands separators are allowed (`1,234.5`). Anything else gives None.
  """
  if not isinstance(text, str):
    return None
  s = text.strip().replace(" ", "")
  if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s):
    s = s.replace(",", "")
  if len(s) > 64:
    return None
  match = re.fullmatch(r"([-+]?(?:\d+\.?\d*|\.\d+))(?:/([-+]?(?:\d+\.?\d*|\.\d+)))?", s)
  if match is None:
    return None
  try:
    value = Fraction(match.group(1))
    if match.group(2) is not None:
      value /= Fraction(match.group(2))
  except (ValueError, ZeroDivisionError):
    return None
  return value


def _format_number(value: Fraction) -> str:
  """Integers as integers, finite decimals as decimals (no trailing zeros), the rest as a/b."""
  if value.denominator == 1:
    return str(value.numerator)
  den = value.denominator
  for prime in (2, 5):
    while den % prime == 0:
      den //= prime
  if den != 1:
    return f"{value.numerator}/{value.denominator}"
  sign = "-" if value < 0 else ""
  whole, rest = divmod(abs(value.numerator), value.denominator)
  digits = []
  while rest:
    rest *= 10
    digit, rest = divmod(rest, value.denominator)
    digits.append(str(digit))
  return f"{sign}{whole}.{''.join(digits)}"


def _replace_frac(s: str) -> str:
  """Rewrites `\\frac{a}{b}` (any nesting) and `\\frac12` as `a/b`, bracketing compound parts."""
  out = []
  i = 0
  while i < len(s):
    if not s.startswith("\\frac", i):
      out.append(s[i])
      i += 1
      continue
    j = i + len("\\frac")
    parts = []
    for _ in range(2):
      group = _braced(s, j)
      if group is not None:
        parts.append(_replace_frac(group[0]))
        j = group[1]
      elif j < len(s) and s[j].isalnum():
        # "\frac12": single-character arguments without braces.
        parts.append(s[j])
        j += 1
      else:
        break
    if len(parts) != 2:
      out.append(s[i:j])
      i = j
      continue
    # Bracket a part only if it holds an operator after its sign: \frac{a+b}{2} is (a+b)/2, but
    # \frac{\sqrt{3}}{2} stays \sqrt{3}/2 as it would be written inline.
    num, den = (f"({p})" if re.search(r"(?<=.)[-+*/]", p) else p for p in parts)
    out.append(f"{num}/{den}")
    i = j
  return "".join(out)


def normalize_answer(answer: str) -> str:
  """Normalises a final answer for string comparison.

  Strips whitespace, surrounding `$`, a `\\boxed{}` wrapper, `\\text{}` wrappers, LaTeX spacing,
  `\\left`/`\\right`, degrees and percent signs, a leading `x =`, a trailing period; rewrites
  `\\dfrac{a}{b}` as `a/b`; canonicalises numbers (`1,000.0` becomes `1000`, `0.50` becomes
  `0.5`, `\\frac{2}{4}` becomes `0.5`, `\\frac{1}{3}` becomes `1/3`).
  """
  if not isinstance(answer, str):
    return ""
  s = answer.strip()
  boxed = extract_boxed_answer(s) if "\\boxed" in s or "\\fbox" in s else None
  if boxed is not None:
    s = boxed
  s = s.strip().strip("$").strip()
  s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", s)
  s = re.sub(r"\\[,!;: ]|\\left|\\right|\\displaystyle", "", s)
  s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
  s = re.sub(r"\^\s*\{?\\circ\}?|\\circ|°", "", s)
  s = s.replace("\\%", "").replace("%", "").replace("\\$", "")
  s = _replace_frac(s)
  s = re.sub(r"\s+", "", s)
  s = re.sub(r"^[a-zA-Z]\w*=(?=.)", "", s)
  s = s.rstrip(".")
  number = parse_number(s)
  if number is not None:
    return _format_number(number)
  return s


def _answers_match(predicted: str | None, reference: str | None) -> bool:
  if predicted is None or reference is None:
    return False
  pred, ref = normalize_answer(predicted), normalize_answer(reference)
  if not pred or not ref:
    return False
  if pred == ref:
    return True
  pred_num, ref_num = parse_number(pred), parse_number(ref)
  return pred_num is not None and pred_num == ref_num


# ---------------------------------------------------------------------------------------------
# Safe arithmetic expressions (countdown).
# ---------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"\s*(?:(\d+)|(.))")


def _tokenize_expression(expr: str) -> list[str]:
  tokens = []
  for number, symbol in _TOKEN_RE.findall(expr):
    if number:
      if len(number) > _MAX_LITERAL_DIGITS:
        raise ValueError("literal too long")
      tokens.append(number)
    elif symbol.strip():
      if symbol not in "+-*/()":
        raise ValueError(f"unexpected {symbol!r}")
      tokens.append(symbol)
  return tokens


class _ExpressionParser:
  """Recursive-descent parser for `+ - * / ( )` over non-negative integer literals.

  Evaluates exactly with Fractions and records every literal it reads, so a caller can check
  which numbers an expression uses. Unary minus is not part of the grammar (countdown answers
  never need it).
  """

  def __init__(self, tokens: list[str]) -> None:
    self.tokens = tokens
    self.pos = 0
    self.literals: list[int] = []

  def peek(self) -> str | None:
    return self.tokens[self.pos] if self.pos < len(self.tokens) else None

  def take(self) -> str:
    token = self.peek()
    if token is None:
      raise ValueError("unexpected end of expression")
    self.pos += 1
    return token

  def expression(self) -> Fraction:
    value = self.term()
    while self.peek() in ("+", "-"):
      op = self.take()
      rhs = self.term()
      value = value + rhs if op == "+" else value - rhs
    return value

  def term(self) -> Fraction:
    value = self.factor()
    while self.peek() in ("*", "/"):
      op = self.take()
      rhs = self.factor()
      if op == "*":
        value *= rhs
      else:
        value /= rhs  # ZeroDivisionError is caught by the caller.
    return value

  def factor(self) -> Fraction:
    token = self.take()
    if token == "(":
      value = self.expression()
      if self.take() != ")":
        raise ValueError("missing ')'")
      return value
    if token.isdigit():
      self.literals.append(int(token))
      return Fraction(int(token))
    raise ValueError(f"unexpected {token!r}")


def evaluate_expression(expr: str) -> tuple[Fraction, list[int]] | None:
  """Evaluates an arithmetic expression exactly, without `eval`.

  Args:
    expr: Integer literals combined with `+ - * /` and parentheses.

  Returns:
    (value, literals in order of appearance), or None if the expression is malformed, too long,
    divides by zero or nests too deeply.
  """
  if not isinstance(expr, str) or len(expr) > _MAX_ANSWER_CHARS:
    return None
  try:
    parser = _ExpressionParser(_tokenize_expression(expr))
    value = parser.expression()
    if parser.peek() is not None:
      return None
  except (ValueError, ZeroDivisionError, RecursionError):
    return None
  return value, parser.literals


# ---------------------------------------------------------------------------------------------
# Rewards.
# ---------------------------------------------------------------------------------------------


def check_marked(completion: str, answer: str) -> float:
  """1.0 if the marked final answer of `completion` equals `answer` after normalisation."""
  return float(_answers_match(extract_marked_answer(completion), answer))


def check_exact(completion: str, answer: str) -> float:
  """1.0 if the whole completion (stripped, normalised) equals `answer`: for short-answer data
  whose prompt asks for the answer alone."""
  if not isinstance(completion, str) or not isinstance(answer, str):
    return 0.0
  return float(_answers_match(completion.strip()[: _MAX_ANSWER_CHARS + 1], answer))


def check_arithmetic(completion: str, answer: str) -> float:
  """Reward for the `arithmetic` task: the marked final answer must be the integer `answer`."""
  predicted = extract_marked_answer(completion)
  if predicted is None or not re.fullmatch(r"-?\d{1,12}", predicted):
    return 0.0
  reference = answer.strip() if isinstance(answer, str) else ""
  if not re.fullmatch(r"-?\d{1,12}", reference):
    return 0.0
  return float(int(predicted) == int(reference))


# Labels: one letter, or two from the 53rd operation of a labelled question.
_ARITH_QUESTION = re.compile(r"(\d{1,9})((?:,?[A-Za-z]{0,2}[+-]\d{1,9})*)=")
_ARITH_OP = re.compile(r",?([A-Za-z]{0,2})([+-])(\d{1,9})")
_ARITH_LINE = re.compile(r"([A-Za-z]{1,2}|\d{1,9})?([+-])(\d{1,9})=(\d{1,9});")
# A hasty line of the effort mix: several labelled operations, one result.
_ARITH_MULTI = re.compile(r"((?:[A-Za-z]{1,2}[+-]\d{1,9}){2,})=(\d{1,9});")
_ARITH_LABELLED_OP = re.compile(r"([A-Za-z]{1,2})([+-])(\d{1,9})")


def arithmetic_steps(question: str, completion: str) -> list[tuple[int, float]]:
  """Process rewards for the `arithmetic` task: one (end, reward) per step of `completion`.

  Steps are the `;`-terminated lines and the final `#answer`; `end` is the index in
  `completion` just past the step. A line is judged locally, given the value the completion
  itself wrote on its previous line: 1.0 when it is the next operation of the question (its
  label, sign and operand) with the right result, else 0.0, so a line after a mistake can
  still be right. A line of several labelled operations (a hasty solution: `a+8b-3=11;`) is
  right when they are the next operations and the result their sum. The first line may
  restate the question's first number (after an effort marker, `~` or `!`). The final
  answer step scores 1.0 when it is the question's true result (the outcome reward).
  Anything unparseable scores 0.0; never raises.

  Args:
    question: The task's question, e.g. "23,a+7,b+41=" (labelled) or "23+7+41=".
    completion: Generated text, e.g. "23;a+7=30;b+41=71;#71".

  Returns:
    [(end, reward)] in order; empty when the question cannot be parsed.
  """
  if not isinstance(question, str) or not isinstance(completion, str):
    return []
  q = _ARITH_QUESTION.fullmatch(question.strip())
  if q is None:
    return []
  first = int(q.group(1))
  ops = [(label, sign, int(v)) for label, sign, v in _ARITH_OP.findall(q.group(2))]
  truth = first
  for _, sign, v in ops:
    truth = truth + v if sign == "+" else truth - v
  steps: list[tuple[int, float]] = []
  value, next_op, start = first, 0, 0
  while start < len(completion):
    cut = completion.find(";", start)
    if cut < 0:  # the last piece: the final answer (or an unfinished line)
      answer = extract_marked_answer(completion[start:])
      good = answer is not None and re.fullmatch(r"-?\d{1,12}", answer) and int(answer) == truth
      steps.append((len(completion), float(bool(good) and next_op == len(ops))))
      break
    line, end = completion[start : cut + 1], cut + 1
    good = False
    if not steps and line.lstrip(CAREFUL + HASTY) == f"{first};":
      good = True
    elif (m := _ARITH_MULTI.fullmatch(line)) is not None and next_op < len(ops):
      # Several operations at once: each must be the next one of the question, and the
      # result their sum from the previous written value.
      written, good, expected = int(m.group(2)), True, value
      for label, sign, v in _ARITH_LABELLED_OP.findall(m.group(1)):
        if next_op >= len(ops) or (label, sign, int(v)) != ops[next_op]:
          good = False
        expected = expected + int(v) if sign == "+" else expected - int(v)
        next_op += 1
      good = good and written == expected
      value = written
    elif (m := _ARITH_LINE.fullmatch(line)) is not None and next_op < len(ops):
      label, sign, v = ops[next_op]
      prefix, written = m.group(1) or "", int(m.group(4))
      expected = value + v if sign == "+" else value - v
      # labelled lines name the operation; unlabelled ones restate the running value or not.
      prefix_ok = prefix == label if label else prefix in ("", str(value))
      good = prefix_ok and (m.group(2), int(m.group(3))) == (sign, v) and written == expected
      value, next_op = written, next_op + 1
    steps.append((end, float(good)))
    start = end
  return steps


_STRIDE_QUESTION = re.compile(r"(\d{1,9})\+(\d{1,9})([>x])(\d{1,12})=")
_STRIDE_LINE = re.compile(r"[~!]?(\d{1,9}):(\d{1,12})\+(\d{1,12})=(\d{1,12});")


def check_stride(completion: str, answer: str) -> float:
  """Reward for the `stride` task: the marked final answer must be the step count."""
  return check_arithmetic(completion, answer)


def stride_steps(question: str, completion: str) -> list[tuple[int, float]]:
  """Process rewards for the `stride` task: one (end, reward) per `;`-terminated line and the
  final `#answer`. A line `i:u+d=v;` is right when it moves the counter forward from the
  previous line's (or, counting down, names the steps left: the question's count first,
  then the last counter minus its jump), restates the previous value as u, adds the stride
  that many times as d and sums them right (modulo 100 for a clock question, `23+7x3=`),
  judged from what the
  completion itself wrote, so a line after a mistake can be right; the first line may carry
  an effort marker. The answer step scores 1.0 when it is the true answer (the step count;
  a clock's last value).
  Unparseable pieces score 0.0; never raises."""
  if not isinstance(question, str) or not isinstance(completion, str):
    return []
  q = _STRIDE_QUESTION.fullmatch(question.strip())
  if q is None:
    return []
  first, stride, form, limit = q.groups()
  first, stride, limit = int(first), int(stride), int(limit)
  # "x": `limit` steps on a clock of 100, answer the last value; ">": count to the limit.
  clock = 100 if form == "x" else 0
  truth = (first + stride * limit) % 100 if clock else -(-(limit - first) // stride)
  steps: list[tuple[int, float]] = []
  # Counters count up (the steps done after the line) or, on a clock, down (the steps left
  # before it: the first line names the question's count); `left` is None until known.
  count, value, start, left = 0, first, 0, None
  while start < len(completion):
    cut = completion.find(";", start)
    if cut < 0:
      answer = extract_marked_answer(completion[start:])
      good = answer is not None and re.fullmatch(r"\d{1,12}", answer) and int(answer) == truth
      steps.append((len(completion), float(bool(good))))
      break
    end = cut + 1
    m = _STRIDE_LINE.fullmatch(completion[start:end])
    good = False
    if m is not None and (not steps or completion[start].isdigit()):
      i, u, d, v = (int(x) for x in m.groups())
      jump = d // stride if d % stride == 0 else 0
      if not steps:
        left = limit if clock and i == limit and i != jump else None
      if left is not None:
        good = i == left and jump >= 1
        left = i - jump
      else:
        good = i > count and d == (i - count) * stride
      good = good and u == value and v == ((u + d) % clock if clock else u + d)
      count, value = i, v
    steps.append((end, float(good)))
    start = end
  return steps


def check_countdown(completion: str, answer: str) -> float:
  """Reward for the `countdown` task.

  Args:
    completion: Generated text ending in `#<expression>` (optionally `#<expression>=<target>`).
    answer: A reference expression, e.g. `(7-5)*12`: it fixes both the numbers (each to be used
      exactly once) and the target (its value).

  Returns:
    1.0 if the completion's expression uses exactly the reference's numbers and evaluates to the
    same value, else 0.0. Any correct expression counts, not only the reference one.
  """
  predicted = extract_marked_answer(completion)
  reference = evaluate_expression(answer) if isinstance(answer, str) else None
  if predicted is None or reference is None:
    return 0.0
  target, numbers = reference
  if predicted.count("=") == 1:
    predicted, stated = predicted.split("=")
    stated_value = parse_number(stated)
    if stated_value is None or stated_value != target:
      return 0.0
  result = evaluate_expression(predicted)
  if result is None:
    return 0.0
  value, used = result
  return float(value == target and sorted(used) == sorted(numbers))


def check_gsm8k(completion: str, answer: str, strict: bool = True) -> float:
  """Reward for GSM8K-style data.

  Args:
    completion: Generated text; its answer follows the last `####`.
    answer: The reference: a bare number or a full GSM8K solution ending in `#### <number>`.
    strict: If False, a completion without `####` is judged by its last number.

  Returns:
    1.0 if the numbers are equal (commas, `$` and trailing `.0` ignored), else 0.0.
  """
  predicted = extract_gsm8k_answer(completion)
  if predicted is None and not strict:
    predicted = extract_last_number(completion)
  if not isinstance(answer, str):
    return 0.0
  reference = extract_gsm8k_answer(answer) if "####" in answer else answer
  return float(_answers_match(predicted, reference))


def gsm8k_reference(answer: str) -> str | None:
  """The number `check_gsm8k` compares a completion with: the text after the reference's last
  `####` (a full GSM8K solution), or the whole reference (a bare number).

  GSM8K's answers are numbers. A reference without `####` whose text is not a number (a
  worked solution without its `#### 42` line, say) is compared whole with the completion's
  answer and is never matched in practice: None, so a run on such data is refused instead of
  training on rewards that are always 0.
  """
  if not isinstance(answer, str):
    return None
  text = extract_gsm8k_answer(answer) if "####" in answer else answer
  normalized = normalize_answer(text or "")
  return normalized if parse_number(normalized) is not None else None


def math_reference(answer: str) -> str | None:
  """The answer `check_math` compares a completion with (a `\\boxed{}` reference's content,
  or the whole reference), normalised; None where there is none (an unbalanced box, an
  empty answer)."""
  if not isinstance(answer, str):
    return None
  boxed = "\\boxed" in answer or "\\fbox" in answer
  text = extract_boxed_answer(answer) if boxed else answer
  if text is None:
    return None
  return normalize_answer(text) or None


# How the named checkers read a reference answer (None: one they cannot read, so no
# completion is ever rewarded on it); checkers not named here take any non-empty answer.
REFERENCE_READERS = {"gsm8k": gsm8k_reference, "math": math_reference}
# What a readable reference looks like, for the message that lists unreadable ones.
REFERENCE_FORMATS = {
  "gsm8k": " (a number, or a solution ending in '#### <number>')",
  "math": " (an answer, or a solution with a balanced \\boxed{...})",
}


def check_math(completion: str, answer: str) -> float:
  """Reward for MATH-style data: the last `\\boxed{}` of the completion against the reference.

  `answer` may be a bare answer or a full solution holding a `\\boxed{}`. Answers are compared
  after `normalize_answer`, and numerically when both are numbers (`\\frac{1}{2}` equals `0.5`).
  """
  if not isinstance(answer, str):
    return 0.0
  reference = (
    extract_boxed_answer(answer) if ("\\boxed" in answer or "\\fbox" in answer) else answer
  )
  return float(_answers_match(extract_boxed_answer(completion), reference))

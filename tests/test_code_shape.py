"""The codebase's shape rules, checked on its source (no imports, milliseconds):

- library functions read as named steps: none has more than `MAX_CODE_LINES` lines outside
  its docstring (a docstring is the function's reference, its arguments and returns, and
  does not count);
- modules meet at public seams: neither the library nor the experiments import another
  module's underscore names or read one through a module or another object (tests may
  reach into what they test).
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_CODE_LINES = 80


def _sources(*folders: str) -> list[pathlib.Path]:
  return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _code_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
  lines = fn.end_lineno - fn.lineno + 1
  first = fn.body[0]
  value = first.value if isinstance(first, ast.Expr) else None
  if isinstance(value, ast.Constant) and isinstance(value.value, str):
    lines -= first.end_lineno - first.lineno + 1
  return lines


def _long_functions(tree: ast.AST) -> list[tuple[str, int]]:
  return [
    (n.name, _code_lines(n))
    for n in ast.walk(tree)
    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and _code_lines(n) > MAX_CODE_LINES
  ]


def _foreign_private_names(tree: ast.AST) -> list[str]:
  """`from m import _x`, or `obj._x` where `_x` is neither defined in this file nor read
  through self / cls."""
  own = set()
  for n in ast.walk(tree):
    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
      own.add(n.name)
    elif _through_self(n):
      own.add(n.attr)
  found = []
  for n in ast.walk(tree):
    if isinstance(n, ast.ImportFrom):
      found += [
        f"line {n.lineno}: from {n.module} import {a.name}" for a in n.names if _private(a.name)
      ]
    elif isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in own:
      found += [] if _through_self(n) else [f"line {n.lineno}: {ast.unparse(n)}"]
  return found


def _through_self(n: ast.AST) -> bool:
  return (
    isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")
  )


def _private(name: str) -> bool:
  return name.startswith("_") and not name.startswith("__")


@pytest.mark.parametrize("path", _sources("tlt_jax"), ids=lambda p: str(p.relative_to(ROOT)))
def test_library_functions_are_short_outside_their_docstrings(path):
  long = _long_functions(ast.parse(path.read_text()))
  assert not long, f"split into named steps (over {MAX_CODE_LINES} lines of code): {long}"


@pytest.mark.parametrize(
  "path", _sources("tlt_jax", "experiments"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_modules_use_each_others_public_names_only(path):
  found = _foreign_private_names(ast.parse(path.read_text()))
  assert not found, found


def test_the_checks_can_fail():
  """Each rule catches a deliberate break."""
  body = "\n".join(f"  x{i} = {i}" for i in range(MAX_CODE_LINES))
  long = ast.parse(f'def f():\n  """Doc."""\n{body}\n')
  assert _long_functions(long) == [("f", MAX_CODE_LINES + 1)]
  docs = "\n".join("  more doc" for _ in range(MAX_CODE_LINES))
  documented = ast.parse(f'def f():\n  """Doc.\n{docs}\n  """\n  return 1\n')
  assert _long_functions(documented) == []
  reach = ast.parse("from tlt_jax.rollout import engine\nengine._weights(1)\n")
  assert _foreign_private_names(reach) == ["line 2: engine._weights"]
  imported = ast.parse("from tlt_jax.train import _load_data\n")
  assert _foreign_private_names(imported) == ["line 1: from tlt_jax.train import _load_data"]
  own = ast.parse("class A:\n  def _f(self):\n    return self._g\n\ndef g(a):\n  return a._f()\n")
  assert _foreign_private_names(own) == []

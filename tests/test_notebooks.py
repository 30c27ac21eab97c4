"""The notebooks: each `# %%` script runs, and its paired .ipynb (committed with its
outputs, so plots render on a repository page) holds the same cells."""

import os
import runpy

import jupytext
import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
SCRIPTS = sorted(n for n in os.listdir(NOTEBOOKS) if n.endswith(".py"))


def test_notebooks_are_found():
  assert len(SCRIPTS) >= 3


@pytest.mark.parametrize("name", SCRIPTS)
def test_notebook_executes(name):
  runpy.run_path(os.path.join(NOTEBOOKS, name), run_name="__main__")


def _cells(notebook) -> list[tuple[str, str]]:
  return [(c.cell_type, c.source.strip()) for c in notebook.cells]


@pytest.mark.parametrize("name", SCRIPTS)
def test_ipynb_matches_its_script_and_has_its_plots(name):
  """Regenerate after editing a script:
  `python experiments/build_notebooks.py notebooks/<name>.py`."""
  script = jupytext.read(os.path.join(NOTEBOOKS, name))
  path = os.path.join(NOTEBOOKS, name[: -len(".py")] + ".ipynb")
  assert os.path.exists(path), f"{path} is missing: run experiments/build_notebooks.py"
  notebook = nbformat.read(path, as_version=4)
  assert _cells(notebook) == _cells(script), f"{path} is out of date with {name}"
  outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs), f"{path} has no plot"

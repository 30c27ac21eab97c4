"""Executes the notebooks' `# %%` scripts and writes each paired .ipynb with its outputs.

  python experiments/build_notebooks.py                 # all of notebooks/*.py
  python experiments/build_notebooks.py notebooks/01_long_tail.py

(jupytext reads the scripts, nbclient runs them in an ipykernel; `jupytext --execute` would
need nbconvert too.) tests/test_notebooks.py checks that each .ipynb holds its script's
cells and a plot.
"""

from __future__ import annotations

import glob
import os
import sys

import jupytext
import nbclient
import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL = {"name": "python3", "language": "python", "display_name": "Python 3 (ipykernel)"}


def build(script: str) -> str:
  notebook = jupytext.read(script)
  notebook.metadata["kernelspec"] = KERNEL
  nbclient.NotebookClient(
    notebook, timeout=1800, kernel_name="python3", resources={"metadata": {"path": ROOT}}
  ).execute()
  out = script[: -len(".py")] + ".ipynb"
  nbformat.write(notebook, out)
  return out


if __name__ == "__main__":
  scripts = sys.argv[1:] or sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.py")))
  for script in scripts:
    print("wrote", build(script), flush=True)

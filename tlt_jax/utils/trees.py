"""Names for pytree leaves."""

from __future__ import annotations

from typing import Any


def path_name(path: tuple[Any, ...], sep: str = "/") -> str:
  """A leaf's key path as "layers/3/mlp/down_proj/kernel".

  Dict keys, sequence indices and attribute names are joined; an nnx Variable's trailing
  ".value" is dropped, so an nnx.State and its pure dict (or an orbax-restored one, whose
  integer keys are strings) give the same names.
  """
  parts = (str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
  return sep.join(p for p in parts if p != "value")

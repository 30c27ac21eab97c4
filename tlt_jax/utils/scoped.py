"""Trace-time settings held in context variables (`models.attention`'s forms and blocks,
`models.precision`'s head precision): set within a `with`, restored after."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator


@contextlib.contextmanager
def scoped(var: contextvars.ContextVar, value) -> Iterator[None]:
  """`var` set to `value` within, restored after."""
  token = var.set(value)
  try:
    yield
  finally:
    var.reset(token)

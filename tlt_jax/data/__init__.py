"""Data: tokenizers, synthetic reasoning tasks, answer checkers and tfds builders."""

from __future__ import annotations

import importlib
from typing import Any

from tlt_jax.data.checkers import (
  check_arithmetic,
  check_countdown,
  check_gsm8k,
  check_marked,
  check_math,
  extract_boxed_answer,
  extract_gsm8k_answer,
  extract_marked_answer,
  normalize_answer,
)
from tlt_jax.data.cursor import DataCursor
from tlt_jax.data.tasks import (
  TASKS,
  TaskSpec,
  format_prompt,
  format_target,
  generate_arithmetic,
  get_task,
  make_split,
)
from tlt_jax.data.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, get_tokenizer

# The builders import tensorflow_datasets (about a second); load them on first use so that code
# needing only tokenizers or rewards does not pay for it.
_LAZY_BUILDERS = (
  "LocalQA",
  "SyntheticReasoning",
  "load_local_split",
  "load_task_split",
  "read_qa_file",
)


def __getattr__(name: str) -> Any:
  if name in _LAZY_BUILDERS:
    return getattr(importlib.import_module("tlt_jax.data.builders"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
  "TASKS",
  "CharTokenizer",
  "DataCursor",
  "HFTokenizer",
  "LocalQA",
  "SyntheticReasoning",
  "TaskSpec",
  "Tokenizer",
  "check_arithmetic",
  "check_countdown",
  "check_gsm8k",
  "check_marked",
  "check_math",
  "extract_boxed_answer",
  "extract_gsm8k_answer",
  "extract_marked_answer",
  "format_prompt",
  "format_target",
  "generate_arithmetic",
  "get_task",
  "get_tokenizer",
  "load_local_split",
  "load_task_split",
  "make_split",
  "normalize_answer",
  "read_qa_file",
]

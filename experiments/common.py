"""What the experiment scripts share: the warm-started policy of a workdir; row comparison."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import train  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402


def load_policy(config, workdir: str) -> dict[str, Any]:
  """The job's tokenizer, data splits and warm-started policy (restored from
  <workdir>/warm_start, else trained there as the default job does)."""
  tok = get_tokenizer(config.task.tokenizer)
  train_split, test_split = train._load_data(config, workdir)
  model_cfg, graphdef, params, info = train.build_policy(config, workdir, tok, train_split)
  return {
    "tokenizer": tok,
    "train_split": train_split,
    "test_split": test_split,
    "model_config": model_cfg,
    "graphdef": graphdef,
    "params": params,
    "info": info,
  }


def rows_differing(a, b) -> np.ndarray:
  """Per row, whether two rollouts of the same prompts and keys differ in tokens or length
  (coupled sampling makes speculative and plain rows equal)."""
  return np.any(a.tokens != b.tokens, axis=1) | (a.length != b.length)

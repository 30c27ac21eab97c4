"""Warm-start checkpoints round-trip; wrong files fail clearly."""

import jax
import numpy as np
import pytest
from flax import nnx

from tlt_jax import checkpoint
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import init_model

CFG = ModelConfig(
  vocab_size=30, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


def test_round_trip_and_errors(tmp_path):
  _, params = nnx.split(init_model(CFG, seed=1))
  checkpoint.save_params(tmp_path / "ckpt", params)
  _, other = nnx.split(init_model(CFG, seed=2))
  restored = checkpoint.restore_params(tmp_path / "ckpt", other)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    checkpoint.restore_params(tmp_path / "missing", params)
  _, wider = nnx.split(init_model(ModelConfig(**{**CFG.to_dict(), "d_model": 24})))
  with pytest.raises(ValueError, match="does not match"):
    checkpoint.restore_params(tmp_path / "ckpt", wider)

"""Model configs the tests share (one config lets tests in a worker share compiled programs)."""

from tlt_jax.models.config import ModelConfig

# 2 layers of width 32 over a 40-token vocabulary, untied head (the speculative tests'
# functional drafter pair needs one).
TINY_UNTIED = ModelConfig(
  vocab_size=40,
  num_layers=2,
  d_model=32,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  mlp_dim=64,
  tie_embeddings=False,
)

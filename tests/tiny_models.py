"""Model and engine configs the tests share (one config lets tests in a worker share compiled
programs)."""

from tlt_jax.models.config import ModelConfig
from tlt_jax.rollout.config import EngineConfig

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

# One layer of width 32 over a 40-token vocabulary, tied head: the RL tests' policy.
TINY_ONE_LAYER = ModelConfig(
  vocab_size=40, num_layers=1, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64
)

# One batch, cache and prompt bucket and one chunk: a trainer test's fewest rollout programs.
ONE_PROGRAM_ENGINE = EngineConfig(
  max_prompt_len=8,
  max_new_tokens=12,
  max_batch=8,
  chunk_steps=12,
  min_batch_bucket=8,
  min_cache_bucket=32,
  min_prompt_bucket=8,
  compact=False,
  cache_buckets=False,
  capture_hidden=False,
  stop_tokens=(0,),
)

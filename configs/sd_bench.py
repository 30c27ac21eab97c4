"""The speculative-decoding benchmark policy: a ~50M-parameter warm start.

Same task and tokenizer as the default job, a model big enough that decode is
bound by weight reads (where speculative decoding pays) and deep-narrow so the
one-layer drafter is cheap next to it (~7% of its parameters). Used by
experiments/train_drafter.py and experiments/bench_sd.py.
"""

import ml_collections

from configs import default


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  c = default.get_config(arg)
  if not arg:
    c.model.num_layers = 16
    c.model.d_model = 512
    c.model.num_heads = 8
    c.model.num_kv_heads = 4
    c.model.head_dim = 64
    c.model.mlp_dim = 1536
    c.sft.steps = 120
    c.sft.batch_rows = 6
    c.sft.row_len = 320
    c.sft.learning_rate = 1.5e-3
    c.sft.warmup_steps = 12
    c.engine.max_batch = 64
    # Deep chains: on the 2-core CPU hosts a 17-token forward costs ~2 decode steps, and
    # coupled drafts are accepted ~0.95 per token at temperature 1 (experiments/RESULTS.md).
    c.engine.spec_strategies = ("chain2", "chain4", "chain8", "chain12")
  return c

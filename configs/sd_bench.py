"""The speculative-decoding benchmark policy: a ~50M-parameter warm start.

Same task and tokenizer as the default job, a model big enough that decode is
bound by weight reads (where speculative decoding pays) and deep-narrow so the
one-layer drafter is cheap next to it (~7% of its parameters). Used by
experiments/train_drafter.py and experiments/bench_sd.py.

Variants via the config argument:
  (none)     the default job's arithmetic task;
  countdown  the same policy on countdown puzzles solved by written-out search, whose G
             samples of a prompt share sub-expressions (the case for group drafts);
  tiny       the default job's tiny model (tests).
"""

import ml_collections

from configs import default


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg not in ("", "countdown", "tiny"):
    raise ValueError(f"configs/sd_bench.py: unknown variant {arg!r}; allowed: '', countdown, tiny")
  c = default.get_config("tiny" if arg == "tiny" else "")
  if arg == "tiny":
    return c
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
  if arg == "countdown":
    c.task.name = "countdown"
    # Traces capped so that a prompt (<= 18 characters) and its search fit one SFT row.
    c.task.params = ml_collections.ConfigDict(
      {"number_counts": (3, 3, 4), "max_number": 12, "max_target": 100, "max_trace_chars": 300}
    )
  return c

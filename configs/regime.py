"""GRPO in TLT's regime on a CPU host: decode bound by weight reads, and a long tail.

TLT pays where a decode step costs about the same for 1 row as for the whole rollout
batch (the weights, not the arithmetic, bound the step) and a few long responses keep
the device busy. Why each setting (figures in experiments/RESULTS.md):
- policy: the 50M model of configs/sd_bench.py (16 layers x 512): 200 MB of float32
  weights, ~6x the 32 MB L3 of this project's CPU hosts. Its decode step measured 15.6 ms
  at batch 1, 26.1 at 8 and 69.6 at 16 rows: b* = 8.7 rows (experiments/cost_surface.py).
- rollout: 2 prompts x 4 samples = 8 rows, at b*: the full batch and its tail cost about
  the same per step, so the tail's steps are nearly all waste.
- task: countdown with 3-4 numbers solved by a written-out depth-first search, whose
  length is the search's: median ~100 characters (one token each), p90 ~800, max ~1200
  (max / median >= 10), the shape of real reasoning traces (DAPO on 32B: median ~450-500,
  max 9-23x the median).
- all-parameter GRPO at a small rate, so the policy moves and a frozen drafter can go
  stale (mode sd) while the online one follows it (mode tlt).
The warm start (SFT on the search traces) and the drafter's warm start are built once
into the workdir and reused. Not yet a working regime (experiments/RESULTS.md, stop 25): a
short warm start solves nothing and runs its rows to the cap, since a search trace stops only
when it finds the target; it needs far more SFT or a task whose traces stop by format.
Compare the modes with
  python experiments/e2e_modes.py --config=configs/regime.py --out=runs/regime
"""

import ml_collections

from configs import sd_bench

# Search traces longer than this are redrawn; the rollout may run a little past it.
MAX_TRACE_CHARS = 1200


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg:
    raise ValueError(f"configs/regime.py takes no variant, got {arg!r}")
  c = sd_bench.get_config()
  c.task.name = "countdown"
  c.task.params = ml_collections.ConfigDict(
    {"number_counts": (3, 4, 4), "max_number": 12, "max_target": 100},
  )
  c.task.params.max_trace_chars = MAX_TRACE_CHARS
  c.task.train_size = 20_000
  c.task.test_size = 200

  # Packed rows of many short traces and a few long ones.
  c.sft.steps = 200
  c.sft.batch_rows = 4
  c.sft.row_len = 1280
  c.sft.learning_rate = 1e-3
  c.sft.warmup_steps = 20

  c.engine.max_prompt_len = 32
  c.engine.max_new_tokens = MAX_TRACE_CHARS + 64  # the trace and its "#answer" line
  c.engine.max_batch = 8
  c.engine.min_cache_bucket = 128
  c.engine.min_prompt_bucket = 32
  c.engine.spec_threshold = 8  # the whole rollout is at or below b*

  c.drafter.warmup_prompts = 128
  c.drafter.offline_steps = 300

  c.rollout.num_prompts = 2
  c.rollout.num_samples = 4
  c.eval.num_examples = 32

  c.rl.steps = 20
  c.rl.prompts_per_step = 2
  c.rl.group_size = 4
  c.rl.max_refills = 1
  c.rl.eval_every = 10
  c.rl.eval_examples = 32
  c.rl.eval_samples = 0
  c.rl.checkpoint_every = 5
  # Programs compile lazily, when a rollout first needs them: their seconds are taken out of
  # the step times (e2e_modes.py) and of the bandit's rewards, and most of the (batch bucket x
  # cache bucket x arm) programs an eager warm-up would compile are never run.
  c.rl.warmup_engine = False
  c.rl_update.trainable = ""  # every parameter
  c.rl_update.learning_rate = 3e-6
  c.rl_update.warmup_steps = 2
  c.rl_update.micro_batch = 4
  c.reference = ml_collections.ConfigDict()  # nothing measured to compare with yet
  return c

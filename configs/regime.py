"""GRPO in TLT's regime on a CPU host: decode bound by weight reads, and a long tail.

TLT pays where a decode step costs about the same for 1 row as for the whole rollout
batch (the weights, not the arithmetic, bound the step) and a few long responses keep
the device busy. Why each setting (figures in experiments/RESULTS.md):
- policy: the 50M model of configs/sd_bench.py (16 layers x 512): 200 MB of float32
  weights, several times the last-level cache of most of this project's CPU hosts (32 MB;
  one kind has 260 MB, so measure: experiments/cost_surface.py gives b* per host).
- rollout: 2 prompts x 4 samples = 8 rows, near the b* measured on the hosts so far (4-9
  rows): the full batch and its tail cost about the same per step, so the tail's steps
  are nearly all waste.
- task: addition/subtraction whose number of operations is log-normal (median 15, up to
  140), each operation labelled in the question (a, b, ..., Z, aa, ab, ...) and in the
  worked solution, one line per operation, so its length is set by the question: median
  ~104 characters (one token each), p90 ~420, max ~1,070 (max / median 10.3), the shape of
  real reasoning traces (DAPO on 32B: median ~450-500, max 9-23x the median). A trace ends
  when its question's operations run out, right or wrong. Labels make finding the next
  operation a lookup (the default task's recipe); unlabelled chains (stop 26) need the
  model to count its place, which a 60-step warm start did not learn.
- all-parameter GRPO at a small rate, so the policy moves and a frozen drafter can go
  stale (mode sd) while the online one follows it (mode tlt). The warm start solves few
  problems outright (0-3% held out), so every scratchpad line is also rewarded (process credit, each
  line checked against the question): groups whose answers all fail still have a gradient.
The warm start (SFT on the worked solutions) and the drafter's warm start are built once
into the workdir and reused. SFT can start from the sd_bench policy, which already does the
default task's labelled lookups (`--config.sft.init_from=runs/sd_policy/warm_start`, built by
experiments/train_drafter.py). Measured (experiments/RESULTS.md, stop 27): 60 steps from
that policy give rows that stop by format (held-out mean length 257 of the 1,184 cap) but
solve 3% of problems; more SFT would give RL more signal. Compare the modes with
  python experiments/e2e_modes.py --config=configs/regime.py --out=runs/regime
"""

import ml_collections

from configs import sd_bench

# Operations per question: log-normal around the median, capped (solutions ~8 characters each).
MEDIAN_STEPS, MAX_STEPS = 15, 140


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg:
    raise ValueError(f"configs/regime.py takes no variant, got {arg!r}")
  c = sd_bench.get_config()
  c.task.name = "arithmetic"
  c.task.params = ml_collections.ConfigDict(
    {
      "style": "labelled",
      "median_steps": MEDIAN_STEPS,
      "steps_sigma": 1.1,
      "max_steps": MAX_STEPS,
      "max_operand": 9,
      "max_value": 99,
    }
  )
  c.task.train_size = 20_000
  c.task.test_size = 200

  # Packed rows of many short solutions and a few long ones (the longest question and
  # solution, ~1,720 tokens, fit a row).
  c.sft.steps = 60
  c.sft.batch_rows = 3
  c.sft.row_len = 1792
  c.sft.learning_rate = 1.5e-3
  c.sft.warmup_steps = 6

  c.engine.max_prompt_len = 704  # the longest question (~650 characters) and BOS
  c.engine.max_new_tokens = 8 * MAX_STEPS + 64  # the longest solution and its "#answer"
  c.engine.max_batch = 8
  c.engine.min_cache_bucket = 128
  c.engine.min_prompt_bucket = 64
  c.engine.spec_threshold = 8  # the whole rollout is at or below b*
  # A 20-step run passes each (batch bucket, answer phase) cell a few dozen chunks: the
  # bandit must settle quickly. Replayed on stop 39's run (experiments/simulate.py
  # --validate, rewards with a 10-30% spread as measured), a narrower UCB bonus and the
  # neighbouring buckets' prior cut its rollouts by 4-7% (exploration 2, no prior: 9-16%
  # slower than a converged bandit; 1 and 2: 4-8%).
  c.engine.bandit_exploration = 1.0
  c.engine.bandit_prior = 2.0

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
  c.rl.process_credit = "step"
  c.rl_update.trainable = ""  # every parameter
  c.rl_update.learning_rate = 1e-5
  c.rl_update.warmup_steps = 2
  # One packed row per micro-batch: an update row holds up to ~2k tokens, whose attention
  # activations for the backward pass (rows x heads x width^2 per layer) at 4 rows a
  # micro-batch took a 24 GB host out of memory in mode tlt; 1 row also pads the least.
  c.rl_update.micro_batch = 1
  c.reference = ml_collections.ConfigDict()  # nothing measured to compare with yet
  return c

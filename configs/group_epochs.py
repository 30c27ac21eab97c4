"""Group drafts over RL epochs: a training set small enough that prompts come back.

Multi-epoch DAPO-style runs revisit each prompt; its earlier rollouts then sit in the
engine's per-prompt history (`engine.group_history`), and group drafts read them. This
config measures what that buys: the countdown policy of configs/sd_bench.py (50M
parameters; its search traces share sub-expressions across samples) trained on 8
problems, 2 per RL step with G = 8, so each problem returns every 4 steps. The engine
runs speculative decoding on the whole rollout (16 rows, near this project's CPU hosts'
b*) and the bandit picks among plain, the EAGLE chains, group and hybrid drafts.
`experiments/e2e_modes.py` records per RL step the arm mix and each arm's accept length.
Warm starts: the countdown policy and drafter of experiments/train_drafter.py, copied
into <out>/shared/warm_start and <out>/shared/drafter_warm_start (without them e2e_modes
trains both first: 120 SFT steps and the config's drafter warm start).

  python experiments/train_drafter.py --config=configs/sd_bench.py:countdown \
    --workdir=runs/sd_countdown --steps=900 --logit_weight=1.0 --out_name=drafter_kd900
  python experiments/e2e_modes.py --config=configs/group_epochs.py --out=runs/group_epochs \
    --modes=baseline,tlt
"""

import ml_collections

from configs import sd_bench


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg:
    raise ValueError(f"configs/group_epochs.py takes no variant, got {arg!r}")
  c = sd_bench.get_config("countdown")
  c.task.train_size = 8
  c.task.test_size = 32

  c.engine.max_prompt_len = 32
  c.engine.max_new_tokens = 320  # the longest trace (300 characters) and its answer
  c.engine.max_batch = 16
  c.engine.min_cache_bucket = 128
  c.engine.spec_threshold = 16  # the whole rollout
  c.engine.spec_strategies = ("chain4", "chain8", "group8", "hybrid8")

  c.rl.steps = 16
  c.rl.prompts_per_step = 2
  c.rl.group_size = 8
  c.rl.dynamic_sampling = False  # every group in the update: the same prompts each epoch
  c.rl.eval_every = 0
  c.rl.eval_examples = 16
  c.rl.eval_samples = 0
  c.rl.checkpoint_every = 4
  c.rl.warmup_engine = False  # programs compile when first needed (out of the step times)
  c.rl_update.trainable = ""  # every parameter, at a small rate: the policy moves a little
  c.rl_update.learning_rate = 1e-5
  c.rl_update.warmup_steps = 2
  c.rl_update.micro_batch = 4
  c.eval.num_examples = 16
  c.reference = ml_collections.ConfigDict()
  return c

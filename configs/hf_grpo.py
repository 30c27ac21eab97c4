"""GRPO on a Hugging Face checkpoint and a local question/answer file (GSM8K, MATH, ...).

  python -m tlt_jax.main --config=configs/hf_grpo.py --workdir=runs/qwen_gsm8k \
    --config.model.checkpoint=/models/Qwen2.5-0.5B-Instruct \
    --config.task.path=data/gsm8k_train.jsonl --config.task.test_path=data/gsm8k_test.jsonl

The tokenizer is the checkpoint's own (its tokenizer.json and chat template) unless
--config.task.tokenizer names another directory. Defaults are those of reasoning-RL runs on
real models, not the toy task's: every parameter trained at a small learning rate, prompts
rendered with the chat template, GSM8K's checker ("#### answer"; --config.task.checker=math
for \\boxed{}), DAPO's clip-higher and token-mean loss, no KL term (--config.rl_loss.kl_coef
and kl_type add one). Modes as in the default job: --config.mode=tlt adds the online drafter.
"""

import ml_collections

from configs import default


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg:
    raise ValueError(f"configs/hf_grpo.py takes no variant, got {arg!r}")
  c = default.get_config()
  c.reference = ml_collections.ConfigDict()  # the toy task's measured ranges do not apply
  c.model.checkpoint = ""  # required: a local HF directory (config.json + safetensors)
  # bfloat16 forward and rollout over float32 master weights: updates at lr 1e-6 survive.
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.task.tokenizer = ""  # "": the checkpoint's own
  c.task.name = "local"
  c.task.checker = "gsm8k"
  c.task.prompt_format = "chat"
  c.task.system_prompt = ""
  c.task.test_fraction = 0.05

  c.engine.max_prompt_len = 512
  c.engine.max_new_tokens = 1024
  c.engine.max_batch = 128
  c.engine.min_cache_bucket = 256
  c.engine.min_prompt_bucket = 64
  c.engine.chunk_steps = 32

  c.rollout.num_prompts = 8
  c.rollout.num_samples = 8
  c.eval.num_examples = 200

  c.rl.steps = 200
  c.rl.prompts_per_step = 32
  c.rl.group_size = 8
  c.rl.eval_every = 20
  c.rl.eval_examples = 200
  c.rl.eval_samples = 0
  c.rl.checkpoint_every = 20
  c.rl.reward_timeout_s = 10.0
  c.rl_loss.kl_coef = 0.0
  c.rl_loss.vocab_chunk = 8192  # no [tokens, 150k] float32 logits in the loss
  c.rl_loss.entropy_metric = False  # a pass over [tokens, 150k vocabulary]: only if asked
  c.rl_update.trainable = ""  # every parameter
  c.rl_update.learning_rate = 1e-6
  c.rl_update.warmup_steps = 10
  c.rl_update.weight_decay = 0.0
  c.rl_update.micro_batch = 4
  c.rl_update.remat = True  # long reasoning rows: keep one layer's activations at a time
  # The layers as one scan: the same update, with less memory and compiling (Qwen2.5-1.5B's
  # compiled on a CPU: 36.0 GiB where unrolled needs 45.5, in 13 s where it takes 35;
  # experiments/RESULTS.md, 2026-12-05).
  c.rl_update.scan_layers = True
  # Mode tlt: the drafter's update at a real model's width, whose whole-batch logits over a
  # 150k vocabulary and long rows' attention scores do not fit beside the policy
  # (experiments/RESULTS.md, 2026-12-06).
  c.drafter.logit_chunk = 1024  # no [positions, 150k] float32 logits either
  c.drafter.remat_attention = True
  return c

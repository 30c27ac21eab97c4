"""Default job: warm-start a small policy on a built-in task, then a long-tail rollout.

Run (from the repository root):
  python -m tlt_jax.main --config=configs/default.py --workdir=runs/default
Variants via the config argument:
  --config=configs/default.py:tiny    a seconds-long CPU variant used by the tests
Override any field: --config.rollout.num_samples=4 --config.sampling.temperature=0.7
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  variant = arg or "default"
  if variant not in ("default", "tiny"):
    raise ValueError(f"unknown config variant {variant!r}; expected '' (default) or 'tiny'")
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Compiled programs kept on disk for the next run on this host to load instead of compiling
  # (tlt_jax.utils.compile_cache; a folder per host inside): "" off, or a folder, e.g.
  # ~/.cache/tlt_jax. experiments/learning_curve.py keeps them in <out>/compile_cache.
  c.compile_cache_dir = ""
  # baseline: no speculative decoding; sd: a drafter trained once on the warm
  # start's rollouts, then frozen; tlt: the same drafter, trained on in RL's idle slices.
  c.mode = "baseline"

  c.task = ml_collections.ConfigDict()
  c.task.name = "arithmetic"
  c.task.seed = 0
  c.task.train_size = 20_000
  c.task.test_size = 500
  c.task.data_dir = ""  # "" -> <workdir>/tfds
  c.task.tokenizer = "char"  # or a local Hugging Face model directory
  # name "local": question/answer rows from a .jsonl or .parquet file (GSM8K, MATH, ...);
  # without test_path, test_fraction of the questions (by hash) are held out.
  c.task.path = ""
  c.task.test_path = ""
  c.task.test_fraction = 0.1
  c.task.question_key = "question"
  c.task.answer_key = "answer"
  c.task.solution_key = "solution"
  # "" (the task's own; GSM8K's for local files), gsm8k, math, exact, marked, arithmetic,
  # countdown, or "package.module:function" (completion, answer) -> reward.
  c.task.checker = ""
  # "plain": the question is the prompt; "chat": the tokenizer's chat template renders it
  # as a user turn (after system_prompt, if any) with the assistant's turn opened.
  c.task.prompt_format = "plain"
  c.task.system_prompt = ""
  # Single-digit operands and labelled steps keep the task learnable by a
  # ~1M-parameter model in minutes on a CPU; the step count (and so the
  # response length) stays long-tailed: median ~26 characters, max ~280.
  c.task.params = ml_collections.ConfigDict(
    {"max_operand": 9, "max_value": 99, "max_steps": 40, "style": "labelled", "slip_rate": 0.0}
  )

  c.model = ml_collections.ConfigDict()
  c.model.vocab_size = 100  # the char tokenizer's
  c.model.num_layers = 4
  c.model.d_model = 128
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.head_dim = 32
  c.model.mlp_dim = 384
  c.model.rope_theta = 10_000.0
  c.model.qkv_bias = False
  c.model.tie_embeddings = True
  c.model.dtype = "float32"  # compute; bfloat16 on accelerators
  c.model.param_dtype = "float32"  # stored (master) weights and optimizer state
  c.model.init_seed = 0
  c.model.checkpoint = ""  # a local HF directory to start from instead of SFT

  c.sft = ml_collections.ConfigDict()
  # The lookup of the next labelled operation is learnt suddenly. At 480 steps the warm
  # start could stop short of that jump; at 720 every seed measured is past it
  # (experiments/RESULTS.md, "default job by seed").
  c.sft.steps = 720
  c.sft.batch_rows = 16
  c.sft.row_len = 448
  c.sft.learning_rate = 5e-3
  c.sft.warmup_steps = 20
  c.sft.weight_decay = 0.01
  c.sft.grad_clip = 1.0
  # XLA:CPU's library fusions in the SFT step (tlt_jax/utils/cpu_fusions.py), as the update's.
  c.sft.cpu_fusions = "dots"
  # A fraction of warm-start targets that state the answer without the scratchpad
  # (a habit for RL to unlearn). Measured at 0.5 with 300 steps: the scratchpad was
  # learned too poorly (5-7% right) for RL to prefer it, so it is off by default.
  c.sft.direct_answer_fraction = 0.0
  # A fraction of warm-start targets that stop after the scratchpad without the final
  # "#answer" line (a format habit for RL to unlearn; the checker scores such a trace 0).
  c.sft.unanswered_fraction = 0.0
  # A warm_start/ directory (same model shapes) that SFT starts from instead of random
  # weights ("": from scratch).
  c.sft.init_from = ""

  c.engine = ml_collections.ConfigDict()
  c.engine.max_prompt_len = 192
  c.engine.max_new_tokens = 320
  c.engine.max_batch = 128
  c.engine.chunk_steps = 16
  c.engine.min_batch_bucket = 1
  c.engine.min_cache_bucket = 64
  c.engine.min_prompt_bucket = 32
  c.engine.compact = True
  c.engine.cache_buckets = True
  c.engine.capture_hidden = True
  # Speculative decoding for batch buckets <= spec_threshold (0: off; it needs a
  # trained drafter, see experiments/train_drafter.py). Strategy names: "chain<depth>",
  # "tree<depth>x<topk>x<nodes>" (the EAGLE drafter), "group<depth>" (drafts read off the
  # prompt's sibling rows and earlier rollouts, no model), "hybrid<depth>" (per row the
  # group draft where its match is long, the drafter's otherwise); the adaptive bandit also
  # considers plain decode.
  c.engine.spec_threshold = 32  # used by modes sd and tlt only
  c.engine.spec_strategies = ("chain3", "chain6", "tree6x4x16")
  c.engine.spec_adaptive = True
  c.engine.spec_rounds = 8
  # Group drafts: longest suffix compared, occurrences followed, the hybrid's switch (match
  # length, leading tokens shared with the drafter's draft), sibling rows read, reference
  # tokens per row, rollouts kept per prompt.
  c.engine.group_ngram = 8
  c.engine.group_candidates = 16
  c.engine.group_min_match = 3
  c.engine.group_agree = 1
  c.engine.group_siblings = 8
  c.engine.group_reference_len = 2048
  c.engine.group_history = 4
  # The UCB bonus's weight, in units of a bucket's best mean reward (lower: fewer chunks on
  # close seconds, a slower response to a change).
  c.engine.bandit_exploration = 0.2
  # A one-row bucket's plain step: "single", "paired" (a two-token forward) or "auto"
  # (paired on a GPU, single elsewhere; `rollout.config.EngineConfig`).
  c.engine.one_row_step = "auto"
  # A chunk whose arm is not compiled yet runs a compiled arm while that one compiles on a
  # host thread; with compile_ahead the program the rollout likely needs next compiles there
  # too (opt-in: on 2 cores it starved the bandit; `rollout.config.EngineConfig`).
  c.engine.background_compiles = True
  c.engine.compile_ahead = False
  # Float32 products of the rollout at "highest": on GPUs the default (TF32) rounds a decode
  # step and a verification apart, and speculative rows stop being plain's token for token.
  c.engine.matmul_precision = "highest"

  # The EAGLE drafter (modes sd and tlt): warm start on the warm-start policy's rollouts,
  # then (tlt) online updates from each RL step's rollouts.
  c.drafter = ml_collections.ConfigDict()
  c.drafter.init_seed = 0
  c.drafter.warmup_prompts = 256  # training prompts rolled out (G = 1) for the warm start
  c.drafter.offline_steps = 300
  c.drafter.learning_rate = 2e-3
  # The online phase's peak rate (mode tlt; 0: learning_rate). It restarts from the warm
  # start's parameters with a new optimizer state and its own warm-up.
  c.drafter.online_learning_rate = 0.0
  c.drafter.warmup_steps = 20
  c.drafter.weight_decay = 0.01
  c.drafter.grad_clip = 1.0
  c.drafter.batch_rows = 4
  c.drafter.row_len = 0  # 0: the engine's cache slots
  c.drafter.buffer_rows = 512
  c.drafter.buffer_bytes = 2**31  # host memory: the rows' tokens, then packed features
  c.drafter.buffer_dtype = "bfloat16"  # the buffered target features
  c.drafter.keep_steps = 2
  # > 0: the update's logit term over this many of a batch's positions at a time (a 150k
  # vocabulary's float32 logits of a whole batch are tens of GiB); 0: all at once.
  c.drafter.logit_chunk = 0
  # Recompute the update's attention scores a query block at a time in its backward pass
  # (rows of thousands of positions), rather than keep them all.
  c.drafter.remat_attention = False
  # Online updates wait for this many rows in the buffer (1: from the first row in).
  c.drafter.min_rows = 1
  # XLA:CPU's library fusions in the drafter's update (tlt_jax/utils/cpu_fusions.py).
  c.drafter.cpu_fusions = "dots"
  c.scheduler = ml_collections.ConfigDict()
  c.scheduler.rollout_budget = 0.05
  c.scheduler.long_tail_batch = 8
  c.scheduler.max_window_updates = 200
  # Drafter updates every RL step gets at least (0: only the idle slices'): what the slices
  # leave short runs blocking between engine calls or at the step's end (time/drafter).
  c.scheduler.min_step_updates = 1

  # Devices for the rollout and policy-training meshes (1: one device; 0: all). On a
  # mesh, rollout rows and update rows are split over the devices, and in mode tlt the
  # devices a compacted long tail frees train the drafter.
  c.parallel = ml_collections.ConfigDict()
  c.parallel.devices = 1
  # Policy update on a ("data", "tensor") mesh of those devices: fsdp splits parameters
  # and optimizer state over "data"; tensor > 1 also splits heads and MLP width.
  c.parallel.fsdp = False
  c.parallel.tensor = 1
  # Rollout weights split over tensor groups of this many devices (1: whole on each device).
  c.parallel.rollout_tensor = 1

  c.sampling = ml_collections.ConfigDict()
  c.sampling.temperature = 1.0
  c.sampling.top_k = 0
  c.sampling.top_p = 1.0

  c.rollout = ml_collections.ConfigDict()
  c.rollout.num_prompts = 16
  c.rollout.num_samples = 8

  c.eval = ml_collections.ConfigDict()
  c.eval.num_examples = 100

  # GRPO/DAPO after the warm start (steps = 0: warm start + rollout report only).
  c.rl = ml_collections.ConfigDict()
  c.rl.steps = 8
  c.rl.prompts_per_step = 16
  c.rl.group_size = 8
  c.rl.normalize_std = True
  # The group std's ddof: 0 population std (GRPO's usual), 1 with Bessel's correction.
  c.rl.std_ddof = 0
  # Scale of negative advantages: 1 is GRPO; 0 learns from better-than-average samples only.
  c.rl.negative_weight = 1.0
  c.rl.dynamic_sampling = True
  c.rl.max_refills = 1
  c.rl.overlong_buffer = 0
  # Process supervision (arithmetic: each scratchpad line checked against the question):
  # "" off, "step" (a token gets its own line's normalised reward) or "return" (the sum
  # over its line and the later ones, DeepSeekMath); added to the outcome advantage.
  c.rl.process_credit = ""
  c.rl.process_coef = 1.0
  c.rl.eval_every = 4
  c.rl.eval_examples = 100
  # Sampled pass@1 too: the mean accuracy of k samples per held-out problem at the
  # rollout temperature (fixed key), the figure RL at that temperature optimises.
  c.rl.eval_samples = 4
  c.rl.checkpoint_every = 4
  c.rl.reward_workers = 2
  c.rl.reward_timeout_s = 5.0
  # Rows per engine call (a multiple of group_size, <= engine.max_batch): a step's P x G rows
  # as several sequential calls of whole groups, the same tokens; 0: one call.
  c.rl.rows_per_call = 0
  c.rl.profile_steps = ()  # steps traced by JAX's profiler (GRPOConfig.profile_steps)
  # Host-to-device copies into the loop's programs must be explicit (GRPOConfig.transfer_guard).
  c.rl.transfer_guard = "disallow"
  # Compile every rollout program before step 0 (experiments comparing step times).
  c.rl.warmup_engine = False
  c.rl.format_reward = 0.0  # bonus in [0, 0.5) for a response with a final "#answer"
  # Weighted reward functions instead of the task's checker: "name=weight,...", names "task"
  # (the checker), "format" / "format:gsm8k" / "format:math" (an answer in that format at
  # all), a checker name or "package.module:function"; "": the checker (+ format_reward).
  c.rl.rewards = ""
  # Modes sd and tlt: every this many steps (0: never), the accept length (tokens per
  # speculative round per row, at the rollout temperature, one fixed key) of the online
  # and the warm-start drafter on the same first drafter_eval_prompts held-out prompts
  # (in engine calls of max_batch; at most rl.eval_examples), every chunk drafted by
  # drafter_eval_strategy ("": the engine's deepest chain); drafter_eval/* metrics, in
  # time/eval.
  c.rl.drafter_eval_every = 0
  c.rl.drafter_eval_prompts = 8
  c.rl.drafter_eval_strategy = ""
  c.rl_loss = ml_collections.ConfigDict()
  c.rl_loss.clip_low = 0.2
  c.rl_loss.clip_high = 0.28  # DAPO clip-higher
  c.rl_loss.aggregation = "token-mean"
  c.rl_loss.kl_coef = 0.0
  c.rl_loss.kl_type = "k3"  # or "k1", "k2" (0.5 (log r)^2, veRL's "mse")
  c.rl_loss.entropy_coef = 0.0
  c.rl_loss.vocab_chunk = 0  # > 0: log-probs over vocabulary chunks (large vocabularies)
  c.rl_loss.entropy_metric = True  # entropy in the metrics even at coef 0 (a vocab-wide pass)
  # "ppo" (clipped surrogate) or "cispo" (REINFORCE, clipped ratio as a constant weight).
  c.rl_loss.kind = "ppo"
  # "token" ratios, or "sequence" (GSPO: each sample's exp(mean log ratio), clipped per sample).
  c.rl_loss.ratio_level = "token"
  c.rl_loss.clip_ratio_c = 0.0  # dual clip (> 1; veRL uses 3): negative advantages' loss <= c|A|
  c.rl_loss.log_ratio_clamp = 0.0  # > 0: log ratios clamped to +-this before exp
  # Truncated IS weights min(exp(trainer - rollout log-prob), cap) (>= 1; 0: off).
  c.rl_loss.tis_cap = 0.0
  c.rl_update = ml_collections.ConfigDict()
  # At this scale the policy gradient of one batch (16 prompts x 8) is almost all noise:
  # full-parameter gradients of independent batches have cosine ~0.01, and all-parameter
  # GRPO either moves too little (lr 1e-5) or wrecks the warm start (>= 1e-4). Its one
  # reliable direction is sharpening: the gradient favours a lower temperature in every
  # batch, and the final norm's scale carries it (tied embeddings). So RL updates the final
  # norm only, at a large lr: sampled pass@1 rises within 8 steps while greedy stays.
  # All parameters: --config.rl_update.trainable='' --config.rl_update.learning_rate=1e-5.
  # (experiments/gradient_signal.py measures it; figures in experiments/RESULTS.md.)
  c.rl_update.learning_rate = 0.2
  c.rl_update.warmup_steps = 2
  # RL steps the warmup-cosine schedule spans (0: rl.steps). The schedule's horizon sets
  # every step's rate after the warmup, so a shorter run repeats a longer one's first steps
  # exactly only with the longer one's horizon: --config.rl.steps=5
  # --config.rl_update.schedule_steps=40 replays the first 5 steps of a 40-step run.
  c.rl_update.schedule_steps = 0
  c.rl_update.weight_decay = 0.0
  c.rl_update.grad_clip = 1.0
  c.rl_update.micro_batch = 8  # packed rows (rl/packing.py)
  c.rl_update.pow2_rows = True  # packed rows padded to micro_batch x 2^k: few programs
  c.rl_update.mini_batches = 1  # PPO mini-batches: optimizer steps per rollout batch
  c.rl_update.epochs = 1
  # A regex over parameter paths to update ("": all), e.g. "layers/3|final_norm".
  c.rl_update.trainable = "final_norm"
  # Recompute each layer's activations in the backward pass (long rows on accelerators).
  c.rl_update.remat = False
  # The layers as one scan in the update: one layer's body in its program, not num_layers
  # (less to trace and compile for deep policies; experiments/bench_update.py compares).
  c.rl_update.scan_layers = False
  # Per-group learning rates, "regex=multiplier,..." over the trained parameters' paths
  # (first match wins, others x1), e.g. "final_norm=30,embed=3"; "": one learning rate.
  c.rl_update.lr_multipliers = ""
  # Packed update rows of this many columns when the longest sample fits (0: the longest
  # rounded up to 128): fewer update programs to compile on an accelerator.
  c.rl_update.pack_width = 0
  # XLA:CPU's library fusions in the update program (tlt_jax/utils/cpu_fusions.py): "dots"
  # (YNNPACK for its dots only) or "xla" (XLA's default); ignored off a CPU.
  c.rl_update.cpu_fusions = "dots"

  # Metrics also to Weights & Biases and / or MLflow ("wandb", "mlflow", "wandb,mlflow"; each
  # needs its package: pip install 'tlt_jax[wandb]'), as project / run_name ("": the workdir's).
  c.metrics = ml_collections.ConfigDict()
  c.metrics.loggers = ""
  c.metrics.project = "tlt_jax"
  c.metrics.run_name = ""

  # The trained policy as a Hugging Face directory at the end of the run (dir relative to the
  # workdir; "": none); python -m tlt_jax.export does it for any workdir later.
  c.export = ml_collections.ConfigDict()
  c.export.dir = ""
  c.export.dtype = "float32"  # bfloat16 / float16 round away small updates (a warning says so)

  # What this job printed on this project's 2-core CPU hosts, as ranges over seeds 0-2
  # (--config.seed=S --config.model.init_seed=S): the summary prints them beside the run's
  # own figures. Held-out pass@1 on 100 problems, greedy / sampled (4 samples at temperature
  # 1). The warm start decides most of the spread: the task is still being learnt at 720
  # SFT steps (final loss 0.01-0.10 by seed). README: "What the default job does and shows".
  c.reference = ml_collections.ConfigDict(
    {
      "runs": "seeds 0-2, one host, 2026-11-24",
      "warm_start": "greedy 0.58-0.93, sampled 0.45-0.87",
      "after_rl": "greedy 0.55-0.94, sampled 0.48-0.90",
      "rl_gain_sampled": "+0.027 to +0.035",
    }
  )

  if variant == "tiny":
    c.task.train_size = 400
    c.task.test_size = 16
    c.task.params.max_steps = 8
    c.model.num_layers = 1
    c.model.d_model = 32
    c.model.head_dim = 8
    c.model.mlp_dim = 64
    c.sft.steps = 3
    c.sft.batch_rows = 2
    c.sft.row_len = 128
    c.sft.warmup_steps = 1
    c.engine.max_prompt_len = 48
    c.engine.max_new_tokens = 64
    c.engine.max_batch = 8
    # Few buckets: every (batch, cache, prompt) bucket is one more program to trace and
    # compile, which dominates a tiny job's seconds (23 programs -> 12 for the default job).
    c.engine.min_batch_bucket = 4
    c.engine.min_cache_bucket = 64
    c.engine.min_prompt_bucket = 48
    c.rollout.num_prompts = 2
    c.rollout.num_samples = 4
    c.eval.num_examples = 4
    c.rl.steps = 2
    c.rl.prompts_per_step = 2
    c.rl.group_size = 4
    c.rl.eval_every = 0
    c.rl.eval_examples = 4
    c.rl.eval_samples = 0  # greedy only: fewer programs to compile in the tests' CLI runs
    c.rl.checkpoint_every = 1
    c.rl_update.warmup_steps = 0
    c.rl_update.micro_batch = 4
    c.engine.spec_threshold = 4
    c.engine.spec_strategies = ("chain2", "tree2x2x4")
    c.engine.spec_rounds = 2
    # Its rollouts reach the speculative bucket for a chunk or two, fewer than a background
    # compile lasts: compiled in place, a drafting arm runs in the rehearsal.
    c.engine.background_compiles = False
    c.drafter.warmup_prompts = 4
    c.drafter.offline_steps = 3
    c.drafter.batch_rows = 2
    c.drafter.buffer_rows = 32
    c.scheduler.long_tail_batch = 4
    c.reference = ml_collections.ConfigDict()  # nothing measured to compare with
  return c

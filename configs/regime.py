"""GRPO in TLT's regime on a CPU host, on a task where RL visibly learns.

TLT pays where a decode step costs about the same for 1 row as for a device's whole share
of the rollout (the weights, not the arithmetic, bound the step) and a few long responses
keep the devices busy. Why each setting (figures in experiments/RESULTS.md):
- policy: 16 layers x 256 (13M parameters): 48 MB of float32 weights, above the 32 MB
  last-level cache of most of this project's CPU hosts, so a decode step is bound by reading
  them (experiments/cost_surface.py: b* = 4.2 rows on host G, 2026-11-27). Where the cache
  holds them (host I, 300 MiB) the step is bound by the 16 small layers' work and is as flat
  (b* 10.1-12.4 rows, 2026-12-02): measure b*, not the cache.
- rollout: 8 rows per engine call (what one device decodes at once, near the hosts'
  measured b*: 4.2 rows on host G, 10.8 on host H, 10-12 on host I), 16 calls of 8 rows
  per RL step (16 prompts x 8 samples): what 16 devices would decode side by side, run one
  after another here (`rl.rows_per_call`). Every mode pays the same sum of calls, so the ratios stay
  honest, and the optimiser sees 128 samples a step, as in the small variant's gates. Twice
  that (32 prompts) narrowed the reward rise's interval, not its size (RESULTS.md, 2026-12-04).
- task (`stride` on a clock of 100, counters counting down): from a start, add a stride a
  given number of times modulo 100 (`23+7x12=`); the worked solution writes one line a step
  (`12:23+7=30;11:30+7=37;...;1:...;#..`), each line's counter the steps still to go, so
  every line follows from the one before it and when to stop is local too: long but local,
  what a small model does reliably, where lookups into the question it does not (with
  counters counting up, stopping meant comparing with the count far back in the question,
  and half the careful answers stopped a line or two off). The number of steps is
  log-normal (median 12, spread 1.5, up to 250), so responses are long-tailed: a careful
  demonstrator's longest answer to a step's 16 problems is ~12x their median, a run's ~23x
  (at spread 1.3 and up to 125 steps, the curves until 2026-12-04: ~8x and ~11x; the
  policy's answers to problems of more than 99 steps were cut to its two-digit counts).
  The warm start's demonstrator mixes two efforts (`hasty_fraction`): careful solutions
  open with "~" and write a line per step (median 134 tokens), hasty ones with "!" and
  jump two steps a line, so they are shorter and overshoot every odd count. The outcome
  reward teaches the policy to choose care at its first token: accuracy and response
  length grow together, as in reasoning RL, and so does the tail TLT attacks. (The learning
  recipe of the "small" variant's gates, RESULTS.md 2026-11-27/28, on this policy.)
- all parameters trained, the token embedding (which, tied, is the output head: the effort's
  logit) and the final norm (a sharpness) faster than the rest (`lr_multipliers`): with Adam
  every parameter moves by about its learning rate a step whatever the batch, and the body's
  skills do not survive the rate that moves a decision in 40 steps. The base rate is the one
  a 12-layer policy learnt at in 10 steps on an H200 (2026-11-28). At the embedding's 10x
  care's share of openings goes 0.3 -> ~0.8 by step 9 and > 0.9 by step ~15 (six seeds);
  at 5x more slowly, with the same reward rise (RESULTS.md, 2026-12-03, seed 5's gate).
  At 30x (the first curve, 2026-11-29) care was chosen within 9 steps, but the digits'
  embedding rows (the same table: inputs too) drifted 7-14% in 40 steps, and forced careful
  answers, sampled, fell from 0.38 to 0.27 on 64 training problems: RL unlearnt the skill it
  chose.
The curve's warm start is built in eleven SFT stages (experiments/regime_warm_start.sh,
about three hours on host H and one and a half on host J; RESULTS.md 2026-11-28/29 and
2026-12-04): 1,710 steps with an 80%-hasty
demonstrator and counters counting up, whose careful answers, sampled, passed less often
than hasty ones (0.13 vs 0.30: GRPO rightly dropped care and the reward stayed flat over
20 steps); 220 with half hasty, which did not fix that (0.16 vs 0.30: careful answers
stopped a line or two off); 520 with counters counting down and 70% hasty (careful 0.41,
hasty 0.24, care's share 0.32: the first curve's warm start, whose reward barely rose);
then 500 on short problems (median 4 steps, then 2), because careful answers failed in
their first line, which copies the count and stride from the question (teacher-forced,
7% of its tokens wrong, the count often read 2 off), where later lines erred < 0.2% a
token (experiments/line_errors.py). A ninth (2026-12-04, host J: 100 steps at 3e-4 on 90%
hasty demonstrations) lowers care's share of openings from 0.31 to 0.08, so RL makes the
effort choice inside the curve: the rise doubled on the two seeds that missed the bar on
stage 8 (RESULTS.md, 2026-12-04). A tenth (350 steps on rows of
2,048 tokens, problems of up to 250 steps) taught the later lines of long answers but not
their first, which copies a three-digit count (98% wrong); an eleventh
(experiments/sft_openings.py: 150 steps mixing the openings of long demonstrations, their
first 2-16 lines with no end taught, ~15 three-digit first lines a step, into whole ones)
did (35% wrong, later lines < 0.5% a token to line 160), and the longest answer of a step
went from 7.7x its median to ~18x (RESULTS.md, 2026-12-04); the committed warm start is
this one.
The SFT fields below are the first stage's steps and rate, in the countdown format
(`learning_curve.py` builds that when the workdir has no warm start; a from-scratch
countdown warm start is not measured); the drafter's warm start is built from the
policy in the workdir.
TLT's figure (experiments/learning_curve.py: baseline, sd and tlt interleaved, reward
against wall-clock):
  bash experiments/regime_warm_start.sh runs/regime_warm_start
  mkdir -p runs/curve/shared && cp -r runs/regime_warm_start/8/warm_start runs/curve/shared/
  python experiments/learning_curve.py --config=configs/regime.py --out=runs/curve
"""

import ml_collections

from configs import sd_bench

# Steps per question: log-normal around the median, capped (a line ~11 characters).
MEDIAN_STEPS, MAX_STEPS = 12, 250


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Variants: "" (the CPU regime above), "small" (the learning recipe on the 0.8M policy),
  "gpu" (this curve at a GPU's rows, from this warm start carried to the device, for one
  ~9-minute sitting: experiments/gpu_curve.sh), "tiny" (a seconds-long rehearsal of that
  script on a CPU: the same program count and compile seconds on tiny shapes)."""
  if arg not in ("", "gpu", "tiny", "small"):
    raise ValueError(f"configs/regime.py: unknown variant {arg!r}; allowed: '', gpu, small, tiny")
  c = sd_bench.get_config()
  c.model.d_model = 256
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.head_dim = 64
  c.model.mlp_dim = 768
  c.task.name = "stride"
  c.task.params = ml_collections.ConfigDict(
    {
      "median_steps": MEDIAN_STEPS,
      "steps_sigma": 1.5,
      "max_steps": MAX_STEPS,
      "max_start": 99,
      "max_stride": 9,
      "hasty_fraction": 0.8,
      "hasty_jump": 2,
      "clock": 100,
      "countdown": True,
    }
  )
  c.task.train_size = 20_000
  c.task.test_size = 400

  # Packed rows of many short solutions and a few long ones; the ~5% of examples longer
  # than a row are left out of these first stages' SFT (the tenth stage's rows of 2,048
  # tokens hold all but ~1%; the eleventh shows the openings of problems of 100-250 steps).
  c.sft.steps = 700
  c.sft.batch_rows = 4
  c.sft.row_len = 1024
  c.sft.learning_rate = 3e-3
  c.sft.warmup_steps = 20
  # Key windows (see rl_update.key_windows below) speed SFT's packed rows too
  # (experiments/bench_attention.py; RESULTS.md, 2026-11-29, seed 1's entry).
  c.sft.key_windows = (256, 512)

  c.engine.max_prompt_len = 16  # the longest question (10 characters) and BOS
  c.engine.max_new_tokens = 12 * MAX_STEPS + 16  # the longest solution (~2,860), "#answer"
  c.engine.max_batch = 8
  c.engine.min_cache_bucket = 128
  c.engine.min_prompt_bucket = 16
  c.engine.spec_threshold = 8  # the whole call is at or below b*
  # A 40-step run passes each batch bucket's bandit a few dozen chunks: it must settle
  # quickly (a narrower UCB bonus).
  c.engine.bandit_exploration = 0.1

  c.drafter.warmup_prompts = 128
  c.drafter.offline_steps = 300
  # Online (mode tlt), from the warm start's parameters: at the fit's 2e-3 the first ~10
  # updates cost accept length; at 1e-3, sampling the buffer's last 8 steps (its 512 rows
  # hold 4 of this curve's), no dip and ~0.25 more tokens a round after 50 updates, with the
  # policy held fixed (experiments/drafter_online_start.py; RESULTS.md, 2026-12-03). Inside
  # RL the dip stayed until updates waited for a step's rows (min_rows, set below): a step's
  # first engine calls hold one or two prompts' samples, and the updates the rollout's long
  # tail ran on those alone still cost ~0.6 tokens a round after 10 steps (RESULTS.md,
  # 2026-12-03, "min_rows"). The five seeds of 2026-11-29..12-02 ran at 2e-3 and 2 steps,
  # from 1 row.
  c.drafter.online_learning_rate = 1e-3
  c.drafter.keep_steps = 8

  c.rollout.num_prompts = 2
  c.rollout.num_samples = 4
  c.eval.num_examples = 128

  c.rl.steps = 40
  c.rl.prompts_per_step = 16
  c.rl.group_size = 8
  c.rl.rows_per_call = 8
  c.rl.max_refills = 0
  c.rl.eval_every = 10
  c.rl.eval_examples = 128
  c.rl.eval_samples = 4
  c.rl.checkpoint_every = 10
  c.rl.drafter_eval_every = 10
  # Six engine calls of 8: one call's prompts gave the online drafter's gain within a token
  # a round either way (RESULTS.md, 2026-12-03, "min_rows").
  c.rl.drafter_eval_prompts = 48
  # Programs compile lazily, when a rollout first needs them: their seconds are taken out of
  # the step times and of the bandit's rewards, and most of the (batch bucket x cache
  # bucket x arm) programs an eager warm-up would compile are never run.
  c.rl.warmup_engine = False
  c.rl.process_credit = ""
  c.rl_update.trainable = ""  # every parameter
  c.rl_update.learning_rate = 6e-5
  c.rl_update.lr_multipliers = "embed=10,final_norm=30"
  c.rl_update.warmup_steps = 2
  # One packed row per micro-batch: an update row holds up to ~2k tokens, whose attention
  # activations for the backward pass (rows x heads x width^2 per layer) at 4 rows a
  # micro-batch took a 24 GB host out of memory in mode tlt; 1 row also pads the least.
  c.rl_update.micro_batch = 1
  # One update program: rows as wide as the cache (every sample fits) and at least 16 of
  # them (a step's kept groups fill 2-14; padding rows skip their forward and backward).
  # With the width of the longest sample, the CPU gate compiled one program per packed
  # shape it met, a dozen in 20 steps (RESULTS.md, 2026-11-28).
  c.rl_update.pack_width = c.engine.max_prompt_len + c.engine.max_new_tokens
  c.rl_update.min_rows = 16
  # A query block of a packed row reads only the keys its samples hold (a third to a half
  # of the key columns at the curve's rows): a faster update for a longer compile, little
  # end to end (experiments/bench_key_windows.py; RESULTS.md, 2026-11-29, seed 1's entry).
  c.rl_update.key_windows = (256, 512, 1024)
  c.reference = ml_collections.ConfigDict()  # nothing measured to compare with yet
  if arg == "gpu":
    _gpu(c)
  elif arg == "small":
    _small(c)
  elif arg == "tiny":
    _gpu(c)
    _tiny(c)
  # Online drafter updates wait for one RL step's rows (see online_learning_rate above).
  c.drafter.min_rows = min(c.rl.prompts_per_step * c.rl.group_size, c.drafter.buffer_rows)
  return c


def _gpu(c: ml_collections.ConfigDict) -> None:
  """The CPU curve itself at a GPU's rows, for one ~9-minute device sitting
  (experiments/gpu_curve.sh): the same 13M policy, task, warm start and RL (16 prompts x 8
  samples, the rates above, 40 steps), with the step's 128 rows in one engine call instead
  of 16 calls of 8 (one device decodes them all at once).

  The warm start is the CPU's, carried over (experiments/pack_warm_start.py: its weights
  travel as bfloat16 and are restored to float32): its eleven SFT stages took about four and
  a half hours on hosts H and J, and a sitting has fifteen minutes. The model, task, SFT and
  drafter settings therefore stay the CPU recipe's (`configuration.check_same_recipe`
  refuses another). The variant it replaces built a 12-layer x 128 policy (2.4M) in the
  sitting: it learnt in 10 steps, but its decode step was kernel launches and a chain-8
  round cost about as many of them as it accepted tokens, so speculation barely paid
  (RESULTS.md, 2026-11-28, second H200 sitting). Here the countdown format's drafter accepts
  9-11 tokens of a chain-12 round on the CPU (RESULTS.md, 2026-11-29), each round's verify
  pass is 16 layers, and the curve is the one the CPU seeds drew: the GPU adds only its
  speed. Programs are capped for the sitting's compiles: five batch buckets (8-128 rows),
  four cache views (three until answers grew to 3,016 tokens, 2026-12-04), speculation
  from 64 rows down with three chains (chain2 pays only where a round costs about a step,
  not on a GPU's launches), one update program (`min_rows` 16 rows as wide as the cache, 8
  a micro-batch); all compiled side by side before the first step; float32 products at
  "highest" (gpu_curve.sh) so the modes' curves coincide."""
  c.rl.rows_per_call = 0
  c.engine.max_batch = c.rl.prompts_per_step * c.rl.group_size
  c.engine.min_batch_bucket = 8
  c.engine.min_cache_bucket = 512
  c.engine.spec_threshold = 64
  c.engine.spec_strategies = ("chain4", "chain8", "chain12")
  # Each device call costs a host round trip, many decode steps' worth on a GPU (RESULTS.md,
  # the H200 sittings): longer plain chunks in every mode.
  c.engine.chunk_steps = 32
  c.rl_update.micro_batch = 8
  # Key windows choose their keys by `lax.switch` on the device: measured on a CPU only.
  c.rl_update.key_windows = ()
  # Every rollout program compiled before the first step, on 8 threads of the GPU's host
  # (compare.warm_up): lazily, one at a time, the first sitting's programs took minutes.
  c.rl.warmup_engine = True


def _small(c: ml_collections.ConfigDict) -> None:
  """The same task and RL on the default job's 0.8M policy (4 layers x 128), which a CPU
  warm-starts in minutes: a gate for the learning alone. Its weights sit in cache, so it is
  outside TLT's regime (a decode step costs in proportion to its rows) and its step times
  say nothing about TLT. The recipe the learning gates found (experiments/RESULTS.md,
  2026-11-27): a demonstrator 80% hasty (hasty solutions jump two steps a line: right only
  for even counts); outcome rewards only (process credit slowed the effort choice); 16
  prompts x 8 samples a step in two engine calls of 64 rows; 60 steps, evaluated every 15.
  (Three-step jumps, which make hasty answers wronger, also made the careful ones too
  unreliable when sampled for RL to choose them: RESULTS.md, 2026-11-28.)"""
  c.model.num_layers = 4
  c.model.d_model = 128
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.head_dim = 32
  c.model.mlp_dim = 384
  c.sft.steps = 720
  c.sft.batch_rows = 16
  c.sft.row_len = 448
  c.sft.learning_rate = 5e-3
  c.sft.warmup_steps = 20
  c.engine.max_batch = 64
  c.engine.spec_threshold = 16
  c.rl.group_size = 8
  c.rl_update.learning_rate = 3e-5
  c.rl_update.lr_multipliers = "embed=30,final_norm=30"  # as in its gates and the H200 runs
  c.rl_update.micro_batch = 8
  c.rl_update.pack_width = 0  # the width of the longest sample, as in its gates
  c.rl_update.min_rows = 0
  c.task.params.steps_sigma = 0.9  # its curves' tails (RESULTS.md, 2026-11-27/28)
  c.task.params.max_steps = 125  # as in its gates (the CPU curve's until 2026-12-04)
  c.engine.max_new_tokens = 12 * 125 + 16
  c.task.params.countdown = False  # counters that count up, as in its gates
  c.rl.prompts_per_step = 16
  c.rl.rows_per_call = 64
  c.rl.steps = 60
  c.rl.eval_every = 15


def _tiny(c: ml_collections.ConfigDict) -> None:
  """The GPU variant's script on tiny shapes: what a CPU can rehearse in about a minute."""
  c.model.num_layers = 2
  c.model.d_model = 64
  c.model.num_heads = 2
  c.model.num_kv_heads = 1
  c.model.head_dim = 32
  c.model.mlp_dim = 128
  c.task.params.median_steps = 3
  c.task.params.max_steps = 12
  c.task.train_size = 400
  c.task.test_size = 16
  c.engine.max_new_tokens = 14 * 12
  c.engine.max_batch = 16
  c.engine.min_batch_bucket = 4
  c.engine.min_cache_bucket = 128
  c.engine.spec_threshold = 8
  c.sft.steps = 4
  c.sft.batch_rows = 2
  c.sft.row_len = 256
  c.sft.warmup_steps = 1
  c.drafter.warmup_prompts = 4
  c.drafter.offline_steps = 3
  c.drafter.batch_rows = 2
  c.drafter.buffer_rows = 64
  c.eval.num_examples = 4
  c.rl.steps = 4
  # Four SFT steps solve nothing: with DAPO's filter every group would be dropped and the
  # rehearsal would never compile or run the update the sitting needs.
  c.rl.dynamic_sampling = False
  c.rl.prompts_per_step = 2
  c.rl.group_size = 4
  c.rl.eval_every = 2
  c.rl.eval_examples = 4
  c.rl.eval_samples = 2
  c.rl.drafter_eval_every = 2
  c.rl.drafter_eval_prompts = 2
  c.rl.checkpoint_every = 2
  c.rl_update.micro_batch = 4
  c.rl_update.pack_width = 256

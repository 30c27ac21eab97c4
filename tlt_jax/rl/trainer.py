"""The GRPO/DAPO training loop: rollout -> rewards -> advantages -> update -> new weights.

One step:
1. rollout: G samples for each of P prompts (the long-tail engine);
2. rewards on the host (`RewardPool`, worker threads) while the device
   recomputes the old log-probs of the same batch;
3. advantages per group; with DAPO dynamic sampling, groups whose rewards are
   all equal carry no signal: they are dropped and more prompts are rolled out
   (up to `max_refills` times) to fill the batch;
4. one jitted update (micro-batched, non-finite guard);
5. the engine takes the new params on its next call (params are arguments).
Every step logs a phase-time breakdown (time/other: host work between phases)
to metrics.jsonl and TensorBoard (workdir/tensorboard); checkpoints (orbax)
hold params, optimizer state, the KL reference when used, data position and
step (and in TLT the online drafter with its data buffer and the scheduler's state,
beside them: see `save`), so a killed run resumes exactly.

The trainer's forward passes (old log-probs, update) run on packed rows
(rl/packing.py): samples first-fit into rows of W columns (the longest sample
rounded up to 128), rows padded to the micro-batch times a power of two, so a
long-tailed batch costs its tokens, not P * G x its longest row, and compiles once
per (rows, width) bucket.

Parts: batch assembly (rl/batch.py), the metrics writers (rl/metrics.py), held-out
evaluation (tlt_jax/evaluation.py), checkpoint state (rl/checkpoints.py); this module is
the step loop.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from tqdm.auto import tqdm

from tlt_jax.data.tokenizer import Tokenizer
from tlt_jax.evaluation import held_out_metrics
from tlt_jax.parallel.meshes import replicated, rows_sharding
from tlt_jax.parallel.sharding import DATA, TRAIN_RULES, param_shardings
from tlt_jax.rl.advantages import PROCESS_CREDITS, overlong_penalty
from tlt_jax.rl.batch import (
  ProcessCredit,
  ScoredRollout,
  StepRewardFn,
  assemble,
  chosen_groups,
  packed_width,
)
from tlt_jax.rl.checkpoints import TrainerCheckpoints
from tlt_jax.rl.loss import PolicyLossConfig
from tlt_jax.rl.metrics import MetricsLog, spec_metrics
from tlt_jax.rl.packing import pack_policy_batch, plan_packing
from tlt_jax.rl.rewards import RewardFn, RewardPool
from tlt_jax.rl.update import UpdateConfig, make_optimizer, make_policy_update, token_logprobs
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.scheduler import SliceScheduler

# Timed phases of a step (metrics "time/<phase>"); time/other is the step's remainder.
PHASES = ("rollout", "reward", "old_logp", "update", "eval", "checkpoint")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """The RL loop's schedule and DAPO options.

  Attributes:
    steps: RL steps (policy updates).
    prompts_per_step: P, prompts per step.
    group_size: G, samples per prompt.
    normalize_std: divide advantages by the group's std (GRPO); False: Dr. GRPO.
    negative_weight: scale of negative advantages (1: GRPO; 0: positive samples only).
    dynamic_sampling: drop groups with all-equal rewards and refill (DAPO).
    max_refills: extra rollouts per step to refill dropped groups.
    overlong_buffer: DAPO soft overlong punishment window in tokens (0: off).
    process_credit: "" (outcome rewards only), or process supervision from a step
      reward function (`step_reward_fn`): step rewards normalised per group
      (DeepSeekMath's process-supervised GRPO) and given to each token, "step" its own
      step's, "return" the sum over its step and the later ones.
    process_coef: weight of the process advantage, added to the outcome one.
    eval_every: held-out greedy pass@1 every this many steps (0: only at the end).
    eval_examples: held-out problems per evaluation.
    eval_samples: also sampled pass@1 (mean accuracy of this many samples per
      problem at the rollout temperature, fixed key); 0: greedy only.
    checkpoint_every: steps between checkpoints.
    reward_workers / reward_timeout_s: the host reward pool.
    seed: data order and rollout keys.
  """

  steps: int = 20
  prompts_per_step: int = 8
  group_size: int = 8
  normalize_std: bool = True
  negative_weight: float = 1.0
  dynamic_sampling: bool = True
  max_refills: int = 2
  overlong_buffer: int = 0
  process_credit: str = ""
  process_coef: float = 1.0
  eval_every: int = 10
  eval_examples: int = 100
  eval_samples: int = 0
  checkpoint_every: int = 5
  reward_workers: int = 4
  reward_timeout_s: float = 5.0
  seed: int = 0

  def __post_init__(self):
    for name in ("steps", "prompts_per_step", "group_size", "eval_examples", "checkpoint_every"):
      v = getattr(self, name)
      if not isinstance(v, int) or v <= 0:
        raise ValueError(f"GRPOConfig.{name} must be a positive int, got {v!r}")
    if self.group_size < 2:
      raise ValueError(
        f"GRPOConfig.group_size must be >= 2 (advantages are relative), got {self.group_size}"
      )
    for name in ("max_refills", "overlong_buffer", "eval_every", "eval_samples"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 0:
        raise ValueError(f"GRPOConfig.{name} must be an int >= 0, got {v!r}")
    if self.process_credit not in ("", *PROCESS_CREDITS):
      raise ValueError(
        f"GRPOConfig.process_credit must be '' or one of {PROCESS_CREDITS}, "
        f"got {self.process_credit!r}"
      )
    if not (self.process_coef >= 0.0 and np.isfinite(self.process_coef)):
      raise ValueError(f"GRPOConfig.process_coef must be >= 0, got {self.process_coef!r}")
    if not 0.0 <= self.negative_weight <= 1.0:
      raise ValueError(
        f"GRPOConfig.negative_weight must be in [0, 1], got {self.negative_weight!r}"
      )


class GRPOTrainer:
  """Runs GRPO/DAPO on (prompt, answer) examples; resumes from `workdir`."""

  def __init__(
    self,
    graphdef: nnx.GraphDef,
    params: nnx.State,
    engine: RolloutEngine,
    tokenizer: Tokenizer,
    train_examples: Sequence[Mapping[str, str]],
    eval_examples: Sequence[Mapping[str, str]],
    reward_fn: RewardFn,
    format_prompt: Callable[[Mapping[str, str]], str],
    config: GRPOConfig,
    loss_config: PolicyLossConfig,
    update_config: UpdateConfig,
    workdir: str,
    drafter_params: nnx.State | None = None,
    eval_check: RewardFn | None = None,
    scheduler: SliceScheduler | None = None,
    mesh: Mesh | None = None,
    step_reward_fn: StepRewardFn | None = None,
    shard_params: bool = False,
  ):
    """See the module docstring.

    `drafter_params` (optional, for an engine built with a drafter and
    spec_threshold > 0): rollouts use speculative decoding with this frozen
    drafter; the engine's bandit statistics go into every checkpoint.
    `eval_check`: the held-out checker (default `reward_fn`); give the bare task
    checker when `reward_fn` adds shaping such as a format bonus.
    `scheduler` (TLT, instead of `drafter_params`): an online drafter trained from
    every rollout's tokens and features in idle slices (reward scoring, checkpoint
    writes, the rollout's long tail); its params, optimizer state, version and data
    buffer are checkpointed beside the policy (see `save`).
    `step_reward_fn` (needed when config.process_credit is set): per-step rewards of a
    completion, for process supervision.
    `mesh` (the policy-training role's mesh: 1-D "data", or ("data", "tensor") from
    `parallel.training_mesh`): every update's rows split over "data"; params, optimizer
    state and reference replicated on it, or with `shard_params` split by
    `parallel.sharding.TRAIN_RULES` (FSDP over "data", heads and MLP width over "tensor").
    The engine has its own rollout mesh (`RolloutEngine(mesh=...)`) and places the
    weights there itself, device to device.
    """
    self.graphdef, self.engine, self.tokenizer = graphdef, engine, tokenizer
    if scheduler is not None and drafter_params is not None:
      raise ValueError("give drafter_params (frozen drafter) or scheduler (online), not both")
    self.drafter_params, self.scheduler = drafter_params, scheduler
    self.eval_check = eval_check or reward_fn
    self.train, self.evals = list(train_examples), list(eval_examples)[: config.eval_examples]
    self.reward_fn, self.format_prompt = reward_fn, format_prompt
    if config.process_credit and step_reward_fn is None:
      raise ValueError(
        f"process_credit={config.process_credit!r} needs a step_reward_fn (the task's "
        "per-step checker)"
      )
    self.process_credit = (
      ProcessCredit(
        step_reward_fn, tokenizer, config.process_credit, config.group_size, config.normalize_std
      )
      if config.process_credit
      else None
    )
    self.cfg, self.loss_cfg, self.update_cfg = config, loss_config, update_config
    self.workdir = workdir
    # The loss scores the distribution the engine samples: same temperature and truncation.
    for name in ("temperature", "top_k", "top_p"):
      sampled, scored = getattr(engine.sampling, name), getattr(loss_config, name)
      if sampled != scored:
        raise ValueError(
          f"the engine samples at {name}={sampled!r} but the loss config has "
          f"{name}={scored!r}: the ratios would refer to a policy that did not generate "
          f"the data (engine sampling {engine.sampling}, loss {loss_config.sampling})"
        )
    self.rows = config.prompts_per_step * config.group_size
    self._tail_batch = max(engine.config.max_batch // 4, 1)
    if self.rows > engine.config.max_batch:
      raise ValueError(
        f"{config.prompts_per_step} prompts x {config.group_size} samples exceeds the "
        f"engine's max_batch {engine.config.max_batch}"
      )
    self.optimizer = make_optimizer(update_config)
    update_config.mini_batch_samples(self.rows)  # validates mini_batches
    if shard_params and mesh is None:
      raise ValueError("shard_params needs a mesh")
    self.param_sharding = param_shardings(params, mesh, TRAIN_RULES) if shard_params else None
    self.update = make_policy_update(
      graphdef,
      self.optimizer,
      loss_config,
      update_config.micro_batch,
      update_config.trainable,
      param_sharding=self.param_sharding,
      remat=update_config.remat,
    )
    self.old_logp = jax.jit(
      lambda p, t, pos, seg: token_logprobs(
        graphdef,
        p,
        t,
        loss_config.temperature,
        top_k=loss_config.top_k,
        top_p=loss_config.top_p,
        positions=pos,
        segment_ids=seg,
        vocab_chunk=loss_config.vocab_chunk,
      )[0]
    )
    # Update and old-log-prob programs, compiled ahead of time per packed shape, so a
    # step's compile seconds are counted (time/train_compile) apart from its compute.
    self.programs = ExecutablePool()
    self.mesh = mesh
    if mesh is not None:
      data = mesh.shape[DATA]
      if update_config.micro_batch % data:
        raise ValueError(
          f"a micro-batch of {update_config.micro_batch} rows does not split over the "
          f"mesh's {data} data shards"
        )
      layout = replicated(mesh) if self.param_sharding is None else self.param_sharding
      params = jax.device_put(params, layout)
    self.params = params
    # The frozen KL reference: the starting policy, kept (and checkpointed) only when used.
    self.ref_params = jax.tree.map(jnp.copy, params) if loss_config.kl_coef > 0 else None
    self.opt_state = self.optimizer.init(params)
    self.step = 0
    self.cursor = 0  # position in the shuffled training order
    self.order = np.random.default_rng(config.seed).permutation(len(self.train))
    self.checkpoints = TrainerCheckpoints(workdir, with_drafter=scheduler is not None)
    self.metrics_path = self.checkpoints.metrics_path
    self.lengths_path = self.checkpoints.lengths_path
    self.checkpoints.restore(self)

  # ------------------------------------------------------------ checkpoints
  def save(self) -> None:
    """Checkpoints the step (`checkpoints.TrainerCheckpoints.save`)."""
    self.checkpoints.save(self)

  # ------------------------------------------------------------------- step
  def _next_examples(self, n: int) -> list[Mapping[str, str]]:
    idx = [int(self.order[(self.cursor + i) % len(self.order)]) for i in range(n)]
    self.cursor += n
    return [self.train[i] for i in idx]

  def _rollout(self, examples, rewards: RewardPool, salt: int, times: dict[str, float]):
    """Rolls out G samples of each example, dispatches their old log-probs and scores them
    (host threads) meanwhile. Returns the scored rollout, a function that waits for its
    old log-probs, and the reward pool's result; adds to times' rollout and reward."""
    t = time.perf_counter()
    cfg, p, g = self.cfg, len(examples), self.cfg.group_size
    prompts = [self.tokenizer.encode(self.format_prompt(ex), add_bos=True) for ex in examples]
    key = jax.random.fold_in(jax.random.key(cfg.seed), self.step * 64 + salt)
    drafter_params, hook = self.drafter_params, None
    if self.scheduler is not None:
      drafter_params, hook = self.scheduler.begin_rollout(self.params), self.scheduler.on_chunk
    result = self.engine.generate(
      self.params,
      prompts,
      g,
      key=key,
      seq_id_offset=(self.cursor - p) * g,
      drafter_params=drafter_params,
      on_chunk=hook,
    )
    if self.scheduler is not None:
      self.scheduler.end_rollout()
      self.scheduler.drafter.observe(result, self.step)
    texts = [self.tokenizer.decode(result.completion(n)) for n in range(p * g)]
    pending = rewards.submit(texts, [examples[n // g]["answer"] for n in range(p * g)])
    times["rollout"] += time.perf_counter() - t
    # The device computes old log-probs while the host threads score rewards.
    t = time.perf_counter()
    old_logp = self._old_logp(result)
    if self.scheduler is not None and salt == 0:
      # Once the old log-probs are done the device idles until the host has scored.
      done = old_logp()
      old_logp = lambda: done  # noqa: E731
      self.scheduler.fill("reward", lambda: not pending.done(), self.params)
    got = pending()
    process = self.process_credit(result, texts, examples) if self.process_credit else None
    times["reward"] += time.perf_counter() - t
    shaped = got.rewards.copy()
    if cfg.overlong_buffer:
      shaped += overlong_penalty(
        result.num_generated, self.engine.config.max_new_tokens, cfg.overlong_buffer
      )
    return ScoredRollout(result, shaped, got.rewards, process=process), old_logp, got

  def _old_logp(self, result) -> Callable[[], np.ndarray]:
    """Dispatches the old log-probs of a rollout's samples on packed rows; the
    returned function waits and gives them per sample, [N, slots]."""
    width = packed_width([result], self.engine.config.slots)
    plan = plan_packing(
      result.length, width, self.update_cfg.micro_batch, self.update_cfg.pow2_rows
    )
    t = result.tokens.shape[1]
    tokens = self._rows(plan.pack(np.asarray(result.tokens, np.int32)))
    args = (self.params, tokens, *map(self._rows, plan.layout()))
    fn = self.programs.get(("old_logp", args[1].shape), self.old_logp, args)
    out = fn(*args)
    return lambda: plan.unpack(np.asarray(out), t)

  def train_step(self, rewards: RewardPool) -> dict[str, Any]:
    """One RL step: rollouts (refilled under dynamic sampling), the update batch, the
    update; returns the step's metrics row."""
    cfg, g, p = self.cfg, self.cfg.group_size, self.cfg.prompts_per_step
    times = {"rollout": 0.0, "reward": 0.0}
    if self.process_credit:
      self.process_credit.reset_errors()
    compiled = self.engine.pool.compile_seconds
    train_compiled = self.programs.compile_seconds
    rollouts, waits, got = [], [], None
    data_epoch = self.cursor // len(self.order)  # which pass over the training set
    times["old_logp"] = 0.0
    while len(rollouts) <= (cfg.max_refills if cfg.dynamic_sampling else 0):
      if waits:
        # A refill waits for the previous rollout's old log-probs: dispatched, not awaited,
        # they would run on the device during the refill and be timed as its rollout.
        t = time.perf_counter()
        done = waits[-1]()
        waits[-1] = lambda done=done: done
        times["old_logp"] += time.perf_counter() - t
      scored, wait, scores = self._rollout(self._next_examples(p), rewards, len(rollouts), times)
      rollouts.append(scored)
      waits.append(wait)
      got = scores if got is None else got  # the first rollout's: the step's reward figures
      if sum(int(r.informative(g).sum()) for r in rollouts) >= p:
        break
    t = time.perf_counter()
    for scored, wait in zip(rollouts, waits):
      scored.old_logp = wait()
    times["old_logp"] += time.perf_counter() - t
    chosen = chosen_groups(rollouts, g, p, cfg.dynamic_sampling)
    results = [r.result for r in rollouts]
    width = packed_width(results, self.engine.config.slots)
    samples, logp_gap = assemble(
      rollouts,
      chosen,
      g,
      width,
      normalize_std=cfg.normalize_std,
      negative_weight=cfg.negative_weight,
      process_coef=cfg.process_coef,
    )
    t = time.perf_counter()
    m = self._optimize(samples, width)
    times["update"] = time.perf_counter() - t
    first = rollouts[0]
    self.step += 1
    return {
      "step": self.step - 1,
      "reward_mean": float(got.rewards.mean()),
      "accuracy": float((got.rewards > 0.5).mean()),
      "length_mean": float(first.result.num_generated.mean()),
      "length_max": int(first.result.num_generated.max()),
      "groups_used": len(chosen),
      "data/epoch": data_epoch,
      "refills": len(rollouts) - 1,
      "reward_errors": got.errors,
      "reward_timeouts": got.timeouts,
      "samples_rolled_out": int(sum(r.raw_rewards.size for r in rollouts)),
      "update_tokens": int(samples["mask"].sum()),
      "logp_rollout_vs_trainer_max_abs": logp_gap,
      "rollout_tokens": int(sum(r.num_generated.sum() for r in results)),
      # Each rollout's response lengths (refills are rollouts of their own): the trace the
      # step simulator replays (tlt_jax.sim); MetricsLog moves it to rollout_lengths.jsonl.
      "rollout_lengths": [r.num_generated.tolist() for r in results],
      "rollout_prompt_lengths": [r.prompt_len.tolist() for r in results],  # the rows' prompts
      **{f"loss/{k}": v for k, v in m.items()},
      **{f"time/{k}": v for k, v in times.items()},
      # Programs the rollouts compiled lazily (inside time/rollout): compare modes without it.
      "time/rollout_compile": self.engine.pool.compile_seconds - compiled,
      # Old-log-prob and update programs compiled for new packed shapes (inside
      # time/reward or time/old_logp, and time/update).
      "time/train_compile": self.programs.compile_seconds - train_compiled,
      **spec_metrics(results),
      **(
        {
          "step_reward_mean": first.process.mean_step_reward,
          "step_reward_errors": self.process_credit.errors,
        }
        if first.process is not None
        else {}
      ),
      # Generation time at batch buckets <= max_batch / 4 (the long tail) and in all:
      # their ratio caps what speculative decoding can save (1 / (1 - share)).
      "time/rollout_tail": sum(r.generation_seconds(self._tail_batch) for r in results),
      "time/rollout_generate": sum(r.generation_seconds() for r in results),
    }

  def _rows(self, x: np.ndarray) -> jax.Array:
    """A batch array on the training devices, rows split over the mesh when there is one."""
    if self.mesh is None:
      return jnp.asarray(x)
    return jax.device_put(x, rows_sharding(self.mesh))

  def _optimize(self, samples: dict[str, np.ndarray], width: int) -> dict[str, float]:
    """epochs x mini_batches optimizer steps on one rollout batch (PPO-style).

    With no sample (no informative group) there is no optimizer step. Samples are
    reshuffled every epoch by a generator keyed on (seed, step), so a
    resumed run repeats them, and each mini-batch is packed into rows of `width`.
    Metrics: the first mini-batch's (its ratio is 1: the policy that sampled the
    batch) for the loss terms, with clip fractions, approx_kl, skips and grad
    norms averaged over all optimizer steps; update_rows / update_fill (share of
    the packed cells holding sample tokens) of all of them.
    """
    ucfg, n = self.update_cfg, len(samples["length"])
    if n == 0:  # dynamic sampling found no informative group: nothing to learn from
      return {"skipped": 0.0, "optimizer_steps": 0.0}
    rng = np.random.default_rng([self.cfg.seed, self.step])
    rows, cells = [], 0
    for _ in range(ucfg.epochs):
      perm = np.arange(n) if ucfg.mini_batches == 1 else rng.permutation(n)
      # Equal parts when the batch is full; a short (refill-limited) batch splits unevenly.
      for part in np.array_split(perm, ucfg.mini_batches):
        if not part.size:
          continue
        idx = np.sort(part)
        batch, plan = pack_policy_batch(
          **{k: v[idx] for k, v in samples.items()},
          aggregation=self.loss_cfg.aggregation,
          width=width,
          row_multiple=ucfg.micro_batch,
          pow2_rows=ucfg.pow2_rows,
        )
        cells += plan.num_rows * plan.width
        batch = {k: self._rows(v) for k, v in batch.items()}
        args = (self.params, self.opt_state, batch, self.ref_params)
        key = ("policy_update", batch["tokens"].shape)
        update = self.programs.get(key, self.update, args, donate_argnums=(0, 1))
        self.params, self.opt_state, m = update(*args)
        rows.append(m)
    rows = [{k: float(v) for k, v in r.items()} for r in jax.device_get(rows)]
    out = dict(rows[0])
    for k in ("clip_fraction_low", "clip_fraction_high", "approx_kl", "grad_norm"):
      out[k] = float(np.mean([r[k] for r in rows]))
    out["ratio_max"] = max(r["ratio_max"] for r in rows)
    out["skipped"] = float(sum(r["skipped"] for r in rows))
    out["optimizer_steps"] = float(len(rows))
    out["update_rows"] = float(cells // width)
    out["update_fill"] = float(ucfg.epochs * samples["length"].sum() / cells)
    return out

  def evaluate(self) -> dict[str, Any]:
    """Greedy pass@1 and (eval_samples > 0) sampled pass@1 on the held-out problems."""
    return held_out_metrics(
      self.engine,
      self.params,
      self.tokenizer,
      self.evals,
      self.eval_check,
      self.format_prompt,
      samples=self.cfg.eval_samples,
      key=self.cfg.seed,
    )

  def run(self, progress: bool = True) -> list[dict[str, Any]]:
    """Trains to `config.steps`, resuming from the last checkpoint; returns this call's metrics."""
    cfg = self.cfg
    rewards = RewardPool(self.reward_fn, workers=cfg.reward_workers, timeout_s=cfg.reward_timeout_s)
    history = []
    bar = tqdm(total=cfg.steps, initial=self.step, desc="grpo", disable=not progress)
    log = MetricsLog(
      self.metrics_path,
      self.lengths_path,
      os.path.join(self.workdir, "tensorboard"),
      purge_step=self.step,
    )
    last_eval = {}
    try:
      while self.step < cfg.steps:
        t0 = time.perf_counter()
        row = self.train_step(rewards)
        skipped = row.get("loss/skipped", 0.0) > 0
        t = time.perf_counter()
        if cfg.eval_every and self.step % cfg.eval_every == 0 or self.step == cfg.steps:
          row["eval"] = self.evaluate()
        row["time/eval"] = time.perf_counter() - t
        t = time.perf_counter()
        # The last step is always saved (a skipped update left the params as they were).
        if self.step == cfg.steps or (not skipped and self.step % cfg.checkpoint_every == 0):
          self.save()
        row["time/checkpoint"] = time.perf_counter() - t
        row["time/step"] = time.perf_counter() - t0
        if self.scheduler is not None:
          row.update(self.scheduler.step_records())
        # Weight sync costs nothing here: the engine reads the trainer's arrays.
        row["time/other"] = row["time/step"] - sum(row[f"time/{p}"] for p in PHASES)
        log.write(row)
        history.append(row)
        if "eval" in row:
          last_eval = {"eval": f"{row['eval']['accuracy']:.3f}"}
          if "sampled_accuracy" in row["eval"]:
            last_eval["eval_sampled"] = f"{row['eval']['sampled_accuracy']:.3f}"
        bar.update(1)
        bar.set_postfix(
          reward=f"{row['reward_mean']:.2f}",
          acc=f"{row['accuracy']:.2f}",
          len=f"{row['length_mean']:.0f}",
          **last_eval,
        )
    finally:
      bar.close()
      log.close()
      rewards.close()
      if self.checkpoints.drafter is not None:
        self.checkpoints.drafter.wait_until_finished()
    return history

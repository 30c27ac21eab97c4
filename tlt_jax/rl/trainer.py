"""The GRPO/DAPO training loop: rollout -> rewards -> advantages -> update -> new weights.

One step:
1. rollout: G samples for each of P prompts (the long-tail engine), in one engine call
   or, with `rows_per_call`, in several sequential calls of whole groups (D devices each
   decoding rows_per_call rows); sampling is keyed per (seed, sequence id, position), so
   the tokens are the same either way;
2. rewards on the host (`RewardPool`, worker threads): each row's from the moment the
   engine harvests it, while the long tail decodes; meanwhile the device recomputes the
   old log-probs of the batch, only when the update takes several optimizer steps on it
   (one on-policy step uses the update forward's own log-probs,
   `make_policy_update(on_policy=True)`);
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

import collections
import contextlib
import dataclasses
import json
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

from tlt_jax.data.cursor import DataCursor
from tlt_jax.data.tokenizer import Tokenizer
from tlt_jax.drafter.acceptance import DrafterAcceptance, DrafterEvalConfig
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
  pooled_step_reward,
)
from tlt_jax.rl.checkpoints import TrainerCheckpoints
from tlt_jax.rl.loss import PolicyLossConfig
from tlt_jax.rl.metrics import (
  MetricsConfig,
  MetricsLog,
  progress_postfix,
  rollout_part_metrics,
  spec_metrics,
)
from tlt_jax.rl.packing import pack_policy_batch, plan_packing
from tlt_jax.rl.rewards import RewardFn, RewardPool, RewardResult
from tlt_jax.rl.update import UpdateConfig, make_optimizer, policy_update_step, token_logprobs
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.scheduler import SliceScheduler
from tlt_jax.utils.cpu_fusions import compiler_options
from tlt_jax.utils.keys import folded_key

# Timed phases of a step (metrics "time/<phase>"); time/other is the step's remainder.
PHASES = ("rollout", "reward", "old_logp", "update", "drafter", "eval", "checkpoint")


# JAX's transfer-guard levels (GRPOConfig.transfer_guard).
TRANSFER_GUARDS = ("disallow", "log", "allow")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """The RL loop's schedule and DAPO options.

  Attributes:
    steps: RL steps (policy updates).
    prompts_per_step: P, prompts per step.
    group_size: G, samples per prompt.
    normalize_std: divide advantages by the group's std (GRPO); False: Dr. GRPO.
    std_ddof: that std's ddof: 0 population (default), 1 Bessel-corrected (outcome rewards).
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
    rows_per_call: 0: a batch of P x G rows is one engine call (P x G <= the engine's
      max_batch); else it is rolled out as ceil(P x G / rows_per_call) sequential calls of
      whole groups (a multiple of group_size, <= max_batch), the same tokens as one call:
      the step's rollout time is their sum, as D devices each decoding this many rows.
    profile_steps: steps (counted from 0) whose train step, the online drafter's end of
      step included, runs under JAX's profiler (its Python tracer off): a trace in
      <workdir>/profile/step_<n>, which experiments/traces.py's `program_summary` reads by
      program. The profiler's start and stop are the row's time/profiler, not its step's.
    transfer_guard: JAX's host-to-device transfer guard over the loop's steps and
      evaluations ("disallow", "log" or "allow"): under "disallow" an array the host hands
      a device program without `jax.device_put` (a NumPy array or a Python number passed
      to a jitted function, say) is an error, so no hidden copy enters the step unseen;
      the library's own transfers are all explicit.
  """

  steps: int = 20
  prompts_per_step: int = 8
  group_size: int = 8
  normalize_std: bool = True
  std_ddof: int = 0
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
  rows_per_call: int = 0
  profile_steps: tuple[int, ...] = ()
  transfer_guard: str = "disallow"

  def __post_init__(self):
    for name in ("steps", "prompts_per_step", "group_size", "eval_examples", "checkpoint_every"):
      v = getattr(self, name)
      if not isinstance(v, int) or v <= 0:
        raise ValueError(f"GRPOConfig.{name} must be a positive int, got {v!r}")
    if self.group_size < 2:
      raise ValueError(
        f"GRPOConfig.group_size must be >= 2 (advantages are relative), got {self.group_size}"
      )
    for name in ("max_refills", "overlong_buffer", "eval_every", "eval_samples", "rows_per_call"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 0:
        raise ValueError(f"GRPOConfig.{name} must be an int >= 0, got {v!r}")
    if not all(isinstance(s, int) and s >= 0 for s in self.profile_steps):
      raise ValueError(f"GRPOConfig.profile_steps must be ints >= 0, got {self.profile_steps!r}")
    if self.transfer_guard not in TRANSFER_GUARDS:
      raise ValueError(
        f"GRPOConfig.transfer_guard must be one of {TRANSFER_GUARDS}, got {self.transfer_guard!r}"
      )
    if self.process_credit not in ("", *PROCESS_CREDITS):
      raise ValueError(
        f"GRPOConfig.process_credit must be '' or one of {PROCESS_CREDITS}, "
        f"got {self.process_credit!r}"
      )
    if not (self.process_coef >= 0.0 and np.isfinite(self.process_coef)):
      raise ValueError(f"GRPOConfig.process_coef must be >= 0, got {self.process_coef!r}")
    if isinstance(self.std_ddof, bool) or self.std_ddof not in (0, 1):
      raise ValueError(f"GRPOConfig.std_ddof must be 0 or 1, got {self.std_ddof!r}")
    if not 0.0 <= self.negative_weight <= 1.0:
      raise ValueError(
        f"GRPOConfig.negative_weight must be in [0, 1], got {self.negative_weight!r}"
      )
    if self.rows_per_call % self.group_size:
      raise ValueError(
        f"GRPOConfig.rows_per_call ({self.rows_per_call}) must be a multiple of group_size "
        f"({self.group_size}): a call rolls out whole groups"
      )


def _check_setup(
  config: GRPOConfig,
  loss_config: PolicyLossConfig,
  update_config: UpdateConfig,
  engine: RolloutEngine,
  drafter_params: nnx.State | None,
  scheduler: SliceScheduler | None,
  step_reward_fn: StepRewardFn | None,
  mesh: Mesh | None,
  shard_params: bool,
) -> None:
  """Refuses, naming the fields, what a trainer cannot run: the loss scoring another
  distribution than the engine samples, a step's rows beyond what its engine calls hold,
  two drafters, process credit without a step checker, mini-batches that do not divide,
  micro-batches that do not split over the mesh."""
  if shard_params and mesh is None:
    raise ValueError("shard_params needs a mesh")
  if mesh is not None and update_config.micro_batch % mesh.shape[DATA]:
    raise ValueError(
      f"a micro-batch of {update_config.micro_batch} rows does not split over the "
      f"mesh's {mesh.shape[DATA]} data shards"
    )
  if scheduler is not None and drafter_params is not None:
    raise ValueError("give drafter_params (frozen drafter) or scheduler (online), not both")
  if config.process_credit and step_reward_fn is None:
    raise ValueError(
      f"process_credit={config.process_credit!r} needs a step_reward_fn (the task's "
      "per-step checker)"
    )
  # The loss scores the distribution the engine samples: same temperature and truncation.
  for name in ("temperature", "top_k", "top_p"):
    sampled, scored = getattr(engine.sampling, name), getattr(loss_config, name)
    if sampled != scored:
      raise ValueError(
        f"the engine samples at {name}={sampled!r} but the loss config has "
        f"{name}={scored!r}: the ratios would refer to a policy that did not generate "
        f"the data (engine sampling {engine.sampling}, loss {loss_config.sampling})"
      )
  rows, max_batch = config.prompts_per_step * config.group_size, engine.config.max_batch
  if config.rows_per_call > max_batch:
    raise ValueError(
      f"GRPOConfig.rows_per_call ({config.rows_per_call}) exceeds the engine's max_batch "
      f"{max_batch}"
    )
  if not config.rows_per_call and rows > max_batch:
    raise ValueError(
      f"{config.prompts_per_step} prompts x {config.group_size} samples exceeds the "
      f"engine's max_batch {max_batch}; set GRPOConfig.rows_per_call (rl.rows_per_call) "
      "to roll a step out in several calls"
    )
  update_config.mini_batch_samples(rows)  # validates mini_batches


def _old_logp_program(
  graphdef: nnx.GraphDef, loss_config: PolicyLossConfig, scan_layers: bool = False
):
  """The jitted old-log-prob pass: the sampling policy's log-probs of a packed batch,
  scored as the loss scores them (mini_batches > 1 or epochs > 1 only); its layers scanned
  as the update's are (UpdateConfig.scan_layers)."""
  return jax.jit(
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
      scan_layers=scan_layers,
    )[0]
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
    drafter_eval: DrafterEvalConfig | None = None,
    metrics: MetricsConfig | None = None,
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
    `drafter_eval` (with a frozen or online drafter): every `every` steps the accept
    length of the rollouts' drafter and of the warm start (the frozen one, or the
    scheduler's `initial_params`) on the same held-out prompts
    (`drafter.acceptance.DrafterAcceptance`; drafter_eval/* metrics, in time/eval).
    """
    _check_setup(
      config,
      loss_config,
      update_config,
      engine,
      drafter_params,
      scheduler,
      step_reward_fn,
      mesh,
      shard_params,
    )
    self.graphdef, self.engine, self.tokenizer = graphdef, engine, tokenizer
    self.drafter_params, self.scheduler = drafter_params, scheduler
    self.drafter_eval = drafter_eval
    self.eval_check = eval_check or reward_fn
    self.evals = list(eval_examples)[: config.eval_examples]
    self.reward_fn, self.format_prompt = reward_fn, format_prompt
    self.process_credit = None
    if config.process_credit:
      self.process_credit = ProcessCredit(
        step_reward_fn, tokenizer, config.process_credit, config.group_size, config.normalize_std
      )
    self.cfg, self.loss_cfg, self.update_cfg = config, loss_config, update_config
    self.workdir = workdir
    self.metrics_config = metrics or MetricsConfig()  # W&B / MLflow beside TensorBoard
    self.rows = config.prompts_per_step * config.group_size
    self._tail_batch = max(engine.config.max_batch // 4, 1)
    self.optimizer = make_optimizer(update_config)
    self.param_sharding = param_shardings(params, mesh, TRAIN_RULES) if shard_params else None
    # One optimizer step per rollout batch: its old log-probs are the policy's own, so the
    # update takes them from its forward and no separate old-log-prob pass runs.
    self.skip_old_logp = update_config.mini_batches == 1 and update_config.epochs == 1
    self.update = self._make_update()
    self.update_options = compiler_options(update_config.cpu_fusions)
    self.old_logp = _old_logp_program(graphdef, loss_config, update_config.scan_layers)
    # Update and old-log-prob programs, compiled ahead of time per packed shape, so a
    # step's compile seconds are counted (time/train_compile) apart from its compute.
    self.programs = ExecutablePool()
    self.mesh = mesh
    if mesh is not None:
      layout = replicated(mesh) if self.param_sharding is None else self.param_sharding
      params = jax.device_put(params, layout)
    self.params = params
    self.num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    # The frozen KL reference: the starting policy, kept (and checkpointed) only when used.
    self.ref_params = jax.tree.map(jnp.copy, params) if loss_config.kl_coef > 0 else None
    self.opt_state = self.optimizer.init(params)
    self.step = 0
    self.data = DataCursor(train_examples, config.seed)  # the training examples, in order
    self.checkpoints = TrainerCheckpoints(workdir, with_drafter=scheduler is not None)
    self.metrics_path = self.checkpoints.metrics_path
    self.lengths_path = self.checkpoints.lengths_path
    self.timelines_path = self.checkpoints.timelines_path
    self.checkpoints.restore(self)

  def _make_update(self):
    """The policy update's step, for `self.programs` to compile (under
    `self.update_options`); on-policy (no old log-probs in the batch) when
    `skip_old_logp`."""
    ucfg = self.update_cfg
    return policy_update_step(
      self.graphdef,
      self.optimizer,
      self.loss_cfg,
      ucfg.micro_batch,
      ucfg.trainable,
      param_sharding=self.param_sharding,
      remat=ucfg.remat,
      scan_layers=ucfg.scan_layers,
      on_policy=self.skip_old_logp,
      key_windows=ucfg.key_windows,
    )

  # ------------------------------------------------------------ checkpoints
  def save(self) -> None:
    """Checkpoints the step (`checkpoints.TrainerCheckpoints.save`)."""
    self.checkpoints.save(self)

  def state_dict(self) -> dict[str, Any]:
    """The trainer's state, by component: "policy" (params, optimizer state, KL reference:
    arrays), "step", "data" (`DataCursor.state_dict`: the position in the shuffled
    training order) and "engine" (`RolloutEngine.state_dict`: the bandit's statistics, the
    group-draft history)."""
    policy = {"params": nnx.to_pure_dict(self.params), "opt_state": self.opt_state}
    if self.ref_params is not None:
      policy["reference"] = nnx.to_pure_dict(self.ref_params)
    return {
      "policy": policy,
      "step": self.step,
      "data": self.data.state_dict(),
      "engine": self.engine.state_dict(),
    }

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Restores what `state_dict` saved (an "engine" part it lacks stays as it is)."""
    nnx.replace_by_pure_dict(self.params, state["policy"]["params"])
    if self.ref_params is not None:
      nnx.replace_by_pure_dict(self.ref_params, state["policy"]["reference"])
    self.opt_state = state["policy"]["opt_state"]
    self.step = int(state["step"])
    self.data.load_state_dict(state["data"])
    self.engine.load_state_dict(state.get("engine", {}))

  def drafter_state_dict(self) -> dict[str, Any] | None:
    """TLT: "drafter" (`OnlineDrafter.state_dict`) and "scheduler"
    (`SliceScheduler.state_dict`); None without an online drafter."""
    if self.scheduler is None:
      return None
    return {
      "drafter": self.scheduler.drafter.state_dict(),
      "scheduler": self.scheduler.state_dict(),
    }

  def drafter_abstract_state(self) -> dict[str, Any]:
    """The shapes, dtypes and shardings `drafter_state_dict()["drafter"]["train"]` restores
    into."""
    return self.scheduler.drafter.abstract_state()

  def load_drafter_state_dict(self, state: dict[str, Any]) -> None:
    """Restores what `drafter_state_dict` saved."""
    self.scheduler.drafter.load_state_dict(state["drafter"])
    self.scheduler.load_state_dict(state["scheduler"])

  # ------------------------------------------------------------------- step
  def call_groups(self, prompts: int) -> list[tuple[int, int]]:
    """[first, end) prompt ranges of a batch of `prompts` prompts, one per engine call."""
    per = self.cfg.rows_per_call // self.cfg.group_size or prompts
    return [(a, min(a + per, prompts)) for a in range(0, prompts, per)]

  def rollout_key(self, salt: int = 0) -> jax.Array:
    """The sampling key of this step's rollout batch `salt` (0, then refills 1, 2, ...).
    One key serves all of a batch's engine calls: row n of the prompt at position i of the
    data order has sequence id i x group_size + n, so the calls reproduce one call."""
    return folded_key(self.cfg.seed, self.step * 64 + salt)

  def _rollout(self, examples, rewards: RewardPool, salt: int, times: dict[str, float]):
    """Rolls out G samples of each example, one engine call per `call_groups` range, each
    row's reward scored (host threads) from its harvest on, while the rest decode; then
    dispatches the batch's old log-probs (unless `skip_old_logp`) and waits for the scores.

    Returns the calls' scored rollouts, a function that waits for their old log-probs
    (one array per call; None when skipped) and the batch's pooled reward result; adds to
    times' rollout and reward.
    """
    t = time.perf_counter()
    cfg, p, g = self.cfg, len(examples), self.cfg.group_size
    first = self.data.position - p  # the batch's first example in the data order: its sequence ids
    key = self.rollout_key(salt)
    calls, between = [], 0.0
    for a, b in self.call_groups(p):
      part = examples[a:b]
      prompts = [self.tokenizer.encode(self.format_prompt(ex), add_bos=True) for ex in part]
      drafter_params, hook = self.drafter_params, None
      if self.scheduler is not None:
        if calls:  # TLT between two calls: the drafter's updates due, before the next drafts
          between += self.scheduler.between_calls(self.params)
        compiled = self.scheduler.drafter.compile_seconds
        drafter_params = self.scheduler.begin_rollout(self.params)
        hook = self.scheduler.on_chunk
      rows = len(part) * g
      # Rows are scored from the moment the engine harvests them (the long tail decodes);
      # the engine reports every row once, so a missing one fails the batch's collection.
      pending = rewards.batch([part[n // g]["answer"] for n in range(rows)])
      texts: list[str] = [""] * rows

      def finished(n, tokens, texts=texts, pending=pending):
        texts[n] = self.tokenizer.decode(tokens)
        pending.add(n, texts[n])

      result = self.engine.generate(
        self.params,
        prompts,
        g,
        key=key,
        seq_id_offset=(first + a) * g,
        drafter_params=drafter_params,
        on_chunk=hook,
        on_finished=finished,
      )
      if self.scheduler is not None:
        self.scheduler.end_rollout()
        # The drafter's update compiled while priming or inside the call: a compile.
        times["rollout_drafter_compile"] += self.scheduler.drafter.compile_seconds - compiled
        self.scheduler.drafter.observe(result, self.step)
      calls.append((part, result, texts, pending))
    # Drafter updates between calls are the drafter's phase, not the rollout's.
    times["rollout"] += time.perf_counter() - t - between
    times["drafter"] = times.get("drafter", 0.0) + between
    # The device computes old log-probs while the host threads score rewards.
    t = time.perf_counter()
    old_logp = None if self.skip_old_logp else self._old_logp([c[1] for c in calls])
    if self.scheduler is not None and salt == 0:
      if old_logp is not None:
        # Once the old log-probs are done the device idles until the host has scored.
        done = old_logp()
        old_logp = lambda: done  # noqa: E731
      busy = lambda: not all(pending.done() for *_, pending in calls)  # noqa: E731
      self.scheduler.fill("reward", busy, self.params)
    scored, got = [], []
    for part, result, texts, pending in calls:
      scores = pending()
      process = self.process_credit(result, texts, part) if self.process_credit else None
      shaped = scores.rewards.copy()
      if cfg.overlong_buffer:
        shaped += overlong_penalty(
          result.num_generated, self.engine.config.max_new_tokens, cfg.overlong_buffer
        )
      scored.append(ScoredRollout(result, shaped, scores.rewards, process=process))
      got.append(scores)
    times["reward"] += time.perf_counter() - t
    pooled = RewardResult(
      np.concatenate([r.rewards for r in got]),
      sum(r.errors for r in got),
      sum(r.timeouts for r in got),
      sum(r.seconds for r in got),
    )
    return scored, old_logp, pooled

  def _finish_drafter_step(self, row: dict[str, Any]) -> None:
    """TLT: the updates the step's slices left short of its minimum, blocking, before the
    checkpoint (which saves them); a phase of their own (added to what train_step timed
    there, between its engine calls). A first update compiles here (mode tlt's step 0,
    when no rollout primed it; seconds on an H200, RESULTS.md 2026-11-28): counted as a
    compile, as train_step counts its own."""
    row.setdefault("time/drafter", 0.0)
    if self.scheduler is not None:
      t, compiled = time.perf_counter(), self._drafter_compile_seconds()
      self.scheduler.finish_step(self.params)
      row["time/drafter"] += time.perf_counter() - t
      row["time/train_compile"] += self._drafter_compile_seconds() - compiled

  def _drafter_compile_seconds(self) -> float:
    return 0.0 if self.scheduler is None else self.scheduler.drafter.compile_seconds

  def _old_logp(self, results: Sequence[Any]) -> Callable[[], list[np.ndarray]]:
    """Dispatches the old log-probs of a batch's samples (the calls' results together) on
    packed rows; the returned function waits and gives them per call, [rows, slots]."""
    lengths = np.concatenate([r.length for r in results])
    width = packed_width(results, self.engine.config.slots, self.update_cfg.pack_width)
    ucfg = self.update_cfg
    plan = plan_packing(lengths, width, ucfg.micro_batch, ucfg.pow2_rows, ucfg.min_rows)
    t = max(r.tokens.shape[1] for r in results)
    pad = lambda x: np.pad(np.asarray(x, np.int32), ((0, 0), (0, t - x.shape[1])))  # noqa: E731
    tokens = np.concatenate([pad(r.tokens) for r in results])
    args = (self.params, self._rows(plan.pack(tokens)), *map(self._rows, plan.layout()))
    fn = self.programs.get(("old_logp", args[1].shape), self.old_logp, args)
    out = fn(*args)
    ends = np.cumsum([len(r.length) for r in results])[:-1]
    return lambda: np.split(plan.unpack(np.asarray(out), t), ends)

  def train_step(self, rewards: RewardPool) -> dict[str, Any]:
    """One RL step: rollouts (refilled under dynamic sampling), the update batch, the
    update; returns the step's metrics row."""
    cfg, g, p = self.cfg, self.cfg.group_size, self.cfg.prompts_per_step
    times = {"rollout": 0.0, "reward": 0.0, "old_logp": 0.0, "rollout_drafter_compile": 0.0}
    if self.process_credit:
      self.process_credit.reset_errors()
    compiled = self.engine.pool.compile_seconds
    train_compiled = self.programs.compile_seconds
    drafter_compiled = self._drafter_compile_seconds()
    data_epoch = self.data.epoch  # which pass over the training set
    batches, got = self._collect_rollouts(rewards, times)
    # The drafter's update compiled outside the rollouts (its fills, time/drafter).
    drafter_outside = (
      self._drafter_compile_seconds() - drafter_compiled - times["rollout_drafter_compile"]
    )
    rollouts = [r for calls in batches for r in calls]
    chosen = chosen_groups(rollouts, g, p, cfg.dynamic_sampling)
    results = [r.result for r in rollouts]
    width = packed_width(results, self.engine.config.slots, self.update_cfg.pack_width)
    samples, logp_gap = assemble(
      rollouts,
      chosen,
      g,
      width,
      normalize_std=cfg.normalize_std,
      std_ddof=cfg.std_ddof,
      negative_weight=cfg.negative_weight,
      process_coef=cfg.process_coef,
    )
    t = time.perf_counter()
    m = self._optimize(samples, width)
    times["update"] = time.perf_counter() - t
    self.step += 1
    return {
      "step": self.step - 1,
      **self._response_metrics(batches[0], got),
      "groups_used": len(chosen),
      "data/epoch": data_epoch,
      "refills": len(batches) - 1,
      "rollout_calls": len(rollouts),
      "samples_rolled_out": int(sum(r.raw_rewards.size for r in rollouts)),
      "update_tokens": int(samples["mask"].sum()),
      # The old-log-prob pass's against the engine's, or (no pass) the update forward's.
      "logp_rollout_vs_trainer_max_abs": (
        m.pop("rollout_logp_gap", 0.0) if logp_gap is None else logp_gap
      ),
      "rollout_tokens": int(sum(r.num_generated.sum() for r in results)),
      # Each engine call's response lengths (refills and the calls of a batch are rollouts
      # of their own): the trace the step simulator replays (tlt_jax.sim); MetricsLog moves
      # it to rollout_lengths.jsonl.
      "rollout_lengths": [r.num_generated.tolist() for r in results],
      "rollout_prompt_lengths": [r.prompt_len.tolist() for r in results],  # the rows' prompts
      # Each row's completion tokens as a CRC-32: runs and replays compared token for token.
      "rollout_digests": [r.completion_digests() for r in results],
      # Each call's timeline and wall seconds: the run's own engine costs (`tlt_jax.sim`);
      # MetricsLog moves them to rollout_timelines.jsonl.
      "rollout_timelines": [{"wall": r.wall_seconds, "timeline": r.timeline} for r in results],
      **self._update_metrics(m, times["update"]),
      **{f"time/{k}": v for k, v in times.items() if k != "rollout_drafter_compile"},
      # Programs the rollouts compiled lazily (inside time/rollout), the drafter's update
      # primed for them included: compare modes without it.
      "time/rollout_compile": (
        self.engine.pool.compile_seconds - compiled + times["rollout_drafter_compile"]
      ),
      # Old-log-prob and update programs compiled for new packed shapes (inside
      # time/reward or time/old_logp, and time/update), and the drafter's outside rollouts.
      "time/train_compile": self.programs.compile_seconds - train_compiled + drafter_outside,
      **spec_metrics(results),
      **rollout_part_metrics(results),
      # Generation time at batch buckets <= max_batch / 4 (the long tail) and in all:
      # their ratio caps what speculative decoding can save (1 / (1 - share)).
      "time/rollout_tail": sum(r.generation_seconds(self._tail_batch) for r in results),
      "time/rollout_generate": sum(r.generation_seconds() for r in results),
      # Host seconds copying finished rows off the device (mode tlt: their hidden states).
      "time/rollout_harvest": sum(r.phase_seconds("harvest") for r in results),
    }

  def _collect_rollouts(self, rewards: RewardPool, times: dict[str, float]):
    """The step's rollout batches (each a list of scored engine calls): the first, then,
    under dynamic sampling, refills until enough groups carry signal (`max_refills` at
    most), each with its old log-probs unless `skip_old_logp`; and the first batch's
    pooled reward result (the step's reward figures)."""
    cfg, g, p = self.cfg, self.cfg.group_size, self.cfg.prompts_per_step
    batches, waits, got = [], [], None
    while len(batches) <= (cfg.max_refills if cfg.dynamic_sampling else 0):
      if waits and waits[-1] is not None:
        # A refill waits for the previous rollout's old log-probs: dispatched, not awaited,
        # they would run on the device during the refill and be timed as its rollout.
        t = time.perf_counter()
        done = waits[-1]()
        waits[-1] = lambda done=done: done
        times["old_logp"] += time.perf_counter() - t
      calls, wait, scores = self._rollout(self.data.next(p), rewards, len(batches), times)
      batches.append(calls)
      waits.append(wait)
      got = scores if got is None else got
      if sum(int(r.informative(g).sum()) for b in batches for r in b) >= p:
        break
    if not self.skip_old_logp:
      t = time.perf_counter()
      for calls, wait in zip(batches, waits):
        for scored, old_logp in zip(calls, wait()):
          scored.old_logp = old_logp
      times["old_logp"] += time.perf_counter() - t
    return batches, got

  def _response_metrics(self, first: list, got) -> dict[str, Any]:
    """Rewards, accuracy, lengths and openings of the step's first rollout batch, and the
    per-step process rewards when process credit is on."""
    generated = np.concatenate([r.result.num_generated for r in first])
    # How the responses open (the share of each first token): where a warm start chooses a
    # strategy at its first token (configs/regime.py's effort), the decision RL moves.
    opens = collections.Counter(
      self.tokenizer.decode([int(r.result.tokens[n, r.result.prompt_len[n]])])
      for r in first
      for n in range(len(r.result.length))
      if r.result.num_generated[n] > 0
    )
    out = {
      "reward_mean": float(got.rewards.mean()),
      "accuracy": float((got.rewards > 0.5).mean()),
      "length_mean": float(generated.mean()),
      "length_median": float(np.median(generated)),
      "length_max": int(generated.max()),
      # The responses' commonest opening tokens and their shares, as JSON text (a plain
      # value for every sink): e.g. the effort choice an RL run should learn.
      "first_token_share": json.dumps(
        {t: round(c / max(sum(opens.values()), 1), 4) for t, c in opens.most_common(4)}
      ),
      "reward_errors": got.errors,
      "reward_timeouts": got.timeouts,
    }
    processes = [r.process for r in first if r.process is not None]
    if processes:
      out["step_reward_mean"] = pooled_step_reward(processes)
      out["step_reward_errors"] = self.process_credit.errors
    return out

  @contextlib.contextmanager
  def _profiled(self, step: int, spent: dict[str, float]):
    """Within: the profiler traces `step` where `profile_steps` names it (GRPOConfig); its
    start and stop seconds go into `spent["s"]`."""
    if step not in self.cfg.profile_steps:
      yield
      return
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # every Python call traced would slow the step
    path = os.path.join(self.workdir, "profile", f"step_{step}")
    t = time.perf_counter()
    jax.profiler.start_trace(path, create_perfetto_trace=True, profiler_options=options)
    spent["s"] = time.perf_counter() - t
    try:
      yield
    finally:
      t = time.perf_counter()
      jax.profiler.stop_trace()
      spent["s"] += time.perf_counter() - t

  def _update_metrics(self, m: dict[str, Any], update_s: float) -> dict[str, Any]:
    """The update's loss metrics (loss/...) and its throughput: every non-padding token of
    the packed rows (prompts and responses, each epoch), the model FLOPs they cost (6 x
    params a token, forward and backward) per second of the update's compute (programs
    compiled for new shapes left out), and the share of packed cells that are padding, of
    all rows and of the micro-batches computed."""
    update_compute = max(update_s - m.pop("compile_seconds"), 1e-9)
    real_tokens = m.pop("real_tokens")
    m.pop("rollout_logp_gap", None)
    return {
      **{f"loss/{k}": v for k, v in m.items()},
      "update/real_tokens": real_tokens,
      "update/model_tflops": (
        6.0 * self.num_params * real_tokens / update_compute / 1e12 if real_tokens else 0.0
      ),
      "update/padding_fraction": 1.0 - m.get("update_fill", 1.0),
      "update/computed_padding": 1.0 - m.get("update_computed_fill", 1.0),
    }

  def _rows(self, x: np.ndarray) -> jax.Array:
    """A batch array on the training devices, rows split over the mesh when there is one."""
    return jax.device_put(x, None if self.mesh is None else rows_sharding(self.mesh))

  def _optimize(self, samples: dict[str, np.ndarray], width: int) -> dict[str, float]:
    """epochs x mini_batches optimizer steps on one rollout batch (PPO-style).

    With no sample (no informative group) there is no optimizer step. Samples are
    reshuffled every epoch by a generator keyed on (seed, step), so a
    resumed run repeats them, and each mini-batch is packed into rows of `width`.
    Metrics: the first mini-batch's (its ratio is 1: the policy that sampled the
    batch) for the loss terms, with clip fractions, approx_kl, skips and grad
    norms averaged over all optimizer steps; update_rows / update_fill (share of
    the packed cells holding sample tokens) of all of them, update_computed_fill (that
    share of the micro-batches computed: those holding no sample are skipped); real_tokens (those
    tokens), compile_seconds (the update programs compiled for new shapes) and, on
    the on-policy path (`skip_old_logp`), rollout_logp_gap (the update forward's
    largest gap to the engine's log-probs), for `train_step` to report.
    """
    ucfg, n = self.update_cfg, len(samples["length"])
    if n == 0:  # dynamic sampling found no informative group: nothing to learn from
      return {"skipped": 0.0, "optimizer_steps": 0.0, "real_tokens": 0, "compile_seconds": 0.0}
    compiled = self.programs.compile_seconds
    if self.skip_old_logp:
      samples = {k: v for k, v in samples.items() if k != "old_logp"}
    elif not self.loss_cfg.tis_cap:  # the gap came from the old-log-prob pass (TIS needs it)
      samples = {k: v for k, v in samples.items() if k != "rollout_logp"}
    rng = np.random.default_rng([self.cfg.seed, self.step])
    rows, cells, computed, real = [], 0, 0, 0
    for _ in range(ucfg.epochs):
      perm = np.arange(n) if ucfg.mini_batches == 1 else rng.permutation(n)
      # Equal parts when the batch is full; a short (refill-limited) batch splits unevenly.
      for part in np.array_split(perm, ucfg.mini_batches):
        if not part.size:
          continue
        idx = np.sort(part)
        batch, plan = pack_policy_batch(
          **{"old_logp": None, **{k: v[idx] for k, v in samples.items()}},
          aggregation=self.loss_cfg.aggregation,
          width=width,
          row_multiple=ucfg.micro_batch,
          pow2_rows=ucfg.pow2_rows,
          min_rows=ucfg.min_rows,
        )
        cells += plan.num_rows * plan.width
        # Micro-batches holding no sample skip their forward and backward.
        computed += len(np.unique(plan.row // ucfg.micro_batch)) * ucfg.micro_batch * plan.width
        real += int(plan.length.sum())
        batch = {k: self._rows(v) for k, v in batch.items()}
        args = (self.params, self.opt_state, batch, self.ref_params)
        key = ("policy_update", batch["tokens"].shape)
        update = self.programs.get(
          key, self.update, args, donate_argnums=(0, 1), compiler_options=self.update_options
        )
        self.params, self.opt_state, m = update(*args)
        rows.append(m)
    rows = [{k: float(v) for k, v in r.items()} for r in jax.device_get(rows)]
    out = dict(rows[0])
    for k in ("clip_fraction_low", "clip_fraction_high", "clip_fraction_dual", "approx_kl"):
      if k in out:  # clip_fraction_dual: with rl_loss.clip_ratio_c only
        out[k] = float(np.mean([r[k] for r in rows]))
    out["grad_norm"] = float(np.mean([r["grad_norm"] for r in rows]))
    out["ratio_max"] = max(r["ratio_max"] for r in rows)
    if "rollout_logp_gap" in out:
      out["rollout_logp_gap"] = max(r["rollout_logp_gap"] for r in rows)
    out["skipped"] = float(sum(r["skipped"] for r in rows))
    out["optimizer_steps"] = float(len(rows))
    out["update_rows"] = float(cells // width)
    out["update_fill"] = float(real / cells)
    out["update_computed_fill"] = float(real / computed)
    out["real_tokens"] = real
    out["compile_seconds"] = self.programs.compile_seconds - compiled
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

  def run(
    self,
    progress: bool = True,
    *,
    until: int | None = None,
    evaluate: Callable[[GRPOTrainer], dict[str, Any]] | None = None,
  ) -> list[dict[str, Any]]:
    """Trains to `config.steps` (or to step `until`, e.g. one block of modes run in turn),
    resuming from the last checkpoint; returns this call's metrics. `evaluate(trainer)`
    replaces `self.evaluate` for the held-out evaluations (e.g. shared between runs whose
    parameters are equal)."""
    cfg = self.cfg
    until = cfg.steps if until is None else min(until, cfg.steps)
    evaluate = evaluate or (lambda trainer: trainer.evaluate())
    # The drafters' accept lengths on fixed held-out prompts (drafter_eval), on an engine
    # of their own built once per run; the warm start is the frozen drafter itself, or the
    # params the online one started from (a resumed run's scheduler keeps them too).
    acceptance, online, frozen = None, None, self.drafter_params
    if self.drafter_eval is not None and self.drafter_eval.every:
      if self.scheduler is not None:
        frozen = self.scheduler.initial_params
      if frozen is None:
        raise ValueError("drafter_eval needs a drafter: drafter_params or a scheduler")
      prompts = [self.tokenizer.encode(self.format_prompt(ex), add_bos=True) for ex in self.evals]
      acceptance = DrafterAcceptance(self.engine, prompts, self.drafter_eval, key=cfg.seed)
    rewards = RewardPool(self.reward_fn, workers=cfg.reward_workers, timeout_s=cfg.reward_timeout_s)
    history = []
    bar = tqdm(total=until, initial=self.step, desc="grpo", disable=not progress)
    log = MetricsLog(
      self.metrics_path,
      self.lengths_path,
      os.path.join(self.workdir, "tensorboard"),
      purge_step=self.step,
      config=self.metrics_config,
      timelines_path=self.timelines_path,
    )
    last_eval = {}
    try:
      # Every transfer into the loop's programs is explicit (GRPOConfig.transfer_guard).
      with jax.transfer_guard_host_to_device(cfg.transfer_guard):
        while self.step < until:
          t0, profiler = time.perf_counter(), {"s": 0.0}
          with self._profiled(self.step, profiler):
            row = self.train_step(rewards)
            self._finish_drafter_step(row)
          skipped = row.get("loss/skipped", 0.0) > 0
          t = time.perf_counter()
          if cfg.eval_every and self.step % cfg.eval_every == 0 or self.step == cfg.steps:
            row["eval"] = evaluate(self)
          if acceptance is not None and self.drafter_eval.due(self.step):
            # A measurement, not training: in time/eval, which step comparisons leave out.
            if self.scheduler is not None:
              online = self.scheduler.drafter.params
              row["drafter_eval/online_version"] = self.scheduler.drafter.version
            row.update(acceptance.compare(self.params, frozen, online))
          row["time/eval"] = time.perf_counter() - t
          t = time.perf_counter()
          # The last step is always saved (a skipped update left the params as they were).
          if self.step == cfg.steps or (not skipped and self.step % cfg.checkpoint_every == 0):
            self.save()
          row["time/checkpoint"] = time.perf_counter() - t
          row["time/step"] = time.perf_counter() - t0 - profiler["s"]
          if profiler["s"]:
            row["time/profiler"] = profiler["s"]
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
          bar.set_postfix(**progress_postfix(row), **last_eval)  # tok/s; accept, drafter: SD
    finally:
      bar.close()
      log.close()
      rewards.close()
      if self.checkpoints.drafter is not None:
        self.checkpoints.drafter.wait_until_finished()
    return history

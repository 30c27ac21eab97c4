"""The default job: warm start, held-out evaluation, long-tail rollout report.

`train_and_evaluate(config, workdir)` is the importable entry point; the CLI in
`tlt_jax.main` only parses flags. Everything it produces lands in `workdir`:
config.json, the warm-start checkpoint (reused on the next run), summary.json
and rollout.png (response-length distribution and active-batch timeline).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from tlt_jax import checkpoint, configuration
from tlt_jax.data import load_local_split, load_task_split
from tlt_jax.data.checkers import extract_marked_answer
from tlt_jax.data.tasks import format_prompt, sft_pairs
from tlt_jax.drafter import OnlineDrafter
from tlt_jax.drafter.export import save_drafter
from tlt_jax.evaluation import evaluate_pass_at_1
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.transformer import init_model
from tlt_jax.reporting import length_stats, plot_rl, plot_rollout
from tlt_jax.rl.rewards import with_format_reward
from tlt_jax.rl.trainer import PHASES, GRPOTrainer
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.scheduler import SliceScheduler
from tlt_jax.warmstart.drafter import collect_rollouts, fit_drafter
from tlt_jax.warmstart.sft import train_sft


def _load_data(config, workdir):
  data_dir = config.task.data_dir or os.path.join(workdir, "tfds")
  t = config.task
  if t.name == "local":  # rows from .jsonl / .parquet files (configuration.task_spec checked them)
    kwargs = dict(
      test_path=t.get("test_path") or None,
      test_fraction=t.get("test_fraction", 0.1),
      split_seed=t.seed,
      question_key=t.get("question_key", "question"),
      answer_key=t.get("answer_key", "answer"),
      solution_key=t.get("solution_key", "solution"),
    )
    return tuple(load_local_split(t.path, split, data_dir, **kwargs) for split in ("train", "test"))
  kwargs = dict(
    seed=config.task.seed,
    train_size=config.task.train_size,
    test_size=config.task.test_size,
    **config.task.params.to_dict(),
  )
  train = load_task_split(config.task.name, "train", data_dir, **kwargs)
  test = load_task_split(config.task.name, "test", data_dir, **kwargs)
  return train, test


def _check_init_from(config) -> str:
  init_from = config.sft.get("init_from", "")
  if init_from and not os.path.isdir(init_from):
    raise configuration.ConfigError(f"config.sft.init_from={init_from!r}: no such directory")
  return init_from


def build_policy(config, workdir, tokenizer, train, progress: bool = True, prompt=format_prompt):
  """The warm-started policy: restored from workdir if present, else SFT (or HF import);
  `prompt` renders an example's prompt text (the job's `configuration.prompt_format`)."""
  if config.model.checkpoint:
    from tlt_jax.models.hf_io import load_hf_checkpoint

    model_cfg, model = load_hf_checkpoint(
      config.model.checkpoint, dtype=config.model.dtype, param_dtype=config.model.param_dtype
    )
    graphdef, params = nnx.split(model)
    return model_cfg, graphdef, params, {"source": config.model.checkpoint}
  model_cfg = configuration.model_config(config, tokenizer)
  sft_cfg = configuration.sft_config(config)
  graphdef, params = nnx.split(init_model(model_cfg, seed=config.model.init_seed))
  ckpt_dir = os.path.join(workdir, "warm_start")
  if os.path.isdir(ckpt_dir):
    logging.info("restoring the warm-started policy from %s", ckpt_dir)
    return model_cfg, graphdef, checkpoint.restore_params(ckpt_dir, params), {"source": ckpt_dir}
  init_from = _check_init_from(config)
  if init_from:
    # SFT continues from another warm start of the same shapes (a policy that already
    # reads this kind of question learns a new format in far fewer tokens).
    logging.info("SFT starts from the policy in %s", init_from)
    params = checkpoint.restore_params(init_from, params)
  pairs = sft_pairs(
    train,
    config.sft.get("direct_answer_fraction", 0.0),
    seed=config.seed,
    unanswered_fraction=config.sft.get("unanswered_fraction", 0.0),
    prompt=prompt,
  )
  start = time.perf_counter()
  params, history = train_sft(graphdef, params, tokenizer, pairs, sft_cfg, progress=progress)
  seconds = time.perf_counter() - start
  checkpoint.save_params(ckpt_dir, params)
  info = {
    "source": "sft",
    "sft_init_from": init_from or None,
    "sft_seconds": seconds,
    "sft_steps": sft_cfg.steps,
    "final_loss": history[-1]["loss"],
    "final_token_accuracy": history[-1]["token_accuracy"],
  }
  return model_cfg, graphdef, params, info


def build_drafter(
  config,
  workdir,
  model_cfg,
  graphdef,
  params,
  engine,
  tokenizer,
  train,
  progress: bool = True,
  prompt=format_prompt,
) -> tuple[OnlineDrafter, dict[str, Any]]:
  """The EAGLE drafter's warm start for modes sd and tlt (reused from
  workdir/drafter_warm_start when present): `drafter.warmup_prompts` training
  prompts rolled out once by the warm-start policy (features captured), then
  `drafter.offline_steps` optax updates on them."""
  dcfg = configuration.drafter_config(config)
  dg, dp = nnx.split(init_drafter(model_cfg, seed=config.drafter.init_seed))
  drafter = OnlineDrafter(
    dg, dp, graphdef, dcfg, slots=engine.config.slots, feature_dim=model_cfg.d_model
  )
  path = os.path.join(workdir, "drafter_warm_start")
  if os.path.isdir(path):
    drafter.params = checkpoint.restore_params(path, dp)
    return drafter, {"source": path}
  start = time.perf_counter()
  # Prompts disjoint from the RL stream's first steps: drawn from the end of a fixed shuffle.
  order = np.random.default_rng(config.seed + 1).permutation(len(train))
  picks = order[-config.drafter.warmup_prompts :]
  prompts = [tokenizer.encode(prompt(train[int(i)]), add_bos=True) for i in picks]
  results = collect_rollouts(
    engine, params, prompts, key=10**6, seq_id_offset=10**8, progress=progress
  )
  for result in results:
    drafter.observe(result, step=0)
  rollout_s = time.perf_counter() - start
  fit_drafter(drafter, params, config.drafter.offline_steps, progress=progress)
  m = {k: float(v) for k, v in jax.device_get(drafter.last_metrics).items()}
  checkpoint.save_params(path, drafter.params)
  info = {
    "source": "trained",
    "rollout_seconds": rollout_s,
    "seconds": time.perf_counter() - start,
    "rows": len(drafter.buffer),
    "steps": config.drafter.offline_steps,
    "final_loss": m["loss"],
    "final_top1_agreement": m["top1_agreement"],
  }
  logging.info("drafter warm start: %s", info)
  return drafter, info


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, progress: bool = True
) -> dict[str, Any]:
  """Runs the default job and returns its summary (also written to workdir)."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  # Every config check before anything is built (the dataset, the warm start).
  checkpoint_dir = config.model.get("checkpoint", "")
  if checkpoint_dir and not os.path.isdir(checkpoint_dir):
    raise configuration.ConfigError(
      f"config.model.checkpoint={checkpoint_dir!r}: no such directory"
    )
  _check_init_from(config)
  tokenizer = configuration.tokenizer(config)
  task = configuration.task_spec(config)
  prompt = configuration.prompt_format(config, tokenizer)
  sampling = configuration.sampling_config(config)
  engine_cfg = configuration.engine_config(config, tokenizer)
  if config.rl.steps > 0:
    configuration.rl_configs(config)  # RL's fields too, before the data and the warm start
  mesh = configuration.mesh(config)
  configuration.train_mesh(config, mesh)  # parallel.fsdp / tensor, checked as early
  if checkpoint_dir and config.rl.steps and config.rl_update.learning_rate > 1e-3:
    raise configuration.ConfigError(
      f"config.rl_update.learning_rate={config.rl_update.learning_rate} on a checkpoint: the "
      "default config's RL settings are the toy task's (final norm only, lr 0.2); use "
      "configs/hf_grpo.py or set rl_update.learning_rate (<= 1e-3) and trainable"
    )
  train, test = _load_data(config, workdir)

  model_cfg, graphdef, params, warm = build_policy(
    config, workdir, tokenizer, train, progress, prompt=prompt
  )
  mode = configuration.mode(config)
  drafter = None
  if mode == "baseline":
    # No drafter reads hidden states: the rollout does not capture or copy them.
    engine_cfg = dataclasses.replace(engine_cfg, capture_hidden=False)
    engine = RolloutEngine(graphdef, model_cfg, engine_cfg, sampling, mesh=mesh)
  else:
    # The drafter's warm start rolls out with plain decode (there is no drafter yet).
    plain_cfg = dataclasses.replace(engine_cfg, spec_threshold=0)
    plain = RolloutEngine(graphdef, model_cfg, plain_cfg, sampling, mesh=mesh)
    drafter, drafter_info = build_drafter(
      config, workdir, model_cfg, graphdef, params, plain, tokenizer, train, progress, prompt
    )
    engine = RolloutEngine(
      graphdef,
      model_cfg,
      engine_cfg,
      sampling,
      plain.pool,
      drafter_graphdef=drafter.graphdef,
      mesh=mesh,
    )
  summary: dict[str, Any] = {"mode": mode, "model_params": model_cfg.num_params, "warm_start": warm}
  if config.get("reference"):  # the config's measured ranges, printed beside this run's figures
    summary["reference"] = config.reference.to_dict()
  if drafter is not None:
    summary["drafter_warm_start"] = drafter_info

  evals = [test[i] for i in range(min(config.eval.num_examples, len(test)))]
  start = time.perf_counter()
  summary["eval"] = evaluate_pass_at_1(engine, params, tokenizer, evals, task.check, prompt)
  k = int(config.rl.get("eval_samples", 0))
  if k:  # the trainer's protocol: same problems, k samples at the rollout temperature, same key
    summary["eval"]["sampled_accuracy"] = evaluate_pass_at_1(
      engine,
      params,
      tokenizer,
      evals,
      task.check,
      prompt,
      sampling=sampling,
      num_samples=k,
      key=int(config.seed),
    )["accuracy"]
  summary["eval"]["seconds"] = time.perf_counter() - start

  if config.rl.steps > 0:
    params, summary["rl"] = _reinforce(
      config,
      workdir,
      graphdef,
      params,
      engine,
      tokenizer,
      train,
      test,
      task,
      drafter,
      progress,
      prompt,
    )
  drafter_params = None if drafter is None else drafter.params
  if drafter is not None:
    export = save_drafter(
      os.path.join(workdir, "drafter"),
      drafter.params,
      model_cfg,
      mode=mode,
      version=drafter.version,
    )
    summary["drafter_export"] = str(export)

  if config.rollout.num_prompts == 0:  # no closing rollout report
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
    return summary
  # The long-tail rollout: G samples per prompt from the train split.
  rng = np.random.default_rng(config.seed)
  picks = rng.choice(len(train), config.rollout.num_prompts, replace=False)
  prompts = [tokenizer.encode(prompt(train[int(i)]), add_bos=True) for i in picks]
  # No warm-up: compiling every (batch x cache) program up front cost far more than the
  # default job's short closing rollout. Programs the RL loop left in the pool are reused, the rest
  # compile lazily, and their seconds are kept out of the reported throughput.
  compiles, compile_s = engine.pool.compiles, engine.pool.compile_seconds
  result = engine.generate(
    params,
    prompts,
    config.rollout.num_samples,
    key=jax.random.key(config.seed),
    drafter_params=drafter_params,
  )
  rewards = [
    task.check(
      tokenizer.decode(result.completion(n)),
      train[int(picks[n // config.rollout.num_samples])]["answer"],
    )
    for n in range(len(result.length))
  ]
  compiled_s = engine.pool.compile_seconds - compile_s
  summary["rollout"] = {
    "sequences": len(result.length),
    "generated_tokens": int(result.num_generated.sum()),
    "wall_seconds": result.wall_seconds,
    "compile_seconds": compiled_s,
    "tokens_per_second": int(result.num_generated.sum()) / (result.wall_seconds - compiled_s),
    "lengths": length_stats(result.num_generated),
    "mean_reward": float(np.mean(rewards)),
    "chunks": sum(e["phase"] == "decode" for e in result.timeline),
    "batch_buckets_used": sorted({e["batch"] for e in result.timeline}, reverse=True),
    "executables": engine.pool.compiles,
    "executable_temp_MB": sum(r["temp_bytes"] or 0 for r in engine.pool.summary()) / 2**20,
    "compiled_during_rollout": engine.pool.compiles - compiles,
  }
  if drafter is not None:
    summary["rollout"]["spec"] = result.spec_summary()
  with open(os.path.join(workdir, "executables.json"), "w") as f:
    json.dump(engine.pool.summary(), f, indent=1)
  plot_rollout(result, os.path.join(workdir, "rollout.png"))
  with open(os.path.join(workdir, "timeline.json"), "w") as f:
    json.dump(result.timeline, f)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  return summary


def _step_reward_fn(task, process_credit: str):
  """The task's per-step checker on an example's question (process supervision), or None."""
  if not process_credit:
    return None
  if task.steps is None:
    raise ValueError(
      f"rl.process_credit={process_credit!r}, but task {task.name!r} has no step checker"
    )
  return lambda example, completion: task.steps(example["question"], completion)


def _reinforce(
  config, workdir, graphdef, params, engine, tokenizer, train, test, task, drafter, progress, prompt
):
  """GRPO/DAPO from the warm start; resumes from workdir/checkpoints if present.

  Mode sd rolls out with the warm-start drafter, frozen; mode tlt hands it to a
  `SliceScheduler` that trains it on in idle slices."""
  rl_cfg, loss_cfg, update_cfg = configuration.rl_configs(config)
  reward = with_format_reward(
    task.check, extract_marked_answer, float(config.rl.get("format_reward", 0.0))
  )
  rollout_mesh = engine.placement.mesh if engine.placement is not None else None
  train_mesh = configuration.train_mesh(config, rollout_mesh)
  trainer = GRPOTrainer(
    graphdef,
    params,
    engine,
    tokenizer,
    train,
    [test[i] for i in range(min(rl_cfg.eval_examples, len(test)))],
    reward,
    prompt,
    rl_cfg,
    loss_cfg,
    update_cfg,
    workdir,
    eval_check=task.check,
    drafter_params=drafter.params if configuration.mode(config) == "sd" else None,
    scheduler=(
      SliceScheduler(
        drafter,
        configuration.scheduler_config(config),
        placement=engine.placement,
        batch_buckets=engine.config.batch_buckets,
      )
      if configuration.mode(config) == "tlt"
      else None
    ),
    mesh=train_mesh,
    step_reward_fn=_step_reward_fn(task, rl_cfg.process_credit),
    shard_params=train_mesh is not None and train_mesh is not rollout_mesh,
  )
  warm_s = 0.0
  if config.rl.get("warmup_engine", False):
    # Compile every rollout program first, so step times compare modes, not compiles.
    warm_s = engine.warmup(
      trainer.params,
      num_prompts=[rl_cfg.prompts_per_step],
      num_samples=rl_cfg.group_size,
      drafter_params=None if drafter is None else drafter.params,
    )
  start = time.perf_counter()
  trainer.run(progress=progress)
  seconds = time.perf_counter() - start
  with open(trainer.metrics_path) as f:
    rows = [json.loads(line) for line in f]
  plot_rl(rows, os.path.join(workdir, "rl.png"))
  phases = (*PHASES, "other", "step")
  mean = {p: float(np.mean([r.get(f"time/{p}", 0.0) for r in rows])) for p in phases}
  evals = [r for r in rows if "eval" in r]
  out = {
    "steps": len(rows),
    "seconds_this_run": seconds,
    "engine_warmup_seconds": warm_s,
    "final_eval": evals[-1]["eval"] if evals else None,
    "reward_first_last": [rows[0]["reward_mean"], rows[-1]["reward_mean"]],
    "mean_phase_seconds": mean,
    "rollout_share": mean["rollout"] / mean["step"],
    "update_tokens_per_second": float(
      np.sum([r["update_tokens"] for r in rows]) / np.sum([r["time/update"] for r in rows])
    ),
    "skipped_updates": int(sum(r["loss/skipped"] > 0 for r in rows)),
  }
  accept = [r["spec/accept_length"] for r in rows if "spec/accept_length" in r]
  if accept:
    out["accept_length_first_last"] = [accept[0], accept[-1]]
  if trainer.scheduler is not None:
    out["drafter_updates"] = int(sum(r["drafter/updates"] for r in rows))
    out["drafter_reclaimed_seconds"] = float(sum(r["drafter/reclaimed_s"] for r in rows))
    out["drafter_rollout_charged_seconds"] = float(
      sum(r["drafter/rollout_charged_s"] for r in rows)
    )
  return trainer.params, out

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
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from tlt_jax import checkpoint, configuration
from tlt_jax.data import load_local_split, load_task_split
from tlt_jax.data.tasks import format_prompt, sft_pairs
from tlt_jax.drafter import OnlineDrafter
from tlt_jax.drafter.export import save_drafter
from tlt_jax.evaluation import evaluate_pass_at_1
from tlt_jax.export import export_job
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.transformer import init_model
from tlt_jax.reporting import length_stats, plot_rl, plot_rollout
from tlt_jax.rl.metrics import metrics_config
from tlt_jax.rl.rewards import job_reward
from tlt_jax.rl.trainer import PHASES, GRPOTrainer
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.scheduler import SliceScheduler
from tlt_jax.warmstart.drafter import collect_rollouts, fit_drafter
from tlt_jax.warmstart.sft import train_sft


def load_data(config, workdir):
  """The task's train and test splits (tfds under workdir/tfds unless task.data_dir)."""
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

    try:
      model_cfg, model = load_hf_checkpoint(
        config.model.checkpoint, dtype=config.model.dtype, param_dtype=config.model.param_dtype
      )
    except (OSError, ValueError) as e:
      # What `configuration.checkpoint` cannot see without reading the weights (a bias
      # the model lacks holding nonzeros, an untied head that differs): the user's to fix.
      raise configuration.ConfigError(
        f"config.model.checkpoint={config.model.checkpoint!r}: "
        + "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
      ) from None
    graphdef, params = nnx.split(model)
    return model_cfg, graphdef, params, {"source": config.model.checkpoint}
  model_cfg = configuration.model_config(config, tokenizer)
  sft_cfg = configuration.sft_config(config)
  graphdef, params = nnx.split(init_model(model_cfg, seed=config.model.init_seed))
  ckpt_dir = os.path.join(workdir, "warm_start")
  if os.path.isdir(ckpt_dir):
    logging.info("restoring the warm-started policy from %s", ckpt_dir)
    try:
      params = checkpoint.restore_params(ckpt_dir, params)
    except ValueError as e:  # the workdir's warm start is another config's model
      raise configuration.ConfigError(
        f"{e}: config.model differs from the run that made it; use another --workdir"
      ) from None
    return model_cfg, graphdef, params, {"source": ckpt_dir}
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
  `drafter.offline_steps` optax updates on them.

  The drafter returned holds the warm start's parameters and nothing else of the fit (a
  new optimizer state at the online settings, `configuration.drafter_config`, an empty
  buffer, version 0), whether the warm start was fitted here or restored: a run trains
  on from it the same way either way. Carrying the fit's optimizer state on instead cost
  accept length in the first online updates (experiments/drafter_online_start.py)."""
  dg, dp = nnx.split(init_drafter(model_cfg, seed=config.drafter.init_seed))
  path = os.path.join(workdir, "drafter_warm_start")
  info: dict[str, Any] = {"source": path}
  sizes = {"slots": engine.config.slots, "feature_dim": model_cfg.d_model}
  if not os.path.isdir(path):
    fit_cfg = configuration.drafter_config(config, online=False)
    fit = OnlineDrafter(dg, dp, fit_cfg, **sizes)
    info = _fit_drafter_warm_start(
      config, fit, params, engine, tokenizer, train, progress, prompt, path
    )
  restored = checkpoint.restore_params(path, dp)
  return OnlineDrafter(dg, restored, configuration.drafter_config(config), **sizes), info


def _fit_drafter_warm_start(
  config, drafter: OnlineDrafter, params, engine, tokenizer, train, progress, prompt, path
) -> dict[str, Any]:
  """Fits `drafter` on the warm-start policy's rollouts of `drafter.warmup_prompts`
  training prompts and saves its parameters to `path`; returns what the fit measured."""
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
  return info


@dataclasses.dataclass
class Job:
  """A run's parts before RL, as `prepare` builds them from a config and a workdir."""

  config: ml_collections.ConfigDict
  workdir: str
  mode: str
  tokenizer: Any
  task: Any  # data.tasks.TaskSpec
  prompt: Any  # example -> prompt text
  sampling: Any  # decode.sampling.SamplingConfig
  train: Any  # the training split (random access)
  test: Any
  model_cfg: Any
  graphdef: nnx.GraphDef
  params: nnx.State
  warm: dict[str, Any]
  engine: RolloutEngine
  drafter: OnlineDrafter | None = None
  drafter_info: dict[str, Any] | None = None


def prepare(config: ml_collections.ConfigDict, workdir: str, progress: bool = True) -> Job:
  """Checks the config and the files it names, then builds the data, the warm-started
  policy, the rollout engine and (modes sd and tlt) the drafter's warm start; reused from
  `workdir` when there.

  Every check (`configuration.job_inputs`: fields, checkpoint, data rows, reference
  answers) comes before the first write, so a run that fails one leaves the workdir byte
  for byte as it was (a finished run's config.json and summary included).
  """
  inputs = configuration.job_inputs(config)
  devices = inputs.mesh.devices.size if inputs.mesh is not None else 1
  capacity = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
  warning = configuration.memory_warning(config, inputs.model, devices, capacity)
  if warning:
    logging.warning("%s", warning)
  # Warm starts are reused from the workdir by name only: refuse another recipe's.
  configuration.check_same_recipe(config, workdir, configuration.OTHER_WORKDIR)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  tokenizer, prompt, sampling = inputs.tokenizer, inputs.prompt, inputs.sampling
  task, engine_cfg, mesh = inputs.task, inputs.engine, inputs.mesh
  train, test = load_data(config, workdir)

  model_cfg, graphdef, params, warm = build_policy(
    config, workdir, tokenizer, train, progress, prompt=prompt
  )
  mode = inputs.mode
  drafter = drafter_info = None
  if mode == "baseline":
    # No drafter reads hidden states: the rollout does not capture or copy them.
    engine_cfg = dataclasses.replace(engine_cfg, capture_hidden=False)
    engine = RolloutEngine(graphdef, model_cfg, engine_cfg, sampling, mesh=mesh)
  else:
    # The drafter's warm start rolls out with plain decode (there is no drafter yet).
    plain_cfg = dataclasses.replace(engine_cfg, spec_threshold=0)
    plain = RolloutEngine(graphdef, model_cfg, plain_cfg, sampling, mesh=mesh)
    drafter, drafter_info = build_drafter(
      config, workdir, model_cfg, params, plain, tokenizer, train, progress, prompt
    )
    # Only the online drafter (tlt) trains on the rollouts' hidden states: in sd they stay
    # on the device, where the drafter's cache is rebuilt from them.
    # It receives them in its buffer's dtype, cast on the device (half the bytes to copy).
    engine_cfg = dataclasses.replace(
      engine_cfg, harvest_hidden=mode == "tlt", harvest_dtype=drafter.config.buffer_dtype
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
  return Job(
    config, workdir, mode, tokenizer, task, prompt, sampling, train, test, model_cfg,
    graphdef, params, warm, engine, drafter, drafter_info,
  )  # fmt: skip


def evaluate_warm_start(job: Job) -> dict[str, Any]:
  """Held-out pass@1 of the warm start: greedy, and sampled as the trainer measures it."""
  config = job.config
  evals = [job.test[i] for i in range(min(config.eval.num_examples, len(job.test)))]
  start = time.perf_counter()
  args = (job.engine, job.params, job.tokenizer, evals, job.task.check, job.prompt)
  out = evaluate_pass_at_1(*args)
  k = int(config.rl.get("eval_samples", 0))
  if k:  # the trainer's protocol: same problems, k samples at the rollout temperature, same key
    out["sampled_accuracy"] = evaluate_pass_at_1(
      *args, sampling=job.sampling, num_samples=k, key=int(config.seed)
    )["accuracy"]
  out["seconds"] = time.perf_counter() - start
  return out


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, progress: bool = True
) -> dict[str, Any]:
  """Runs the default job and returns its summary (also written to workdir): `prepare`,
  the warm start's evaluation, RL (`make_trainer`, `reinforce`), the drafter's export and
  the closing long-tail rollout (`closing_rollout`)."""
  job = prepare(config, workdir, progress)
  summary: dict[str, Any] = {
    "mode": job.mode,
    "model_params": job.model_cfg.num_params,
    "warm_start": job.warm,
  }
  if config.get("reference"):  # the config's measured ranges, printed beside this run's figures
    summary["reference"] = config.reference.to_dict()
  if job.drafter is not None:
    summary["drafter_warm_start"] = job.drafter_info
  summary["eval"] = evaluate_warm_start(job)

  params = job.params
  if config.rl.steps > 0:
    trainer = make_trainer(job)
    # Where RL starts (a rerun resumes from its last checkpoint, or starts over and drops
    # what a killed run left): in the log, and beside the progress bars.
    note = trainer.checkpoints.start_note(config.rl.steps)
    logging.info("%s", note)
    if progress:
      print(note, file=sys.stderr, flush=True)
    summary["rl"] = reinforce(job, trainer, progress)
    summary["rl"]["resumed_at_step"] = trainer.checkpoints.resumed_at
    params = trainer.params
  if config.get("export") and config.export.dir:  # the policy as a Hugging Face directory
    summary["export"] = export_job(job, params)
  drafter_params = None if job.drafter is None else job.drafter.params
  if job.drafter is not None:
    export = save_drafter(
      os.path.join(workdir, "drafter"),
      job.drafter.params,
      job.model_cfg,
      mode=job.mode,
      version=job.drafter.version,
    )
    summary["drafter_export"] = str(export)
  if config.rollout.num_prompts > 0:
    summary["rollout"] = closing_rollout(job, params, drafter_params)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  return summary


def closing_rollout(job: Job, params: nnx.State, drafter_params: nnx.State | None) -> dict:
  """The long-tail rollout report: G samples of `rollout.num_prompts` training prompts;
  writes rollout.png, timeline.json and executables.json to the workdir."""
  config, engine, tokenizer, workdir = job.config, job.engine, job.tokenizer, job.workdir
  rng = np.random.default_rng(config.seed)
  picks = rng.choice(len(job.train), config.rollout.num_prompts, replace=False)
  prompts = [tokenizer.encode(job.prompt(job.train[int(i)]), add_bos=True) for i in picks]
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
    job.task.check(
      tokenizer.decode(result.completion(n)),
      job.train[int(picks[n // config.rollout.num_samples])]["answer"],
    )
    for n in range(len(result.length))
  ]
  compiled_s = engine.pool.compile_seconds - compile_s
  out = {
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
  if drafter_params is not None:
    out["spec"] = result.spec_summary()
  with open(os.path.join(workdir, "executables.json"), "w") as f:
    json.dump(engine.pool.summary(), f, indent=1)
  plot_rollout(result, os.path.join(workdir, "rollout.png"))
  with open(os.path.join(workdir, "timeline.json"), "w") as f:
    json.dump(result.timeline, f)
  return out


def _step_reward_fn(task, process_credit: str):
  """The task's per-step checker on an example's question (process supervision), or None."""
  if not process_credit:
    return None
  if task.steps is None:
    raise ValueError(
      f"rl.process_credit={process_credit!r}, but task {task.name!r} has no step checker"
    )
  return lambda example, completion: task.steps(example["question"], completion)


def make_trainer(job: Job) -> GRPOTrainer:
  """The GRPO/DAPO trainer from the warm start; it resumes from workdir/checkpoints if
  present. Mode sd rolls out with the warm-start drafter, frozen; mode tlt hands it to a
  `SliceScheduler` that trains it on in idle slices."""
  config, engine = job.config, job.engine
  rl_cfg, loss_cfg, update_cfg = configuration.rl_configs(config)
  reward = job_reward(config.rl, job.task.check)  # rl.rewards' terms, or checker + format bonus
  rollout_mesh = engine.placement.mesh if engine.placement is not None else None
  train_mesh = configuration.train_mesh(config, rollout_mesh)
  scheduler = None
  if job.mode == "tlt":
    scheduler = SliceScheduler(
      job.drafter,
      configuration.scheduler_config(config),
      placement=engine.placement,
      batch_buckets=engine.config.batch_buckets,
    )
  return GRPOTrainer(
    job.graphdef,
    job.params,
    engine,
    job.tokenizer,
    job.train,
    [job.test[i] for i in range(min(rl_cfg.eval_examples, len(job.test)))],
    reward,
    job.prompt,
    rl_cfg,
    loss_cfg,
    update_cfg,
    job.workdir,
    eval_check=job.task.check,
    drafter_params=job.drafter.params if job.mode == "sd" else None,
    scheduler=scheduler,
    drafter_eval=configuration.drafter_eval_config(config) if job.mode != "baseline" else None,
    mesh=train_mesh,
    step_reward_fn=_step_reward_fn(job.task, rl_cfg.process_credit),
    shard_params=train_mesh is not None and train_mesh is not rollout_mesh,
    metrics=metrics_config(config),  # W&B / MLflow (config.metrics.loggers)
  )


def reinforce(job: Job, trainer: GRPOTrainer, progress: bool = True) -> dict[str, Any]:
  """Trains to `rl.steps` (compiling every rollout program first with
  `rl.warmup_engine`); writes rl.png and returns the RL summary."""
  config, engine, drafter = job.config, job.engine, job.drafter
  warm_s = 0.0
  if config.rl.get("warmup_engine", False):
    # Compile every rollout program first, so step times compare modes, not compiles.
    warm_s = engine.warmup(
      trainer.params,
      num_prompts=[trainer.cfg.prompts_per_step],
      num_samples=trainer.cfg.group_size,
      drafter_params=None if drafter is None else drafter.params,
    )
  start = time.perf_counter()
  trainer.run(progress=progress)
  seconds = time.perf_counter() - start
  out = rl_summary(trainer.metrics_path)
  out["seconds_this_run"] = seconds
  out["engine_warmup_seconds"] = warm_s
  plot_rl(_read_rows(trainer.metrics_path), os.path.join(job.workdir, "rl.png"))
  return out


def _read_rows(metrics_path: str) -> list[dict[str, Any]]:
  with open(metrics_path) as f:
    return [json.loads(line) for line in f]


def rl_summary(metrics_path: str) -> dict[str, Any]:
  """A run's RL figures from its metrics.jsonl: phase means, final evaluation, rollout
  share, update throughput, and the drafter's figures in mode tlt."""
  rows = _read_rows(metrics_path)
  phases = (*PHASES, "other", "step")
  mean = {p: float(np.mean([r.get(f"time/{p}", 0.0) for r in rows])) for p in phases}
  evals = [r for r in rows if "eval" in r]
  out = {
    "steps": len(rows),
    "final_eval": evals[-1]["eval"] if evals else None,
    "reward_first_last": [rows[0]["reward_mean"], rows[-1]["reward_mean"]],
    "mean_phase_seconds": mean,
    "rollout_share": mean["rollout"] / mean["step"],
    "update_tokens_per_second": float(
      np.sum([r["update_tokens"] for r in rows]) / np.sum([r["time/update"] for r in rows])
    ),
    "skipped_updates": int(sum(r["loss/skipped"] > 0 for r in rows)),
    # Steps that took no optimizer step: dynamic sampling (DAPO) drops every group whose
    # rewards are all equal, and a batch of only such groups leaves nothing to learn from.
    # They count as steps all the same, so the summary says how many there were.
    "steps_without_update": int(sum(r.get("loss/optimizer_steps", 1) == 0 for r in rows)),
    "optimizer_steps": int(sum(r.get("loss/optimizer_steps", 0) for r in rows)),
  }
  accept = [r["spec/accept_length"] for r in rows if "spec/accept_length" in r]
  if accept:
    out["accept_length_first_last"] = [accept[0], accept[-1]]
  if any("drafter/updates" in r for r in rows):
    out["drafter_updates"] = int(sum(r.get("drafter/updates", 0) for r in rows))
    out["drafter_reclaimed_seconds"] = float(sum(r.get("drafter/reclaimed_s", 0) for r in rows))
    out["drafter_rollout_charged_seconds"] = float(
      sum(r.get("drafter/rollout_charged_s", 0) for r in rows)
    )
  return out

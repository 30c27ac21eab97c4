"""ConfigDict at the edge, frozen dataclasses inside: conversion with clear errors.

The one place where a job's config (configs/*.py, an ml_collections ConfigDict) meets
the library's configs. Each library config is a frozen dataclass that validates itself,
defined next to the code it configures and re-exported here:

  job section          dataclass            defined in
  config.model         ModelConfig          tlt_jax/models/config.py
  config.sampling      SamplingConfig       tlt_jax/decode/sampling.py
  config.engine        EngineConfig         tlt_jax/rollout/config.py
  config.sft           SFTConfig            tlt_jax/warmstart/sft.py
  config.drafter       DrafterTrainConfig   tlt_jax/drafter/online.py
  config.scheduler     SchedulerConfig      tlt_jax/scheduler/slices.py
  config.rl            GRPOConfig           tlt_jax/rl/trainer.py
  config.rl.drafter_eval_*  DrafterEvalConfig  tlt_jax/drafter/acceptance.py
  config.rl_loss       PolicyLossConfig     tlt_jax/rl/loss.py
  config.rl_update     UpdateConfig         tlt_jax/rl/update.py

Each converter names the config section in its error, so a bad override like
`--config.sampling.top_p=2` fails with "config.sampling: top_p must be in
(0, 1]" before anything is built or compiled.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, TypeVar

import jax
import ml_collections
from jax.sharding import Mesh

from tlt_jax.data.prompts import PromptFormat
from tlt_jax.data.tasks import TaskSpec, get_task, local_task, resolve_checker
from tlt_jax.data.tokenizer import Tokenizer, get_tokenizer
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.drafter.acceptance import DrafterEvalConfig
from tlt_jax.drafter.online import DrafterTrainConfig
from tlt_jax.models.config import ModelConfig
from tlt_jax.parallel.meshes import data_mesh
from tlt_jax.parallel.sharding import training_mesh
from tlt_jax.rl.loss import PolicyLossConfig
from tlt_jax.rl.trainer import GRPOConfig
from tlt_jax.rl.update import UpdateConfig
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.scheduler import SchedulerConfig
from tlt_jax.warmstart.sft import SFTConfig

__all__ = [
  "ConfigError",
  "DrafterEvalConfig",
  "DrafterTrainConfig",
  "EngineConfig",
  "GRPOConfig",
  "ModelConfig",
  "PolicyLossConfig",
  "SFTConfig",
  "SamplingConfig",
  "SchedulerConfig",
  "UpdateConfig",
  "drafter_config",
  "drafter_eval_config",
  "engine_config",
  "mesh",
  "mode",
  "model_config",
  "prompt_format",
  "rl_configs",
  "sampling_config",
  "scheduler_config",
  "sft_config",
  "task_spec",
  "to_dataclass",
  "tokenizer",
  "train_mesh",
]

T = TypeVar("T")


class ConfigError(ValueError):
  """A config field with a bad value: the CLI prints the message alone (it names the field
  and what is allowed), without a traceback."""


def to_dataclass(
  cls: type[T],
  section: ml_collections.ConfigDict,
  name: str,
  ignore: tuple[str, ...] = (),
  **extra: Any,
) -> T:
  """Builds `cls` from a config section; unknown or invalid fields fail with its name."""
  fields = {f.name for f in dataclasses.fields(cls)}
  values = {k: v for k, v in section.to_dict().items() if k not in ignore}
  unknown = set(values) - fields
  if unknown:
    raise ConfigError(f"config.{name}: unknown field(s) {sorted(unknown)}; valid: {sorted(fields)}")
  try:
    return cls(**values, **extra)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.{name}: {e}") from e


def model_config(config: ml_collections.ConfigDict, tokenizer: Tokenizer) -> ModelConfig:
  mc = to_dataclass(ModelConfig, config.model, "model", ignore=("init_seed", "checkpoint"))
  if mc.vocab_size < tokenizer.vocab_size:
    raise ConfigError(
      f"config.model.vocab_size={mc.vocab_size} is smaller than the "
      f"tokenizer's vocabulary ({tokenizer.vocab_size})"
    )
  return mc


def tokenizer(config: ml_collections.ConfigDict) -> Tokenizer:
  """config.task.tokenizer ("char" or a directory); "" is the checkpoint's own."""
  name = config.task.tokenizer or config.model.get("checkpoint", "")
  if not name:
    raise ConfigError(
      "config.task.tokenizer is empty and there is no config.model.checkpoint to take it from"
    )
  try:
    return get_tokenizer(name)
  except (ValueError, FileNotFoundError) as e:
    raise ConfigError(f"config.task.tokenizer: {e}") from None


def task_spec(config: ml_collections.ConfigDict) -> TaskSpec:
  """The job's task: a synthetic one by name, or "local" (rows from config.task.path, scored
  by config.task.checker, GSM8K's by default). A checker named for a synthetic task replaces
  its own. Data files are checked here, before anything is built."""
  t = config.task
  checker = t.get("checker", "")
  if t.name == "local":
    if not t.get("path", ""):
      raise ConfigError(
        "config.task.name='local' needs config.task.path (a .jsonl or .parquet file)"
      )
    for key in ("path", "test_path"):
      path = t.get(key, "")
      if path and not os.path.isfile(path):
        raise ConfigError(f"config.task.{key}={path!r}: no such file")
      if path and not path.lower().endswith((".jsonl", ".parquet")):
        raise ConfigError(f"config.task.{key}={path!r}: expected a .jsonl or .parquet file")
    if config.rl.get("format_reward", 0.0):
      raise ConfigError(
        "config.rl.format_reward rewards the synthetic tasks' '#answer' format only"
      )
    try:
      return local_task(checker or "gsm8k")
    except ValueError as e:
      raise ConfigError(f"config.task.checker: {e}") from None
  try:
    task = get_task(t.name)
  except ValueError as e:
    raise ConfigError(f"config.task.name: {e} ('local': rows from config.task.path)") from None
  if checker:
    try:
      task = dataclasses.replace(task, check=resolve_checker(checker))
    except ValueError as e:
      raise ConfigError(f"config.task.checker: {e}") from None
  return task


def prompt_format(config: ml_collections.ConfigDict, tokenizer: Tokenizer) -> PromptFormat:
  """How an example becomes prompt text: config.task.prompt_format "plain" (the question) or
  "chat" (the tokenizer's chat template, with config.task.system_prompt)."""
  t = config.task
  try:
    return PromptFormat.for_tokenizer(
      t.get("prompt_format", "plain"), tokenizer, t.get("system_prompt", "")
    )
  except ValueError as e:
    raise ConfigError(f"config.task: {e}") from None


MODES = ("baseline", "sd", "tlt")


def mode(config: ml_collections.ConfigDict) -> str:
  """The training mode: baseline (no SD), sd (frozen drafter), tlt (online drafter)."""
  m = config.get("mode", "baseline")
  if m not in MODES:
    raise ConfigError(f"config.mode must be one of {MODES}, got {m!r}")
  return m


def engine_config(config: ml_collections.ConfigDict, tokenizer: Tokenizer) -> EngineConfig:
  """The engine; speculative decoding (engine.spec_threshold) only outside baseline mode."""
  stops = tuple(getattr(tokenizer, "eos_ids", (tokenizer.eos_id,)))
  engine = to_dataclass(EngineConfig, config.engine, "engine", stop_tokens=stops)
  if mode(config) == "baseline":
    return dataclasses.replace(engine, spec_threshold=0)
  if not engine.spec_threshold:
    raise ConfigError(f"config.mode={mode(config)!r} needs config.engine.spec_threshold > 0")
  return engine


def drafter_config(config: ml_collections.ConfigDict) -> DrafterTrainConfig:
  # warmup_prompts / offline_steps are the drafter's warm start (train.build_drafter).
  return to_dataclass(
    DrafterTrainConfig,
    config.drafter,
    "drafter",
    ignore=("warmup_prompts", "offline_steps", "init_seed"),
    seed=int(config.seed),
  )


def scheduler_config(config: ml_collections.ConfigDict) -> SchedulerConfig:
  return to_dataclass(SchedulerConfig, config.scheduler, "scheduler")


# config.rl fields of the drafter evaluation (`DrafterEvalConfig`), not of the RL loop.
DRAFTER_EVAL_FIELDS = {
  "drafter_eval_every": "every",
  "drafter_eval_prompts": "prompts",
  "drafter_eval_strategy": "strategy",
}


def drafter_eval_config(config: ml_collections.ConfigDict) -> DrafterEvalConfig:
  """The accept-length comparison of the online and the warm-start drafter during RL
  (config.rl.drafter_eval_every / _prompts / _strategy; modes sd and tlt)."""
  values = {f: config.rl[k] for k, f in DRAFTER_EVAL_FIELDS.items() if k in config.rl}
  try:
    return DrafterEvalConfig(**values)
  except ValueError as e:
    # Named by the job's field, not the dataclass's.
    msg = str(e)
    for k, f in DRAFTER_EVAL_FIELDS.items():
      msg = msg.replace(f"DrafterEvalConfig.{f} ", f"config.rl.{k} ")
    raise ConfigError(msg) from e


def train_mesh(config: ml_collections.ConfigDict, rollout_mesh: Mesh | None) -> Mesh | None:
  """The policy update's mesh: the rollout's devices as ("data", "tensor") with
  `parallel.tensor` devices per tensor group when `parallel.fsdp` or tensor > 1 (params
  then sharded: `parallel.sharding.TRAIN_RULES`), else the rollout mesh itself."""
  par = config.get("parallel", {})
  fsdp, tensor = par.get("fsdp", False), par.get("tensor", 1)
  if not isinstance(tensor, int) or tensor < 1:
    raise ConfigError(f"config.parallel.tensor must be a positive int, got {tensor!r}")
  if not (fsdp or tensor > 1):
    return rollout_mesh
  if rollout_mesh is None:
    raise ConfigError("config.parallel.fsdp / tensor need config.parallel.devices > 1 (or 0)")
  devices = list(rollout_mesh.devices.flat)
  if len(devices) % tensor:
    raise ConfigError(f"config.parallel.tensor={tensor} does not divide the {len(devices)} devices")
  return training_mesh(devices, tensor)


def mesh(config: ml_collections.ConfigDict) -> Mesh | None:
  """The rollout mesh over `parallel.devices` devices (0: all; 1: none): rows split over
  "data", and with `parallel.rollout_tensor` > 1 a ("data", "tensor") mesh whose tensor
  groups of that many devices split the weights (`parallel.sharding.ROLLOUT_RULES`)."""
  par = config.get("parallel", {})
  n, tensor = par.get("devices", 1), par.get("rollout_tensor", 1)
  available = jax.devices()
  if not isinstance(n, int) or n < 0 or n > len(available):
    raise ConfigError(
      f"config.parallel.devices must be an int in [0, {len(available)}] (0: all), got {n!r}"
    )
  n = n or len(available)
  if not isinstance(tensor, int) or tensor < 1 or n % tensor:
    raise ConfigError(
      f"config.parallel.rollout_tensor must be a positive int dividing the {n} devices, "
      f"got {tensor!r}"
    )
  if n == 1:
    return None
  return training_mesh(available[:n], tensor) if tensor > 1 else data_mesh(available[:n])


def sampling_config(config: ml_collections.ConfigDict) -> SamplingConfig:
  return to_dataclass(SamplingConfig, config.sampling, "sampling")


def sft_config(config: ml_collections.ConfigDict) -> SFTConfig:
  # The answer fractions and the starting policy are the data recipe and the initial
  # params (train.build_policy), not the optimizer's.
  return to_dataclass(
    SFTConfig,
    config.sft,
    "sft",
    ignore=("direct_answer_fraction", "unanswered_fraction", "init_from"),
    seed=int(config.seed),
  )


def rl_configs(
  config: ml_collections.ConfigDict,
) -> tuple[GRPOConfig, PolicyLossConfig, UpdateConfig]:
  """The RL loop, loss and optimizer configs; the loss takes the sampling temperature and
  truncation (it scores the distribution the rollout samples)."""
  # format_reward shapes the reward function (train._reinforce), not the loop.
  rl = to_dataclass(
    GRPOConfig,
    config.rl,
    "rl",
    ignore=("format_reward", "warmup_engine", *DRAFTER_EVAL_FIELDS),
    seed=int(config.seed),
  )
  drafter_eval_config(config)  # checked with the loop's fields (the trainer builds it)
  loss = to_dataclass(
    PolicyLossConfig,
    config.rl_loss,
    "rl_loss",
    temperature=float(config.sampling.temperature),
    top_k=int(config.sampling.get("top_k", 0)),
    top_p=float(config.sampling.get("top_p", 1.0)),
  )
  # The schedule counts optimizer steps: mini_batches x epochs per RL step.
  per_step = config.rl_update.get("mini_batches", 1) * config.rl_update.get("epochs", 1)
  update = to_dataclass(
    UpdateConfig, config.rl_update, "rl_update", total_steps=max(rl.steps, 1) * per_step
  )
  return rl, loss, update

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
(0, 1]" before anything is built or compiled. `job_inputs(config)` runs every check of a
job, the files its config names included (the checkpoint directory, the data rows and
their reference answers), before the job writes anything to its workdir.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
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
from tlt_jax.parallel.memory import MemoryPlan, plan_drafter_update, plan_memory
from tlt_jax.parallel.meshes import data_mesh
from tlt_jax.parallel.sharding import training_mesh
from tlt_jax.rl.loss import PolicyLossConfig
from tlt_jax.rl.metrics import metrics_config
from tlt_jax.rl.rewards import job_reward
from tlt_jax.rl.trainer import GRPOConfig
from tlt_jax.rl.update import UpdateConfig
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.scheduler import SchedulerConfig
from tlt_jax.warmstart.sft import SFTConfig

# What `tlt_jax.export` writes (kept here: export imports this module).
EXPORT_DTYPES = ("float32", "bfloat16", "float16")

__all__ = [
  "ConfigError",
  "DrafterEvalConfig",
  "DrafterTrainConfig",
  "EngineConfig",
  "GRPOConfig",
  "JobInputs",
  "ModelConfig",
  "PolicyLossConfig",
  "SFTConfig",
  "SamplingConfig",
  "SchedulerConfig",
  "UpdateConfig",
  "UserError",
  "check_same_recipe",
  "checkpoint",
  "drafter_config",
  "drafter_eval_config",
  "engine_config",
  "job_inputs",
  "mesh",
  "mode",
  "model_config",
  "prompt_format",
  "rl_configs",
  "rl_steps",
  "sampling_config",
  "scheduler_config",
  "sft_config",
  "task_data",
  "task_spec",
  "to_dataclass",
  "tokenizer",
  "train_mesh",
]

T = TypeVar("T")


class UserError(ValueError):
  """Something the user gave that cannot work: a config value, a data file, a checkpoint, a
  busy workdir. The CLI prints the message alone, in one line, with exit status 2 (no
  traceback: the message names what to fix)."""


class ConfigError(UserError):
  """A config field with a bad value, or a file or directory a field names that cannot be
  used (the message names the field and what is allowed)."""


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


def drafter_config(config: ml_collections.ConfigDict, online: bool = True) -> DrafterTrainConfig:
  """The drafter's training settings: of its online phase (mode tlt, at
  `drafter.online_learning_rate` where that is set), or with `online=False` of its warm
  start's offline fit (`train.build_drafter`, with warmup_prompts / offline_steps)."""
  cfg = to_dataclass(
    DrafterTrainConfig,
    config.drafter,
    "drafter",
    ignore=("warmup_prompts", "offline_steps", "init_seed", "online_learning_rate"),
    seed=int(config.seed),
  )
  rate = config.drafter.get("online_learning_rate", 0.0)
  if not (isinstance(rate, int | float) and not isinstance(rate, bool) and rate >= 0):
    raise ConfigError(
      f"config.drafter.online_learning_rate must be a number >= 0 (0: learning_rate), got {rate!r}"
    )
  if not online:  # the fit observes all its rows before its first update
    return dataclasses.replace(cfg, min_rows=1)
  return dataclasses.replace(cfg, learning_rate=float(rate)) if rate else cfg


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


def memory_plan(config: ml_collections.ConfigDict, model: ModelConfig, devices: int) -> MemoryPlan:
  """The job's per-device memory (`parallel.memory.plan_memory`) on `devices` devices for its
  policy `model`, planned before anything is allocated: the update's micro-batch of
  `rl_update.micro_batch` packed rows at their widest (`rl_update.pack_width`, else the
  engine's cache), split and sharded as `parallel` says; the rollout's `engine.max_batch`
  rows of `engine.slots`; in mode tlt the online drafter's update (`plan_drafter_update`).
  Some of it is bounds rather than sizes: packed rows are narrower and fewer when answers
  are short."""
  par = config.get("parallel", {})
  engine = to_dataclass(EngineConfig, config.engine, "engine")
  _, _, update = rl_configs(config)
  width = min(update.pack_width, engine.slots) if update.pack_width else engine.slots
  rows = config.rl.prompts_per_step * config.rl.group_size
  job_mode, drafter = mode(config), None
  if job_mode == "tlt":
    train = drafter_config(config)
    drafter = plan_drafter_update(
      model,
      rows=train.batch_rows,
      width=train.row_len or engine.slots,
      logit_chunk=train.logit_chunk,
      remat_attention=train.remat_attention,
      feature_dtype=train.buffer_dtype,
    )
  return plan_memory(
    model,
    devices=devices,
    tensor=par.get("tensor", 1),
    fsdp=par.get("fsdp", False),
    micro_batch_rows=update.micro_batch,
    row_len=width,
    rollout_rows=engine.max_batch,
    slots=engine.slots,
    vocab_chunk=config.rl_loss.get("vocab_chunk", 0),
    rollout_tensor=par.get("rollout_tensor", 1),
    remat=update.remat,
    micro_batches=max(rows // (update.micro_batch * update.mini_batches), 1),
    capture_hidden=engine.capture_hidden and job_mode != "baseline",  # as `train.prepare`
    speculative=job_mode != "baseline",
    drafter=drafter,
  )


def memory_warning(
  config: ml_collections.ConfigDict, model: ModelConfig, devices: int, capacity: int | None
) -> str | None:
  """A warning when the job's planned per-device peak (`memory_plan`) exceeds `capacity`
  bytes a device (None: unknown, as on a CPU), else None. The plan is an estimate (0.8-1.3
  of XLA's own where compared: experiments/RESULTS.md), so a run is warned, not refused."""
  if not capacity:
    return None
  plan = memory_plan(config, model, devices)
  if plan.peak <= capacity:
    return None
  worst = "rollout beside the drafter's update" if plan.drafter else "rollout"
  if plan.update_peak == plan.peak:
    worst = "update"
  return (
    f"the memory plan puts this job's {worst} at {plan.peak / 2**30:.1f} GiB a device, over "
    f"the device's {capacity / 2**30:.1f} GiB: it may run out of memory (the plan by part: "
    "python experiments/memory_plan.py --config=... with this job's flags)"
  )


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
  # format_reward shapes the reward function (train.reinforce), not the loop.
  rl = to_dataclass(
    GRPOConfig,
    config.rl,
    "rl",
    ignore=("format_reward", "rewards", "warmup_engine", *DRAFTER_EVAL_FIELDS),
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
    UpdateConfig,
    config.rl_update,
    "rl_update",
    ignore=("schedule_steps",),
    total_steps=schedule_steps(config, rl.steps) * per_step,
  )
  return rl, loss, update


def schedule_steps(config: ml_collections.ConfigDict, steps: int) -> int:
  """The RL steps the learning-rate schedule spans: config.rl_update.schedule_steps, or
  `steps` (the run's, at least 1) where it is 0 or absent (configs older than the field).
  A horizon shorter than the run would leave its last steps at a zero rate: an error."""
  horizon = config.rl_update.get("schedule_steps", 0)
  if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
    raise ConfigError(
      f"config.rl_update.schedule_steps must be an int >= 0 (0: rl.steps), got {horizon!r}"
    )
  if horizon and horizon < steps:
    raise ConfigError(
      f"config.rl_update.schedule_steps={horizon} is shorter than rl.steps={steps}: the "
      "learning rate would reach 0 before the run ends (0 spans the run)"
    )
  return horizon or max(steps, 1)


# ------------------------------------------------------------------ a job's inputs, checked


def rl_steps(config: ml_collections.ConfigDict) -> int:
  """config.rl.steps: an int >= 0 (0: the warm start and its report, no RL)."""
  steps = config.rl.steps
  if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
    raise ConfigError(f"config.rl.steps must be an int >= 0 (0: no RL), got {steps!r}")
  return steps


def _one_line(error: BaseException) -> str:
  # Some library messages list their problems one a line; the CLI prints one line.
  return "; ".join(part.strip(" :") for part in str(error).splitlines() if part.strip())


def checkpoint(config: ml_collections.ConfigDict) -> ModelConfig | None:
  """The policy's config of config.model.checkpoint (None without one), from the directory
  as `models.hf_io.load_hf_checkpoint` will read it: config.json understood, every weight
  file present, every tensor present with its shape (from the safetensors headers: no
  weight is read, so a big checkpoint is checked in milliseconds)."""
  path = config.model.get("checkpoint", "")
  if not path:
    return None
  from safetensors import SafetensorError, safe_open

  from tlt_jax.models import hf_io

  field = f"config.model.checkpoint={path!r}"
  if not os.path.isdir(path):
    raise ConfigError(f"{field}: no such directory")
  config_file = os.path.join(path, hf_io.CONFIG_NAME)
  if not os.path.isfile(config_file):
    raise ConfigError(
      f"{field}: no {hf_io.CONFIG_NAME} (a Hugging Face checkpoint directory holds "
      f"{hf_io.CONFIG_NAME} and safetensors weights)"
    )
  try:
    with open(config_file, encoding="utf-8") as f:
      hf = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConfigError(f"{field}: {hf_io.CONFIG_NAME} is not readable JSON ({e})") from None
  if not isinstance(hf, dict):
    raise ConfigError(f"{field}: {hf_io.CONFIG_NAME} holds {type(hf).__name__}, not an object")
  try:
    model = hf_io.config_from_hf(hf, config.model.dtype, config.model.param_dtype)
    files = hf_io.weight_files(Path(path))
    expected = {e.hf_name: e.hf_shape for e in hf_io.checkpoint_entries(model, hf["model_type"])}
    found: dict[str, tuple[int, ...]] = {}
    for file in files:
      with safe_open(file, framework="numpy") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open handles are not iterable)
          found[name] = tuple(f.get_slice(name).get_shape())
  except (OSError, ValueError, TypeError, SafetensorError) as e:
    # Read errors, an index without a weight map, a safetensors header that does not parse.
    raise ConfigError(f"{field}: {_one_line(e)}") from None
  problems = [f"{n} (shape {s})" for n, s in expected.items() if n not in found]
  if problems:
    more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
    shown = ", ".join(problems[:5]) + more
    raise ConfigError(
      f"{field}: incomplete, {len(problems)} of its config's {len(expected)} tensors missing "
      f"from its weights: {shown}"
    )
  wrong = [f"{n} {found[n]} (expected {s})" for n, s in expected.items() if found[n] != s]
  if wrong:
    raise ConfigError(f"{field}: tensors of the wrong shape: {', '.join(wrong[:5])}")
  # As the loader: a tied model's redundant lm_head and recomputed RoPE buffers may be there.
  extra = [
    n
    for n in found
    if n not in expected
    and not (n == "lm_head.weight" and model.tie_embeddings)
    and not hf_io.IGNORED_BUFFERS.search(n)
  ]
  if extra:
    raise ConfigError(
      f"{field}: tensors its config.json does not describe (another architecture, or a "
      f"config.json that does not match the weights): {', '.join(extra[:5])}"
    )
  return model


# The config sections a warm start is made from: reusing one built from other values would
# silently start every run from the wrong policy or drafter.
_RECIPE = ("model", "task", "sft", "drafter")
# What `check_same_recipe` tells a job whose workdir holds another recipe's warm starts.
OTHER_WORKDIR = "use another --workdir or delete that one"


def _recipe(config: dict) -> dict:
  out = {k: dict(config.get(k, {})) for k in _RECIPE}
  out["task"].pop("data_dir", None)  # where the data lies, not what it is
  out["model"].pop("checkpoint", None)  # checked against the summary's source instead
  out["sft"].pop("key_windows", None)  # how fast attention runs, not what it computes
  for section in ("sft", "drafter"):  # how fast their steps run (float rounding aside)
    out[section].pop("cpu_fusions", None)
  for key in ("logit_chunk", "remat_attention"):  # the drafter update's memory, likewise
    out["drafter"].pop(key, None)
  # The online phase's, after the warm start (the fit's rows all come from one step and are
  # all in before its first update, so keep_steps and min_rows do not change it).
  for key in ("online_learning_rate", "keep_steps", "min_rows"):
    out["drafter"].pop(key, None)
  return out


def check_same_recipe(config: ml_collections.ConfigDict, folder: str, instead: str) -> None:
  """Refuses a folder whose warm starts (`warm_start`, `drafter_warm_start`) were built from
  other model, task, SFT or drafter settings than `config` (by the config.json written
  beside them), naming the first settings that differ; `instead` says what to do."""
  path = os.path.join(folder, "config.json")
  built_here = any(
    os.path.isdir(os.path.join(folder, w)) for w in ("warm_start", "drafter_warm_start")
  )
  if not (built_here and os.path.isfile(path)):
    return
  with open(path) as f:
    built = _recipe(json.load(f))
  wanted = _recipe(json.loads(config.to_json_best_effort()))
  differ = [
    f"{section}.{key}: {built[section].get(key)!r} there, {wanted[section].get(key)!r} here"
    for section in _RECIPE
    for key in sorted(set(built[section]) | set(wanted[section]))
    if built[section].get(key) != wanted[section].get(key)
  ]
  if differ:
    raise ConfigError(
      f"{folder} holds warm starts built from other settings ({'; '.join(differ[:3])}"
      f"{'; ...' if len(differ) > 3 else ''}); {instead}"
    )


def task_data(config: ml_collections.ConfigDict) -> None:
  """The task's data as the job will build it, checked first: a synthetic task's generator
  parameters; for name "local" every row of config.task.path (and test_path) with its row
  number, the configured keys, the train/test split, and each reference answer as the
  checker reads it (`data.checkers.REFERENCE_READERS`: one that can never be matched is an
  error, all such rows counted, the first few shown)."""
  from tlt_jax.data import builders, checkers

  t = config.task
  if t.name != "local":
    try:
      builders.synthetic_config(
        t.name,
        seed=t.seed,
        train_size=t.train_size,
        test_size=t.test_size,
        **t.params.to_dict(),
      )
    except ValueError as e:
      raise ConfigError(f"config.task.params: {e}") from None
    return
  name = t.get("checker", "") or "gsm8k"
  keys = {k: t.get(k, k.removesuffix("_key")) for k in builders.QA_KEYS}
  rows = {}
  for field in ("path", "test_path"):
    path = t.get(field, "")
    if not path:
      continue
    try:
      rows[field] = builders.check_qa_file(
        path, reference=checkers.REFERENCE_READERS.get(name), checker=name, **keys
      )
    except (OSError, ValueError) as e:
      raise ConfigError(f"config.task.{field}: {e}") from None
  if not t.get("test_path", ""):
    fraction = t.get("test_fraction", 0.1)
    if not 0.0 < fraction < 1.0:
      raise ConfigError(
        f"config.task.test_fraction must be in (0, 1) without a test_path, got {fraction!r}"
      )
    try:
      builders.split_rows(rows["path"], fraction, t.seed, os.path.basename(t.path))
    except ValueError as e:
      raise ConfigError(f"config.task.path: {e}") from None


@dataclasses.dataclass(frozen=True)
class JobInputs:
  """What `job_inputs` checked and built on the way: everything `train.prepare` needs
  before it writes to the workdir."""

  tokenizer: Tokenizer
  task: TaskSpec
  prompt: PromptFormat
  sampling: SamplingConfig
  engine: EngineConfig
  mesh: Mesh | None
  mode: str
  model: ModelConfig  # the policy's shape: its checkpoint's, else the config's model


def job_inputs(config: ml_collections.ConfigDict) -> JobInputs:
  """Every check of a job's config and of the files it names, before anything is built or
  written: a run that fails here leaves its workdir as it was. Each failure is a
  `ConfigError` in one line naming the field (or the file and row)."""
  init_from = config.sft.get("init_from", "")
  if init_from and not os.path.isdir(init_from):
    raise ConfigError(f"config.sft.init_from={init_from!r}: no such directory")
  steps = rl_steps(config)
  policy = checkpoint(config)
  tok = tokenizer(config)
  task = task_spec(config)
  prompt = prompt_format(config, tok)
  sampling = sampling_config(config)
  engine = engine_config(config, tok)
  if steps > 0:
    rl_configs(config)  # RL's fields too, before the data and the warm start
  rollout_mesh = mesh(config)
  train_mesh(config, rollout_mesh)  # parallel.fsdp / tensor, checked as early
  lr = config.rl_update.learning_rate
  if config.model.get("checkpoint", "") and steps and lr > 1e-3:
    raise ConfigError(
      f"config.rl_update.learning_rate={lr} on a checkpoint: the default config's RL "
      "settings are the toy task's (final norm only, lr 0.2); use configs/hf_grpo.py or set "
      "rl_update.learning_rate (<= 1e-3) and trainable"
    )
  if policy is None:
    policy = model_config(config, tok)
    sft_config(config)
  if mode(config) != "baseline":
    drafter_config(config)
    scheduler_config(config)
  if steps > 0:
    metrics_config(config)  # the loggers asked for, installed
    job_reward(config.rl, task.check)  # rl.rewards' terms
  export = config.get("export")
  if export is not None and export.get("dir") and export.get("dtype") not in EXPORT_DTYPES:
    raise ConfigError(f"config.export.dtype must be one of {EXPORT_DTYPES}, got {export.dtype!r}")
  task_data(config)
  return JobInputs(tok, task, prompt, sampling, engine, rollout_mesh, mode(config), policy)

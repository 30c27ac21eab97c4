"""A trained policy as a Hugging Face checkpoint directory.

  python -m tlt_jax.export --workdir=runs/qwen_gsm8k --out=runs/qwen_gsm8k/hf [--dtype=bfloat16]

Reads the run's config.json, restores the policy of its newest RL checkpoint
(`<workdir>/checkpoints/<step>`: the trainer's master weights, float32; without one, the warm
start) and writes a directory `transformers.AutoModelForCausalLM.from_pretrained` loads:
model.safetensors, config.json (with the tokenizer's eos / bos / pad ids),
generation_config.json (the run's sampling and stop ids) and, when the run used a Hugging Face
tokenizer, its tokenizer files. In float32 (the default) transformers' logits match the
policy's within 1e-4. bfloat16 / float16 halve the files but round every weight: when most of
the weights training changed round back to their initial values, a `PrecisionWarning` says so
(RL at lr 1e-6 moves weights far less than bfloat16's resolution).

`export.dir` in a job config exports the policy at the end of the run (`export_job`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx

from tlt_jax import configuration
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.hf_io import (
  CONFIG_NAME,
  config_from_hf,
  load_hf_checkpoint,
  save_generation_config,
  save_hf_checkpoint,
)

EXPORT_DTYPES = configuration.EXPORT_DTYPES
# Warn when more than this share of the weights training changed would export unchanged.
ROUNDED_AWAY_WARN = 0.5

__all__ = [
  "EXPORT_DTYPES",
  "PrecisionWarning",
  "export_job",
  "export_policy",
  "export_run",
  "export_workdir",
  "policy_steps",
  "read_config",
  "restore_policy",
  "rounded_away",
]


class PrecisionWarning(UserWarning):
  """The export dtype rounds away most of what training changed."""


def _tree(path: str) -> Any:
  """The pytree metadata of an orbax checkpoint item."""
  meta = ocp.PyTreeCheckpointer().metadata(path).item_metadata
  return meta.tree if hasattr(meta, "tree") else meta


def _restore_numpy(path: str, key: str | None = None) -> dict:
  """The arrays of an orbax item (its subtree `key` alone, when given) as host numpy
  arrays: nothing goes to a device, and the optimizer state stays on disk."""
  tree = _tree(path)
  if key is not None:
    if key not in tree:
      raise ValueError(f"the checkpoint at {path} holds no {key!r}")
    tree = {key: tree[key]}
  item = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), tree)
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  args = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
  got = ocp.PyTreeCheckpointer().restore(path, args=args)
  return got[key] if key is not None else got


def policy_steps(workdir: str | os.PathLike) -> list[int]:
  """The steps of the policy checkpoints in `<workdir>/checkpoints`, oldest first (orbax's
  unfinished writes, named `<step>.orbax-checkpoint-tmp-*`, are not steps)."""
  root = os.path.join(os.fspath(workdir), "checkpoints")
  if not os.path.isdir(root):
    return []
  names = [n for n in os.listdir(root) if n.isdigit()]
  return sorted(int(n) for n in names if os.path.isdir(os.path.join(root, n, "state")))


def restore_policy(
  workdir: str | os.PathLike, step: int | None = None, key: str = "params"
) -> tuple[dict, int]:
  """The policy params (or, key="reference", the KL reference) of the RL checkpoint at
  `step` (None: the newest) as a nested dict of numpy arrays, and the step."""
  steps = policy_steps(workdir)
  if not steps:
    raise FileNotFoundError(f"no RL checkpoints in {os.path.join(workdir, 'checkpoints')}")
  step = steps[-1] if step is None else step
  if step not in steps:
    raise FileNotFoundError(f"no RL checkpoint at step {step} in {workdir} (steps: {steps})")
  path = os.path.abspath(os.path.join(workdir, "checkpoints", str(step), "state"))
  return _restore_numpy(path, key), step


def _pure(params: nnx.State | Mapping[str, Any]) -> Mapping[str, Any]:
  return nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params


def rounded_away(
  trained: nnx.State | Mapping[str, Any], initial: nnx.State | Mapping[str, Any], dtype: str
) -> dict[str, float]:
  """How much of training's change survives a cast to `dtype`.

  Returns:
    changed: weights whose trained value differs from the initial one (in float32);
    rounded_away: those of them whose trained and initial values cast to the same
      `dtype` number (the export cannot tell them from untrained ones);
    fraction: rounded_away / changed (0 when nothing changed).
  """
  target = np.dtype(jax.numpy.dtype(dtype))
  changed = lost = 0
  pairs = zip(jax.tree.leaves(_pure(trained)), jax.tree.leaves(_pure(initial)), strict=True)
  for t, i in pairs:
    t, i = np.asarray(t, np.float32), np.asarray(i, np.float32)
    if t.shape != i.shape:
      raise ValueError(f"trained and initial params differ in shape: {t.shape} vs {i.shape}")
    moved = t != i
    changed += int(moved.sum())
    lost += int((moved & (t.astype(target) == i.astype(target))).sum())
  return {
    "changed": float(changed),
    "rounded_away": float(lost),
    "fraction": lost / changed if changed else 0.0,
  }


def export_policy(
  params: nnx.State | Mapping[str, Any],
  model_cfg: ModelConfig,
  out: str | os.PathLike,
  *,
  model_type: str = "llama",
  dtype: str = "float32",
  eos_token_id: int | Sequence[int],
  bos_token_id: int | None = None,
  pad_token_id: int | None = None,
  tokenizer_dir: str | os.PathLike | None = None,
  initial: nnx.State | Mapping[str, Any] | None = None,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  max_new_tokens: int | None = None,
) -> dict[str, Any]:
  """Writes `params` as a Hugging Face checkpoint in `out` (`save_hf_checkpoint`) with its
  generation_config.json.

  Args:
    params: the policy's params (an nnx.State or nested dict of arrays).
    model_cfg: its config.
    out: the directory (created; weight files already there are replaced).
    model_type: "llama", "qwen2" or "qwen3" (`hf_io.config_to_hf`).
    dtype: the stored tensors' dtype, one of EXPORT_DTYPES.
    eos_token_id, bos_token_id, pad_token_id: the tokenizer's ids, for config.json and
      generation_config.json.
    tokenizer_dir: a Hugging Face tokenizer's directory, whose files are copied.
    initial: the params training started from: with a dtype other than float32, a
      `PrecisionWarning` when the cast rounds most of training's changes away.
    temperature, top_k, top_p, max_new_tokens: the sampling written to
      generation_config.json (the rollout's).

  Returns:
    A summary: dir, dtype, model_type, files and (with `initial`) rounding, the
    `rounded_away` figures.
  """
  if dtype not in EXPORT_DTYPES:
    raise ValueError(f"dtype must be one of {EXPORT_DTYPES}, got {dtype!r}")
  rounding = None
  if initial is not None and dtype != "float32":
    rounding = rounded_away(params, initial, dtype)
    if rounding["fraction"] > ROUNDED_AWAY_WARN:
      warnings.warn(
        f"exporting in {dtype} rounds away {rounding['fraction']:.0%} of the weights training "
        f"changed ({rounding['rounded_away']:.0f} of {rounding['changed']:.0f} round to their "
        "initial values): the export is close to the untrained policy; export float32 to keep "
        "the updates",
        PrecisionWarning,
        stacklevel=2,
      )
  files = save_hf_checkpoint(
    params,
    model_cfg,
    out,
    model_type=model_type,
    tokenizer_dir=tokenizer_dir,
    bos_token_id=bos_token_id,
    eos_token_id=eos_token_id,
    dtype=dtype,
    pad_token_id=pad_token_id,
  )
  files.append(
    save_generation_config(
      out,
      eos_token_id,
      bos_token_id=bos_token_id,
      pad_token_id=pad_token_id,
      temperature=temperature,
      top_k=top_k,
      top_p=top_p,
      max_new_tokens=max_new_tokens,
    )
  )
  return {
    "dir": os.fspath(out),
    "dtype": dtype,
    "model_type": model_type,
    "files": sorted(os.path.basename(f) for f in files),
    "rounding": rounding,
  }


@dataclasses.dataclass(frozen=True)
class _RunModel:
  """What a run's config says about its policy's architecture and tokenizer."""

  model_cfg: ModelConfig
  model_type: str
  tokenizer: Any
  tokenizer_dir: str | None
  checkpoint: str  # the Hugging Face checkpoint the run started from ("": none)


def _run_model(config: ml_collections.ConfigDict) -> _RunModel:
  tokenizer = configuration.tokenizer(config)
  checkpoint = config.model.get("checkpoint", "")
  if checkpoint:
    path = os.path.join(checkpoint, CONFIG_NAME)
    if not os.path.isfile(path):
      raise FileNotFoundError(
        f"the run started from the checkpoint {checkpoint!r}, whose {CONFIG_NAME} (the "
        "architecture) is gone"
      )
    with open(path) as f:
      hf = json.load(f)
    model_cfg = config_from_hf(hf, config.model.dtype, config.model.param_dtype)
    model_type = hf["model_type"]
  else:
    model_cfg = configuration.model_config(config, tokenizer)
    # The built-in decoder's three layouts: q/k norms are Qwen3's, q/k/v biases Qwen2's.
    model_type = "qwen3" if model_cfg.qk_norm else "qwen2" if model_cfg.qkv_bias else "llama"
  name = config.task.tokenizer or checkpoint
  tokenizer_dir = name if name != "char" and os.path.isdir(name) else None
  return _RunModel(model_cfg, model_type, tokenizer, tokenizer_dir, checkpoint)


def _initial_params(config, workdir: str, run: _RunModel, step: int | None) -> Any:
  """The params RL started from (for the rounding check): the KL reference when the run
  kept one, else the warm start (workdir/warm_start, or the Hugging Face checkpoint);
  None when neither is there."""
  if step is not None:
    try:
      return restore_policy(workdir, step, key="reference")[0]
    except ValueError:
      pass  # no KL reference in this run's checkpoints
  warm = os.path.join(workdir, "warm_start")
  if os.path.isdir(warm):
    return _restore_numpy(os.path.abspath(warm))
  if run.checkpoint:
    _, model = load_hf_checkpoint(run.checkpoint, param_dtype="float32")
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return None


def export_run(
  config: ml_collections.ConfigDict,
  workdir: str | os.PathLike,
  out: str | os.PathLike,
  *,
  params: nnx.State | Mapping[str, Any] | None = None,
  dtype: str = "float32",
  step: int | None = None,
) -> dict[str, Any]:
  """Exports a run's policy: `params` when given (the live params at the end of a job),
  else its RL checkpoint at `step` (None: the newest), else its warm start.

  Returns:
    `export_policy`'s summary, with "source" (the step or the warm start's path).
  """
  if dtype not in EXPORT_DTYPES:
    raise ValueError(f"dtype must be one of {EXPORT_DTYPES}, got {dtype!r}")
  workdir = os.fspath(workdir)
  run = _run_model(config)
  if params is not None:
    source = "params"
    steps = policy_steps(workdir)
    step = steps[-1] if steps else None
  elif policy_steps(workdir) or step is not None:
    params, step = restore_policy(workdir, step)
    source = f"{os.path.join(workdir, 'checkpoints')} step {step}"
  elif os.path.isdir(os.path.join(workdir, "warm_start")):
    params = _restore_numpy(os.path.abspath(os.path.join(workdir, "warm_start")))
    source = os.path.join(workdir, "warm_start")
  else:
    raise FileNotFoundError(f"{workdir} holds neither RL checkpoints nor a warm start")
  tok = run.tokenizer
  eos = tuple(getattr(tok, "eos_ids", (tok.eos_id,)))
  summary = export_policy(
    params,
    run.model_cfg,
    out,
    model_type=run.model_type,
    dtype=dtype,
    eos_token_id=eos[0] if len(eos) == 1 else list(eos),
    bos_token_id=tok.bos_id if getattr(tok, "uses_bos", True) else None,
    pad_token_id=tok.pad_id,
    tokenizer_dir=run.tokenizer_dir,
    initial=None if dtype == "float32" else _initial_params(config, workdir, run, step),
    temperature=float(config.sampling.temperature),
    top_k=int(config.sampling.get("top_k", 0)),
    top_p=float(config.sampling.get("top_p", 1.0)),
    max_new_tokens=int(config.engine.max_new_tokens),
  )
  summary["source"] = source
  return summary


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
  """The job config a run wrote to `<workdir>/config.json`."""
  path = os.path.join(os.fspath(workdir), "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no config.json in {workdir}: not a tlt_jax run's workdir")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def export_workdir(
  workdir: str | os.PathLike,
  out: str | os.PathLike,
  dtype: str = "float32",
  step: int | None = None,
) -> dict[str, Any]:
  """`export_run` of the run in `workdir`, from its config.json and checkpoints."""
  return export_run(read_config(workdir), workdir, out, dtype=dtype, step=step)


def export_job(job: Any, params: nnx.State) -> dict[str, Any]:
  """The end-of-run export of `train.train_and_evaluate` (config `export.dir`, relative to
  the workdir, and `export.dtype`) of the policy `params`."""
  section = job.config.export
  out = os.path.join(job.workdir, section.dir)  # an absolute export.dir stays as it is
  return export_run(job.config, job.workdir, out, params=params, dtype=section.dtype)


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; returns the exit status (2 for a bad workdir or argument)."""
  parser = argparse.ArgumentParser(
    prog="python -m tlt_jax.export",
    description="Write a run's trained policy as a Hugging Face checkpoint directory.",
  )
  parser.add_argument("--workdir", required=True, help="the run's workdir")
  parser.add_argument("--out", required=True, help="the directory to write")
  parser.add_argument("--dtype", default="float32", choices=EXPORT_DTYPES)
  parser.add_argument("--step", type=int, default=None, help="an RL step (default: newest)")
  args = parser.parse_args(argv)
  logging.set_verbosity(logging.ERROR)  # orbax's notes on the checkpoint's layout: noise here
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always", PrecisionWarning)
      summary = export_workdir(args.workdir, args.out, args.dtype, args.step)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(
    f"wrote {summary['dir']} ({summary['model_type']}, {summary['dtype']}) from "
    f"{summary['source']}: {', '.join(summary['files'])}",
    flush=True,
  )
  for w in caught:  # one line each, without the source line Python's format adds
    print(f"warning: {w.message}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())

r"""Online against frozen drafter on many held-out prompts, from tlt runs' checkpoints.

The RL loop's drafter evaluation (`rl.drafter_eval_every`) rolls out the first
`rl.drafter_eval_prompts` held-out prompts (8 in the runs of 2026-12-03, one engine call).
One slice of 8 is a small sample: with the policy fixed, slices of 8 prompts differed by
up to a token a round in what the same online drafter gained (RESULTS.md, 2026-12-03).
This measures saved checkpoints of tlt runs on many more, slice by slice: per run, the policy
and the online drafter as the run saved them at `--step`, and the frozen drafter (its warm
start), by `DrafterAcceptance` on consecutive slices of held-out prompts (one engine call
each, the loop's key). Runs of one seed that differ only in drafter settings trained the
same policy (checked here by hash), so their online drafters meet the very same tokens.
The first slice is the loop's own prompts: where no drafter update ran between the loop's
evaluation and the checkpoint, it repeats the loop's figure.

  python experiments/drafter_eval_checkpoints.py --config=configs/regime.py --seed=6 \
    --runs=runs/dd6_new/tlt_s6,runs/dd6_old/tlt_s6 --labels=new,old --step=10 --prompts=96 \
    --out=runs/dd6_eval10.json
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import orbax.checkpoint as ocp
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import host_record  # noqa: E402
from tlt_jax import checkpoint, compare, configuration, curves, train  # noqa: E402
from tlt_jax.drafter.acceptance import DrafterAcceptance, DrafterEvalConfig  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "the runs' config")
_SEED = flags.DEFINE_integer("seed", 0, "the runs' seed")
_RUNS = flags.DEFINE_list("runs", [], "tlt run folders (checkpoints/, drafter_checkpoints/)")
_LABELS = flags.DEFINE_list("labels", [], "a name per run (default: the folders' names)")
_STEP = flags.DEFINE_integer("step", 10, "the checkpoint step (RL steps done)")
_PROMPTS = flags.DEFINE_integer("prompts", 96, "held-out prompts, in engine-batch slices")
_OUT = flags.DEFINE_string("out", "", "write the report here as JSON too")


_SAVED = (("checkpoints", "state"), ("drafter_checkpoints", "drafter"))  # (folder, item)


def managers(run: str, step: int) -> dict[str, ocp.CheckpointManager]:
  """The run's policy and drafter checkpoint managers; both must hold `step`."""
  out = {}
  for name, _ in _SAVED:
    out[name] = ocp.CheckpointManager(os.path.abspath(os.path.join(run, name)))
    if step not in out[name].all_steps():
      raise ValueError(f"{run}/{name} has no step {step} (it has {out[name].all_steps()})")
  return out


def restore_saved(run: str, step: int, policy: nnx.State, drafter: nnx.State):
  """(policy params, online drafter params, the drafter's version) saved at `step`,
  restored into copies of `policy` and `drafter`."""
  saved, found = {}, managers(run, step)
  for name, item in _SAVED:
    args = {item: ocp.args.StandardRestore(), "meta": ocp.args.JsonRestore()}
    saved[name] = found[name].restore(step, args=ocp.args.Composite(**args))
  params, online = nnx.clone(policy), nnx.clone(drafter)
  nnx.replace_by_pure_dict(params, saved["checkpoints"]["state"]["params"])
  nnx.replace_by_pure_dict(online, saved["drafter_checkpoints"]["drafter"]["params"])
  return params, online, int(saved["drafter_checkpoints"]["meta"]["version"])


def main(argv):
  del argv
  if not _RUNS.value:
    raise app.UsageError("--runs names at least one tlt run folder")
  labels = _LABELS.value or [os.path.basename(os.path.dirname(r.rstrip("/"))) for r in _RUNS.value]
  if len(labels) != len(_RUNS.value):
    raise app.UsageError("--labels needs one name per run")
  for run in _RUNS.value:  # before the minutes prepare takes
    managers(run, _STEP.value)
  config = _CONFIG.value.copy_and_resolve_references()
  config.mode, config.seed, config.rollout.num_prompts = "tlt", _SEED.value, 0
  first = _RUNS.value[0]
  config.task.data_dir = os.path.join(os.path.dirname(first.rstrip("/")), "shared", "tfds")
  work = tempfile.mkdtemp(prefix="drafter_eval_")
  for piece in ("warm_start", "drafter_warm_start"):  # prepare restores them, fits nothing
    shutil.copytree(os.path.join(first, piece), os.path.join(work, piece))
  job = train.prepare(config, work, progress=False)
  frozen = checkpoint.restore_params(os.path.join(work, "drafter_warm_start"), job.drafter.params)
  key = int(configuration.rl_configs(config)[0].seed)
  batch = job.engine.config.max_batch
  n = min(_PROMPTS.value, len(job.test))
  prompts = [job.tokenizer.encode(job.prompt(job.test[i]), add_bos=True) for i in range(n)]
  cfg = DrafterEvalConfig(every=1, prompts=batch)
  slices = [
    DrafterAcceptance(job.engine, prompts[i : i + batch], cfg, key=key) for i in range(0, n, batch)
  ]

  report = {
    "host": host_record(),
    "step": _STEP.value,
    "prompts": n,
    "slices": len(slices),
    "runs": {},
  }
  policy_hash = None
  for label, run in zip(labels, _RUNS.value, strict=True):
    params, online, version = restore_saved(run, _STEP.value, job.params, job.drafter.params)
    digest = compare.params_digest(params)
    if policy_hash is None:
      policy_hash = digest
      t = time.perf_counter()
      report["frozen"] = [s.accept_length(params, frozen) for s in slices]
      print(
        f"frozen: {np.mean(report['frozen']):.3f} ({time.perf_counter() - t:.0f} s)", flush=True
      )
    elif digest != policy_hash:
      horizons = [compare.schedule_horizon(r) for r in (first, run)]
      why = f" (learning-rate schedules over {horizons[0]} and {horizons[1]} RL steps)"
      raise ValueError(
        f"{run} saved another policy at step {_STEP.value} than {first}"
        + (why if horizons[0] != horizons[1] else "")
      )
    got = [s.accept_length(params, online) for s in slices]
    gap = np.subtract(got, report["frozen"])
    report["runs"][label] = {
      "run": run,
      "version": version,
      "online": got,
      # Over the slices, each a sample of prompts: the mean and its bootstrap interval.
      "online_minus_frozen": curves.paired_gap(got, report["frozen"]),
      "slices_ahead": int(np.sum(gap > 0)),
    }
    print(
      f"{label} (version {version}): online {np.mean(got):.3f}, minus frozen "
      f"{np.mean(gap):+.3f}, slice by slice {np.round(gap, 2).tolist()}",
      flush=True,
    )
  shutil.rmtree(work, ignore_errors=True)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  app.run(main)

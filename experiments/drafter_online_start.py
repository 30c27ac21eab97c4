r"""The online drafter's first updates: does it lose accept length before it gains, and why?

In the regime curve's five seeds the online drafter accepted fewer tokens than the frozen
one on the same fixed prompts after step 9 (its first 10-16 updates), and more from step
19 on. Those runs changed the policy too. Here the policy stays the warm start, so only
the drafter's optimisation can move its acceptance:

1. the drafter's warm start is fitted as a job fits it (`train.prepare`: warm-up prompts
   rolled out, `drafter.offline_steps` updates), or restored from the work folder;
2. steps of RL-like data (`--prompts` prompts x G samples of the training split, rolled
   out by the warm-start policy in calls of `rl.rows_per_call` rows) are fed, the same rows
   to every variant, each variant taking `--updates` updates a step on the same sampled
   batches;
3. after chosen steps every variant's accept length is measured on the same held-out
   prompts (`drafter.acceptance`: one forced chain, one sample a prompt, coupled sampling:
   every drafter sees the very same tokens), in slices of the engine's batch, so each
   variant's difference from the warm start is paired slice by slice.

Variants (`--variants`): `fresh` (what a job does: the warm start's parameters with a new
optimizer state at the config's online settings), or online settings joined by "+":
`lr=<peak rate>`, `keep=<RL steps the buffer samples>`, `warmup=<updates>` (e.g.
`lr=5e-4+keep=8`). A variant that carried the fit's optimizer state on (what a job that
fitted its warm start in the same process did until 2026-12-03) is at commit 8f8fb61.

  python experiments/drafter_online_start.py --config=configs/regime.py --refit \
    --warm=experiments/warm_starts/regime_stage11_hostJ_2026-12-04 --out=runs/dstart
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import host_record  # noqa: E402
from tlt_jax import configuration, train  # noqa: E402
from tlt_jax.drafter.acceptance import DrafterAcceptance, DrafterEvalConfig  # noqa: E402
from tlt_jax.drafter.online import OnlineDrafter  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "job config")
_WARM = flags.DEFINE_string("warm", "", "a folder holding the policy's warm_start (copied in)")
_OUT = flags.DEFINE_string("out", "runs/drafter_online_start", "work folder and report")
_VARIANTS = flags.DEFINE_list("variants", ["fresh", "lr=5e-4"], "see the docstring")
_STEPS = flags.DEFINE_integer("steps", 6, "steps of RL-like data")
_PROMPTS = flags.DEFINE_integer("prompts", 8, "training prompts a step (G samples each)")
_UPDATES = flags.DEFINE_integer("updates", 3, "drafter updates per step, per variant")
_MEASURE = flags.DEFINE_list("measure_after", ["1", "2", "3", "4", "6"], "steps to measure after")
_EVAL_PROMPTS = flags.DEFINE_integer("eval_prompts", 48, "held-out prompts (engine-batch slices)")
_REFIT = flags.DEFINE_bool("refit", False, "fit the drafter's warm start again")


_SETTINGS = {
  "lr": ("learning_rate", float),
  "keep": ("keep_steps", int),
  "warmup": ("warmup_steps", int),
}


def variant_drafter(name: str, fitted: OnlineDrafter, job) -> OnlineDrafter:
  """A drafter starting from the fitted warm start's parameters, with a fresh buffer,
  version 0 (so every variant samples the same batches) and the variant's optimizer:
  "fresh", or settings joined by "+" (e.g. "lr=5e-4+keep=8")."""
  cfg = configuration.drafter_config(job.config)
  if name != "fresh":
    for part in name.split("+"):
      key, _, value = part.partition("=")
      if key not in _SETTINGS:
        raise ValueError(f"unknown variant {name!r}: fresh or {sorted(_SETTINGS)}")
      field, kind = _SETTINGS[key]
      cfg = dataclasses.replace(cfg, **{field: kind(value)})
  d = OnlineDrafter(
    fitted.graphdef,
    jax.tree.map(lambda x: x.copy(), fitted.params),
    cfg,
    slots=job.engine.config.slots,
    feature_dim=job.model_cfg.d_model,
  )
  return d


def main(argv):
  del argv
  config, out = _CONFIG.value, _OUT.value
  config.mode = "tlt"
  print(host_record(), flush=True)
  work = os.path.join(out, "work")
  if _WARM.value and not os.path.isdir(os.path.join(work, "warm_start")):
    os.makedirs(work, exist_ok=True)
    shutil.copytree(os.path.join(_WARM.value, "warm_start"), os.path.join(work, "warm_start"))
  if _REFIT.value:  # prepare then fits the drafter's warm start
    shutil.rmtree(os.path.join(work, "drafter_warm_start"), ignore_errors=True)
  t = time.perf_counter()
  job = train.prepare(config, work)
  fitted = job.drafter
  print(f"warm start and drafter fit: {time.perf_counter() - t:.0f} s {job.drafter_info}")

  drafters = {name: variant_drafter(name, fitted, job) for name in _VARIANTS.value}
  frozen = fitted.params
  n_eval = min(_EVAL_PROMPTS.value, len(job.test))
  evals = [job.tokenizer.encode(job.prompt(job.test[i]), add_bos=True) for i in range(n_eval)]
  batch = job.engine.config.max_batch
  ecfg = DrafterEvalConfig(every=1, prompts=batch)
  slices = [
    DrafterAcceptance(job.engine, evals[i : i + batch], ecfg, key=int(config.seed))
    for i in range(0, n_eval, batch)
  ]

  def accept(drafter_params) -> list[float]:
    return [s.accept_length(job.params, drafter_params) for s in slices]

  report = {
    "host": host_record(),
    "flags": {f: flags.FLAGS[f].value for f in ("steps", "prompts", "updates", "eval_prompts")},
    "variants": _VARIANTS.value,
    "frozen": accept(frozen),
    "points": [],
  }
  print(f"frozen: {np.mean(report['frozen']):.3f} {np.round(report['frozen'], 2).tolist()}")
  group, rows_per_call = int(config.rl.group_size), int(config.rl.rows_per_call)
  per_call = max(1, rows_per_call // group)
  order = np.random.default_rng(int(config.seed)).permutation(len(job.train))
  measure = {int(s) for s in _MEASURE.value}
  for step in range(1, _STEPS.value + 1):
    t = time.perf_counter()
    picks = order[(step - 1) * _PROMPTS.value : step * _PROMPTS.value]
    prompts = [job.tokenizer.encode(job.prompt(job.train[int(i)]), add_bos=True) for i in picks]
    for c in range(0, len(prompts), per_call):
      result = job.engine.generate(
        job.params,
        prompts[c : c + per_call],
        group,
        key=int(config.seed) + step,
        seq_id_offset=(step * len(prompts) + c) * group,
        drafter_params=frozen,
      )
      for d in drafters.values():
        d.observe(result, step)
    rollout_s = time.perf_counter() - t
    for d in drafters.values():
      for _ in range(_UPDATES.value):
        d.update(job.params)
    jax.block_until_ready([d.params for d in drafters.values()])
    if step not in measure:
      print(f"step {step}: rollout {rollout_s:.0f} s")
      continue
    point = {"step": step, "updates": step * _UPDATES.value}
    for name, d in drafters.items():
      point[name] = accept(d.params)
    report["points"].append(point)
    line = ", ".join(
      f"{n} {np.mean(point[n]):.3f} ({np.mean(np.subtract(point[n], report['frozen'])):+.3f})"
      for n in drafters
    )
    print(f"step {step} ({point['updates']} updates; rollout {rollout_s:.0f} s): {line}")
    with open(os.path.join(out, "drafter_online_start.json"), "w") as f:
      json.dump(report, f, indent=1)
  print(json.dumps(report["points"][-1]))


if __name__ == "__main__":
  app.run(main)

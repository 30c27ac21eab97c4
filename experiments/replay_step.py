r"""Replays one RL step's rollout of a finished run with plain decoding, row by row.

Speculative decoding is exact: a tlt or sd run rolls out the tokens plain decoding draws
under the same policy, key and sequence ids. This checks it on a real run: it restores the
policy the run saved after `--step` steps (its checkpoint), rolls out the next step's
prompts again as the RL loop does (the same engine calls, key and sequence ids) with plain
decoding, and compares every row with the run's rollout_lengths.jsonl: its tokens (their
CRC-32, recorded since 2026-12-03) and its length (all older runs recorded it). The
step's first batch only (refills under dynamic sampling depend on its rewards). Run it
from the folder the run was started in (the run's config names its data relative to it),
or pass --data_dir.

Two runs of one seed hold the same policy only under the same learning-rate schedule: it
spans `rl.steps` unless `rl_update.schedule_steps` says otherwise (RESULTS.md, 2026-12-03).

  python experiments/replay_step.py --run=runs/ex_a/tlt_s5 --step=4
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import ml_collections
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import train  # noqa: E402

_RUN = flags.DEFINE_string("run", None, "a run folder (config.json, checkpoints/, warm starts)")
_STEP = flags.DEFINE_integer("step", None, "replay the step after this checkpoint (steps done)")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "the run's data folder (default: its config's)")
_OUT = flags.DEFINE_string("out", "", "write the report here as JSON too")


def run_config(run: str, data_dir: str) -> ml_collections.ConfigDict:
  """The run's own config, in a mode whose engine decodes plain on request (tlt's online
  drafter and its checkpoints are not needed: sd's engine, no drafter passed)."""
  with open(os.path.join(run, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  if config.mode == "tlt":
    config.mode = "sd"
  if data_dir:
    config.task.data_dir = data_dir
  return config


def recorded(run: str, step: int) -> tuple[list[list[int]], list[list[int]] | None]:
  """The step's response lengths per engine call and, where the run recorded them (since
  2026-12-03), its rows' completion digests."""
  with open(os.path.join(run, "rollout_lengths.jsonl")) as f:
    rows = {r["step"]: r for r in (json.loads(line) for line in f if line.strip())}
  if step not in rows:
    raise ValueError(f"{run}/rollout_lengths.jsonl has no step {step}")
  return rows[step]["rollouts"], rows[step].get("digests")


def replay(run: str, step: int, data_dir: str = "") -> dict:
  """{"calls": [{"prompts": [a, b), "replayed": lengths, "recorded": lengths,
  "differing_rows": [...]}], "rows", "differing_rows"} for step `step` of `run`."""
  config = run_config(run, data_dir)
  saved = os.path.join(run, "checkpoints", str(step))
  if not os.path.isdir(saved):
    raise ValueError(f"{run} saved no checkpoint after {step} steps (checkpoints/{step})")
  lengths, digests = recorded(run, step)
  work = tempfile.mkdtemp(prefix="replay_")
  try:
    for piece in ("warm_start", "drafter_warm_start"):  # prepare restores them, fits nothing
      if os.path.isdir(os.path.join(run, piece)):
        shutil.copytree(os.path.join(run, piece), os.path.join(work, piece))
    shutil.copytree(saved, os.path.join(work, "checkpoints", str(step)))  # the one it resumes
    job = train.prepare(config, work, progress=False)
    trainer = train.make_trainer(job)
    if trainer.step != step:
      raise ValueError(f"restored step {trainer.step}, not {step}")
    g, p = trainer.cfg.group_size, trainer.cfg.prompts_per_step
    first = trainer.data.position
    examples = trainer.data.next(p)
    calls = []
    for c, (a, b) in enumerate(trainer.call_groups(p)[: len(lengths)]):
      prompts = [
        trainer.tokenizer.encode(trainer.format_prompt(ex), add_bos=True) for ex in examples[a:b]
      ]
      result = trainer.engine.generate(
        trainer.params,
        prompts,
        g,
        key=trainer.rollout_key(0),
        seq_id_offset=(first + a) * g,
        drafter_params=None,  # plain decoding
      )
      got, want = [int(n) for n in result.num_generated], lengths[c]
      # A row differs in its length or, where the run recorded them, its tokens.
      same = [x == y for x, y in zip(got, want, strict=True)]
      if digests is not None:
        tokens = zip(result.completion_digests(), digests[c], strict=True)
        same = [s and x == y for s, (x, y) in zip(same, tokens)]
      differ = [n for n, s in enumerate(same) if not s]
      calls.append({"prompts": [a, b], "replayed": got, "recorded": want, "differing_rows": differ})
      print(f"prompts {a}-{b - 1}: {got}{'' if not differ else f'  rows {differ} differ: {want}'}")
  finally:
    shutil.rmtree(work, ignore_errors=True)
  return {
    "run": run,
    "step": step,
    "compared": "lengths" if digests is None else "tokens",
    "rows": sum(len(c["replayed"]) for c in calls),
    "differing_rows": sum(len(c["differing_rows"]) for c in calls),
    "calls": calls,
  }


def main(argv):
  del argv
  if not _RUN.value or _STEP.value is None:
    raise app.UsageError("--run and --step are required")
  report = replay(_RUN.value, _STEP.value, _DATA_DIR.value)
  n, rows, what = report["differing_rows"], report["rows"], report["compared"]
  print(f"{n} of {rows} rows differ from the run's ({what} compared)")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=1)
  if report["differing_rows"]:
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)

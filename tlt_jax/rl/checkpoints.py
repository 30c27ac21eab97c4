"""The GRPO trainer's checkpoints: the policy's and, in TLT, the online drafter's.

Two orbax managers in the workdir: `checkpoints/` (params, optimizer state, KL reference,
step, data position, bandit statistics, group-draft history) and `drafter_checkpoints/`
(the drafter's params, optimizer state, version, data buffer and the scheduler's cost
estimates), written one after the other at the same step (see `save`). A resume takes the
newest step present in both, so a kill at any point resumes exactly. What goes in them is
the trainer's `state_dict()` and `drafter_state_dict()`, composed of its components' own
(`RolloutEngine`, `OnlineDrafter`, `SliceScheduler`), laid out as these files always were.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING

import jax
import orbax.checkpoint as ocp
from absl import logging

if TYPE_CHECKING:
  from tlt_jax.rl.trainer import GRPOTrainer


class TrainerCheckpoints:
  """The trainer's orbax managers and the metrics files a resume truncates."""

  def __init__(self, workdir: str, with_drafter: bool):
    self.workdir = workdir
    self.policy = ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, "checkpoints")),
      options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True),
    )
    # TLT: the online drafter's own checkpoints, written after the checkpoint window (see
    # `save`); a resume restores a step present in both.
    self.drafter = None
    if with_drafter:
      self.drafter = ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, "drafter_checkpoints")),
        options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True),
      )
    self.metrics_path = os.path.join(workdir, "metrics.jsonl")
    # Each step's response lengths, apart from the flat metrics rows.
    self.lengths_path = os.path.join(workdir, "rollout_lengths.jsonl")
    # Each step's rollout timelines: the engine's calls as timed in the run (`tlt_jax.sim`
    # prices a replay of the run with them).
    self.timelines_path = os.path.join(workdir, "rollout_timelines.jsonl")
    # The trainer's TensorBoard folder (`metrics.MetricsLog`).
    self.tensorboard_dir = os.path.join(workdir, "tensorboard")
    # Set by `restore`: the step a rerun resumed at (None: a start from step 0), and how
    # many metrics rows of a killed run's lost steps it dropped.
    self.resumed_at: int | None = None
    self.dropped_rows = 0

  def save(self, t: GRPOTrainer) -> None:
    """Writes step, params, optimizer, data position (orbax finalises atomically,
    so a write cut short never replaces the last good checkpoint).

    TLT: while orbax writes the policy, the device is free and the scheduler trains the
    drafter ("checkpoint" window); those updates belong to this step. So the drafter
    (params, optimizer state, version, data buffer) and the scheduler's state go to a
    second manager (workdir/drafter_checkpoints, same step) once the window has closed,
    and `restore` takes the newest step present in both: a kill between the two writes
    falls back to the previous complete pair. (One manager would have to capture the
    drafter before the window, losing its updates on resume, or hold the policy write
    until the window closed, losing the window.) The drafter write is asynchronous too,
    from host copies: it finishes while the next step runs (the next save, or the end of
    `run`, waits for it).
    """
    state = t.state_dict()
    engine = state["engine"]
    meta = {"step": state["step"], "data": state["data"]}
    if "bandit" in engine:
      meta["bandit"] = engine["bandit"]
    items = {"state": ocp.args.StandardSave(state["policy"])}
    if "history" in engine:
      # Group drafts read each prompt's earlier rollouts: a resumed run keeps them.
      meta["history"] = True
      items["history"] = ocp.args.StandardSave(engine["history"])
    self.policy.save(t.step, args=ocp.args.Composite(meta=ocp.args.JsonSave(meta), **items))
    if self.drafter is not None:
      # The write runs in orbax's threads: a device slice for the drafter.
      t.scheduler.fill("checkpoint", self.policy.is_saving_in_progress, t.params)
    self.policy.wait_until_finished()
    if self.drafter is not None:
      d = t.drafter_state_dict()
      self.drafter.save(
        t.step,
        args=ocp.args.Composite(
          drafter=ocp.args.StandardSave(d["drafter"]["train"]),
          buffer=ocp.args.StandardSave(d["drafter"]["buffer"]),
          meta=ocp.args.JsonSave({**d["drafter"]["meta"], "scheduler": d["scheduler"]}),
        ),
      )

  def restore(self, t: GRPOTrainer) -> None:
    """Restores the newest step present in every manager into `t` and drops later steps
    and the metrics rows past it. With no checkpoint the run starts at step 0, so every
    row a killed run wrote before its first checkpoint goes (metrics, response lengths,
    TensorBoard events): the rerun writes those steps afresh, instead of after them."""
    managers = [m for m in (self.policy, self.drafter) if m is not None]
    with_drafter = self.drafter is not None
    if with_drafter and self.policy.all_steps() and not self.drafter.all_steps():
      # Policy checkpoints but no drafter ones at all: a workdir from a mode without an
      # online drafter, or from before drafter checkpoints existed. The policy resumes
      # exactly (its rollouts do not depend on the drafter); the drafter keeps its warm
      # start. Nothing is deleted.
      logging.warning(
        "%s has no drafter checkpoints: resuming the policy, the drafter from its warm start",
        self.workdir,
      )
      managers, with_drafter = [self.policy], False
    steps = set.intersection(*(set(m.all_steps()) for m in managers))
    last = max(steps, default=None)
    # Steps past the last complete pair (a policy whose drafter write was cut short) go:
    # the rerun of that step saves it afresh (orbax skips a step at or below its latest).
    for m in managers:
      for s in m.all_steps():
        if last is None or s > last:
          m.delete(s)
    if last is None:
      self.dropped_rows = self._truncate(0)
      if os.path.isdir(self.tensorboard_dir):
        # No step survives, so neither does any event (a resume's purge_step only hides
        # events past the step it resumes at).
        shutil.rmtree(self.tensorboard_dir)
      return
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, t.state_dict()["policy"])
    got = self.policy.restore(
      last,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
      ),
    )
    meta = got["meta"]
    engine = {"bandit": meta["bandit"]} if "bandit" in meta else {}
    if meta.get("history"):
      hist = self.policy.restore(last, args=ocp.args.Composite(history=ocp.args.StandardRestore()))
      engine["history"] = dict(hist["history"])
    t.load_state_dict(
      {
        "policy": got["state"],
        "step": meta["step"],
        # Checkpoints written before the data cursor had its own state: its bare position.
        "data": meta["data"] if "data" in meta else {"position": meta["cursor"]},
        "engine": engine,
      }
    )
    if with_drafter:
      d = self.drafter.restore(
        last,
        args=ocp.args.Composite(
          drafter=ocp.args.StandardRestore(t.drafter_abstract_state()),
          buffer=ocp.args.StandardRestore(),
          meta=ocp.args.JsonRestore(),
        ),
      )
      dmeta = dict(d["meta"])
      scheduler = dmeta.pop("scheduler")
      drafter = {"train": d["drafter"], "buffer": d["buffer"], "meta": dmeta}
      t.load_drafter_state_dict({"drafter": drafter, "scheduler": scheduler})
    # Metrics past the checkpoint belong to the lost tail of the killed run.
    self.dropped_rows = self._truncate(t.step)
    self.resumed_at = t.step
    logging.info("resumed at step %d from %s", t.step, self.policy.directory)

  def _truncate(self, step: int) -> int:
    """Keeps the metrics, response-length and timeline rows of steps before `step`; returns
    how many metrics rows went."""
    dropped = 0
    for path in (self.metrics_path, self.lengths_path, self.timelines_path):
      if not os.path.exists(path):
        continue
      with open(path) as f:
        lines = [line for line in f if line.strip()]
      # A row cut short by the kill (no newline, no closing brace) is past any checkpoint.
      keep = [line for line in lines if _row_step(line) < step]
      if path == self.metrics_path:
        dropped = len(lines) - len(keep)
      if len(keep) < len(lines):
        with open(path, "w") as f:
          f.writelines(keep)
    return dropped

  def start_note(self, steps: int) -> str:
    """Where RL starts, in one line for the terminal and the log."""
    if self.resumed_at is not None:
      return (
        f"RL resumes at step {self.resumed_at} of {steps} from the checkpoint in "
        f"{self.policy.directory}"
        + (f" ({self.dropped_rows} metrics rows past it dropped)" if self.dropped_rows else "")
      )
    note = f"RL starts at step 0 of {steps}"
    if self.dropped_rows:
      note += (
        f": no RL checkpoint in {self.workdir}, so the {self.dropped_rows} metrics rows "
        "an earlier run left were dropped"
      )
    return note


def _row_step(line: str) -> float:
  """A metrics line's step; a line cut short by a kill counts as past every step."""
  try:
    return json.loads(line)["step"]
  except (json.JSONDecodeError, KeyError, TypeError):
    return float("inf")

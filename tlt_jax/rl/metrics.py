"""What an RL run records per step: speculative-decoding figures of its rollouts, and the
writers of metrics.jsonl, rollout_lengths.jsonl and TensorBoard."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tensorboardX import SummaryWriter


def spec_metrics(results: Sequence[Any]) -> dict[str, float]:
  """Speculative-decoding figures of a step's rollouts (nothing when SD never ran): the
  accept length over all speculative rounds, their tokens and seconds, and the arm mix
  (chunks per arm, plain decode included) with each draft arm's accept length and the
  row-rounds it is over."""
  chunks = [s for s in (r.spec_summary() for r in results) if s["row_rounds"]]
  if not chunks:
    return {}
  rounds = sum(s["row_rounds"] for s in chunks)
  out = {
    "spec/accept_length": sum(s["accept_length"] * s["row_rounds"] for s in chunks) / rounds,
    "spec/tokens": sum(s["tokens"] for s in chunks),
    "spec/seconds": sum(s["seconds"] for s in chunks),
  }
  per_arm: dict[str, list[int]] = {}
  for r in results:
    for e in r.timeline:
      if e["phase"] in ("decode", "spec"):
        acc = per_arm.setdefault(e.get("strategy", "plain"), [0, 0, 0])
        acc[0] += 1
        if e["phase"] == "spec":
          acc[1] += e["tokens"]
          acc[2] += e["row_rounds"]
  for arm, (n, tokens, row_rounds) in sorted(per_arm.items()):
    out[f"spec/arm/{arm}/chunks"] = n
    if row_rounds:
      out[f"spec/arm/{arm}/accept_length"] = tokens / row_rounds
      out[f"spec/arm/{arm}/row_rounds"] = row_rounds
  return out


class MetricsLog:
  """Appends each step's row to metrics.jsonl, its rollouts' response lengths to
  rollout_lengths.jsonl (the trace `tlt_jax.sim` replays) and every number to TensorBoard
  (workdir/tensorboard). `purge_step`: TensorBoard drops events a killed run logged past
  the checkpoint the run resumes from."""

  def __init__(self, metrics_path: str, lengths_path: str, tensorboard_dir: str, purge_step: int):
    self.metrics_path, self.lengths_path = metrics_path, lengths_path
    self.tb = SummaryWriter(tensorboard_dir, purge_step=purge_step)

  def write(self, row: dict[str, Any]) -> None:
    """Writes `row`; its "rollout_lengths" and "rollout_prompt_lengths" entries go to the
    lengths file only (as "rollouts" and "prompts": per rollout, one length per row)."""
    lengths = {"step": row["step"], "rollouts": row.pop("rollout_lengths")}
    if "rollout_prompt_lengths" in row:
      lengths["prompts"] = row.pop("rollout_prompt_lengths")
    with open(self.lengths_path, "a") as f:
      f.write(json.dumps(lengths) + "\n")
    with open(self.metrics_path, "a") as f:
      f.write(json.dumps(row) + "\n")
    self._tensorboard(row)

  def _tensorboard(self, row: Mapping[str, Any]) -> None:
    """Every number of a row as a scalar at its step (eval/* nested ones too)."""
    flat = dict(row)
    for k, v in row.get("eval", {}).items():
      flat[f"eval/{k}"] = v
    for k, v in flat.items():
      if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
        self.tb.add_scalar(k, v, row["step"])
    self.tb.flush()

  def close(self) -> None:
    self.tb.close()

"""What a rollout returns: tokens, log-probs, hidden states and the chunk timeline."""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import numpy as np


@dataclasses.dataclass
class RolloutResult:
  """Host-side outputs of one rollout, one row per sequence in request order.

  tokens[n, :length[n]] is prompt + completion; completion = tokens[n,
  prompt_len[n]:length[n]]. logprobs[n, t] is the policy log-prob of token t
  (generated positions only). hidden[n, t] is the hidden state after token t
  (all positions but the last).
  """

  tokens: np.ndarray  # [N, S] int32
  logprobs: np.ndarray  # [N, S] float32
  hidden: np.ndarray | None  # [N, S, D]
  length: np.ndarray  # [N]
  prompt_len: np.ndarray  # [N]
  prompt_index: np.ndarray  # [N] which prompt each row samples
  timeline: list[dict[str, Any]]
  wall_seconds: float

  @property
  def num_generated(self) -> np.ndarray:
    return self.length - self.prompt_len

  def completion(self, n: int) -> np.ndarray:
    return self.tokens[n, self.prompt_len[n] : self.length[n]]

  def completion_digests(self) -> list[int]:
    """A CRC-32 of each row's completion tokens (as int32): rows of two rollouts with
    equal digests drew the same tokens (up to a 2^-32 collision)."""
    return [
      zlib.crc32(np.ascontiguousarray(self.completion(n), dtype=np.int32).tobytes())
      for n in range(len(self.length))
    ]

  def completion_logprobs(self, n: int) -> np.ndarray:
    return self.logprobs[n, self.prompt_len[n] : self.length[n]]

  @property
  def tokens_per_second(self) -> float:
    return float(self.num_generated.sum()) / max(self.wall_seconds, 1e-9)

  def generation_seconds(self, max_batch: int | None = None) -> float:
    """Seconds of decode chunks (plain, speculative and drafter-cache rebuilds) run at
    batch buckets <= `max_batch` (all when None), lazy compiles left out. The long
    tail's share, generation_seconds(small) / generation_seconds(), bounds what
    speculative decoding can save: SD runs only at small batches."""
    phases = ("decode", "spec", "drafter_prefill")
    return sum(
      e["dt"] - e.get("compile_s", 0.0)
      for e in self.timeline
      if e["phase"] in phases and (max_batch is None or e["batch"] <= max_batch)
    )

  def phase_seconds(self, phase: str) -> float:
    """Seconds of the timeline's entries of one phase, e.g. "harvest": the host time that
    copies finished rows (and in mode tlt their hidden states) off the device."""
    return sum(e["dt"] for e in self.timeline if e["phase"] == phase)

  def seconds_by_part(self) -> dict[str, float]:
    """Device-call seconds of this rollout by what ran them, lazy compiles left out: the
    "prefill", decode chunks by arm ("plain" or the draft arm's name) and the drafter's
    cache rebuilds after a switch of arm ("drafter_prefill"). Host work between calls
    (harvests, the drafter's scheduler) is not among them, nor are the rebuilds a drafter
    push forced (the scheduler's seconds)."""
    parts: dict[str, float] = {}
    rebuild_compile = 0.0  # a rebuild's compile, counted in its chunk's compile_s too
    for e in self.timeline:
      phase, compile_s = e["phase"], e.get("compile_s", 0.0)
      if phase == "drafter_prefill":
        rebuild_compile = e.get("rebuild_compile_s", 0.0)
        compile_s = rebuild_compile
        if e.get("forced_by_push"):
          continue
      elif phase in ("decode", "spec"):
        phase, compile_s = e.get("strategy", "plain"), compile_s - rebuild_compile
        rebuild_compile = 0.0
      elif phase != "prefill":
        continue
      parts[phase] = parts.get(phase, 0.0) + e["dt"] - compile_s
    return parts

  def spec_summary(self) -> dict[str, float]:
    """Speculative chunks of this rollout: rounds, and per active row-round the
    tokens committed (`accept_length`, the bonus/correction token included) and
    draft tokens accepted (`accepted_drafts`)."""
    spec = [e for e in self.timeline if e["phase"] == "spec"]
    row_rounds = sum(e["row_rounds"] for e in spec)
    per = lambda k: sum(e[k] for e in spec) / row_rounds if row_rounds else 0.0
    return {
      "chunks": len(spec),
      "rounds": sum(e["rounds"] for e in spec),
      "row_rounds": row_rounds,
      "tokens": sum(e["tokens"] for e in spec),
      "seconds": sum(e["dt"] for e in spec),
      "accept_length": per("tokens"),
      "accepted_drafts": per("accepted"),
    }

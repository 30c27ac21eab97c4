"""How many draft tokens a chain's rounds accept, and the speed a chain is predicted from it.

A cost model of speculative chains, used by the bandit (`rollout.bandit`: chain arms of one
drafter are scored from their family's curve) and the simulator (`sim.replay`: rows draw
their acceptance from an i.i.d. per-token rate). Not to be confused with
`drafter.acceptance`, which measures a drafter's accept length on held-out prompts.

A chain's draft of depth d is the first d tokens of a deeper chain's from the same state, so
L, the number of draft tokens the target would accept from an unbounded chain, has one
distribution per family, and a depth-d round emits 1 + min(L, d) tokens.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


class AcceptCurve:
  """Discounted Kaplan-Meier counts of how many draft tokens a chain family's rounds accept.

  at_risk[k]: row-rounds in which draft token k + 1 was checked (the first k accepted and
  the chain at least k + 1 deep); rejected[k]: those that rejected it. A chain of depth d
  accepting a tokens adds to at_risk[0 .. min(a, d - 1)] and, when a < d, to rejected[a].
  Kaplan-Meier, because a round of a shallow chain that accepted everything says nothing
  about the tokens past its depth (it is censored there), yet every chain's rounds inform
  the tokens they did check.
  """

  def __init__(self, at_risk=(), rejected=()):
    self.at_risk = np.asarray(at_risk, dtype=np.float64)
    self.rejected = np.asarray(rejected, dtype=np.float64)
    if self.at_risk.shape != self.rejected.shape or self.at_risk.ndim != 1:
      raise ValueError("acceptance curve: at_risk and rejected must be equal 1-D lists")

  def observe(self, accepted: np.ndarray, depth: int, discount: float) -> None:
    """`accepted[a]`: row-rounds of a depth-`depth` chain that accepted a draft tokens."""
    hist = np.asarray(accepted, dtype=np.float64)
    grow = depth - self.at_risk.size
    if grow > 0:
      self.at_risk = np.pad(self.at_risk, (0, grow))
      self.rejected = np.pad(self.rejected, (0, grow))
    self.at_risk *= discount
    self.rejected *= discount
    # Rounds that reached token k + 1: those that accepted k or more (k < depth).
    self.at_risk[:depth] += np.cumsum(hist[::-1])[::-1][:depth]
    self.rejected[:depth] += hist[:depth]

  def tokens_per_round(self, depth: int) -> float:
    """Predicted tokens a depth-`depth` round emits: 1 + E[min(L, depth)]. Depths past the
    data extrapolate its deepest hazard (NaN without data)."""
    if not (self.at_risk > 0).any():  # a prefix: a round checking token k + 1 checked k
      return math.nan
    return 1.0 + float(self._survival(depth).sum())  # sum of P(L >= k), k = 1..depth

  def tokens_sd(self, depth: int) -> float:
    """Standard deviation of the tokens a depth-`depth` round emits (NaN without data):
    E[min(L, d)^2] = sum over k of (2k - 1) P(L >= k)."""
    if not (self.at_risk > 0).any():
      return math.nan
    survival = self._survival(depth)
    second = float(((2 * np.arange(1, depth + 1) - 1) * survival).sum())
    return math.sqrt(max(second - float(survival.sum()) ** 2, 0.0))

  def frontier_tokens(self, depth: int, z: float, rounds: int) -> float:
    """Tokens per round of the row `z` standard deviations from the mean over a chunk of
    `rounds` rounds (rows spread apart by the per-round spread over sqrt(rounds)), at least
    1; `z` 0: the mean row (`frontier_z`)."""
    tokens = self.tokens_per_round(depth)
    if not z:
      return tokens
    return max(tokens + z * (self.tokens_sd(depth) / math.sqrt(rounds)), 1.0)

  def to_state(self) -> dict[str, list[float]]:
    return {"at_risk": self.at_risk.tolist(), "rejected": self.rejected.tolist()}

  def _survival(self, depth: int) -> np.ndarray:
    """P(L >= k) for k = 1..depth (past the data, its deepest hazard continues)."""
    seen = self.at_risk > 0
    known = self.rejected[seen] / self.at_risk[seen]
    hazard = np.full(depth, known[-1])
    hazard[: min(depth, known.size)] = known[:depth]
    return np.cumprod(1.0 - hazard)


def frontier_z(quantile: float | None, rows: int) -> float:
  """Where the `quantile` row of `rows` falls, in standard deviations from the mean: the
  expected k-th smallest of `rows` standard normals (Blom's approximation), k as
  `bandit.frontier_advance` picks it. 0 for the mean row (None) or a single row. A reward
  that follows a bucket's slowest rows is predicted for that row, not the mean one."""
  if quantile is None or rows <= 1:
    return 0.0
  k = int(quantile * (rows - 1))
  return NormalDist().inv_cdf((k + 1 - 0.375) / (rows + 0.25))


def per_token_acceptance(accept_length: float, nodes: int) -> float:
  """The i.i.d. per-token acceptance a whose chain of depth nodes - 1 emits `accept_length`
  tokens per round (bisection on (1 - a^n) / (1 - a); `sim.costs.chain_accept_length` is
  its inverse)."""
  n = nodes
  if accept_length >= n:
    return 1.0
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    value = n if mid == 1.0 else (1 - mid**n) / (1 - mid)
    lo, hi = (mid, hi) if value < accept_length else (lo, mid)
  return (lo + hi) / 2

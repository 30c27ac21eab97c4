"""Batch assembly: a step's scored rollouts -> the policy update's samples.

A step rolls out P prompts x G samples, and with DAPO dynamic sampling up to
`max_refills` more such batches, each in one or more engine calls of whole groups
(GRPOConfig.rows_per_call). Each call becomes a `ScoredRollout` (the engine's
result, its rewards, its old log-probs, its process credit); `assemble` takes
the first P informative groups of them, in rollout order, and lays them out as
[samples, width] arrays: tokens, response mask, old log-probs, the engine's
log-probs and advantages.
Everything here is host-side numpy and can be tested without a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tlt_jax.data.tokenizer import Tokenizer, text_ends
from tlt_jax.rl.advantages import (
  group_advantages,
  informative_groups,
  process_advantages,
  token_process_advantages,
)

# (example, completion) -> [(end, reward)] per reasoning step of the completion, e.g.
# data.checkers.arithmetic_steps on the example's question (see GRPOConfig.process_credit).
StepRewardFn = Callable[[Mapping[str, str], str], Sequence[tuple[int, float]]]


@dataclasses.dataclass(frozen=True)
class ProcessAdvantages:
  """Process supervision of one rollout.

  Attributes:
    tokens: [N, slots] per-token process advantages (0 off the response).
    informative: [P] per group, whether its step rewards differ at all.
    mean_step_reward: mean over all steps of all samples (0 when none).
    num_steps: how many steps that mean is over (to pool several calls' means).
  """

  tokens: np.ndarray
  informative: np.ndarray
  mean_step_reward: float
  num_steps: int = 0


class ProcessCredit:
  """Per-token process advantages from a step reward function (DeepSeekMath's
  process-supervised GRPO): step rewards normalised per group, then given to each token,
  "step" its own step's, "return" the sum over its step and the later ones.

  A step checker that raises or returns something malformed (ends not increasing within
  the text, rewards not finite) gives that sample no step credit; `errors` counts them
  since the last `reset_errors`.
  """

  def __init__(
    self,
    step_reward_fn: StepRewardFn,
    tokenizer: Tokenizer,
    credit: str,
    group_size: int,
    normalize_std: bool,
  ):
    self.step_reward_fn, self.tokenizer = step_reward_fn, tokenizer
    self.credit, self.group_size, self.normalize_std = credit, group_size, normalize_std
    self.errors = 0

  def reset_errors(self) -> None:
    self.errors = 0

  def __call__(
    self, result: Any, texts: Sequence[str], examples: Sequence[Mapping[str, str]]
  ) -> ProcessAdvantages:
    """`result`: a RolloutResult of len(examples) x G rows; `texts` its decoded completions."""
    g = self.group_size
    steps = [self._steps(examples[n // g], text) for n, text in enumerate(texts)]
    normalised = process_advantages(
      [[r for _, r in s] for s in steps], g, normalize_std=self.normalize_std
    )
    out = np.zeros(result.tokens.shape, np.float32)
    for n, (s, adv) in enumerate(zip(steps, normalised)):
      if not s:
        continue
      ids = result.completion(n)
      start = int(result.prompt_len[n])
      out[n, start : start + len(ids)] = token_process_advantages(
        [e for e, _ in s], adv, text_ends(self.tokenizer, ids), self.credit
      )
    informative = np.array(
      [any(np.any(a != 0) for a in normalised[j : j + g]) for j in range(0, len(texts), g)]
    )
    flat = [r for s in steps for _, r in s]
    return ProcessAdvantages(out, informative, float(np.mean(flat)) if flat else 0.0, len(flat))

  def _steps(self, example: Mapping[str, str], text: str) -> list[tuple[int, float]]:
    try:
      steps = [(int(e), float(r)) for e, r in self.step_reward_fn(example, text)]
      ends = [0, *(e for e, _ in steps)]
      increasing = all(a < b for a, b in zip(ends, ends[1:])) and ends[-1] <= len(text)
      if increasing and all(np.isfinite(r) for _, r in steps):
        return steps
    except Exception:  # a user's checker must not kill the run
      pass
    self.errors += 1
    return []


@dataclasses.dataclass
class ScoredRollout:
  """One engine call of a step with what the update needs from it.

  Attributes:
    result: the RolloutResult (P x G rows, grouped by prompt).
    rewards: [P x G] rewards the advantages use (shaping such as the overlong penalty in).
    raw_rewards: [P x G] the reward function's own values.
    old_logp: [P x G, slots] the trainer's log-probs of the sampled tokens under the
      policy that sampled them (filled once the device has computed them; None when the
      update needs no old-log-prob pass: one on-policy optimizer step).
    process: process advantages, or None without process supervision.
  """

  result: Any
  rewards: np.ndarray
  raw_rewards: np.ndarray
  old_logp: np.ndarray | None = None
  process: ProcessAdvantages | None = None

  def informative(self, group_size: int) -> np.ndarray:
    """[P] per group, whether it carries a learning signal: outcome rewards that differ,
    or (process supervision) step rewards that do."""
    kept = informative_groups(self.rewards, group_size)
    return kept if self.process is None else kept | self.process.informative


def packed_width(results: Sequence[Any], slots: int, fixed: int = 0) -> int:
  """Packed-row columns: the longest sample rounded up to 128 (few compiled shapes),
  at most the cache's `slots`; with `fixed` > 0, that width whenever the longest sample
  fits it, else `slots` (two widths in all)."""
  longest = max(int(r.length.max()) for r in results)
  if fixed:
    return min(fixed, slots) if longest <= fixed else slots
  return min(slots, -(-longest // 128) * 128)


def chosen_groups(
  rollouts: Sequence[ScoredRollout], group_size: int, groups: int, dynamic_sampling: bool
) -> list[tuple[int, int]]:
  """(rollout, group) pairs of the update batch: the first `groups` informative groups in
  rollout order with dynamic sampling, else the first `groups` of all."""
  pairs, flags = [], []
  for i, r in enumerate(rollouts):
    n = len(r.rewards) // group_size
    pairs += [(i, j) for j in range(n)]
    flags += list(r.informative(group_size) if dynamic_sampling else np.ones(n, bool))
  return [pair for pair, keep in zip(pairs, flags) if keep][:groups]


def pooled_step_reward(processes: Sequence[ProcessAdvantages]) -> float:
  """The mean step reward over several calls' process advantages (0 when no step)."""
  steps = sum(p.num_steps for p in processes)
  return sum(p.mean_step_reward * p.num_steps for p in processes) / steps if steps else 0.0


def assemble(
  rollouts: Sequence[ScoredRollout],
  chosen: Sequence[tuple[int, int]],
  group_size: int,
  width: int,
  *,
  normalize_std: bool = True,
  negative_weight: float = 1.0,
  process_coef: float = 1.0,
  std_ddof: int = 0,
) -> tuple[dict[str, np.ndarray], float | None]:
  """The update's samples for the `chosen` groups, and the largest |trainer - rollout|
  log-prob gap over their response tokens (0 without any; None when the rollouts have no
  old log-probs: the update's own forward then measures it).

  Samples, per sample row: tokens [n, width] int32, length [n], mask [n, width] (1 on
  response tokens), old_logp [n, width] (left out when the rollouts have none),
  rollout_logp [n, width] (the engine's recorded log-probs), advantages [n, width] (the
  group's outcome advantage on every column, plus process_coef x the process advantage
  per token). The chosen rollouts must all have old log-probs or all have none.
  """
  g = group_size
  n = len(chosen) * g
  with_old = {rollouts[i].old_logp is not None for i, _ in chosen}
  if len(with_old) > 1:
    raise ValueError("some chosen rollouts have old log-probs and some do not")
  with_old = with_old != {False}
  tokens = np.zeros((n, width), np.int32)
  length = np.zeros((n,), np.int32)
  mask = np.zeros((n, width), np.float32)
  adv = np.zeros((n, width), np.float32)
  rollout_lp = np.zeros((n, width), np.float32)
  old = np.zeros((n, width), np.float32)
  cols = np.arange(width)[None]
  for slot, (i, j) in enumerate(chosen):
    r = rollouts[i]
    res = r.result
    rows = slice(j * g, (j + 1) * g)
    dst = slice(slot * g, (slot + 1) * g)
    tokens[dst] = res.tokens[rows, :width]
    length[dst] = res.length[rows]
    rollout_lp[dst] = res.logprobs[rows, :width]
    if with_old:
      old[dst] = r.old_logp[rows, :width]
    mask[dst] = (cols >= res.prompt_len[rows, None]) & (cols < res.length[rows, None])
    adv[dst] = group_advantages(
      r.rewards[rows],
      g,
      normalize_std=normalize_std,
      negative_weight=negative_weight,
      std_ddof=std_ddof,
    )[:, None]
    if r.process is not None:
      adv[dst] += process_coef * r.process.tokens[rows, :width]
  samples = {
    "tokens": tokens,
    "length": length,
    "mask": mask,
    "rollout_logp": rollout_lp,
    "advantages": adv,
  }
  if not with_old:
    return samples, None
  samples["old_logp"] = old
  diff = np.abs(old - rollout_lp)[mask > 0]
  return samples, float(diff.max()) if diff.size else 0.0

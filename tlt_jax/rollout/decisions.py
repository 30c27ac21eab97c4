"""The rollout's decisions between chunks, written once: the engine (`rollout.run.RolloutRun`)
and the simulator (`sim.replay`) both call these, so a change to one changes both.

Between two device calls the engine decides, in order: the batch bucket the unfinished rows
move to (`bucket_after_compaction`); plain decode or a draft arm, and whether the chunk
teaches the bandit (`choose_arm`); the cache view the chunk's program reads (`chunk_view`);
how many plain steps it runs (`plain_steps`); after it, what the bandit learns from it
(`teach_bandit`, whose reward is `chunk_reward`). What each side does around them is its
own: the engine runs programs and times them, the simulator charges a cost model.
"""

from __future__ import annotations

from collections.abc import Sequence

from tlt_jax.rollout.bandit import PLAIN, StrategyBandit
from tlt_jax.rollout.state import round_up


def bucket_after_compaction(active_rows: int, batch: int, buckets: Sequence[int]) -> int:
  """The batch bucket the unfinished rows move to between chunks: the smallest that holds
  them, never larger than the one they are in."""
  return min(batch, round_up(active_rows, buckets))


def chunk_view(reach: float, views: Sequence[int]) -> int:
  """The cache view a chunk's program is compiled for: the bucket covering the furthest
  cache slot its rows may write (`state.plain_reach` / `state.spec_reach`; raises past the
  largest view)."""
  return round_up(int(reach), views)


def exploits_plain(bandit: StrategyBandit, batch: int) -> bool:
  """The bandit's pick for `batch` is plain decode as exploitation, not exploration."""
  return bandit.warmed_up(batch) and bandit.best(batch) == PLAIN


def choose_arm(
  bandit: StrategyBandit | None,
  batch: int,
  *,
  speculate: bool,
  default: str,
  last_bucket: bool,
) -> tuple[str, bool]:
  """(arm, learn) for the next chunk of a `batch`-row bucket.

  `speculate`: speculation is on and the bucket is at or below the threshold; otherwise
  plain decode, teaching nothing. With a bandit, its choice, learning from the chunk;
  without one, the `default` strategy. Once the bandit has settled on plain decode for the
  last bucket (`last_bucket`), that chunk runs to the end in one call (`plain_steps`): it is
  not chunk-sized, so it teaches nothing, but it counts as a pull of plain at plain's mean
  (`StrategyBandit.repeat`), so the bucket ages and the other arms are retried in time.
  """
  if not speculate:
    return PLAIN, False
  if bandit is None:
    return default, False
  arm = bandit.select(batch)
  settled = arm == PLAIN and last_bucket and exploits_plain(bandit, batch)
  if settled:
    bandit.repeat(batch, PLAIN)
  return arm, not settled


def plain_steps(chunk_steps: int, view: int, reach: float, run_to_end: bool) -> int:
  """Decode steps of a plain chunk: `chunk_steps`, or, with nothing left to compact and no
  bandit comparing arms (`run_to_end`), to the end of the cache view in one device call
  (host round trips cost more than small-batch steps); `reach` is the longest active row."""
  return max(chunk_steps, int(view - reach) + 1) if run_to_end else chunk_steps


def chunk_reward(run_s: float, *, tokens: float, mean_rows: float) -> float:
  """The bandit's reward for one chunk that ran `run_s` seconds: how fast the mean active
  row advanced, tokens per second over the rows active during the chunk (`mean_rows`).
  (The advance of the rows' lower octile, or of the least-advanced row, chose no better
  in an A/B against a control: experiments/RESULTS.md, 2026-11-28, host H.)"""
  return tokens / run_s / max(mean_rows, 1e-9)


def teach_bandit(
  bandit: StrategyBandit,
  batch: int,
  arm: str,
  *,
  run_s: float,
  full: bool,
  tokens: float,
  mean_rows: float,
) -> float | None:
  """What the bandit learns from a chunk it chose (`choose_arm`'s learn): a reward
  (`chunk_reward`) when the chunk ran all its steps and emitted tokens; nothing from a
  chunk cut short by its rows finishing (mostly fixed overhead, and an arm that ends a
  bucket sooner would be rewarded less for it). Returns the reward given, or None."""
  if not (full and tokens > 0):
    return None
  reward = chunk_reward(run_s, tokens=tokens, mean_rows=mean_rows)
  bandit.update(batch, arm, reward)
  return reward

"""The rollout's decisions between chunks, written once: the engine (`rollout.run.RolloutRun`)
and the simulator (`sim.replay`) both call these, so a change to one changes both.

Between two device calls the engine decides, in order: the batch bucket the unfinished rows
move to (`bucket_after_compaction`); plain decode or a draft arm, and whether the chunk
teaches the bandit (`choose_arm`); the cache view the chunk's program reads (`chunk_view`);
how many plain steps it runs (`runs_to_end`, `plain_steps`); after it, whether it measured
its arm (`measured`) and what the bandit learns from it (`teach_bandit`, whose reward is
`chunk_reward`). What each side does around them is its own: the engine runs programs and
times them, the simulator charges a cost model.
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
) -> tuple[str, bool]:
  """(arm, learn) for the next chunk of a `batch`-row bucket.

  `speculate`: speculation is on and the bucket is at or below the threshold; otherwise
  plain decode, teaching nothing. With a bandit, its choice, learning from the chunk;
  without one, the `default` strategy, teaching nothing.
  """
  if not speculate:
    return PLAIN, False
  if bandit is None:
    return default, False
  return bandit.select(batch), True


def runs_to_end(
  bandit: StrategyBandit | None, batch: int, *, learn: bool, last_bucket: bool
) -> bool:
  """Whether a plain chunk runs to the end of its cache view in one device call
  (`plain_steps`): in the last bucket (`last_bucket`), where there is nothing left to
  compact, unless the bandit is still comparing arms there (it needs chunk-sized samples).
  Once plain is its settled best, the chunk runs to the end and still teaches it
  (`measured`): plain's speed is re-measured, so a warm-up outlier does not keep the
  drafter arms out for good (experiments/RESULTS.md, 2026-12-05)."""
  return last_bucket and (not learn or exploits_plain(bandit, batch))


def plain_steps(chunk_steps: int, view: int, reach: float, run_to_end: bool) -> int:
  """Decode steps of a plain chunk: `chunk_steps`, or, run to the end (`runs_to_end`), to
  the end of the cache view in one device call (host round trips cost more than
  small-batch steps); `reach` is the longest active row."""
  return max(chunk_steps, int(view - reach) + 1) if run_to_end else chunk_steps


def measured(arm: str, ran: int, requested: int, chunk_steps: int) -> bool:
  """Whether a chunk that ran `ran` of its `requested` steps (rounds) measures its arm's
  speed: a speculative one that ran all its rounds; a plain one that ran at least
  `chunk_steps` (all of a chunk-sized one's; one run to the end of its view and cut short
  by its rows finishing has still spread its call's fixed cost over a chunk's steps or
  more). A chunk cut shorter is mostly fixed overhead, and an arm that ends a bucket sooner
  would be rewarded less for it."""
  return ran >= chunk_steps if arm == PLAIN else ran == requested


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
  measured: bool,
  tokens: float,
  mean_rows: float,
) -> float | None:
  """What the bandit learns from a chunk it chose (`choose_arm`'s learn): a reward
  (`chunk_reward`) when the chunk `measured` its arm and emitted tokens; nothing
  otherwise. Returns the reward given, or None."""
  if not (measured and tokens > 0):
    return None
  reward = chunk_reward(run_s, tokens=tokens, mean_rows=mean_rows)
  bandit.update(batch, arm, reward)
  return reward

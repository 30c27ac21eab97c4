"""The rollout engine's static configuration: shape budgets, buckets, and the policy of
speculative decoding (strategies, group-draft matching, the bandit's reward)."""

from __future__ import annotations

import dataclasses
import math

import jax

from tlt_jax.decode.group_drafts import GroupMatch
from tlt_jax.rollout.bandit import PLAIN, BanditSettings
from tlt_jax.rollout.speculative import SpecStrategy
from tlt_jax.rollout.state import power_of_two_buckets

ONE_ROW_STEPS = ("auto", "single", "paired")
# The smallest packed harvest (positions): below it a copy's bytes no longer matter.
HARVEST_MIN_POSITIONS = 256


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static shape budget and policy of a rollout engine.

  Attributes:
    max_prompt_len: longest prompt accepted.
    max_new_tokens: longest generation accepted (per-sequence limits may be lower).
    max_batch: most rows (prompts x samples) in one rollout.
    chunk_steps: decode steps per device call; the host decides between calls.
    min_batch_bucket / min_cache_bucket / min_prompt_bucket: smallest buckets;
      buckets double from there up to the maximum.
    compact: move the unfinished rows into smaller batch buckets as rows finish.
    cache_buckets: attend only to the smallest cache bucket that fits.
    capture_hidden: keep every position's last-layer hidden state.
    harvest_hidden: copy a finished row's hidden states to the host (the result's
      `hidden`: the online drafter's training data). Off, they stay on the device, where
      speculative decoding rebuilds the drafter's cache from them: a frozen drafter has
      no use for the copy, which at a GPU's batch costs more than the decoding.
    harvest_dtype: the dtype those copies arrive in, cast on the device ("bfloat16", the
      online drafter's buffer dtype, halves float32's bytes and leaves the host no
      conversion; the buffer's contents are the same either way).
    stop_tokens: token ids that end a sequence (the stop token is kept).
    spec_threshold: speculative decoding is considered for batch buckets at or
      below this many rows (0: never). Needs capture_hidden.
    spec_strategies: draft strategies by name ("chain4", "tree5x4x16", see
      `SpecStrategy.parse`).
    spec_adaptive: a bandit per batch bucket picks among plain decode and the
      strategies by measured tokens/s; False always uses the first strategy.
    spec_rounds: draft-verify rounds per speculative device call.
    group_ngram / group_candidates / group_min_match / group_agree: group drafts' match
      settings (`decode.group_drafts.GroupMatch`).
    group_siblings: sibling rows (same prompt, the row itself included) a row's group
      drafts read from the batch.
    group_reference_len: tokens of each row's reference line (its prompt's earlier
      rollouts and finished siblings, newest kept).
    group_history: rollouts per prompt the engine remembers for group drafts (0: none).
    bandit_exploration: the weight of the bandit's UCB bonus, in units of a bucket's best
      mean reward (`BanditSettings.exploration`): lower settles sooner on the best-looking
      arm and spends fewer chunks on close seconds.
    one_row_step: how a one-row bucket's plain decode step runs: "single" (its token, a
      one-token forward), "paired" (the token twice at its position, a two-token forward
      whose copy is discarded; the copy's cache slot is the next token's, written over by
      the next step) or "auto" (paired on a GPU, single elsewhere). On a GPU, XLA turns a
      product whose activation side is one row into an elementwise product and a reduction
      it often cannot fuse with what feeds it; two rows keep every projection a matrix
      product in fewer kernels (experiments/deviceless.py; experiments/RESULTS.md,
      2026-12-05). The layers' products now pair a lone row themselves (`models.products`,
      2026-12-06), which leaves the paired step a few kernels ahead of the single one (the
      50M policy's 249 against 258), its attention and the rest in matrix products too. A
      two-row bucket is no remedy: it would double a one-row verify's rows.
    matmul_precision: the precision the rollout programs' float32 matrix products run at
      (`jax.default_matmul_precision`; None: the platform's default). "highest" keeps
      speculative and plain decoding token-identical on GPUs, whose default (TF32) rounds
      a one-token decode step and a k-token verification differently: on an H200, 6 of
      216 greedy rows of the 50M policy differed at the default; at "highest" every float32
      exactness test passed (experiments/RESULTS.md, 2026-11-26, the second H200
      sitting). CPUs compute float32 products in float32 either way. bfloat16 compute is
      exact in distribution but not token-identical on GPUs (near ties round apart).
    background_compiles: with the bandit choosing (`spec_adaptive`), a chunk whose arm's
      program is not compiled yet runs an arm whose program is, while that one compiles
      on a host thread (`rollout.run.RolloutRun`; the tokens are the same under every
      arm); False waits for the compile, as an engine without a bandit always does.
    compile_ahead: with `background_compiles`, after a chunk while nothing compiles, the
      program the rollout likely needs next and does not hold compiles in the background
      (the arm's at the next cache view, the likely arm's at the next smaller batch
      bucket: `rollout.run.RolloutRun`), so the first chunk of a new cell need not wait.
      Off by default: it sped up a cold pool's first engine calls, but in the RL loop
      it kept the background thread busy with cells the rows may never reach, and chunks
      beside a compile teach the bandit nothing (experiments/RESULTS.md, 2026-12-07,
      compiles ahead).
  """

  max_prompt_len: int = 64
  max_new_tokens: int = 256
  max_batch: int = 128
  chunk_steps: int = 16
  min_batch_bucket: int = 1
  min_cache_bucket: int = 64
  min_prompt_bucket: int = 16
  compact: bool = True
  cache_buckets: bool = True
  capture_hidden: bool = True
  harvest_hidden: bool = True
  harvest_dtype: str = "float32"
  stop_tokens: tuple[int, ...] = ()
  spec_threshold: int = 0
  spec_strategies: tuple[str, ...] = ("chain4",)
  spec_adaptive: bool = True
  spec_rounds: int = 8
  group_ngram: int = 8
  group_candidates: int = 16
  group_min_match: int = 3
  group_agree: int = 1
  group_siblings: int = 8
  group_reference_len: int = 2048
  group_history: int = 4
  bandit_exploration: float = 0.2
  one_row_step: str = "auto"
  matmul_precision: str | None = "highest"
  background_compiles: bool = True
  compile_ahead: bool = False

  def __post_init__(self):
    for name in (
      "max_prompt_len",
      "max_new_tokens",
      "max_batch",
      "chunk_steps",
      "min_batch_bucket",
      "min_cache_bucket",
      "min_prompt_bucket",
      "spec_rounds",
      "group_siblings",
      "group_reference_len",
    ):
      v = getattr(self, name)
      if not isinstance(v, int) or v <= 0:
        raise ValueError(f"EngineConfig.{name} must be a positive int, got {v!r}")
    if not all(isinstance(t, int) and t >= 0 for t in self.stop_tokens):
      raise ValueError(f"stop_tokens must be non-negative ints, got {self.stop_tokens!r}")
    t = self.spec_threshold
    if not isinstance(t, int) or not 0 <= t <= self.max_batch:
      raise ValueError(
        f"EngineConfig.spec_threshold must be an int in [0, max_batch={self.max_batch}] "
        f"(0 turns speculative decoding off), got {t!r}"
      )
    names = self.spec_strategies
    if isinstance(names, str) or not isinstance(names, tuple | list) or not names:
      raise ValueError(
        f"EngineConfig.spec_strategies must be a non-empty tuple of names, got {names!r}"
      )
    object.__setattr__(self, "spec_strategies", tuple(names))
    parsed = [SpecStrategy.parse(n) for n in names]  # raises on unknown names
    if len({p.name for p in parsed}) != len(parsed):
      raise ValueError(f"EngineConfig.spec_strategies has duplicates: {names!r}")
    if t and not self.capture_hidden:
      raise ValueError("speculative decoding (spec_threshold > 0) needs capture_hidden=True")
    _ = self.group_match  # validates the match settings
    h = self.group_history
    if isinstance(h, bool) or not isinstance(h, int) or h < 0:
      raise ValueError(f"EngineConfig.group_history must be an int >= 0, got {h!r}")
    weight = self.bandit_exploration
    if (
      isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight < math.inf
    ):
      raise ValueError(f"EngineConfig.bandit_exploration must be a number >= 0, got {weight!r}")
    precisions = (None, "default", "high", "highest", "bfloat16", "tensorfloat32", "float32")
    if self.one_row_step not in ONE_ROW_STEPS:
      raise ValueError(
        f"EngineConfig.one_row_step must be one of {ONE_ROW_STEPS}, got {self.one_row_step!r}"
      )
    if self.matmul_precision not in precisions:
      raise ValueError(
        f"EngineConfig.matmul_precision must be one of {precisions}, got {self.matmul_precision!r}"
      )
    for name in ("harvest_hidden", "background_compiles", "compile_ahead"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"EngineConfig.{name} must be a bool, got {getattr(self, name)!r}")
    if self.harvest_dtype not in ("float32", "bfloat16", "float16"):
      raise ValueError(
        "EngineConfig.harvest_dtype must be float32, bfloat16 or float16, got "
        f"{self.harvest_dtype!r}"
      )

  @property
  def slots(self) -> int:
    """Cache / buffer length: room for the longest prompt plus generation."""
    return self.max_prompt_len + self.max_new_tokens

  @property
  def harvests_hidden(self) -> bool:
    """Whether finished rows' hidden states are copied to the host."""
    return self.capture_hidden and self.harvest_hidden

  def harvest_sizes(self, batch: int) -> tuple[int, ...]:
    """Position counts a harvest from a bucket of `batch` rows copies, packed: the rows'
    positions end to end, padded to the smallest of these that holds them (doubling from
    `HARVEST_MIN_POSITIONS` up to `batch` full rows); () when nothing is copied. The bytes
    then follow the tokens the rows hold, not the bucket's rows times a cache width."""
    if not self.harvests_hidden:
      return ()
    full = batch * self.slots
    return power_of_two_buckets(min(HARVEST_MIN_POSITIONS, full), full)

  @property
  def strategies(self) -> tuple[SpecStrategy, ...]:
    return tuple(SpecStrategy.parse(n) for n in self.spec_strategies)

  @property
  def group_match(self) -> GroupMatch:
    return GroupMatch(
      self.group_ngram, self.group_candidates, self.group_min_match, self.group_agree
    )

  @property
  def uses_group(self) -> bool:
    """Some strategy drafts from the group's text."""
    return bool(self.spec_threshold) and any(s.uses_group for s in self.strategies)

  @property
  def needs_drafter(self) -> bool:
    """Some strategy runs the EAGLE drafter."""
    return bool(self.spec_threshold) and any(s.uses_drafter for s in self.strategies)

  @property
  def cache_slots(self) -> int:
    """KV cache length: `slots`, plus room for a full draft past the last token
    when speculative decoding is on (see `rollout.speculative`)."""
    if not self.spec_threshold:
      return self.slots
    return self.slots + max(s.nodes for s in self.strategies) - 1

  def pairs_step(self, batch: int) -> bool:
    """Whether a plain step over a `batch`-row bucket runs as a two-token forward: one row
    only, as `one_row_step` says ("auto" reads the platform when asked, so a config built
    before the backend is chosen still follows it)."""
    if batch != 1:
      return False
    if self.one_row_step == "auto":
      return jax.default_backend() == "gpu"
    return self.one_row_step == "paired"

  @property
  def drafter_margin(self) -> int:
    return max(s.drafter_slots for s in self.strategies)

  @property
  def drafter_slots(self) -> int:
    """Drafter cache length: every committed pair plus the deepest draft."""
    return self.slots + self.drafter_margin

  @property
  def batch_buckets(self) -> tuple[int, ...]:
    return power_of_two_buckets(min(self.min_batch_bucket, self.max_batch), self.max_batch)

  @property
  def view_buckets(self) -> tuple[int, ...]:
    if not self.cache_buckets:
      return (self.cache_slots,)
    top = self.cache_slots
    return power_of_two_buckets(min(self.min_cache_bucket, top), top)

  @property
  def prompt_buckets(self) -> tuple[int, ...]:
    return power_of_two_buckets(
      min(self.min_prompt_bucket, self.max_prompt_len), self.max_prompt_len
    )


def bandit_settings(config: EngineConfig) -> tuple[tuple[str, ...], BanditSettings]:
  """The adaptive engine's bandit for `config`: its arms and `BanditSettings`.

  One place for the settings, so that experiments/bench_bandit.py times, and the simulator
  (`sim.replay`) replays, the bandit the engine builds. The config sets the UCB bonus's
  weight; the rest are `BanditSettings`' defaults.
  """
  settings = BanditSettings(exploration=float(config.bandit_exploration))
  return (PLAIN, *(s.name for s in config.strategies)), settings

"""Accept length of drafters on fixed held-out prompts, measured on equal terms.

During RL the online drafter's effect on the rollouts is hidden by everything else the
step's speed depends on (the bandit's arm choices, the batch's length mix, a changing
policy). `DrafterAcceptance` isolates it: the same held-out prompts, one sample each,
rolled out by the current policy with one forced draft strategy in every chunk (no
bandit, no plain chunks) under a fixed key, once per drafter. Speculative decoding is
exact, so every drafter sees the very same tokens (greedy or sampled: coupled sampling),
and the tokens committed per round per row (`RolloutResult.spec_summary()`'s
`accept_length`, the bonus token included) differ only by what the drafters propose.

The rollouts sample at the engine's own sampling configuration (the rollout temperature:
the acceptance the RL rollouts get), on an engine of their own that shares the trainer's
compiled-program pool and keeps the trainer's engine's bandit and group-draft history
untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from flax import nnx

from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.rollout.speculative import SpecStrategy

# Sequence ids apart from those of the held-out evaluation's samples (same base key).
_SEQ_OFFSET = 1 << 30


@dataclasses.dataclass(frozen=True)
class DrafterEvalConfig:
  """The drafter evaluation during RL (config rl.drafter_eval_*).

  Attributes:
    every: RL steps between measurements (0: never); measured after steps every,
      2 x every, ... (the step's metrics row gets drafter_eval/*).
    prompts: held-out prompts rolled out (one sample each) per drafter, the first ones of
      the trainer's held-out examples, in engine calls of its max_batch (one call's worth
      is a small sample: slices of 8 prompts differed by up to a token a round).
    strategy: the draft strategy every chunk runs, a drafter's chain or tree ("": the
      deepest chain among the engine's strategies, "chain4" when it has none).
  """

  every: int = 0
  prompts: int = 8
  strategy: str = ""

  def __post_init__(self):
    for name, low in (("every", 0), ("prompts", 1)):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ValueError(f"DrafterEvalConfig.{name} must be an int >= {low}, got {v!r}")
    if self.strategy:
      try:
        group = SpecStrategy.parse(self.strategy).uses_group
      except ValueError as e:
        raise ValueError(f"DrafterEvalConfig.strategy must be a strategy name: {e}") from None
      if group:
        raise ValueError(
          f"DrafterEvalConfig.strategy must be a drafter's chain or tree, got "
          f"{self.strategy!r} (it drafts from the group's text)"
        )

  def due(self, steps_done: int) -> bool:
    """Whether a measurement follows the step that brought the count to `steps_done`."""
    return bool(self.every) and steps_done > 0 and steps_done % self.every == 0


def default_strategy(config: EngineConfig) -> str:
  """The deepest drafter chain among the engine's strategies (the longest acceptance a
  round can show), or "chain4"."""
  chains = [s for s in config.strategies if s.kind == "chain"]
  return max(chains, key=lambda s: s.depth).name if chains else "chain4"


class DrafterAcceptance:
  """Speculative rollouts of fixed prompts with one forced strategy, one per drafter."""

  def __init__(
    self,
    engine: RolloutEngine,
    prompts: Sequence[Sequence[int]],
    config: DrafterEvalConfig,
    key: int = 0,
  ):
    """`engine`: the trainer's (its model, sampling, mesh and program pool are reused);
    `prompts`: encoded held-out prompts, the first `config.prompts` of them used."""
    if engine.drafter_graphdef is None:
      raise ValueError("a drafter evaluation needs an engine built with drafter_graphdef")
    ecfg = engine.config
    self.strategy = config.strategy or default_strategy(ecfg)
    self.prompts = [list(p) for p in prompts[: config.prompts]]
    if not self.prompts:
      raise ValueError("a drafter evaluation needs held-out prompts; none were given")
    # Every batch bucket speculative with the one strategy: no bandit, no plain chunk.
    cfg = dataclasses.replace(
      ecfg, spec_threshold=ecfg.max_batch, spec_strategies=(self.strategy,), spec_adaptive=False
    )
    mesh = engine.placement.mesh if engine.placement is not None else None
    self.engine = RolloutEngine(
      engine.graphdef,
      engine.model_config,
      cfg,
      engine.sampling,
      engine.pool,
      drafter_graphdef=engine.drafter_graphdef,
      mesh=mesh,
    )
    self.key = key

  def accept_length(self, params: nnx.State, drafter_params: nnx.State) -> float:
    """Tokens committed per speculative round per row with `drafter_params`, over all the
    prompts (one engine call per max_batch of them; the same tokens whatever the drafter:
    only the rounds they take differ)."""
    tokens = row_rounds = 0
    batch = self.engine.config.max_batch
    for start in range(0, len(self.prompts), batch):
      result = self.engine.generate(
        params,
        self.prompts[start : start + batch],
        1,
        key=self.key,
        seq_id_offset=_SEQ_OFFSET + start,
        drafter_params=drafter_params,
      )
      summary = result.spec_summary()
      tokens += summary["tokens"]
      row_rounds += summary["row_rounds"]
    # No round at all (every row ended at its prompt): nothing was measured.
    return tokens / row_rounds if row_rounds else float("nan")

  def compare(
    self, params: nnx.State, frozen: nnx.State, online: nnx.State | None = None
  ) -> dict[str, float]:
    """drafter_eval/accept_frozen (and with `online`, drafter_eval/accept_online) under the
    policy `params`."""
    out = {"drafter_eval/accept_frozen": self.accept_length(params, frozen)}
    if online is not None:
      out["drafter_eval/accept_online"] = self.accept_length(params, online)
    return out

"""The long-tail rollout engine: compaction, cache buckets, speculative decoding with a
bandit over draft strategies, and the executable pool its programs come from."""

from tlt_jax.rollout import decisions
from tlt_jax.rollout.bandit import PLAIN, BanditSettings, StrategyBandit
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import EnginePrograms, RolloutEngine
from tlt_jax.rollout.history import PromptHistory
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.rollout.profile import round_costs
from tlt_jax.rollout.result import RolloutResult
from tlt_jax.rollout.run import RolloutRun
from tlt_jax.rollout.speculative import RoundStages, SpecStrategy
from tlt_jax.rollout.state import RolloutState

__all__ = [
  "PLAIN",
  "BanditSettings",
  "EngineConfig",
  "EnginePrograms",
  "ExecutablePool",
  "PromptHistory",
  "RolloutEngine",
  "RolloutResult",
  "RolloutRun",
  "RolloutState",
  "RoundStages",
  "SpecStrategy",
  "StrategyBandit",
  "decisions",
  "round_costs",
]

"""GRPO-family policy optimisation: advantages, the clipped policy loss, the update step,
rewards and the trainer."""

from tlt_jax.rl.advantages import group_advantages, informative_groups, overlong_penalty
from tlt_jax.rl.loss import AGGREGATIONS, KL_TYPES, PolicyLossConfig, kl_penalty, policy_loss
from tlt_jax.rl.metrics import MetricsConfig
from tlt_jax.rl.rewards import (
  RewardBatch,
  RewardPool,
  format_reward,
  rewards_from_spec,
  weighted_rewards,
)
from tlt_jax.rl.trainer import GRPOConfig, GRPOTrainer
from tlt_jax.rl.update import (
  UpdateConfig,
  make_optimizer,
  make_policy_update,
  token_logprobs,
)

__all__ = [
  "AGGREGATIONS",
  "KL_TYPES",
  "MetricsConfig",
  "GRPOConfig",
  "GRPOTrainer",
  "PolicyLossConfig",
  "RewardBatch",
  "RewardPool",
  "UpdateConfig",
  "group_advantages",
  "informative_groups",
  "kl_penalty",
  "make_optimizer",
  "format_reward",
  "make_policy_update",
  "overlong_penalty",
  "policy_loss",
  "rewards_from_spec",
  "token_logprobs",
  "weighted_rewards",
]

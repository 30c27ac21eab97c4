"""GRPO-family policy optimisation: advantages, the clipped policy loss, the update step."""

from tlt_jax.rl.advantages import group_advantages, informative_groups, overlong_penalty
from tlt_jax.rl.loss import AGGREGATIONS, KL_TYPES, PolicyLossConfig, kl_penalty, policy_loss
from tlt_jax.rl.update import (
  UpdateConfig,
  make_optimizer,
  make_policy_update,
  token_logprobs,
)

__all__ = [
  "AGGREGATIONS",
  "KL_TYPES",
  "PolicyLossConfig",
  "UpdateConfig",
  "group_advantages",
  "informative_groups",
  "kl_penalty",
  "make_optimizer",
  "make_policy_update",
  "overlong_penalty",
  "policy_loss",
  "token_logprobs",
]

"""The warm starts: the policy's supervised training on a task's worked solutions, and the
drafter's fit on the policy's own rollouts."""

from tlt_jax.warmstart.drafter import collect_rollouts, fit_drafter
from tlt_jax.warmstart.sft import SFTConfig, train_sft

__all__ = ["SFTConfig", "collect_rollouts", "fit_drafter", "train_sft"]

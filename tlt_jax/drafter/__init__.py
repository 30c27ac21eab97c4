"""EAGLE drafter training: aligned data from rollouts, the loss, the update step, the
online drafter (buffer + versioned params) and its standalone export."""

from tlt_jax.drafter.acceptance import DrafterAcceptance, DrafterEvalConfig
from tlt_jax.drafter.buffer import DrafterBuffer
from tlt_jax.drafter.online import DrafterTrainConfig, OnlineDrafter
from tlt_jax.drafter.training import (
  batch_targets,
  drafter_loss,
  drafter_optimizer,
  make_drafter_update,
  make_training_batch,
)

__all__ = [
  "DrafterAcceptance",
  "DrafterBuffer",
  "DrafterEvalConfig",
  "DrafterTrainConfig",
  "OnlineDrafter",
  "batch_targets",
  "drafter_loss",
  "drafter_optimizer",
  "make_drafter_update",
  "make_training_batch",
]

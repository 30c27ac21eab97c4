"""EAGLE drafter training: aligned data from rollouts, the loss and the update step."""

from tlt_jax.drafter.training import (
  default_drafter_optimizer,
  drafter_loss,
  make_drafter_update,
  make_training_batch,
)

__all__ = [
  "default_drafter_optimizer",
  "drafter_loss",
  "make_drafter_update",
  "make_training_batch",
]

"""The optimizer every model here trains with: global-norm clipping, then AdamW.

The policy's SFT and RL updates and the drafter's offline and online training differ only
in their schedules and Adam's betas, which their own factories pass in.
"""

from __future__ import annotations

import optax


def clipped_adamw(
  schedule: optax.ScalarOrSchedule,
  *,
  grad_clip: float,
  b1: float = 0.9,
  b2: float = 0.999,
  weight_decay: float = 0.0,
) -> optax.GradientTransformation:
  return optax.chain(
    optax.clip_by_global_norm(grad_clip),
    optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay),
  )

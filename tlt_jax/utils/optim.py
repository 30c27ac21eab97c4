"""The optimizer every model here trains with: global-norm clipping, then AdamW.

The policy's SFT and RL updates and the drafter's offline and online training differ only
in their schedules and Adam's betas, which their own factories pass in. The RL update can
also scale its schedule per parameter group (`grouped_clipped_adamw`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import optax

# The label of parameters that are not trained (`grouped_clipped_adamw`).
FROZEN = "frozen"


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


def grouped_clipped_adamw(
  schedule: optax.Schedule,
  multipliers: Mapping[str, float],
  labels: Callable[[Any], Any],
  *,
  grad_clip: float,
  b1: float = 0.9,
  b2: float = 0.999,
  weight_decay: float = 0.0,
) -> optax.GradientTransformation:
  """`clipped_adamw` with a learning rate per parameter group.

  Args:
    schedule: the base learning-rate schedule.
    multipliers: group label -> factor on `schedule` for that group's AdamW (its weight
      decay, which AdamW scales by the learning rate, scales with it).
    labels: params -> a pytree like them of group labels; `FROZEN` leaves get zero updates.
    grad_clip, b1, b2, weight_decay: as `clipped_adamw`.

  Returns:
    A transformation that zeroes the frozen gradients, clips the rest by their one global
    norm (as `clipped_adamw` over the trained parameters), then runs each group's AdamW.
  """
  if FROZEN in multipliers:
    raise ValueError(f"{FROZEN!r} is the frozen parameters' label, not a group")
  scaled = lambda m: lambda count: m * schedule(count)  # noqa: E731
  groups = {
    label: optax.adamw(scaled(m), b1=b1, b2=b2, weight_decay=weight_decay)
    for label, m in multipliers.items()
  }
  return optax.chain(
    # Frozen gradients go first, so the clipping norm is the trained parameters' alone.
    optax.multi_transform(
      {**{label: optax.identity() for label in multipliers}, FROZEN: optax.set_to_zero()},
      labels,
    ),
    optax.clip_by_global_norm(grad_clip),
    optax.multi_transform({**groups, FROZEN: optax.set_to_zero()}, labels),
  )

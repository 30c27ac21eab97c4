"""A trace-driven simulator of RL steps: the rollout engine's policy replayed on response
lengths with a decode cost model (`costs`), predicting rollout and step time per mode
(`replay`). experiments/simulate.py calibrates it on this host and projects it to others."""

from tlt_jax.sim.costs import (
  ArmModel,
  DecodeCost,
  RooflineCost,
  TableCost,
  arms_from_accept,
  chain_accept_length,
)
from tlt_jax.sim.replay import (
  EnginePolicy,
  RolloutPrediction,
  StepPrediction,
  replay_rollout,
  replay_step,
  speedup_bound,
)

__all__ = [
  "ArmModel",
  "DecodeCost",
  "EnginePolicy",
  "RolloutPrediction",
  "RooflineCost",
  "StepPrediction",
  "TableCost",
  "arms_from_accept",
  "chain_accept_length",
  "replay_rollout",
  "replay_step",
  "speedup_bound",
]

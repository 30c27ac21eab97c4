"""A trace-driven simulator of RL steps: the rollout engine's policy replayed on response
lengths with a decode cost model (`costs`), predicting rollout and step time per mode
(`replay`), and checked against a measured run (`validate`). experiments/simulate.py
calibrates it on this host and projects it to others."""

from tlt_jax.sim.costs import (
  ArmModel,
  DecodeCost,
  EngineCost,
  RooflineCost,
  TableCost,
  arms_from_accept,
  chain_accept_length,
  per_token_acceptance,
)
from tlt_jax.sim.replay import (
  ChunkPlan,
  EnginePolicy,
  RecordedChunk,
  ReplayRun,
  RolloutPrediction,
  StepPrediction,
  replay_rollout,
  replay_step,
  speedup_bound,
)
from tlt_jax.sim.validate import (
  Calibration,
  StepRecord,
  compare,
  decision_mismatch,
  engine_bandit,
  modelled,
  step_record,
)

__all__ = [
  "ArmModel",
  "ChunkPlan",
  "Calibration",
  "DecodeCost",
  "EngineCost",
  "EnginePolicy",
  "RecordedChunk",
  "ReplayRun",
  "RolloutPrediction",
  "RooflineCost",
  "StepPrediction",
  "StepRecord",
  "TableCost",
  "arms_from_accept",
  "chain_accept_length",
  "compare",
  "decision_mismatch",
  "engine_bandit",
  "modelled",
  "per_token_acceptance",
  "replay_rollout",
  "replay_step",
  "speedup_bound",
  "step_record",
]

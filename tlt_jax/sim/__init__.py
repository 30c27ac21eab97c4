"""A trace-driven simulator of RL steps: the rollout engine's policy replayed on response
lengths with a decode cost model (`costs`), predicting rollout and step time per mode
(`replay`), projected onto a device's costs (`project`), and checked against a measured
run (`validate`). experiments/simulate.py calibrates it on this host and projects it to
others."""

from tlt_jax.sim.costs import (
  ArmModel,
  DecodeCost,
  EngineCost,
  PairedOneRow,
  RooflineCost,
  TableCost,
  arms_from_accept,
  chain_accept_length,
  per_token_acceptance,
)
from tlt_jax.sim.project import (
  ACCEPT_FROZEN,
  ACCEPT_ONLINE,
  TAIL_ACCEPT_MEASURED,
  device_roofline,
  lognormal_lengths,
  paper_policy,
  predict_modes,
  project_step,
  scaled_accept,
  scaled_arms,
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
  bucket_accept_lengths,
  compare,
  decision_mismatch,
  engine_bandit,
  modelled,
  step_record,
)

__all__ = [
  "ACCEPT_FROZEN",
  "ACCEPT_ONLINE",
  "TAIL_ACCEPT_MEASURED",
  "ArmModel",
  "ChunkPlan",
  "Calibration",
  "DecodeCost",
  "EngineCost",
  "EnginePolicy",
  "PairedOneRow",
  "RecordedChunk",
  "ReplayRun",
  "RolloutPrediction",
  "RooflineCost",
  "StepPrediction",
  "StepRecord",
  "TableCost",
  "arms_from_accept",
  "bucket_accept_lengths",
  "chain_accept_length",
  "compare",
  "decision_mismatch",
  "device_roofline",
  "engine_bandit",
  "lognormal_lengths",
  "modelled",
  "paper_policy",
  "per_token_acceptance",
  "predict_modes",
  "project_step",
  "replay_rollout",
  "replay_step",
  "scaled_accept",
  "scaled_arms",
  "speedup_bound",
  "step_record",
]

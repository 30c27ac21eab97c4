"""Projections: what TLT does to an RL step on a device, from that device's costs.

The rollout engine's policy is replayed (`replay.replay_step`) in each mode (baseline, sd
with a frozen drafter, tlt with the online one) on drawn response lengths, with a decode
cost model: a device's measured forwards (`costs.TableCost`, e.g. from
experiments/real_sizes.py) or a roofline. experiments/simulate.py prints these
projections; notebooks/05_your_device.py plots them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tlt_jax.models.config import ModelConfig
from tlt_jax.sim.costs import ArmModel, DecodeCost, RooflineCost, arms_from_accept
from tlt_jax.sim.replay import EnginePolicy, replay_step, speedup_bound

# The paper's long-tail statistics for DAPO-like runs (median ~470 tokens, p90 ~1k, 32k
# cap; REFERENCE: "RL in the Wild" traces) and its engine settings.
DAPO_MEDIAN, DAPO_P90, DAPO_CAP = 470.0, 1000.0, 32768
# Chain accept lengths this project measured for a drafter trained once and then frozen
# (sd) and for the online one (tlt), on its own policies (experiments/bench_sd.py and
# e2e_modes.py; experiments/RESULTS.md): the projections' defaults.
ACCEPT_FROZEN = {"chain4": 3.4, "chain8": 4.6}
ACCEPT_ONLINE = {"chain4": 3.9, "chain8": 5.9}
# The one-row tail's accepted draft tokens over a full bucket's, as host G's regime run
# measured them (chain4 0.79, chain8 0.59; experiments/RESULTS.md, 2026-12-07): the low end
# of the projections' sensitivity to it (1.0: the tail accepts what every bucket does).
TAIL_ACCEPT_MEASURED = 0.6


def lognormal_lengths(
  median: float, p90: float, cap: int, rows: int, steps: int, seed: int
) -> list[list[int]]:
  """Response lengths of `steps` rollouts of `rows`: log-normal through the median and p90,
  capped (rows at the cap are the truncated ones)."""
  sigma = math.log(p90 / median) / 1.2816  # the normal's 90th percentile
  rng = np.random.default_rng(seed)
  draws = rng.lognormal(math.log(median), sigma, size=(steps, rows))
  return np.clip(np.rint(draws), 1, cap).astype(int).tolist()


def paper_policy(rows: int) -> EnginePolicy:
  """The paper's engine settings for `rows` rows an instance: chunks of 16 steps,
  speculation at <= 32 running rows, prompts of 256 tokens."""
  return EnginePolicy(max_batch=rows, chunk_steps=16, spec_threshold=32, prompt_len=256)


def predict_modes(
  cost: DecodeCost,
  policy: EnginePolicy,
  traces: Sequence[Sequence[int]],
  arms_sd: Sequence[ArmModel],
  arms_tlt: Sequence[ArmModel],
  update_s: float,
  other_s: float = 0.0,
  drafter_s: float = 0.0,
  stochastic: bool = True,
  prompts: Sequence[Sequence[int]] | None = None,
  tail_accept: float = 1.0,
) -> dict[str, dict[str, Any]]:
  """Mean rollout / step seconds per mode over the traces (with their rows' prompt lengths,
  when known), the end-to-end ratios over the baseline and Amdahl's bound for each.
  `tail_accept`: the arms' accepted draft tokens in the one-row bucket, as a fraction of
  theirs elsewhere (a run's longest rows are its hardest to draft)."""
  modes = {"baseline": (), "sd": arms_sd, "tlt": arms_tlt}
  out: dict[str, dict[str, Any]] = {}
  for mode, arms in modes.items():
    preds = [
      replay_step(
        mode,
        lengths,
        cost,
        policy,
        arms,
        update_s_per_token=update_s,
        other_s=other_s,
        drafter_s=drafter_s,
        prompt_lens=prompts[i] if prompts else None,
        stochastic=stochastic,
        seed=i,
        bucket_arms={1: scaled_arms(arms, tail_accept)} if tail_accept != 1.0 else None,
      )
      for i, lengths in enumerate(traces)
    ]
    arm_chunks: dict[str, int] = {}
    for p in preds:
      for k, v in p.rollout.chunks_by_arm.items():
        arm_chunks[k] = arm_chunks.get(k, 0) + v
    out[mode] = {
      "rollout_s": float(np.mean([p.rollout_s for p in preds])),
      "step_s": float(np.mean([p.step_s for p in preds])),
      "chunks_by_arm": arm_chunks,
    }
  base = out["baseline"]
  for mode in ("sd", "tlt"):
    m = out[mode]
    m["rollout_speedup"] = base["rollout_s"] / m["rollout_s"]
    m["step_speedup"] = base["step_s"] / m["step_s"]
    m["bound"] = speedup_bound(base["rollout_s"] / base["step_s"], m["rollout_speedup"])
  base["rollout_share"] = base["rollout_s"] / base["step_s"]
  return out


def scaled_accept(accept: Mapping[str, float], factor: float) -> dict[str, float]:
  """Accept lengths ({"chain4": 3.9, ...}) with their accepted draft tokens (length - 1)
  scaled by `factor`, at most a chain's depth + 1."""
  return {a.name: a.accept_length for a in scaled_arms(arms_from_accept(accept, 0.0), factor)}


def scaled_arms(arms: Sequence[ArmModel], factor: float) -> tuple[ArmModel, ...]:
  """`arms` with their accepted draft tokens (accept length - 1) scaled by `factor`, at most
  their nodes."""
  return tuple(
    dataclasses.replace(a, accept_length=min(1.0 + (a.accept_length - 1.0) * factor, a.nodes))
    for a in arms
  )


def device_roofline(
  measured: Mapping[str, Any], cfg: ModelConfig, overhead_s: float
) -> tuple[RooflineCost | None, float | None]:
  """A roofline of the device experiments/real_sizes.py measured on (`measured`: its
  results): the spec sheet's peaks with bandwidth at the measured copy rate (on a CPU the
  measured copy and matmul rates), and its peak FLOP/s; (None, None) where neither was
  measured."""
  bw = measured.get("bandwidth") or {}
  spec = bw.get("spec")
  peak = spec[1] * 1e12 if spec else (measured.get("update") or {}).get("peak_flops")
  if not (bw.get("gb_per_s") and peak):
    return None, None
  bandwidth = spec[0] * 1e12 if spec else bw["gb_per_s"] * 1e9
  cost = RooflineCost(
    params=cfg.num_params,
    bytes_per_param=2,
    kv_bytes_per_token=2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2,
    peak_flops=peak,
    bandwidth=bandwidth,
    bandwidth_efficiency=min(bw["gb_per_s"] * 1e9 / bandwidth, 1.0),
    overhead_s=overhead_s,
  )
  return cost, peak


def project_step(
  cost: DecodeCost,
  cfg: ModelConfig,
  peak_flops: float,
  accept_sd: Mapping[str, float],
  accept_tlt: Mapping[str, float],
  *,
  rows: int,
  draft: float,
  mfu: float = 0.4,
  p90: float = DAPO_P90,
  accept: float = 1.0,
  tail_accept: float = 1.0,
  steps: int = 20,
  seed: int = 0,
) -> dict[str, dict[str, Any]]:
  """The three modes on `cost` in the paper's settings: DAPO-like lengths (median 470,
  `p90`, 32k cap) for `rows` rows an instance, chain arms at the given accept lengths (their
  accepted draft tokens scaled by `accept`, and in the one-row tail by `tail_accept` too), a
  drafter step of `draft` decode steps, and an update of 6 x params FLOPs a token at `mfu`
  of `peak_flops`."""
  traces = lognormal_lengths(DAPO_MEDIAN, p90, DAPO_CAP, rows, steps, seed)
  arms_sd = arms_from_accept(scaled_accept(accept_sd, accept), draft)
  arms_tlt = arms_from_accept(scaled_accept(accept_tlt, accept), draft)
  update_s = 6 * cfg.num_params / (mfu * peak_flops)
  policy = paper_policy(rows)
  return predict_modes(cost, policy, traces, arms_sd, arms_tlt, update_s, tail_accept=tail_accept)

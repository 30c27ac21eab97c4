"""The EAGLE drafter's offline warm start: roll prompts out with the policy (its hidden
states captured), then fit an `OnlineDrafter` to them.

The default job (`train.build_drafter`) and `experiments/train_drafter.py` both go through
these two functions; online training later goes on from the same `OnlineDrafter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.drafter.online import OnlineDrafter


def collect_rollouts(
  engine: Any,
  params: nnx.State,
  prompts: Sequence[Sequence[int]],
  *,
  temperatures: Sequence[float | None] = (None,),
  key: int = 0,
  seq_id_offset: int = 0,
  progress: bool = True,
) -> list[Any]:
  """One rollout (G = 1) of every prompt in engine-sized batches; batch i samples at
  `temperatures[i % len(temperatures)]` (None: the engine's own sampling). The engine
  must capture hidden states (a drafter's training data)."""
  results = []
  batch = engine.config.max_batch
  starts = range(0, len(prompts), batch)
  for n, i in enumerate(tqdm(starts, desc="rollouts", disable=not progress)):
    t = temperatures[n % len(temperatures)]
    results.append(
      engine.generate(
        params,
        prompts[i : i + batch],
        key=key + i,
        sampling=None if t is None else SamplingConfig(temperature=t),
        seq_id_offset=seq_id_offset + i,
      )
    )
  return results


def stack_rollouts(parts) -> dict[str, np.ndarray]:
  """Several rollouts' rows as one set of arrays, `tokens` and `hidden` cut or zero-padded
  to the longest row: each rollout's hidden states come back only as wide as its own rows
  reach (`EngineConfig.harvest_sizes`)."""
  width = int(max(r.length.max() for r in parts))

  def columns(x):
    x = x[:, :width]
    return np.pad(x, [(0, 0), (0, width - x.shape[1])] + [(0, 0)] * (x.ndim - 2))

  cat = lambda f: np.concatenate([f(r) for r in parts])  # noqa: E731
  return {
    "tokens": cat(lambda r: columns(r.tokens)),
    "hidden": cat(lambda r: columns(r.hidden)),
    "prompt_len": cat(lambda r: r.prompt_len),
    "length": cat(lambda r: r.length),
  }


def fit_drafter(
  drafter: OnlineDrafter,
  target_params: nnx.State,
  steps: int,
  *,
  log_every: int = 10,
  progress: bool = True,
) -> list[dict[str, float]]:
  """`steps` optax updates of `drafter` on its buffer; returns the metrics of every
  `log_every`-th update and of the last (host floats, with their step)."""
  history = []
  bar = tqdm(range(steps), desc="drafter", disable=not progress)
  for step in bar:
    metrics = drafter.update(target_params)
    if step % log_every == 0 or step == steps - 1:
      m = {k: float(v) for k, v in jax.device_get(metrics).items()}
      history.append({"step": step, **m})
      bar.set_postfix(loss=f"{m['loss']:.3f}", top1=f"{m['top1_agreement']:.3f}")
  return history

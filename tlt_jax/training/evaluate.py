"""Held-out evaluation: pass@1 with greedy decoding through the rollout engine."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flax import nnx

from tlt_jax.data.tokenizer import Tokenizer
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.rollout.engine import RolloutEngine

GREEDY = SamplingConfig(temperature=0.0)


def evaluate_pass_at_1(
  engine: RolloutEngine,
  params: nnx.State,
  tokenizer: Tokenizer,
  examples: Sequence[Mapping[str, str]],
  check: Callable[[str, str], float],
  format_prompt: Callable[[Mapping[str, str]], str],
  batch_prompts: int | None = None,
) -> dict[str, Any]:
  """Greedy pass@1 over `examples`; returns accuracy, lengths and a few samples."""
  batch_prompts = batch_prompts or engine.config.max_batch
  rewards, lengths, samples = [], [], []
  for i in range(0, len(examples), batch_prompts):
    chunk = examples[i : i + batch_prompts]
    prompts = [tokenizer.encode(format_prompt(ex), add_bos=True) for ex in chunk]
    res = engine.generate(params, prompts, 1, sampling=GREEDY)
    for n, ex in enumerate(chunk):
      text = tokenizer.decode(res.completion(n))
      rewards.append(check(text, ex["answer"]))
      lengths.append(int(res.num_generated[n]))
      if len(samples) < 3:
        samples.append({"prompt": format_prompt(ex), "completion": text, "answer": ex["answer"]})
  return {
    "accuracy": float(np.mean(rewards)),
    "num_examples": len(rewards),
    "mean_length": float(np.mean(lengths)),
    "samples": samples,
  }

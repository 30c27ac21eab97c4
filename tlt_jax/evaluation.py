"""Held-out evaluation through the rollout engine: greedy pass@1, and sampled pass@1.

Greedy pass@1 scores the policy's mode. RL at temperature T optimises the
*sampling* distribution, so the figure it moves first is sampled pass@1: the mean
accuracy of k samples per problem at T (avg@k, the pass@1 estimate reasoning-RL
papers report). Both are computed on the same problems; sampling uses a fixed key
so two policies are compared on the same random numbers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flax import nnx

from tlt_jax.data.tokenizer import Tokenizer
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.rollout.engine import RolloutEngine

GREEDY = SamplingConfig(temperature=0.0)


def completions(
  engine: RolloutEngine,
  params: nnx.State,
  tokenizer: Tokenizer,
  examples: Sequence[Mapping[str, str]],
  format_prompt: Callable[[Mapping[str, str]], str],
  batch_prompts: int | None = None,
  *,
  sampling: SamplingConfig = GREEDY,
  num_samples: int = 1,
  key: int = 0,
  drafter_params: nnx.State | None = None,
) -> tuple[list[str], list[int]]:
  """Decodes `num_samples` completions per example (example-major), `batch_prompts`
  examples a call (default: what the engine's max batch holds), each row keyed by its
  sequence id so that the batching does not change the tokens. Returns (texts, lengths)."""
  if num_samples < 1 or (sampling.greedy and num_samples != 1):
    raise ValueError(f"num_samples must be 1 for greedy and >= 1 otherwise, got {num_samples}")
  batch_prompts = batch_prompts or max(engine.config.max_batch // num_samples, 1)
  texts, lengths = [], []
  for i in range(0, len(examples), batch_prompts):
    chunk = examples[i : i + batch_prompts]
    prompts = [tokenizer.encode(format_prompt(ex), add_bos=True) for ex in chunk]
    res = engine.generate(
      params,
      prompts,
      num_samples,
      sampling=sampling,
      key=key,
      seq_id_offset=i * num_samples,
      drafter_params=drafter_params,
    )
    for n in range(len(chunk) * num_samples):
      texts.append(tokenizer.decode(res.completion(n)))
      lengths.append(int(res.num_generated[n]))
  return texts, lengths


def problems_digest(examples: Sequence[Mapping[str, str]]) -> str:
  """A short fingerprint of held-out problems (every field of each, in order): a recorded
  evaluation is comparable with another only on the same problems, and a task's held-out
  split changes with its parameters (e.g. a warm start's SFT stage built with another
  `median_steps` scores other problems)."""
  text = json.dumps([dict(ex) for ex in examples], sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def evaluate_pass_at_1(
  engine: RolloutEngine,
  params: nnx.State,
  tokenizer: Tokenizer,
  examples: Sequence[Mapping[str, str]],
  check: Callable[[str, str], float],
  format_prompt: Callable[[Mapping[str, str]], str],
  batch_prompts: int | None = None,
  *,
  sampling: SamplingConfig = GREEDY,
  num_samples: int = 1,
  key: int = 0,
  drafter_params: nnx.State | None = None,
) -> dict[str, Any]:
  """pass@1 over `examples`: greedy by default; with a sampling config, the mean
  accuracy of `num_samples` samples per problem drawn with `key`. `drafter_params` (an
  engine built with a drafter): decode speculatively, the same tokens sooner.

  Returns accuracy, num_examples, num_samples, mean_length, the problems' digest
  (`problems_digest`) and a few samples.
  """
  texts, lengths = completions(
    engine,
    params,
    tokenizer,
    examples,
    format_prompt,
    batch_prompts,
    sampling=sampling,
    num_samples=num_samples,
    key=key,
    drafter_params=drafter_params,
  )
  owners = [ex for ex in examples for _ in range(num_samples)]
  rewards = [check(text, ex["answer"]) for text, ex in zip(texts, owners)]
  samples = [
    {"prompt": format_prompt(ex), "completion": text, "answer": ex["answer"]}
    for text, ex in zip(texts[:3], owners[:3])
  ]
  return {
    "accuracy": float(np.mean(rewards)),
    "num_examples": len(examples),
    "num_samples": num_samples,
    "mean_length": float(np.mean(lengths)),
    "problems": problems_digest(examples),
    "samples": samples,
  }


def held_out_metrics(
  engine: RolloutEngine,
  params: nnx.State,
  tokenizer: Tokenizer,
  examples: Sequence[Mapping[str, str]],
  check: Callable[[str, str], float],
  format_prompt: Callable[[Mapping[str, str]], str],
  *,
  samples: int = 0,
  key: int = 0,
  drafter_params: nnx.State | None = None,
) -> dict[str, float]:
  """An RL run's evaluation row: greedy accuracy and mean response length, and with
  `samples` > 0 sampled pass@1 (`samples` per problem at the engine's own sampling, drawn
  with `key`, so every evaluation of a run uses the same random numbers). `drafter_params`:
  speculative decoding (`evaluate_pass_at_1`)."""
  args = (engine, params, tokenizer, examples, check, format_prompt)
  greedy = evaluate_pass_at_1(*args, drafter_params=drafter_params)
  row = {"accuracy": greedy["accuracy"], "mean_length": greedy["mean_length"]}
  if samples:
    sampled = evaluate_pass_at_1(
      *args, sampling=engine.sampling, num_samples=samples, key=key, drafter_params=drafter_params
    )
    row["sampled_accuracy"] = sampled["accuracy"]
  return row

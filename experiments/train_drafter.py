r"""Offline EAGLE drafter training for a warm-started policy; reports acceptance length.

1. The warm-started policy: restored from <workdir>/warm_start, else trained
   (SFT) and saved there, exactly as the default job does.
2. Rollouts of the policy on training prompts (half greedy, half temperature 1)
   with the target's hidden states captured: the drafter's training data.
3. Offline drafter training (`warmstart.drafter.fit_drafter`, the default job's loop:
   an `OnlineDrafter` whose buffer holds every rollout; AdamW with a cosine decay;
   SmoothL1 on features + `--logit_weight` x soft CE, EAGLE alignment, samples packed
   without attending to each other).
4. Acceptance on HELD-OUT prompts: speculative rollouts with a fixed chain
   strategy at temperature 0 and 1; tokens committed per round per sequence.

Writes <workdir>/drafter (orbax params), drafter_report.json, drafter_loss.png.

  python experiments/train_drafter.py --config=configs/sd_bench.py --workdir=runs/sd_policy
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax
import numpy as np
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import host_info  # noqa: E402
from tlt_jax import checkpoint, configuration, train  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.data.tasks import format_prompt  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.drafter.online import DrafterTrainConfig, OnlineDrafter  # noqa: E402
from tlt_jax.models.drafter import init_drafter  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402
from tlt_jax.rollout.pool import ExecutablePool  # noqa: E402
from tlt_jax.warmstart.drafter import collect_rollouts, fit_drafter, stack_rollouts  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sd_bench.py", "policy config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/sd_policy", "holds warm_start/ and outputs")
_PROMPTS = flags.DEFINE_integer("rollout_prompts", 256, "training prompts to roll out")
_STEPS = flags.DEFINE_integer("steps", 300, "drafter optimiser steps")
_ROWS = flags.DEFINE_integer("batch_rows", 8, "packed rows per drafter step")
_LR = flags.DEFINE_float("lr", 3e-3, "peak drafter learning rate")
_EVAL = flags.DEFINE_integer(
  "eval_prompts", 16, "held-out prompts for acceptance (0: no acceptance check)"
)
_STRATEGY = flags.DEFINE_string("eval_strategy", "chain4", "strategy for the acceptance check")
_LOGIT_WEIGHT = flags.DEFINE_float(
  "logit_weight", 0.1, "weight of the soft cross-entropy to the target's distribution"
)
_TEACHER_T = flags.DEFINE_float(
  "teacher_temperature", 1.0, "temperature of that distribution (0: one-hot on its argmax)"
)
_OUT_NAME = flags.DEFINE_string("out_name", "drafter", "<workdir>/<out_name>: the drafter's params")


def encode_prompts(tokenizer, examples):
  return [tokenizer.encode(format_prompt(ex), add_bos=True) for ex in examples]


def rollout_arrays(engine, params, prompts):
  """Half greedy, half temperature 1 (`warmstart.drafter.collect_rollouts`), stacked
  (`warmstart.drafter.stack_rollouts`); saved so that drafters trained with other losses
  reuse them."""
  return stack_rollouts(collect_rollouts(engine, params, prompts, temperatures=(0.0, 1.0)))


def acceptance(engine, params, dparams, prompts, temperature, strategy):
  r = engine.generate(
    params,
    prompts,
    key=123,
    sampling=SamplingConfig(temperature=temperature),
    drafter_params=dparams,
    seq_id_offset=10**6,
  )
  return {
    "temperature": temperature,
    "strategy": strategy,
    **r.spec_summary(),
    "tokens_per_second": r.tokens_per_second,
  }


def plot(history, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
  steps = [h["step"] for h in history]
  ax[0].plot(steps, [h["loss"] for h in history])
  ax[0].set_xlabel("step")
  ax[0].set_ylabel("loss")
  ax[0].set_title("drafter loss")
  ax[1].plot(steps, [h["top1_agreement"] for h in history])
  ax[1].set_xlabel("step")
  ax[1].set_ylabel("top-1 agreement")
  ax[1].set_title("drafter vs target next token (train)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)
  tokenizer = get_tokenizer(config.task.tokenizer)
  train_split, test_split = train.load_data(config, workdir)
  model_cfg, graphdef, params, info = train.build_policy(config, workdir, tokenizer, train_split)
  logging.info("policy: %.1fM params (%s)", model_cfg.num_params / 1e6, info["source"])
  engine_cfg = configuration.engine_config(config, tokenizer)
  engine = RolloutEngine(graphdef, model_cfg, engine_cfg)

  t0 = time.perf_counter()
  prompts = encode_prompts(tokenizer, list(train_split)[: _PROMPTS.value])
  # The rollouts are saved: drafters trained with other losses reuse them.
  cached = os.path.join(workdir, f"drafter_data_{len(prompts)}.npz")
  if os.path.exists(cached):
    with np.load(cached) as f:
      data = dict(f)
  else:
    with engine.pool.compiling_ahead():  # both temperatures' programs, side by side
      for t in (0.0, 1.0):
        batch = [min(len(prompts), engine_cfg.max_batch)]
        lens = [len(p) for p in prompts]
        engine.warmup(params, SamplingConfig(temperature=t), num_prompts=batch, prompt_lens=lens)
    data = rollout_arrays(engine, params, prompts)
    np.savez(cached, **data)
  rollout_s = time.perf_counter() - t0

  dgraph, dparams = nnx.split(init_drafter(model_cfg, seed=0))
  steps = _STEPS.value
  dcfg = DrafterTrainConfig(
    learning_rate=_LR.value,
    warmup_steps=max(1, steps // 20),
    decay_steps=steps,
    logit_weight=_LOGIT_WEIGHT.value,
    teacher_temperature=_TEACHER_T.value,
    batch_rows=_ROWS.value,
    buffer_rows=len(data["length"]),
    buffer_bytes=2**34,
    buffer_dtype="float32",
  )
  drafter = OnlineDrafter(
    dgraph, dparams, dcfg, slots=engine_cfg.slots, feature_dim=model_cfg.d_model
  )
  added = drafter.buffer.add(**data, step=0)
  logging.info("drafter data: %d rollout rows", added)
  t0 = time.perf_counter()
  history = fit_drafter(drafter, params, steps)
  train_s = time.perf_counter() - t0
  dparams = drafter.params
  checkpoint.save_params(os.path.join(workdir, _OUT_NAME.value), dparams)

  held_out = encode_prompts(tokenizer, list(test_split)[: _EVAL.value])
  eval_pool = ExecutablePool()

  def spec_engine(strategy):
    cfg = dataclasses.replace(
      engine_cfg,
      max_batch=len(held_out),
      spec_threshold=len(held_out),
      spec_strategies=(strategy,),
      spec_adaptive=False,
    )
    return RolloutEngine(graphdef, model_cfg, cfg, pool=eval_pool, drafter_graphdef=dgraph)

  # Coupled drafts at both temperatures; argmax drafts at temperature 1 for comparison
  # (greedy drafts are the same either way).
  evals = [(_STRATEGY.value, 0.0), (_STRATEGY.value, 1.0), (f"{_STRATEGY.value}-argmax", 1.0)]
  evals = evals if held_out else []
  with eval_pool.compiling_ahead():
    for name, t in evals:
      sampling = SamplingConfig(temperature=t)
      spec_engine(name).warmup(
        params,
        sampling,
        [len(held_out)],
        drafter_params=dparams,
        prompt_lens=[len(p) for p in held_out],
      )
  report = {
    "host": host_info((graphdef, params)),
    "policy_params": model_cfg.num_params,
    "drafter_params": sum(x.size for x in jax.tree.leaves(dparams)),
    "policy": info,
    "rollout_samples": len(prompts),
    "rollout_seconds": rollout_s,
    "train_steps": _STEPS.value,
    "logit_weight": _LOGIT_WEIGHT.value,
    "teacher_temperature": _TEACHER_T.value,
    "train_seconds": train_s,
    "final_train_metrics": history[-1],
    "strategy": _STRATEGY.value,
    "held_out": [
      acceptance(spec_engine(name), params, dparams, held_out, t, name) for name, t in evals
    ],
  }
  with open(os.path.join(workdir, f"{_OUT_NAME.value}_report.json"), "w") as f:
    json.dump(report, f, indent=2)
  plot(history, os.path.join(workdir, f"{_OUT_NAME.value}_loss.png"))
  print(json.dumps(report["held_out"], indent=2))


if __name__ == "__main__":
  app.run(main)

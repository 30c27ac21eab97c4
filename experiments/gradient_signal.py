r"""Where does one GRPO batch's policy gradient carry signal, and where only noise?

Rolls out independent batches of training prompts (G samples each, the RL temperature) from
a warm-started policy, scores them, and takes the gradient of the GRPO objective (group-
normalised advantage times token log-prob, token mean; on-policy, so the clipped ratio is 1)
for each batch. Reports:
  - the cosine between the full-parameter gradients of different batches: near 0 means the
    batch gradient is almost all sampling noise (its expectation is a small part of it);
  - the same for the final norm's scale alone, and how well their mean aligns with the
    scale itself (with tied embeddings, growing the scale uniformly sharpens every
    next-token distribution, as a lower temperature would);
  - dJ/dT, the derivative of the batch objective with respect to the sampling temperature:
    negative in a batch means its rewards favour a sharper policy.
This is the measurement behind the default job's RL settings (configs/default.py, rl_update).

  python experiments/gradient_signal.py --workdir=runs/default --batches=8
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import configuration, train  # noqa: E402
from tlt_jax.data import get_task, get_tokenizer  # noqa: E402
from tlt_jax.data.tasks import format_prompt  # noqa: E402
from tlt_jax.rl.advantages import group_advantages  # noqa: E402
from tlt_jax.rl.update import token_logprobs  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "the run's config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "a workdir with tfds/ and warm_start/")
_BATCHES = flags.DEFINE_integer("batches", 8, "independent rollout batches")
_OUT = flags.DEFINE_string("out", "", "write the figures as JSON here too")


def _cosines(rows: np.ndarray) -> float:
  """Mean cosine similarity over the distinct pairs of rows."""
  unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
  c = unit @ unit.T
  n = len(rows)
  return float((c.sum() - n) / (n * n - n))


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  if not os.path.isdir(os.path.join(workdir, "warm_start")):
    raise app.UsageError(f"no warm start in {workdir}: run tlt_jax.main there first")
  if _BATCHES.value < 2:
    raise app.UsageError("--batches must be >= 2 (cosines need pairs)")
  tok, task = get_tokenizer(config.task.tokenizer), get_task(config.task.name)
  train_split, _ = train.load_data(config, workdir)
  _, graphdef, params, _ = train.build_policy(config, workdir, tok, train_split, progress=False)
  engine = RolloutEngine(
    graphdef,
    configuration.model_config(config, tok),
    configuration.engine_config(config, tok),
    configuration.sampling_config(config),
  )
  temperature = float(config.sampling.temperature)
  truncation = dict(top_k=int(config.sampling.top_k), top_p=float(config.sampling.top_p))
  p, g = config.rl.prompts_per_step, config.rl.group_size
  examples = list(train_split)
  if len(examples) < p * _BATCHES.value:
    raise app.UsageError(f"{_BATCHES.value} batches of {p} prompts exceed the training split")

  def objective(params, temp, tokens, mask, adv):
    # Of the distribution sampled from (tempered, truncated), as the RL update scores it.
    logp, _ = token_logprobs(graphdef, params, tokens, temp, **truncation)
    return jnp.sum(adv[:, None] * logp * mask) / jnp.sum(mask)

  grad_params = jax.jit(jax.grad(objective))
  grad_temp = jax.jit(jax.grad(objective, argnums=1))
  scale = np.asarray(params["final_norm"]["scale"][...])
  flat, norm_grads, d_temp, rewards = [], [], [], []
  for b in range(_BATCHES.value):
    batch = examples[b * p : (b + 1) * p]
    prompts = [tok.encode(format_prompt(ex), add_bos=True) for ex in batch]
    res = engine.generate(params, prompts, g, key=1000 + b)
    rows, r = [], []
    for n in range(p * g):
      completion = list(res.completion(n))
      rows.append((prompts[n // g], completion))
      r.append(float(task.check(tok.decode(completion), batch[n // g]["answer"])))
    width = -(-max(len(a) + len(c) for a, c in rows) // 64) * 64  # few shapes to compile
    tokens = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), np.float32)
    for i, (a, c) in enumerate(rows):
      tokens[i, : len(a) + len(c)] = a + c
      mask[i, len(a) : len(a) + len(c)] = 1.0
    adv = group_advantages(np.asarray(r, np.float32), g)
    grads = grad_params(params, jnp.float32(temperature), tokens, mask, adv)
    flat.append(np.concatenate([np.ravel(x) for x in jax.tree.leaves(grads)]))
    norm_grads.append(np.asarray(grads["final_norm"]["scale"][...]))
    d_temp.append(float(grad_temp(params, jnp.float32(temperature), tokens, mask, adv)))
    rewards.append(float(np.mean(r)))
    print(f"batch {b}: reward {rewards[-1]:.3f}, dJ/dT {d_temp[-1]:+.4f}", flush=True)
  flat, norm_grads = np.stack(flat), np.stack(norm_grads)
  mean_norm_grad = norm_grads.mean(0)
  out = {
    "workdir": workdir,
    "batches": _BATCHES.value,
    "samples_per_batch": p * g,
    "parameters": int(flat.shape[1]),
    "reward": rewards,
    "dJ_dT": d_temp,
    "dJ_dT_negative_fraction": float(np.mean(np.asarray(d_temp) < 0)),
    "cosine_full_gradient": _cosines(flat),
    "cosine_final_norm_gradient": _cosines(norm_grads),
    "final_norm_mean_gradient_alignment_with_scale": float(
      mean_norm_grad @ scale / (np.linalg.norm(mean_norm_grad) * np.linalg.norm(scale))
    ),
  }
  for k, v in out.items():
    if not isinstance(v, list):
      print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(out, f, indent=2)


if __name__ == "__main__":
  app.run(main)

r"""The policy update on a run's own packed rows, with and without attention key windows.

The learning curve packs a step's samples first-fit into rows as wide as the cache
(`rl_update.pack_width`, 1,472 columns in configs/regime.py), and causal attention then
reads, for each query block, every key up to the block's end: a row of eight 150-token
samples pays for one 1,200-token sequence. Under `rl_update.key_windows` a block reads only
the last w keys (w the narrowest window holding every key its queries see). This rebuilds
the packed rows of chosen steps of a run (its rollout_lengths.jsonl: prompt and response
length of every sample; the first `groups_used` groups of the step, as many as its update
kept), with random tokens, and times one on-policy update step (forward, backward, AdamW)
under each setting, interleaved, on fresh copies of the same parameters. It prints the
median seconds [min-max], the paired ratio, the update's rate in model FLOPs (6 x params a
real token) as a fraction of a square matmul measured in the same process, the share of
key columns the windows read, and both settings' gradient norms (which must agree).

  python experiments/bench_key_windows.py --run=runs/lc2/baseline_s0 --steps=0,20,39
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import cpu_model, matmul_flops  # noqa: E402
from tlt_jax import configuration  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.models.attention import current_causal_block  # noqa: E402
from tlt_jax.models.transformer import init_model  # noqa: E402
from tlt_jax.rl.packing import pack_policy_batch  # noqa: E402
from tlt_jax.rl.update import make_optimizer, make_policy_update  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "the run's job config")
_RUN = flags.DEFINE_string("run", None, "a run folder with rollout_lengths.jsonl, metrics.jsonl")
_STEPS = flags.DEFINE_list("steps", ["0", "20", "39"], "the run's steps whose rows are timed")
_WINDOWS = flags.DEFINE_list("windows", ["256", "512", "1024"], "key windows, tokens")
_REPS = flags.DEFINE_integer("reps", 5, "timed calls per setting and step, interleaved")
_OUT = flags.DEFINE_string("out", "", "write the results as JSON here too")


def step_lengths(run: str, step: int, group: int) -> tuple[np.ndarray, np.ndarray, int]:
  """(prompt lengths, response lengths) of the samples of the first `groups_used` groups
  of `step`, and the real tokens the run's update counted that step."""
  with open(os.path.join(run, "metrics.jsonl")) as f:
    metrics = next(r for r in map(json.loads, f) if r["step"] == step)
  with open(os.path.join(run, "rollout_lengths.jsonl")) as f:
    lengths = next(r for r in map(json.loads, f) if r["step"] == step)
  kept = metrics["groups_used"]
  prompts = np.asarray([n for call in lengths["prompts"] for n in call][: kept * group])
  responses = np.asarray([n for call in lengths["rollouts"] for n in call][: kept * group])
  return prompts, responses, int(metrics.get("update/real_tokens", 0))


def packed_batch(prompts, responses, update_cfg, vocab: int, seed: int):
  """The update's packed rows for these samples: random tokens, the response counted."""
  rng = np.random.default_rng(seed)
  length = prompts + responses
  width = int(length.max())
  cols = np.arange(width)[None]
  tokens = rng.integers(3, vocab, (len(length), width)).astype(np.int32)
  mask = ((cols >= prompts[:, None]) & (cols < length[:, None])).astype(np.float32)
  batch, plan = pack_policy_batch(
    tokens,
    length,
    mask,
    None,
    rng.standard_normal(len(length)).astype(np.float32),
    aggregation="token-mean",
    width=update_cfg.pack_width,
    row_multiple=update_cfg.micro_batch,
    pow2_rows=update_cfg.pow2_rows,
    min_rows=update_cfg.min_rows,
  )
  return {k: jnp.asarray(v) for k, v in batch.items()}, plan


def keys_read(plan, windows: tuple[int, ...], block: int) -> float:
  """Key columns the packed rows' query blocks read under `windows`, over those read
  without them (rows without a sample are skipped by the update in both)."""
  starts = {}
  for r, c, n in zip(plan.row, plan.col, plan.length, strict=True):
    starts.setdefault(int(r), []).append((int(c), int(n)))
  full = part = 0
  for samples in starts.values():
    first = np.arange(plan.width)  # a column's first visible key (padding: itself)
    for c, n in samples:
      first[c : c + n] = c
    for s in range(0, plan.width, block):
      e = min(s + block, plan.width)
      need = e - int(first[s:e].min())
      fits = [w for w in windows if e - s <= w < e and w >= need]
      full += (e - s) * e
      part += (e - s) * (min(fits) if fits else e)
  return part / full


def main(argv):
  del argv
  config = _CONFIG.value
  windows = tuple(int(w) for w in _WINDOWS.value)
  settings = {"all keys": (), f"windows {'/'.join(map(str, windows))}": windows}
  tok = get_tokenizer(config.task.tokenizer)
  model_cfg = configuration.model_config(config, tok)
  rl_cfg, loss_cfg, update_cfg = configuration.rl_configs(config)
  graphdef, params = nnx.split(init_model(model_cfg, seed=0))
  num_params = sum(x.size for x in jax.tree.leaves(params))
  optimizer = make_optimizer(update_cfg)
  square = matmul_flops()
  print(
    f"host: {cpu_model()}, {os.cpu_count()} cores, jax {jax.__version__}; square matmul "
    f"{square / 1e9:.1f} GFLOP/s; policy {num_params / 1e6:.1f}M, rows of "
    f"{update_cfg.pack_width}, micro-batch {update_cfg.micro_batch}",
    flush=True,
  )
  fns = {
    name: make_policy_update(
      graphdef, optimizer, loss_cfg, update_cfg.micro_batch, on_policy=True, key_windows=w
    )
    for name, w in settings.items()
  }
  copy = lambda t: jax.tree.map(jnp.copy, t)  # noqa: E731  (params are donated)
  results = {"cpu": cpu_model(), "square_gflops": square / 1e9, "steps": []}
  for step in (int(s) for s in _STEPS.value):
    prompts, responses, run_tokens = step_lengths(_RUN.value, step, rl_cfg.group_size)
    batch, plan = packed_batch(prompts, responses, update_cfg, model_cfg.vocab_size, step)
    real = int(plan.length.sum())
    flops = 6.0 * num_params * real
    out, first, times = {}, {}, {name: [] for name in settings}
    for name, fn in fns.items():  # the first call compiles (once per row count)
      start = time.perf_counter()
      out[name] = jax.block_until_ready(fn(copy(params), optimizer.init(params), batch, None))
      first[name] = time.perf_counter() - start
    for _ in range(_REPS.value):
      for name, fn in fns.items():
        p, s = copy(params), optimizer.init(params)
        start = time.perf_counter()
        jax.block_until_ready(fn(p, s, batch, None))
        times[name].append(time.perf_counter() - start)
    base, win = (times[n] for n in settings)
    ratios = sorted(a / b for a, b in zip(base, win, strict=True))
    # Adam's first step moves every parameter by about its learning rate whatever the
    # gradient's size, so the gradient's norm is the comparison that can fail.
    norms = [float(out[n][2]["grad_norm"]) for n in settings]
    diff = abs(norms[1] - norms[0]) / norms[0]
    rec = {
      "step": step,
      "samples": len(prompts),
      "real_tokens": real,
      "run_real_tokens": run_tokens,
      "rows_with_samples": len(set(plan.row.tolist())),
      "rows": plan.num_rows,
      "first_call_s": first,
      "seconds": times,
      "keys_read": keys_read(plan, windows, current_causal_block()),
      "paired_ratio": ratios,
      "grad_norm": norms,
      "grad_norm_rel_diff": diff,
    }
    results["steps"].append(rec)
    print(
      f"\nstep {step}: {len(prompts)} samples, {real:,} real tokens (the run's update: "
      f"{run_tokens:,}), {rec['rows_with_samples']} of {plan.num_rows} rows hold samples; "
      f"windows read {rec['keys_read']:.2f} of the key columns"
    )
    for name in settings:
      med = statistics.median(times[name])
      rate = flops / med / 1e9
      print(
        f"  {name:>22}: {med:6.2f} s [{min(times[name]):.2f}-{max(times[name]):.2f}], "
        f"{rate:5.1f} GFLOP/s = {rate / (square / 1e9):.2f} of square "
        f"(first call {first[name]:.1f} s)"
      )
    print(
      f"  paired ratio all/windows: median {statistics.median(ratios):.2f}x "
      f"({ratios[0]:.2f}-{ratios[-1]:.2f}); gradient norms {norms[0]:.6g} / {norms[1]:.6g} "
      f"(relative difference {diff:.1e})"
    )
  if _OUT.value:
    with open(_OUT.value, "w") as fh:
      json.dump(results, fh, indent=1)


if __name__ == "__main__":
  flags.mark_flag_as_required("run")
  app.run(main)

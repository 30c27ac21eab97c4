r"""Does the speculative engine's plain path cost more than the plain engine?

The same B held-out prompts (the longest reference answers, 96 new tokens, one
batch bucket of B, no compaction) decoded by three engines sharing one pool,
repetitions interleaved so drift of the shared CPU hits all alike:
  plain_once       plain engine: the last bucket runs to the end in one call,
  plain_chunked    plain engine forced to chunk-sized calls (host sync per chunk),
  sd_forced_plain  the adaptive speculative engine with its bandit forced to plain
                   (chunk-sized, as while the bandit learns).

  python experiments/check_plain_path.py --batch=64 --reps=3
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import checkpoint, configuration, train  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.data.tasks import format_prompt, format_target  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.models.drafter import init_drafter  # noqa: E402
from tlt_jax.rollout.engine import PLAIN, RolloutEngine  # noqa: E402
from tlt_jax.rollout.pool import ExecutablePool  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sd_bench.py", "policy config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/sd_policy", "warm_start/ and drafter/ live here")
_BATCH = flags.DEFINE_integer("batch", 64, "batch size")
_REPS = flags.DEFINE_integer("reps", 3, "timed repetitions per engine")
_TEMP = flags.DEFINE_float("temperature", 1.0, "sampling temperature")


def main(argv):
  del argv
  config, workdir, b = _CONFIG.value, _WORKDIR.value, _BATCH.value
  tok = get_tokenizer(config.task.tokenizer)
  train_split, test_split = train.load_data(config, workdir)
  model_cfg, graphdef, params, _ = train.build_policy(config, workdir, tok, train_split)
  dgraph, dparams = nnx.split(init_drafter(model_cfg, seed=0))
  dparams = checkpoint.restore_params(os.path.join(workdir, "drafter"), dparams)
  base = dataclasses.replace(
    configuration.engine_config(config, tok),
    max_new_tokens=96,
    max_batch=b,
    min_batch_bucket=b,
    compact=False,
    min_cache_bucket=256,
    spec_rounds=4,
  )
  examples = sorted(test_split, key=lambda ex: -len(format_target(ex)))
  prompts = [tok.encode(format_prompt(ex), add_bos=True) for ex in examples]
  prompts = [p for p in prompts if len(p) <= base.max_prompt_len][:b]
  configs = {
    "plain_once": dataclasses.replace(base, spec_threshold=0),
    "plain_chunked": dataclasses.replace(base, spec_threshold=0, min_batch_bucket=max(b // 2, 1)),
    "sd_forced_plain": dataclasses.replace(
      base,
      spec_threshold=b,
      spec_strategies=("chain2", "chain4", "tree5x4x16"),
      spec_adaptive=True,
    ),
  }
  pool = ExecutablePool()
  engines = {}
  for name, cfg in configs.items():
    spec = cfg.spec_threshold > 0
    engine = RolloutEngine(
      graphdef, model_cfg, cfg, pool=pool, drafter_graphdef=dgraph if spec else None
    )
    if spec:  # plain every chunk, and never "settled" (so chunk-sized, as while learning)
      engine.bandit.select = lambda bucket: PLAIN
      engine.bandit.update = lambda *args: None
    engines[name] = (engine, dparams if spec else None)
  sampling = SamplingConfig(temperature=_TEMP.value)

  def run(name, key):
    engine, dp = engines[name]
    return engine.generate(params, prompts, key=key, sampling=sampling, drafter_params=dp)

  for name in engines:
    run(name, 99)  # compiles
  decode_ms = {name: [] for name in engines}
  for rep in range(_REPS.value):
    for name in engines:
      r = run(name, rep)
      chunks = [e for e in r.timeline if e["phase"] == "decode"]
      steps = sum(e["steps"] for e in chunks)
      decode_ms[name].append(1000 * sum(e["dt"] for e in chunks) / steps)
      print(
        f"{name:16s} rep {rep}: wall {r.wall_seconds:6.2f} s, {len(chunks)} decode calls, "
        f"{decode_ms[name][-1]:6.1f} ms/step",
        flush=True,
      )
  ref = float(np.median(decode_ms["plain_once"]))
  for name, ms in decode_ms.items():
    med = float(np.median(ms))
    print(f"{name:16s} median {med:6.1f} ms/step ({med / ref:.3f}x plain_once)")


if __name__ == "__main__":
  app.run(main)

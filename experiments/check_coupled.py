r"""Is sampled speculative decoding token-identical to plain sampling at scale?

Coupled sampling (tlt_jax/decode/verify.py) makes every token a speculative round emits the
token plain decoding draws from the same (sequence, position) key. The one way they can
differ is a floating-point near-tie: the verify pass scores the draft with a multi-token
forward, plain decoding with one-token forwards, and the two logits differ in the last
bits. This script counts how often that happens on a trained policy and drafter: the
default job's warm start (its workdir), an EAGLE drafter warm-started as mode `sd` does, P
held-out prompts x G samples, speculative decoding at EVERY batch size (so nearly every
token comes from verification), for each strategy and sampling setting, against the plain
engine with the same key.

  python experiments/check_coupled.py --workdir=runs/default --prompts=32 --samples=8
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import load_policy, rows_differing  # noqa: E402
from experiments.host import host_record  # noqa: E402
from tlt_jax import configuration, train  # noqa: E402
from tlt_jax.data.tasks import format_prompt  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402
from tlt_jax.rollout.pool import ExecutablePool  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "the job's config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "warm_start/ (and drafter_warm_start/)")
_PROMPTS = flags.DEFINE_integer("prompts", 32, "held-out prompts")
_SAMPLES = flags.DEFINE_integer("samples", 8, "samples per prompt (G)")
_STRATEGIES = flags.DEFINE_list("strategies", ["chain3", "tree6x4x16"], "draft strategies")
_KEYS = flags.DEFINE_integer("keys", 2, "rollout keys per setting")

SETTINGS = {
  "t1": SamplingConfig(temperature=1.0),
  "t0.7_p0.9": SamplingConfig(temperature=0.7, top_p=0.9),
  "t1_k8": SamplingConfig(temperature=1.0, top_k=8),
  "greedy": SamplingConfig(temperature=0.0),
}


_SETTINGS = flags.DEFINE_list("settings", list(SETTINGS), f"sampling settings, of {list(SETTINGS)}")


def main(argv):
  del argv
  unknown = sorted(set(_SETTINGS.value) - set(SETTINGS))
  if unknown:
    raise app.UsageError(f"--settings: unknown {unknown}; known: {list(SETTINGS)}")
  config, workdir = _CONFIG.value, _WORKDIR.value
  policy = load_policy(config, workdir)
  tok, test_split = policy["tokenizer"], policy["test_split"]
  model_cfg, graphdef, params = policy["model_config"], policy["graphdef"], policy["params"]
  print(host_record((graphdef, params)), flush=True)  # the checked policy's forward costs
  rows = _PROMPTS.value * _SAMPLES.value
  base = dataclasses.replace(configuration.engine_config(config, tok), max_batch=rows)
  pool = ExecutablePool()
  plain = RolloutEngine(graphdef, model_cfg, dataclasses.replace(base, spec_threshold=0), pool=pool)
  drafter, info = train.build_drafter(
    config, workdir, model_cfg, params, plain, tok, policy["train_split"], progress=False
  )
  print(f"drafter: {info}", flush=True)
  prompts = [tok.encode(format_prompt(ex), add_bos=True) for ex in test_split]
  prompts = [p for p in prompts if len(p) <= base.max_prompt_len][: _PROMPTS.value]
  total = {"tokens": 0, "rows": 0, "rows_differing": 0, "tokens_differing": 0}
  specs = {}
  for strategy in _STRATEGIES.value:
    cfg = dataclasses.replace(
      base, spec_threshold=rows, spec_strategies=(strategy,), spec_adaptive=False
    )
    specs[strategy] = RolloutEngine(
      graphdef, model_cfg, cfg, pool=pool, drafter_graphdef=drafter.graphdef
    )
  # One setting at a time, warm-up then check, so a run stopped at its time budget (a
  # borrowed accelerator) still reports the settings it finished.
  for name in _SETTINGS.value:
    sampling = SETTINGS[name]
    t = time.perf_counter()
    with pool.compiling_ahead():  # this setting's programs, side by side (on accelerators)
      warm = dict(
        num_prompts=[len(prompts)],
        num_samples=_SAMPLES.value,
        prompt_lens=[len(p) for p in prompts],
      )
      plain.warmup(params, sampling, **warm)
      for spec in specs.values():
        spec.warmup(params, sampling, drafter_params=drafter.params, **warm)
    print(
      f"{name}: warm-up, {pool.compiles} programs so far ({time.perf_counter() - t:.0f} s)",
      flush=True,
    )
    for strategy, spec in specs.items():
      for key in range(_KEYS.value):
        t = time.perf_counter()
        kw = dict(key=key, sampling=sampling, seq_id_offset=1000 * key)
        a = plain.generate(params, prompts, _SAMPLES.value, **kw)
        b = spec.generate(params, prompts, _SAMPLES.value, drafter_params=drafter.params, **kw)
        generated = int(a.num_generated.sum())
        differ = rows_differing(a, b)
        # Tokens up to a row's first difference agree; count the rest of the row as differing.
        first = [int(np.argmax(a.tokens[n] != b.tokens[n])) for n in np.nonzero(differ)[0]]
        lost = sum(int(a.length[n]) - f for n, f in zip(np.nonzero(differ)[0], first))
        s = b.spec_summary()
        logp = np.abs(a.logprobs - b.logprobs)[~differ].max()
        # At a row's first difference each decoder's log-prob of its own token: a near tie
        # (the two close) is rounding between a 1-token step and a k-token verify, not a bug.
        for n, f in zip(np.nonzero(differ)[0], first):
          print(
            f"  row {n}: first difference at token {f - int(a.prompt_len[n])} of its answer: "
            f"plain chose {int(a.tokens[n, f])} (log-prob {a.logprobs[n, f]:.4f}), "
            f"speculative {int(b.tokens[n, f])} (log-prob {b.logprobs[n, f]:.4f})",
            flush=True,
          )
        print(
          f"{strategy:11s} {name:10s} key {key}: {generated} tokens, {rows} rows, "
          f"{int(differ.sum())} rows differ ({lost} tokens from the first difference on); "
          f"{s['tokens']} tokens from {s['row_rounds']} row-rounds, accept length "
          f"{s['accept_length']:.2f}; max |logp diff| on equal rows {logp:.1e} "
          f"({time.perf_counter() - t:.0f} s)",
          flush=True,
        )
        total["tokens"] += generated
        total["rows"] += rows
        total["rows_differing"] += int(differ.sum())
        total["tokens_differing"] += lost
  print(f"total: {total}")


if __name__ == "__main__":
  app.run(main)

r"""Attention of a few new tokens over the KV cache: batched dots vs multiply-reduce (XLA:CPU).

A decode step's query is one token per row (a verification, a handful), so its attention is,
per (row, kv head), a [G T, E] x [E, S] and a [G T, S] x [S, E] product. Written as einsums,
XLA:CPU runs them as thousands of tiny GEMMs; written as a multiply fused into a reduction
(`models.attention.attend_reduce`, taken where `reduces(batch, tokens)` says), it streams
the cache. Measurements, settings interleaved round by round so drift hits both alike:

1. attention alone: 16 layers of cache attention per decode step, for the policy's shapes
   (default: the 50M speculative-decoding bench policy, configs/sd_bench.py), per batch
   size and cache length; ms per step and the cache-read bound at --gbps;
2. the rollout engine end to end: plain decode of --new_tokens tokens for B prompts (random
   init, no stop token, so every row decodes all of them; greedy), tokens/s for both forms
   and whether they decode the same tokens;
3. speculative rounds end to end: the engine with a random-init drafter and one fixed strategy
   (draft, one target pass over the draft, verify, commit), ms per round at each batch; a
   random drafter is rarely accepted, so rounds run at their full cost.

  python experiments/bench_decode_attention.py
  python experiments/bench_decode_attention.py --batches=1,16,64 --slots=256,512 --rounds=3
  python experiments/bench_decode_attention.py --parts=engine --new_tokens=320
  python experiments/bench_decode_attention.py --parts=spec --spec_batches=1,4,16
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax import configuration  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.models import attention, transformer  # noqa: E402
from tlt_jax.models.drafter import init_drafter  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402
from tlt_jax.rollout.pool import ExecutablePool  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sd_bench.py", "policy config")
_BATCHES = flags.DEFINE_list("batches", ["1", "4", "16", "64"], "batch sizes")
_SLOTS = flags.DEFINE_list("slots", ["256", "512"], "cache slots read per step (attention part)")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "interleaved rounds")
_NEW = flags.DEFINE_integer("new_tokens", 64, "tokens decoded per row (engine part)")
_ENGINE_BATCHES = flags.DEFINE_list("engine_batches", ["1", "16", "64"], "engine batch sizes")
_GBPS = flags.DEFINE_float("gbps", 12.5, "memory bandwidth for the cache-read bound, GB/s")
_PARTS = flags.DEFINE_list("parts", ["attention", "engine", "spec"], "what to measure")
_SPEC_BATCHES = flags.DEFINE_list("spec_batches", ["1", "4", "16"], "speculative batch sizes")
_STRATEGIES = flags.DEFINE_list("strategies", ["chain4", "tree5x4x16"], "draft strategies")
_OUT = flags.DEFINE_string("out", "", "optional JSON file for the results")

_FORMS = flags.DEFINE_list(
  "forms", ["dots", "reduce"], "attention.ATTENTION_FORMS to compare; ratios are to the first"
)
_TOKENS = flags.DEFINE_list("tokens", ["1"], "new tokens per row (attention part)")


def _attention_ms(cfg, batch: int, tokens: int, slots: int, form: str, steps: int = 8) -> float:
  """ms per decode step of cfg.num_layers cache attentions in `form`."""
  key = jax.random.key(0)
  shape = (batch, cfg.num_kv_heads, slots, cfg.head_dim)
  ks = [jax.random.normal(jax.random.fold_in(key, i), shape) for i in range(cfg.num_layers)]
  vs = [jax.random.normal(jax.random.fold_in(key, 99 + i), shape) for i in range(cfg.num_layers)]
  q = jax.random.normal(key, (batch, tokens, cfg.num_heads, cfg.head_dim))
  lens = jnp.full((batch,), slots - steps - tokens)

  @jax.jit
  def run(q, ks, vs):
    def step(i, x):
      mask = attention.cache_mask(lens + i, tokens, slots)
      for k, v in zip(ks, vs):  # each layer's output feeds the next: no work is skipped
        x = attention.attend(x, k, v, mask, form=form)
      return x

    return jax.lax.fori_loop(0, steps, step, q)

  jax.block_until_ready(run(q, ks, vs))
  start = time.perf_counter()
  jax.block_until_ready(run(q, ks, vs))
  return 1e3 * (time.perf_counter() - start) / steps


def _engine_result(model, engine_cfg, prompts, form: str, drafter=None):
  """Greedy rollout of `prompts` (one sample each) by a fresh engine, after a compiling run.

  model: (graphdef, params, config); drafter: (graphdef, params) for speculative decoding.
  """
  graphdef, params, cfg = model
  dgraph, dparams = drafter or (None, None)
  # A fresh pool per run: programs are traced (and the form read) when they compile.
  greedy = SamplingConfig(temperature=0.0)
  engine = RolloutEngine(graphdef, cfg, engine_cfg, greedy, ExecutablePool(), dgraph)
  with attention.attention_form(form):
    engine.generate(params, prompts, 1, key=0, drafter_params=dparams)  # compile
    return engine.generate(params, prompts, 1, key=0, drafter_params=dparams)


def _engine_config(config, tok, batch: int, **changes):
  """One batch bucket of `batch` rows, no stop token: every row decodes --new_tokens."""
  return dataclasses.replace(
    configuration.engine_config(config, tok),
    max_new_tokens=_NEW.value,
    max_batch=batch,
    min_batch_bucket=batch,
    stop_tokens=(),
    **changes,
  )


def main(argv):
  del argv
  config = _CONFIG.value
  tok = get_tokenizer(config.task.tokenizer)
  cfg = configuration.model_config(config, tok)
  out: dict = {"host": host_info(), "attention_ms": {}, "engine_tokens_per_s": {}}
  print(format_host(out["host"]), flush=True)
  print(
    f"policy: {cfg.num_params / 1e6:.1f}M params, {cfg.num_layers} layers, "
    f"{cfg.num_kv_heads} kv heads x {cfg.head_dim}"
  )

  forms = _FORMS.value
  print(f"forms (ratios to {forms[0]}): {', '.join(forms)}")

  def line(med: dict[str, float], better: str) -> str:
    """Each form's median and its ratio to the first form's (>1: faster than it)."""
    cells = []
    for f in forms:
      ratio = med[forms[0]] / med[f] if better == "lower" else med[f] / med[forms[0]]
      cells.append(f"{f} {med[f]:8.2f}" + ("" if f == forms[0] else f" ({ratio:.2f}x)"))
    return "  ".join(cells)

  print("1. cache attention alone, ms per decode step (all layers):")
  for slots in map(int, _SLOTS.value if "attention" in _PARTS.value else []):
    for t in map(int, _TOKENS.value):
      for b in map(int, _BATCHES.value):
        times = {f: [] for f in forms}
        for _ in range(_ROUNDS.value):
          for f in forms:
            times[f].append(_attention_ms(cfg, b, t, slots, f))
        med = {f: float(np.median(x)) for f, x in times.items()}
        cache_bytes = 2 * cfg.num_layers * b * cfg.num_kv_heads * slots * cfg.head_dim * 4
        bound = cache_bytes / _GBPS.value / 1e6
        out["attention_ms"][f"{b}x{t}x{slots}"] = med
        print(
          f"  batch {b:>3}, {t:>2} tokens, {slots} slots: {line(med, 'lower')}"
          f"  (cache-read bound {bound:.2f})",
          flush=True,
        )

  print(f"2. rollout engine, plain greedy decode of {_NEW.value} tokens per row, tokens/s:")
  model = (*nnx.split(transformer.init_model(cfg, seed=0)), cfg)
  rng = np.random.default_rng(0)
  for b in map(int, _ENGINE_BATCHES.value if "engine" in _PARTS.value else []):
    engine_cfg = _engine_config(config, tok, b)
    prompts = [[tok.bos_id, *rng.integers(3, 60, 32).tolist()] for _ in range(b)]
    rates = {f: [] for f in forms}
    tokens = {}
    for _ in range(_ROUNDS.value):
      for f in forms:
        r = _engine_result(model, engine_cfg, prompts, f)
        rates[f].append(float(r.num_generated.sum()) / r.wall_seconds)
        tokens[f] = np.asarray(r.tokens)
    med = {f: float(np.median(r)) for f, r in rates.items()}
    same = min(float(np.mean(tokens[forms[0]] == tokens[f])) for f in forms)
    out["engine_tokens_per_s"][str(b)] = {**med, "same_tokens": same}
    print(f"  batch {b:>3}: {line(med, 'higher')}  (same tokens {same:.3f})", flush=True)
  print("3. speculative rounds (random drafter, fixed strategy), ms per round:")
  out["spec_round_ms"] = {}
  drafter = nnx.split(init_drafter(cfg, seed=0))
  for b in map(int, _SPEC_BATCHES.value if "spec" in _PARTS.value else []):
    prompts = [[tok.bos_id, *rng.integers(3, 60, 32).tolist()] for _ in range(b)]
    for strategy in _STRATEGIES.value:
      engine_cfg = _engine_config(
        config, tok, b, spec_threshold=b, spec_strategies=(strategy,), spec_adaptive=False
      )
      ms = {f: [] for f in forms}
      for _ in range(_ROUNDS.value):
        for f in forms:
          spec = _engine_result(model, engine_cfg, prompts, f, drafter).spec_summary()
          ms[f].append(1e3 * spec["seconds"] / max(spec["rounds"], 1))
      med = {f: float(np.median(m)) for f, m in ms.items()}
      out["spec_round_ms"][f"{b}/{strategy}"] = med
      print(f"  batch {b:>3} {strategy:>12}: {line(med, 'lower')}", flush=True)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  app.run(main)

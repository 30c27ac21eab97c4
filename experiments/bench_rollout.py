"""Rollout benchmark: our engine vs google-tunix's sampler, same models, one process.

Three measurements (ratios are what count: runs vary ~30% on shared CPUs):
1. plain decode tokens/s at batch 1, 8, 32 for the default policy config and a
   ~100M-parameter config, ours vs tunix on identical weights;
2. a long-tail rollout, 16 prompts x 8 samples with per-row lengths drawn from
   the built-in task's solution lengths: our engine (per-row stop, compaction,
   cache buckets) vs tunix (every row decodes to the longest);
3. batch-1 decode of the ~100M model against the memory-bandwidth bound
   (bytes read per token / measured read bandwidth).

Run: python experiments/bench_rollout.py [--out runs/bench_rollout] [--quick]
Needs the bench extra: pip install -e '.[bench]'.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tunix_baseline  # noqa: E402
from host import format_host, host_info, read_bandwidth  # noqa: E402

from tlt_jax.data import CharTokenizer, make_split  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.models.config import ModelConfig  # noqa: E402
from tlt_jax.models.transformer import init_model  # noqa: E402
from tlt_jax.rollout.config import EngineConfig  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0)
PROMPT_LEN = 16

CONFIGS = {
  # The default policy of configs/default.py.
  "default-0.8M": ModelConfig(
    vocab_size=100, num_layers=4, d_model=128, num_heads=4, num_kv_heads=2, head_dim=32, mlp_dim=384
  ),
  "qwen-like-100M": ModelConfig(
    vocab_size=32_000,
    num_layers=12,
    d_model=768,
    num_heads=12,
    num_kv_heads=4,
    head_dim=64,
    mlp_dim=2048,
  ),
}


def decode_throughputs(
  graphdef, params, tmodel, cfg: ModelConfig, batch: int, new_tokens: int, repeats: int
) -> tuple[float, float]:
  """Median tokens/s of (ours, tunix), measured interleaved on the same prompts.

  Each engine is built and warmed up once; then the two alternate, so slow
  drifts of the shared CPU hit both sides alike. Timed calls include each
  side's host work (ours: validation, prefill, harvest; tunix: text round trips).
  """
  engine = RolloutEngine(
    graphdef,
    cfg,
    EngineConfig(
      max_prompt_len=PROMPT_LEN,
      max_new_tokens=new_tokens,
      max_batch=batch,
      chunk_steps=32,
      min_batch_bucket=batch,
      min_prompt_bucket=PROMPT_LEN,
    ),
    GREEDY,
  )
  sampler = tunix_baseline.make_tunix_sampler(tmodel, cfg, PROMPT_LEN + new_tokens)
  rng = np.random.default_rng(0)
  make = lambda: rng.integers(0, cfg.vocab_size, (batch, PROMPT_LEN)).tolist()
  for _ in range(2):  # compile, then one more call (the first after compiling is slow)
    engine.generate(params, make(), 1)
    tunix_baseline.tunix_generate(sampler, make(), new_tokens)
  ours, theirs = [], []
  for _ in range(repeats):
    prompts = make()
    res = engine.generate(params, prompts, 1)
    assert int(res.num_generated.sum()) == batch * new_tokens
    ours.append(batch * new_tokens / res.wall_seconds)
    t0 = time.perf_counter()
    out = tunix_baseline.tunix_generate(sampler, prompts, new_tokens)
    theirs.append(batch * new_tokens / (time.perf_counter() - t0))
    assert all(len(t) == new_tokens for t in out)
  return float(np.median(ours)), float(np.median(theirs))


def longtail(graphdef, params, cfg: ModelConfig, tunix_model, quick: bool) -> dict:
  tok = CharTokenizer()
  examples = make_split("arithmetic", "train", train_size=2000, max_operand=9, max_value=99)
  rng = np.random.default_rng(0)
  picks = rng.choice(len(examples), 16, replace=False)
  prompts = [tok.encode(examples[int(i)]["question"], add_bos=True)[:PROMPT_LEN] for i in picks]
  # Each sample's length: a solution length of the task (tokens + EOS), so
  # the 128 rows have the task's long-tailed distribution.
  pool = np.array([len(e["solution"]) + 1 for e in examples])
  lengths = rng.choice(pool, 16 * 8).tolist()
  max_new = int(max(lengths))
  engine = RolloutEngine(
    graphdef,
    cfg,
    EngineConfig(
      max_prompt_len=PROMPT_LEN,
      max_new_tokens=max_new,
      max_batch=128,
      chunk_steps=16,
      min_prompt_bucket=PROMPT_LEN,
    ),
    GREEDY,
  )
  engine.warmup(params, num_prompts=[16], num_samples=8)
  walls = []
  for _ in range(1 if quick else 2):
    res = engine.generate(params, prompts, 8, max_new_tokens=lengths)
    assert res.num_generated.tolist() == lengths
    walls.append(res.wall_seconds)
  ours = {
    "engine": "tlt_jax",
    "wall_s": float(np.median(walls)),
    "useful_tokens": int(sum(lengths)),
    "batch_buckets": sorted({e["batch"] for e in res.timeline}, reverse=True),
  }
  theirs = tunix_baseline.tunix_longtail_wall(
    tunix_model, cfg, prompts, lengths, cache_size=PROMPT_LEN + max_new
  )
  return {
    "lengths": {"median": float(np.median(lengths)), "max": max_new, "sum": int(sum(lengths))},
    "ours": ours,
    "tunix": theirs,
    "speedup": theirs["wall_s"] / ours["wall_s"],
  }


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--out", default="runs/bench_rollout")
  ap.add_argument("--quick", action="store_true", help="fewer tokens, for a smoke run")
  ap.add_argument("--configs", default=",".join(CONFIGS))
  ap.add_argument("--batches", default="1,8,32")
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  batches = [int(b) for b in args.batches.split(",")]
  results: dict = {"host": host_info(), "decode": []}
  print(format_host(results["host"]), flush=True)

  models = {}
  for name in args.configs.split(","):
    cfg = CONFIGS[name]
    graphdef, params = nnx.split(init_model(cfg, seed=0))
    tmodel, info = tunix_baseline.build_tunix_model(cfg, params)
    models[name] = (cfg, graphdef, params, tmodel)
    new_tokens = 32 if args.quick else (128 if cfg.num_params > 10e6 else 256)
    for b in batches:
      repeats = 7 if cfg.num_params < 10e6 else 3
      ours, theirs = decode_throughputs(graphdef, params, tmodel, cfg, b, new_tokens, repeats)
      row = {
        "config": name,
        "params_M": cfg.num_params / 1e6,
        "batch": b,
        "new_tokens": new_tokens,
        "ours_tok_s": ours,
        "tunix_tok_s": theirs,
        "ratio": ours / theirs,
      }
      results["decode"].append(row)
      print(
        f"{name:>15} batch {b:>3}: ours {row['ours_tok_s']:9.1f} tok/s  "
        f"tunix {row['tunix_tok_s']:9.1f} tok/s  ratio {row['ratio']:.2f}x",
        flush=True,
      )

  if "default-0.8M" in models:
    cfg, graphdef, params, tmodel = models["default-0.8M"]
    lt = longtail(graphdef, params, cfg, tmodel, args.quick)
    results["longtail"] = lt
    print(
      f"long tail 16x8 (lengths median {lt['lengths']['median']:.0f}, max "
      f"{lt['lengths']['max']}): ours {lt['ours']['wall_s']:.2f}s  tunix "
      f"{lt['tunix']['wall_s']:.2f}s  -> {lt['speedup']:.2f}x less wall time",
      flush=True,
    )

  big = [r for r in results["decode"] if r["config"] == "qwen-like-100M" and r["batch"] == 1]
  if big:
    cfg = CONFIGS["qwen-like-100M"]
    bw = read_bandwidth()
    cache_bytes = (
      2
      * cfg.num_layers
      * cfg.num_kv_heads
      * cfg.head_dim
      * 4
      * (PROMPT_LEN + big[0]["new_tokens"] // 2)
    )
    bytes_per_token = cfg.num_params * 4 + cache_bytes
    bound = bw / bytes_per_token
    results["bandwidth"] = {
      "read_GB_s": bw / 1e9,
      "bytes_per_token": bytes_per_token,
      "bound_tok_s": bound,
      "ours_tok_s": big[0]["ours_tok_s"],
      "fraction_of_bound": big[0]["ours_tok_s"] / bound,
    }
    print(
      f"batch-1 100M decode: {big[0]['ours_tok_s']:.1f} tok/s vs bound {bound:.1f} tok/s "
      f"({bw / 1e9:.1f} GB/s read, {bytes_per_token / 1e6:.0f} MB/token) = "
      f"{100 * big[0]['ours_tok_s'] / bound:.0f}% of the bound",
      flush=True,
    )

  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(results, f, indent=2, default=float)
  with open(os.path.join(args.out, "decode.csv"), "w") as f:
    f.write("config,params_M,batch,new_tokens,ours_tok_s,tunix_tok_s,ratio\n")
    for r in results["decode"]:
      f.write(
        ",".join(
          str(r[k])
          for k in (
            "config",
            "params_M",
            "batch",
            "new_tokens",
            "ours_tok_s",
            "tunix_tok_s",
            "ratio",
          )
        )
        + "\n"
      )
  print(f"wrote {args.out}/results.json and decode.csv")


if __name__ == "__main__":
  main()

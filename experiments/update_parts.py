r"""Where the policy update's time goes, part by part, against the host's matmul rate.

The learning curve reports the update's throughput as model FLOPs (6 x params a real
token, forward and backward) per second over the rate of a large square float32 matmul.
This script takes that figure apart at the run's own shapes, so a low fraction says why:

  square       a 2048^3 float32 matmul: the host's arithmetic rate (the denominator);
  products     the model's own dense products, alone, at one micro-batch's token count:
               for every weight [i, o], x @ w, dy @ w.T and x.T @ dy (6 x i x o FLOPs a
               token): the rate the 6 x params count could reach if nothing else ran;
  attention    attention's forward and backward alone (`attend_causal` on the layer's
               query, key and value shapes, times the layers) at one micro-batch;
  forward      the policy's log-probs of one micro-batch (`token_logprobs`, no gradient);
  micro step   one jitted update of a single micro-batch (forward, backward, AdamW);
  update       the same update over `--rows` rows (a scan over micro-batches);
  optimizer    AdamW (with clipping and the run's learning-rate groups) alone.

Every part compiles as the run's update does: under the config's `rl_update.cpu_fusions`
and, where attention runs, its `rl_update.key_windows`. Rows are packed as the regime
curve's (`--packed`: samples of log-normal lengths, median 123 tokens, a row's last few
columns padding) or hold one sample each (`--nopacked`). Rates count real tokens (6 x
params each). Attention is not in that count: its FLOPs (scores and values of the causal
query blocks, each reading the key window its samples need) are given beside, as a share
of the model FLOPs. A run's padding in the micro-batches it computes
(`update/computed_padding` in its metrics; rows holding no sample are skipped) divides its
rate further; `--run` reads that and the run's rate from its metrics.jsonl.

  python experiments/update_parts.py --config=configs/regime.py --columns=1532 --rows=4 \
      --out=experiments/results/update_parts_hostK_2026-12-02/update_parts.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import attention_flops, dense_shapes, packed_rows  # noqa: E402
from experiments.host import cpu_model, matmul_flops  # noqa: E402
from tlt_jax import configuration  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.models.attention import attend_causal, full_mask, key_windows  # noqa: E402
from tlt_jax.models.transformer import init_model  # noqa: E402
from tlt_jax.rl.update import make_optimizer, make_policy_update, token_logprobs  # noqa: E402
from tlt_jax.utils.cpu_fusions import compiler_options  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", "configs/regime.py:small", "the policy and its update settings"
)
_COLUMNS = flags.DEFINE_list("columns", ["512", "1024"], "packed row widths to measure")
_ROWS = flags.DEFINE_integer("rows", 32, "rows of the full update (a multiple of micro_batch)")
_REPS = flags.DEFINE_integer("reps", 5, "timed calls per part, interleaved; medians reported")
_PACKED = flags.DEFINE_bool(
  "packed", True, "rows packed with samples of the curve's lengths (else one sample a row)"
)
_RUN = flags.DEFINE_string("run", "", "a run's metrics.jsonl: its padding and update rate")
_OUT = flags.DEFINE_string("out", "", "write the results as JSON here too")


def products_fn(shapes: list[tuple[int, int]], options: dict[str, str]) -> Callable:
  """One jitted call (under `options`) running, per weight, the forward product and the
  backward's two."""

  def run(xs, dys, ws):
    out = []
    for x, dy, w in zip(xs, dys, ws, strict=True):
      out += [x @ w, dy @ w.T, x.T @ dy]
    return out

  return jax.jit(run, compiler_options=options)


def _batch(rng, rows: int, width: int, vocab: int) -> dict[str, np.ndarray]:
  """`--packed`: rows packed with samples of log-normal lengths around the regime curve's
  median (`common.packed_rows`); else every cell real, one sample a row, a 32-token prompt."""
  if _PACKED.value:
    batch = packed_rows(rng, rows, width, vocab)
    del batch["loss_mask"]
    return batch
  mask = np.zeros((rows, width), np.float32)
  mask[:, 32:] = 1.0
  return dict(
    tokens=rng.integers(3, vocab, (rows, width)).astype(np.int32),
    mask=mask,
    advantages=rng.normal(size=(rows, width)).astype(np.float32) * mask,
    positions=np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width)).copy(),
    segment_ids=np.ones((rows, width), np.int32),
    weights=mask / mask.sum(),
  )


def _time(fn: Callable[[], object]) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def _run_stats(path: str) -> dict[str, float]:
  """Median padding and update rate of a run's RL steps (the padding of the micro-batches
  computed where the run logged it, else of all packed cells)."""
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  rows = [r for r in rows if r.get("update/real_tokens")]
  pick = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
  return {
    "steps": len(rows),
    "padding_fraction": pick(
      "update/computed_padding"
      if "update/computed_padding" in rows[0]
      else "update/padding_fraction"
    ),
    "model_gflops": 1e3 * pick("update/model_tflops"),
  }


def measure(config, width: int, rows: int, reps: int) -> dict[str, object]:
  """Every part's median seconds at one packed width."""
  tok = get_tokenizer(config.task.tokenizer)
  model_cfg = configuration.model_config(config, tok)
  graphdef, params = nnx.split(init_model(model_cfg, seed=0))
  num_params = sum(x.size for x in jax.tree.leaves(params))
  micro = config.rl_update.micro_batch
  if rows % micro:
    raise app.UsageError(f"--rows={rows} is not a multiple of micro_batch {micro}")
  _, loss_cfg, update_cfg = configuration.rl_configs(config)
  optimizer = make_optimizer(update_cfg)
  rng = np.random.default_rng(0)
  tokens = micro * width
  shapes = dense_shapes(params)
  key = jax.random.key(0)
  xs = [
    jax.random.normal(jax.random.fold_in(key, 3 * n), (tokens, i))
    for n, (i, _) in enumerate(shapes)
  ]
  dys = [
    jax.random.normal(jax.random.fold_in(key, 3 * n + 1), (tokens, o))
    for n, (_, o) in enumerate(shapes)
  ]
  ws = [jax.random.normal(jax.random.fold_in(key, 3 * n + 2), s) for n, s in enumerate(shapes)]
  # Every part compiles as the run's update does: its library fusions and key windows.
  options = compiler_options(update_cfg.cpu_fusions)
  windows = update_cfg.key_windows
  products = products_fn(shapes, options)
  full_np = _batch(rng, rows, width, model_cfg.vocab_size)
  one_np = {k: v[:micro] for k, v in full_np.items()}
  full = {k: jnp.asarray(v) for k, v in full_np.items()}
  one = {k: jnp.asarray(v) for k, v in one_np.items()}
  real = lambda b: int((b["segment_ids"] > 0).sum())  # noqa: E731
  heads, kv, dim = model_cfg.num_heads, model_cfg.num_kv_heads, model_cfg.head_dim
  q = jax.random.normal(jax.random.fold_in(key, 10**6), (micro, width, heads, dim))
  k, v = (
    jax.random.normal(jax.random.fold_in(key, 10**6 + i), (micro, kv, width, dim)) for i in (1, 2)
  )
  causal = full_mask(jnp.ones((micro, width), bool), one["segment_ids"])

  def attention_loss(q, k, v, mask):  # the mask an argument, as in the update: not folded
    with key_windows(windows):
      return jnp.sum(attend_causal(q, k, v, mask) ** 2)

  def logprobs(p, t, pos, seg):
    with key_windows(windows):
      return token_logprobs(graphdef, p, t, 1.0, positions=pos, segment_ids=seg)[0]

  attention = jax.jit(jax.grad(attention_loss, argnums=(0, 1, 2)), compiler_options=options)
  forward = jax.jit(logprobs, compiler_options=options)
  step = make_policy_update(
    graphdef,
    optimizer,
    loss_cfg,
    micro,
    on_policy=True,
    key_windows=windows,
    cpu_fusions=update_cfg.cpu_fusions,
  )
  states = {
    name: (jax.tree.map(jnp.copy, params), optimizer.init(params)) for name in ("micro", "full")
  }
  grads = jax.tree.map(lambda x: 1e-3 * jnp.ones_like(x), params)

  def opt_only(p, s, g):
    updates, s = optimizer.update(g, s, p)
    return jax.tree.map(jnp.add, p, updates), s

  opt_only = jax.jit(opt_only, compiler_options=options)

  opt_state = optimizer.init(params)

  def run_step(name, batch):
    p, s = states[name]
    p, s, _ = step(p, s, batch, None)
    states[name] = (p, s)
    return p

  parts = {
    "products": lambda: products(xs, dys, ws),
    "attention": lambda: [attention(q, k, v, causal) for _ in range(model_cfg.num_layers)],
    "forward": lambda: forward(params, one["tokens"], one["positions"], one["segment_ids"]),
    "micro step": lambda: run_step("micro", one),
    "update": lambda: run_step("full", full),
    "optimizer": lambda: opt_only(params, opt_state, grads),
  }
  first = {name: _time(fn) for name, fn in parts.items()}  # compiles
  times = {name: [] for name in parts}
  for _ in range(reps):
    for name, fn in parts.items():
      times[name].append(_time(fn))
  median = {name: statistics.median(v) for name, v in times.items()}
  dense = sum(i * o for i, o in shapes)
  return {
    "width": width,
    "rows": rows,
    "micro_batch": micro,
    "packed": _PACKED.value,
    "cpu_fusions": update_cfg.cpu_fusions,
    "key_windows": list(windows),
    "real_fraction": real(full_np) / (rows * width),
    "params": int(num_params),
    "dense_params": int(dense),
    "first_call_s": first,
    "median_s": median,
    "range_s": {name: (min(v), max(v)) for name, v in times.items()},
    "flops": {
      "products": 6.0 * dense * tokens,
      "micro step": 6.0 * num_params * real(one_np),
      "update": 6.0 * num_params * real(full_np),
      "attention_share": attention_flops(model_cfg, micro, width, one_np["segment_ids"], windows)
      / (6.0 * num_params * real(one_np)),
    },
  }


def main(argv):
  del argv
  config = _CONFIG.value
  square = matmul_flops()
  print(
    f"host: {cpu_model()}, {os.cpu_count()} cores, jax {jax.__version__}; "
    f"square matmul {square / 1e9:.1f} GFLOP/s",
    flush=True,
  )
  results = {"cpu": cpu_model(), "square_gflops": square / 1e9, "widths": []}
  for width in (int(c) for c in _COLUMNS.value):
    r = measure(config, width, _ROWS.value, _REPS.value)
    results["widths"].append(r)
    m, f = r["median_s"], r["flops"]
    print(
      f"\nwidth {width}, {r['rows']} rows ({r['real_fraction']:.2f} real), micro-batch "
      f"{r['micro_batch']}, {r['cpu_fusions']}, key windows {r['key_windows']} "
      f"({r['params'] / 1e6:.2f}M params, {r['dense_params'] / 1e6:.2f}M in products); "
      f"attention adds {f['attention_share']:.2f} of the model FLOPs"
    )
    print("| part | ms [min-max] | GFLOP/s | of square |")
    print("|---|---|---|---|")
    for name in ("products", "attention", "forward", "micro step", "update", "optimizer"):
      lo, hi = r["range_s"][name]
      g = f[name] / m[name] / 1e9 if name in f else None
      cells = f"{g:.1f} | {g / (square / 1e9):.2f}" if g else "- | -"
      print(f"| {name} | {1e3 * m[name]:.1f} [{1e3 * lo:.1f}-{1e3 * hi:.1f}] | {cells} |")
    step = m["micro step"]
    rest = step - m["products"] - m["attention"] - m["optimizer"]
    print(
      f"one micro step: products {m['products'] / step:.2f}, attention "
      f"{m['attention'] / step:.2f}, optimizer {m['optimizer'] / step:.2f}, the rest "
      f"(norms, rotary, activations, log-softmax, embedding) {rest / step:.2f}"
    )
    n_micro = r["rows"] // r["micro_batch"]
    print(
      f"backward / forward: {(m['micro step'] - m['optimizer']) / m['forward'] - 1:.2f}; "
      f"scan of {n_micro} micro-batches vs {n_micro} x one: "
      f"{(m['update'] - m['optimizer']) / (n_micro * (m['micro step'] - m['optimizer'])):.2f}"
    )
  results["square_gflops_end"] = matmul_flops() / 1e9
  print(f"\nsquare matmul at the end {results['square_gflops_end']:.1f} GFLOP/s")
  if _RUN.value:
    results["run"] = _run_stats(_RUN.value)
    run = results["run"]
    print(
      f"\nthe run ({run['steps']} steps): padding {run['padding_fraction']:.2f}, update "
      f"{run['model_gflops']:.1f} GFLOP/s = {run['model_gflops'] / (square / 1e9):.2f} of square"
    )
  if _OUT.value:
    with open(_OUT.value, "w") as fh:
      json.dump(results, fh, indent=2)


if __name__ == "__main__":
  app.run(main)

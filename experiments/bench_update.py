r"""Policy-update step time: all parameters, and a trainable subset with and without
differentiating only that subset.

One jitted `make_policy_update` step (micro-batched scan, clipping, AdamW) on a packed batch
of the default job's shape (rows x columns, one sample per row, random tokens), for:
  all            - every parameter trained;
  frozen-late    - only `--trainable` trained, the full gradient computed and the frozen
                   leaves' part zeroed by the optimizer (the update before 2026-11-24);
  frozen-early   - the same parameters trained, the others held constant inside the loss
                   (`make_policy_update(..., trainable=...)`), so the backward pass stops early;
  all-scan       - every parameter trained, the layers as one scan (`scan_layers`): what a
                   deep policy's update costs to compile, and whether the scan runs slower.
Compile seconds per configuration (lowered and compiled ahead of its first call), then
`--reps` interleaved timed calls each; medians.

  python experiments/bench_update.py --trainable=final_norm --out=runs/bench_update.json
  python experiments/bench_update.py --config=configs/regime.py:gpu --rows=16 --columns=1536 \
    --setups=all,all-scan --reps=3
"""

from __future__ import annotations

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

from experiments.host import host_info  # noqa: E402
from tlt_jax import configuration  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.models.transformer import init_model  # noqa: E402
from tlt_jax.rl.loss import PolicyLossConfig  # noqa: E402
from tlt_jax.rl.update import UpdateConfig, make_optimizer, make_policy_update  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "model and update")
_TRAINABLE = flags.DEFINE_string("trainable", "final_norm", "the trained subset's pattern")
_ROWS = flags.DEFINE_integer("rows", 32, "packed rows (the default job pads 24 to 32)")
_COLUMNS = flags.DEFINE_integer("columns", 384, "row width")
_REPS = flags.DEFINE_integer("reps", 5, "timed calls per configuration, interleaved")
_OUT = flags.DEFINE_string("out", "", "write the results as JSON here too")
_SETUPS = flags.DEFINE_list(
  "setups", ["all", "frozen-late", "frozen-early"], "of all, frozen-late, frozen-early, all-scan"
)


def main(argv):
  del argv
  config = _CONFIG.value
  tok = get_tokenizer(config.task.tokenizer)
  model_cfg = configuration.model_config(config, tok)
  graphdef, params = nnx.split(init_model(model_cfg, seed=0))
  rng = np.random.default_rng(0)
  r, c = _ROWS.value, _COLUMNS.value
  mask = np.zeros((r, c), np.float32)
  mask[:, 32:] = 1.0  # a 32-token prompt, then the response
  batch = dict(
    tokens=rng.integers(3, model_cfg.vocab_size, (r, c)).astype(np.int32),
    mask=mask,
    old_logp=np.full((r, c), -1.0, np.float32) * mask,
    advantages=rng.normal(size=(r, c)).astype(np.float32) * mask,
    positions=np.broadcast_to(np.arange(c, dtype=np.int32), (r, c)).copy(),
    segment_ids=np.ones((r, c), np.int32),
    weights=mask / mask.sum(),
  )
  loss_cfg = PolicyLossConfig()
  micro = config.rl_update.micro_batch
  base = UpdateConfig(learning_rate=1e-3, micro_batch=micro)
  subset = UpdateConfig(learning_rate=1e-3, micro_batch=micro, trainable=_TRAINABLE.value)
  known = {  # optimizer, the loss's trainable pattern, layers scanned
    "all": (make_optimizer(base), "", False),
    "frozen-late": (make_optimizer(subset), "", False),
    "frozen-early": (make_optimizer(subset), _TRAINABLE.value, False),
    "all-scan": (make_optimizer(base), "", True),
  }
  if unknown := set(_SETUPS.value) - set(known):
    raise app.UsageError(f"--setups: unknown {sorted(unknown)}; known: {sorted(known)}")
  setups = {name: known[name] for name in _SETUPS.value}
  fns, states, compile_s, first_s = {}, {}, {}, {}
  for name, (opt, told, scan) in setups.items():
    fn = make_policy_update(graphdef, opt, loss_cfg, micro, told, scan_layers=scan)
    p = jax.tree.map(jnp.copy, params)
    s = opt.init(p)
    start = time.perf_counter()
    fn = fn.lower(p, s, batch, None).compile()
    compile_s[name] = time.perf_counter() - start
    start = time.perf_counter()
    p, s, m = fn(p, s, batch, None)
    jax.block_until_ready(p)
    first_s[name] = time.perf_counter() - start
    fns[name], states[name] = fn, (p, s)
  times = {name: [] for name in setups}
  for _ in range(_REPS.value):
    for name, fn in fns.items():
      p, s = states[name]
      start = time.perf_counter()
      p, s, m = fn(p, s, batch, None)
      jax.block_until_ready(p)
      times[name].append(time.perf_counter() - start)
      states[name] = (p, s)
  out = {
    "host": host_info((graphdef, params)),
    "rows": r,
    "columns": c,
    "micro_batch": micro,
    "trainable": _TRAINABLE.value,
    "compile_s": compile_s,
    "first_call_s": first_s,
    "median_s": {k: float(np.median(v)) for k, v in times.items()},
    "all_s": times,
  }
  ref_name = "frozen-late" if "frozen-late" in setups else next(iter(setups))
  for name in setups:
    med = out["median_s"][name]
    ratio = out["median_s"][ref_name] / med
    spread = f"{1e3 * min(times[name]):.1f}-{1e3 * max(times[name]):.1f}"
    print(
      f"{name:>13}: compile {compile_s[name]:6.2f} s, step {1e3 * med:7.1f} ms "
      f"[{spread}] ({ratio:.2f}x of {ref_name})"
    )
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(out, f, indent=2)


if __name__ == "__main__":
  app.run(main)

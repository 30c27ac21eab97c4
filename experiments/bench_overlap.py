r"""Would the policy update, run on a second thread while the rollout decodes, come free?

A 2-core host decoding a few rows leaves much of its second core idle (a decode step is a
chain of small ops, RESULTS 2026-11-25: the second core adds ~10% to a 13-row product).
GRPO's gradient is a sum over samples taken at the step's starting parameters, so a
finished group's share could be computed while the rest of the batch decodes, the update
applied once at the end: the same learning, the update hidden behind the rollout. Whether
that pays depends on how the two share the cores, which this measures: one engine-like
device loop (`--chunk` cached forwards of `tokens` new tokens at `batch` rows: 1 token is
a plain decode step, 13 a chain-12 verify forward) and the policy update
(`make_policy_update` on one packed row of `--columns`, the regime's micro-batch), each
alone, then both at once from two threads, for `--seconds` each; rates in calls a second,
interleaved `--reps` times.

  python experiments/bench_overlap.py --config=configs/regime.py --cells=1x1,8x1,1x13,8x13
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import config_policy  # noqa: E402
from experiments.forwards import Forward  # noqa: E402
from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax.rl.loss import PolicyLossConfig  # noqa: E402
from tlt_jax.rl.update import UpdateConfig, make_optimizer, make_policy_update  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "policy config")
_CELLS = flags.DEFINE_list("cells", ["1x1", "8x1", "1x13", "8x13"], "rows x new tokens")
_CHUNK = flags.DEFINE_integer("chunk", 16, "forwards per device loop")
_CONTEXT = flags.DEFINE_integer("context", 400, "cache length")
_COLUMNS = flags.DEFINE_integer("columns", 1536, "the update's packed row")
_SECONDS = flags.DEFINE_float("seconds", 15.0, "seconds per rate")
_REPS = flags.DEFINE_integer("reps", 2, "repetitions of each cell")
_OUT = flags.DEFINE_string("out", "", "write the results as JSON here too")


def update_call(graphdef, params, cfg, columns: int):
  """A callable running one policy update (AdamW included) on a packed row of `columns`."""
  rng = np.random.default_rng(0)
  mask = np.zeros((1, columns), np.float32)
  mask[:, 32:] = 1.0
  batch = dict(
    tokens=rng.integers(3, cfg.vocab_size, (1, columns)).astype(np.int32),
    mask=mask,
    old_logp=-mask,
    advantages=rng.normal(size=(1, columns)).astype(np.float32) * mask,
    positions=np.arange(columns, dtype=np.int32)[None],
    segment_ids=np.ones((1, columns), np.int32),
    weights=mask / mask.sum(),
  )
  opt = make_optimizer(UpdateConfig(learning_rate=1e-6, micro_batch=1))
  fn = make_policy_update(graphdef, opt, PolicyLossConfig(), 1, "")
  state = [jax.tree.map(jnp.copy, params)]
  state.append(opt.init(state[0]))
  fn = fn.lower(state[0], state[1], batch, None).compile()

  def call():
    p, s, _ = fn(state[0], state[1], batch, None)
    state[0], state[1] = jax.block_until_ready((p, s))

  return call


def rate(call, seconds: float, stop: threading.Event | None = None) -> float:
  """Calls a second over `seconds` (or until `stop`)."""
  n, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds and not (stop and stop.is_set()):
    call()
    n += 1
  return n / (time.perf_counter() - start)


def together(decode, update, seconds: float) -> tuple[float, float]:
  """Both rates with the update on a second thread for as long as the decode runs."""
  out, stop = {}, threading.Event()
  worker = threading.Thread(target=lambda: out.setdefault("u", rate(update, 1e9, stop)))
  worker.start()
  d = rate(decode, seconds)
  stop.set()
  worker.join()
  return d, out["u"]


def main(argv):
  del argv
  config = _CONFIG.value
  cfg, graphdef, params = config_policy(config)
  host = host_info((graphdef, params))
  print(format_host(host))
  update = update_call(graphdef, params, cfg, _COLUMNS.value)
  update()
  rows = []
  for cell in _CELLS.value:
    batch, tokens = (int(x) for x in cell.split("x"))
    loop = Forward(graphdef, cfg, batch, tokens, _CONTEXT.value, _CHUNK.value)
    loop.compile(params)
    decode = loop.runner(params)
    decode()
    for rep in range(_REPS.value):
      d0, u0 = rate(decode, _SECONDS.value), rate(update, _SECONDS.value)
      d1, u1 = together(decode, update, _SECONDS.value)
      row = dict(batch=batch, tokens=tokens, rep=rep, decode_alone=d0, update_alone=u0)
      row.update(decode_together=d1, update_together=u1, decode_frac=d1 / d0)
      row.update(update_frac=u1 / u0, sum_frac=d1 / d0 + u1 / u0)
      rows.append(row)
      print(
        f"{batch:>3} rows x {tokens:>2} tokens, rep {rep}: loop {1e3 / d0:7.1f} ms alone, "
        f"{d1 / d0:.2f} of it together; update {1 / u0:5.2f} s alone, {u1 / u0:.2f} of it "
        f"together; sum {d1 / d0 + u1 / u0:.2f}",
        flush=True,
      )
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"host": host, "chunk": _CHUNK.value, "columns": _COLUMNS.value, "rows": rows}, f)


if __name__ == "__main__":
  app.run(main)

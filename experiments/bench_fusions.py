r"""XLA:CPU's library fusions, program by program: which setting of `utils.cpu_fusions` each
of the learning curve's kinds of program runs fastest under.

XLA:CPU hands dots, and by its default list also elementwise and reduction fusions, to
YNNPACK. Each program below is compiled under every `--settings` entry (its jax.jit
compiler_options: the process's XLA_FLAGS stay as they are), then timed interleaved in
one process, `--reps` rounds; medians [min-max] and each setting's time over "xla"'s:

  update   one policy-update step (`make_policy_update`, on-policy, the config's key windows
           and micro-batch) over `--rows` packed rows of the run's width, each packed with
           samples of log-normal lengths (median 123 tokens, as the regime curve's);
  sft      one SFT step (`warmstart.sft.make_train_step`, the config's SFT key windows) on
           the same rows;
  drafter  one online drafter update (`drafter.make_drafter_update`, the config's drafter
           batch: `batch_rows` rows of the engine's cache slots, pairs from random rollouts
           of the rows' lengths, features from the policy's forward);
  decode   an engine chunk's kind of device loop, 16 cached forwards of `tokens` new tokens
           at `rows` rows each, per `--cells` entry (rows x tokens: 1 token is a plain decode
           step, 13 a chain-12 verify forward). The engine's own one-row decode chunk
           (sampling, stop checks) ran 1.27-1.34x slower under "dots" where this loop ran
           faster (RESULTS.md, 2026-12-02): the engine keeps XLA's default.

  python experiments/bench_fusions.py --config=configs/regime.py --reps=5 \
      --out=experiments/results/fusions_hostJ_2026-12-02/bench_fusions.json
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

from experiments.common import config_policy, packed_rows  # noqa: E402
from experiments.forwards import Forward  # noqa: E402
from experiments.host import format_host, host_info  # noqa: E402
from tlt_jax import configuration  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.drafter import drafter_optimizer, make_drafter_update, make_training_batch  # noqa: E402
from tlt_jax.models.drafter import init_drafter  # noqa: E402
from tlt_jax.rl.update import make_optimizer, make_policy_update  # noqa: E402
from tlt_jax.utils.cpu_fusions import CPU_FUSIONS, compiler_options  # noqa: E402
from tlt_jax.warmstart.sft import make_train_step, sft_optimizer  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "policy and update")
_SETTINGS = flags.DEFINE_list("settings", list(CPU_FUSIONS), "of utils.cpu_fusions.CPU_FUSIONS")
PROGRAMS = ("update", "sft", "drafter", "decode")
_PROGRAMS = flags.DEFINE_list("programs", list(PROGRAMS), f"which to time, of {PROGRAMS}")
_ROWS = flags.DEFINE_integer("rows", 4, "packed rows of the update and SFT steps")
_WIDTH = flags.DEFINE_integer("width", 1532, "their columns (the regime run's rows: 1,532)")
_CELLS = flags.DEFINE_list("cells", ["1x1", "2x1", "4x1", "8x1", "1x5", "1x13", "2x13"], "")
_CONTEXT = flags.DEFINE_integer("context", 400, "the decode loops' cache length")
_REPS = flags.DEFINE_integer("reps", 5, "interleaved timed rounds")
_OUT = flags.DEFINE_string("out", "", "write the results as JSON here too")


def _stepper(fn, state, batch) -> Callable[[], None]:
  """A callable running `fn(*state, batch)` in place (its state donated and carried)."""

  def call():
    *new_state, _ = fn(*state, batch)
    state[:] = jax.block_until_ready(new_state)

  return call


def drafter_call(config, cfg, graphdef, params, rows, setting: str) -> Callable[[], None]:
  """One online drafter update under `setting`, on pairs packed from the update's rows read
  as rollouts (each row one sample, the first 12 tokens its prompt)."""
  dcfg = configuration.drafter_config(config)
  slots = configuration.engine_config(config, get_tokenizer(config.task.tokenizer)).slots
  width = rows["tokens"].shape[1]
  hidden = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t, jnp.arange(t.shape[1])[None])[0])(
    params, jnp.asarray(rows["tokens"])
  )
  n = len(rows["tokens"])
  batch = make_training_batch(
    rows["tokens"],
    np.asarray(hidden),
    np.full(n, 12),
    np.full(n, width),
    row_len=dcfg.row_len or slots,
    num_rows=dcfg.batch_rows,
    skip_overflow=True,
  )
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  dgraph, dparams = nnx.split(init_drafter(cfg))
  opt = drafter_optimizer(dcfg.learning_rate, dcfg.warmup_steps, dcfg.decay_steps or None)
  fn = make_drafter_update(
    dgraph, graphdef, opt, logit_weight=dcfg.logit_weight, donate=True, cpu_fusions=setting
  )
  state = [dparams, opt.init(dparams)]

  def call():
    state[:] = jax.block_until_ready(fn(state[0], state[1], params, batch)[:2])

  return call


def programs(config, cfg, graphdef, params, settings: list[str]) -> dict[tuple[str, str], Callable]:
  """Every (program, setting) as a callable, compiled and run once."""
  rows = packed_rows(np.random.default_rng(0), _ROWS.value, _WIDTH.value, cfg.vocab_size)
  batch = {k: jnp.asarray(v) for k, v in rows.items()}  # the update's and SFT's
  _, loss_cfg, update_cfg = configuration.rl_configs(config)
  sft_cfg = configuration.sft_config(config)
  calls = {}
  for setting in settings:
    fresh = lambda: jax.tree.map(jnp.copy, params)  # noqa: E731
    if "update" in _PROGRAMS.value:
      opt = make_optimizer(update_cfg)
      fn = make_policy_update(
        graphdef,
        opt,
        loss_cfg,
        update_cfg.micro_batch,
        on_policy=True,
        key_windows=update_cfg.key_windows,
        cpu_fusions=setting,
      )
      p = fresh()
      calls["update", setting] = _stepper(
        lambda p, s, b, fn=fn: fn(p, s, b, None), [p, opt.init(p)], batch
      )
    if "sft" in _PROGRAMS.value:
      opt = sft_optimizer(sft_cfg)
      fn = make_train_step(graphdef, opt, sft_cfg.key_windows, cpu_fusions=setting)
      p = fresh()
      calls["sft", setting] = _stepper(fn, [p, opt.init(p)], batch)
    if "drafter" in _PROGRAMS.value:
      calls["drafter", setting] = drafter_call(config, cfg, graphdef, params, rows, setting)
    if "decode" in _PROGRAMS.value:
      for cell in _CELLS.value:
        b, t = (int(x) for x in cell.split("x"))
        options = compiler_options(setting)
        loop = Forward(graphdef, cfg, b, t, _CONTEXT.value, 16, options=options)
        loop.compile(params)
        calls[f"decode {cell}", setting] = loop.runner(params)
  for name, call in calls.items():
    start = time.perf_counter()
    call()
    print(f"{name[0]} under {name[1]}: compiled and run in {time.perf_counter() - start:.1f} s")
  return calls


def main(argv):
  del argv
  unknown = sorted(set(_PROGRAMS.value) - set(PROGRAMS))
  if unknown:
    raise app.UsageError(f"--programs: unknown {unknown}; choose from {PROGRAMS}")
  config = _CONFIG.value
  cfg, graphdef, params = config_policy(config)
  host = host_info((graphdef, params))
  print(format_host(host), flush=True)
  calls = programs(config, cfg, graphdef, params, _SETTINGS.value)
  times = {name: [] for name in calls}
  for _ in range(_REPS.value):
    for name, call in calls.items():
      start = time.perf_counter()
      call()
      times[name].append(time.perf_counter() - start)
  results = []
  base = _SETTINGS.value[0]
  for program in dict.fromkeys(name[0] for name in calls):
    line = f"{program:<14}"
    ref = statistics.median(times[program, base])
    for setting in _SETTINGS.value:
      t = times[program, setting]
      med = statistics.median(t)
      results.append(dict(program=program, setting=setting, median_s=med, times_s=t))
      line += f"  {setting} {1e3 * med:8.1f} ms [{1e3 * min(t):.1f}-{1e3 * max(t):.1f}]"
      line += f" {med / ref:.2f}" if setting != base else ""
    print(line, flush=True)
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump(dict(host=host, rows=_ROWS.value, width=_WIDTH.value, results=results), f)


if __name__ == "__main__":
  app.run(main)

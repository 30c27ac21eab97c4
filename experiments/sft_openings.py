r"""An SFT stage that teaches the stride task's long answers by their openings.

A policy whose SFT rows held only a few problems of more than 99 steps cannot copy a
three-digit count into its first line (the regime's stage-9 warm start: 98% of such first
lines wrong, experiments/line_errors.py), so its answers to long problems count down from a
two-digit number and stop early: the response-length tail stops there. Whole demonstrations
of 100-250 steps (1,300-3,300 tokens) would fill a row each; their openings (the question
and the first few lines, `warmstart.sft.encode_opening`: no EOS, so no end is taught where
they were cut) take ~100 tokens, so a step of 4 rows x 1,024 shows ~20 of them beside whole
demonstrations of the curve's sizes (which keep the short counts and the endings).

Continues from a warm start and writes `<out>/warm_start` and `<out>/sft_openings.json`
(the stage's settings, data counts and loss history):

  python experiments/sft_openings.py --config=configs/regime.py \
    --init=runs/regime_warm_start/10c/warm_start --out=runs/regime_warm_start/11
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import opening  # noqa: E402
from tlt_jax import checkpoint, configuration  # noqa: E402
from tlt_jax.data import get_task, get_tokenizer  # noqa: E402
from tlt_jax.data.tasks import format_prompt, format_target  # noqa: E402
from tlt_jax.models.transformer import init_model  # noqa: E402
from tlt_jax.warmstart.sft import SFTConfig, train_sft  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "the curve's config")
_INIT = flags.DEFINE_string("init", None, "the warm_start folder SFT continues from")
_OUT = flags.DEFINE_string("out", None, "writes <out>/warm_start and <out>/sft_openings.json")
_STEPS = flags.DEFINE_integer("steps", 150, "SFT steps")
_LR = flags.DEFINE_float("learning_rate", 5e-4, "peak rate (10 warm-up steps, cosine to 5%)")
_WHOLE = flags.DEFINE_integer("whole", 20_000, "whole demonstrations (the curve's task, wider)")
_WHOLE_MEDIAN = flags.DEFINE_float("whole_median", 20, "their median steps (spread 1.3)")
_OPENINGS = flags.DEFINE_integer("openings", 20_000, "long demonstrations cut to openings")
_OPEN_MEDIAN = flags.DEFINE_float("open_median", 130, "their median steps")
_OPEN_SIGMA = flags.DEFINE_float("open_sigma", 0.4, "their log-normal spread")
_OPEN_HASTY = flags.DEFINE_float("open_hasty", 0.5, "their hasty share")
_LINES = flags.DEFINE_list("lines", ["2", "16"], "an opening keeps [lo, hi] lines, uniform")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 250, "the cap on steps of both kinds")
_HASTY = flags.DEFINE_float("hasty", 0.9, "the whole demonstrations' hasty share")
_ROWS = flags.DEFINE_integer("rows", 4, "rows a step")
_ROW_LEN = flags.DEFINE_integer("row_len", 1024, "tokens a row")
_SEED = flags.DEFINE_integer("data_seed", 777, "whole demonstrations' seed; openings' is +1")


def training_data(params: dict) -> tuple[list, list, dict]:
  """(whole pairs, opening pairs, counts) for the stage."""
  generate = get_task("stride").generate
  base = dict(params, median_steps=_WHOLE_MEDIAN.value, steps_sigma=1.3)
  base.update(max_steps=_MAX_STEPS.value, hasty_fraction=_HASTY.value)
  whole = [
    (format_prompt(e), format_target(e)) for e in generate(_SEED.value, _WHOLE.value, **base)
  ]
  long = dict(base, median_steps=_OPEN_MEDIAN.value, steps_sigma=_OPEN_SIGMA.value)
  long["hasty_fraction"] = _OPEN_HASTY.value
  lo, hi = (int(x) for x in _LINES.value)
  draw = random.Random(5)
  openings, three_digit = [], 0
  for e in generate(_SEED.value + 1, _OPENINGS.value, **long):
    cut = opening(format_target(e), draw.randint(lo, hi))
    if cut is None:
      whole.append((format_prompt(e), format_target(e)))
      continue
    openings.append((format_prompt(e), cut))
    three_digit += int(e["question"].split("x")[1].rstrip("=")) >= 100
  counts = {"whole": len(whole), "openings": len(openings), "three_digit_openings": three_digit}
  return whole, openings, counts


def main(argv):
  del argv
  config = _CONFIG.value
  if config.task.name != "stride" or not config.task.params.get("countdown"):
    raise app.UsageError("sft_openings cuts the stride task's countdown solutions")
  if not (_INIT.value and _OUT.value):
    raise app.UsageError("--init and --out are required")
  tok = get_tokenizer(config.task.tokenizer)
  graphdef, params = nnx.split(init_model(configuration.model_config(config, tok), seed=0))
  params = checkpoint.restore_params(_INIT.value, params)
  whole, openings, counts = training_data(dict(config.task.params))
  print(counts, flush=True)
  cfg = SFTConfig(
    steps=_STEPS.value,
    batch_rows=_ROWS.value,
    row_len=_ROW_LEN.value,
    learning_rate=_LR.value,
    warmup_steps=10,
    key_windows=tuple(config.sft.key_windows),
  )
  start = time.perf_counter()
  params, history = train_sft(graphdef, params, tok, whole, cfg, openings=openings)
  os.makedirs(_OUT.value, exist_ok=True)
  checkpoint.save_params(os.path.join(_OUT.value, "warm_start"), params)
  report = {
    "init": _INIT.value,
    "flags": {f.name: f.value for f in flags.FLAGS.get_key_flags_for_module(sys.argv[0])},
    "counts": counts,
    "seconds": time.perf_counter() - start,
    "history": history,
  }
  with open(os.path.join(_OUT.value, "sft_openings.json"), "w") as f:
    json.dump(report, f, indent=1, default=str)
  print(
    f"{_OUT.value}/warm_start: loss {history[-1]['loss']:.4f}, "
    f"token accuracy {history[-1]['token_accuracy']:.4f}",
    flush=True,
  )


if __name__ == "__main__":
  app.run(main)

r"""How far RL moved a policy's parameters from its warm start, by group and by token.

Prints ||after - before|| / ||before|| for each parameter group (embedding, final norm,
each kind of layer weight) between a workdir's warm start and one of its RL checkpoints,
and the same for the embedding rows of chosen characters (the table is tied: a row is a
token's input and its output logit). With per-group learning rates (`lr_multipliers`)
this shows what a fast group did to the rest of the model: in the regime's first curve
(2026-11-29, host H) the embedding at 30x moved the effort markers' rows 20-23% and the
digits' 7-14% while every layer moved < 0.4%, and the careful skill fell.

  python experiments/param_drift.py --config=configs/regime.py \
    --workdir=runs/curve/baseline_s0 --rl_step=40 --chars='~!0123456789'
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import policy_at, print_report, relative_change  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "the run's config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/curve/baseline_s0", "warm_start/, checkpoints/")
_RL_STEP = flags.DEFINE_integer("rl_step", 40, "the RL checkpoint to compare with the warm start")
_CHARS = flags.DEFINE_string("chars", "", "characters whose embedding rows to report")
_OUT = flags.DEFINE_string("out", "", "a JSON file for the figures ('' : print only)")


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  _, _, before = policy_at(config, workdir)
  _, _, after = policy_at(config, workdir, _RL_STEP.value)
  before, after = nnx.to_pure_dict(before), nnx.to_pure_dict(after)
  report = {"rl_step": _RL_STEP.value, "groups": relative_change(before, after, depth=1)}
  report["layer_weights"] = relative_change(before.get("layers", {}), after.get("layers", {}), 2)
  if _CHARS.value:
    tok = get_tokenizer(config.task.tokenizer)
    table = lambda p: np.asarray(p["embed"]["embedding"], np.float64)
    e0, e1 = table(before), table(after)
    rows = {}
    for ch in _CHARS.value:
      (i,) = tok.encode(ch)
      rows[ch] = float(np.linalg.norm(e1[i] - e0[i]) / np.linalg.norm(e0[i]))
    report["embedding_rows"] = rows
  print_report(report, _OUT.value)


if __name__ == "__main__":
  app.run(main)

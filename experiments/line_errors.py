r"""Where a policy's worked answers go wrong, token by token (the stride task).

Feeds the demonstrator's own solutions (one effort forced: every solution careful, or
every one hasty) to a policy teacher-forced, and reports per field of a line (counter,
start value, stride, new value, answer) and per line (the first line alone, then bins of
8) the mean negative log-likelihood and how often the policy's most likely token is not
the solution's; the share of solutions with any such token in their first line; and a
few of those first-line tokens in their context ("[right->predicted]"). The effort marker
itself is the policy's choice, not a skill: it is left out.

Found with it (2026-11-29, host H): the regime's careful answers failed in their first
line, which copies the count and stride from the question, where every later line erred
< 0.2% a token.

  python experiments/line_errors.py --config=configs/regime.py --workdir=runs/curve/shared
  python experiments/line_errors.py --workdir=runs/curve/baseline_s0 --rl_step=40 \
    --out=runs/line_errors_40.json
"""

from __future__ import annotations

import collections
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import LINE_FIELDS, line_fields, policy_at, print_report  # noqa: E402
from tlt_jax.data import get_task, get_tokenizer  # noqa: E402
from tlt_jax.data.tasks import format_prompt  # noqa: E402
from tlt_jax.warmstart.sft import encode_example  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "the run's config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/curve/shared", "holds warm_start/ (checkpoints/)")
_RL_STEP = flags.DEFINE_integer("rl_step", -1, "an RL checkpoint's step (-1: the warm start)")
_NUM = flags.DEFINE_integer("num", 200, "solutions (generated with their own seed)")
_EFFORT = flags.DEFINE_enum("effort", "careful", ["careful", "hasty"], "the forced effort")
_MAX_LEN = flags.DEFINE_integer(
  "max_len", 1024, "leave out solutions longer than this many tokens (SFT's rows: 1,024)"
)
_OUT = flags.DEFINE_string("out", "", "a JSON file for the figures ('' : print only)")


def line_bin(line: int) -> str:
  return "0" if line == 0 else f"{max(1, 8 * (line // 8))}-{8 * (line // 8) + 7}"


def main(argv):
  del argv
  config = _CONFIG.value
  if config.task.name != "stride":
    raise app.UsageError(f"line_errors reads stride solutions, not {config.task.name!r}")
  tok = get_tokenizer(config.task.tokenizer)
  _, graphdef, params = policy_at(config, _WORKDIR.value, _RL_STEP.value)
  task_params = dict(config.task.params)
  task_params["hasty_fraction"] = 0.0 if _EFFORT.value == "careful" else 1.0
  examples = get_task("stride").generate(12345, _NUM.value, **task_params)

  @jax.jit
  def log_probs(params, tokens):
    model = nnx.merge(graphdef, params)
    hidden, _, _ = model(tokens, jnp.arange(tokens.shape[1])[None])
    return jax.nn.log_softmax(model.logits(hidden[:, :-1]).astype(jnp.float32), -1)

  by_field = collections.defaultdict(lambda: [0, 0.0, 0])  # tokens, nll, argmax wrong
  by_line = collections.defaultdict(lambda: [0, 0.0, 0])
  first_line_wrong, kept, shown = [], 0, []
  for ex in examples:
    tokens, start = encode_example(tok, format_prompt(ex), ex["solution"])
    if len(tokens) > _MAX_LEN.value:
      continue
    kept += 1
    solution = ex["solution"]
    if len(tokens) != start + len(solution) + 1:
      raise app.UsageError("line_errors needs one token per character (the char tokenizer)")
    width = 1 << (len(tokens) - 1).bit_length()  # few shapes: powers of two
    row = np.zeros((1, width), np.int32)
    row[0, : len(tokens)] = tokens
    lp = np.asarray(log_probs(params, row))[0]
    wrong_in_first = False
    for i, (line, field) in enumerate(line_fields(solution)):
      if field == "marker":
        continue
      dist = lp[start - 1 + i]
      nll, wrong = float(-dist[tokens[start + i]]), int(np.argmax(dist) != tokens[start + i])
      for table, key in ((by_field, field), (by_line, line_bin(line))):
        table[key][0] += 1
        table[key][1] += nll
        table[key][2] += wrong
      if wrong and line == 0:
        wrong_in_first = True
        if len(shown) < 12:
          got = tok.decode([int(np.argmax(dist))])
          shown.append(f"{ex['question']} {solution[:i]}[{solution[i]}->{got}]")
    first_line_wrong.append(wrong_in_first)

  def table(t, order):
    return {
      k: {"tokens": t[k][0], "nll": t[k][1] / t[k][0], "wrong": t[k][2] / t[k][0]}
      for k in order
      if k in t
    }

  lines = sorted(by_line, key=lambda k: int(k.split("-")[0]))
  report = {
    "effort": _EFFORT.value,
    "solutions": kept,
    "by_field": table(by_field, LINE_FIELDS[1:]),
    "by_line": table(by_line, lines),
    "first_line_wrong_share": float(np.mean(first_line_wrong)) if first_line_wrong else None,
    "first_line_examples": shown,
  }
  print_report(report, _OUT.value)


if __name__ == "__main__":
  app.run(main)

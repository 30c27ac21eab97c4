r"""Which effort a policy opens with, and how often each effort is right.

For the effort-mix tasks (configs/regime.py: a demonstrator that opens "~" careful or "!"
hasty): decodes held-out (or training) problems greedily and at the rollout temperature,
and reports per effort its share, pass@1 and mean length, and pass@1 by the problem's size.
What RL should move: the hasty share down, so accuracy and length up together.

  python experiments/effort_mix.py --config=configs/regime.py --workdir=runs/curve/shared
  python experiments/effort_mix.py --config=configs/regime.py --workdir=runs/curve/baseline_s0 \
    --rl_step=40
  python experiments/effort_mix.py ... --force=careful --config.sampling.temperature=0.6
With --force an effort's marker opens every answer: how often that effort is right when
chosen, at any temperature.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import policy_at, print_report, summarise  # noqa: E402
from tlt_jax import configuration, train  # noqa: E402
from tlt_jax.data import get_task, get_tokenizer  # noqa: E402
from tlt_jax.data.checkers import CAREFUL, HASTY  # noqa: E402
from tlt_jax.data.tasks import format_prompt  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.evaluation import completions  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/regime.py", "the run's config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/curve/shared", "holds tfds/ and warm_start/")
_RL_STEP = flags.DEFINE_integer("rl_step", -1, "an RL checkpoint's step (-1: the warm start)")
_NUM = flags.DEFINE_integer("num", 64, "problems")
_SPLIT = flags.DEFINE_enum("split", "test", ["test", "train"], "held-out or training problems")
_SAMPLES = flags.DEFINE_integer("samples", 2, "samples per problem at the rollout temperature")
_BATCH = flags.DEFINE_integer("batch", 32, "rows per engine call")
_OUT = flags.DEFINE_string("out", "", "a JSON file for the figures ('' : print only)")
_FORCE = flags.DEFINE_enum(
  "force",
  "",
  ["", "careful", "hasty"],
  "open every answer with this effort's marker (its skill when chosen; '' : the policy picks)",
)


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  tok = get_tokenizer(config.task.tokenizer)
  task = get_task(config.task.name)
  train_split, test_split = train.load_data(config, workdir)
  model_cfg, graphdef, params = policy_at(config, workdir, _RL_STEP.value)
  engine_cfg = dataclasses.replace(
    configuration.engine_config(config, tok), max_batch=_BATCH.value, spec_threshold=0
  )
  engine = RolloutEngine(graphdef, model_cfg, engine_cfg)
  examples = list(test_split if _SPLIT.value == "test" else train_split)[: _NUM.value]
  # A problem's size: its reference solution's length (steps, operations).
  sizes = [len(ex["solution"]) for ex in examples]
  opening = {"": "", "careful": CAREFUL, "hasty": HASTY}[_FORCE.value]
  report = {"force": _FORCE.value, "temperature": float(config.sampling.temperature)}
  for name, temperature, k in (
    ("greedy", 0.0, 1),
    ("sampled", config.sampling.temperature, _SAMPLES.value),
  ):
    texts, _ = completions(
      engine,
      params,
      tok,
      examples,
      lambda ex: format_prompt(ex) + opening,
      max(_BATCH.value // k, 1),
      sampling=SamplingConfig(temperature=temperature),
      num_samples=k,
      key=1,
    )
    texts = [opening + t for t in texts]  # the marker is part of the answer
    answers = [ex["answer"] for ex in examples for _ in range(k)]
    report[name] = summarise(
      texts,
      answers,
      [s for s in sizes for _ in range(k)],
      task.check,
      [format_prompt(ex) for ex in examples for _ in range(k)],
      task.steps,
    )
    report[name]["examples"] = texts[:3]
  print_report(report, _OUT.value)


if __name__ == "__main__":
  app.run(main)

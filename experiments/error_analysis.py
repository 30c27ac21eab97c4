r"""Where does a policy go wrong on the arithmetic task's held-out problems?

Decodes held-out problems (or, with --split=train, training ones), greedy and at temperature 1
with 4 samples each, and compares every wrong response with the reference scratchpad: pass@1
by the problem's number of steps, the step of the first wrong character, and what it is
(the operation copied from the question, i.e. the lookup by label, or the line's result).

  python experiments/error_analysis.py --workdir=runs/default
  python experiments/error_analysis.py --workdir=runs/default --rl_step=8
"""

from __future__ import annotations

import collections
import os
import sys

import numpy as np
import orbax.checkpoint as ocp
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import checkpoint, configuration, train  # noqa: E402
from tlt_jax.data import get_task, get_tokenizer  # noqa: E402
from tlt_jax.data.tasks import format_prompt  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.models.transformer import init_model  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "the run's config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "the run's workdir (tfds/, warm_start/)")
_RL_STEP = flags.DEFINE_integer(
  "rl_step", -1, "the policy of this RL checkpoint (workdir/checkpoints/<step>); -1: the warm start"
)
_NUM = flags.DEFINE_integer("num", 200, "problems")
_SPLIT = flags.DEFINE_enum(
  "split", "test", ["test", "train"], "held-out problems, or training ones (the SFT/RL prompts)"
)
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "0 = greedy")
_SAMPLES = flags.DEFINE_integer("samples", 4, "samples per problem when sampling")


def classify(response: str, reference: str) -> tuple[int, str]:
  """(step, kind) of the first character where `response` leaves `reference`.

  Steps count the reference's ";"-ended lines before that character; kind is "operation"
  inside a line's "<label><op><operand>" part, "result" after its "=", "answer" in the
  final "#..." part.
  """
  j = next((i for i, (a, b) in enumerate(zip(response, reference)) if a != b), None)
  if j is None:
    j = min(len(response), len(reference))
  head = reference[:j]
  line = head.split(";")[-1]
  if line.startswith("#"):
    return head.count(";"), "answer"
  return head.count(";"), "result" if "=" in line else "operation"


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  if config.task.name != "arithmetic":
    raise app.UsageError("the error classes are the arithmetic task's scratchpad lines")
  tok = get_tokenizer(config.task.tokenizer)
  task = get_task(config.task.name)
  train_split, test_split = train.load_data(config, workdir)
  model_cfg = configuration.model_config(config, tok)
  graphdef, params = nnx.split(init_model(model_cfg, seed=0))
  if _RL_STEP.value < 0:
    params = checkpoint.restore_params(os.path.join(workdir, "warm_start"), params)
  else:
    path = os.path.join(os.path.abspath(workdir), "checkpoints", str(_RL_STEP.value), "state")
    nnx.replace_by_pure_dict(params, ocp.StandardCheckpointer().restore(path)["params"])
  engine = RolloutEngine(graphdef, model_cfg, configuration.engine_config(config, tok))
  examples = list(test_split if _SPLIT.value == "test" else train_split)[: _NUM.value]
  prompts = [tok.encode(format_prompt(ex), add_bos=True) for ex in examples]
  for temperature in (float(t) for t in _TEMPERATURES.value):
    k = 1 if temperature == 0 else _SAMPLES.value
    per_call = max(engine.config.max_batch // k, 1)
    responses = []
    for i in range(0, len(prompts), per_call):
      res = engine.generate(
        params,
        prompts[i : i + per_call],
        k,
        sampling=SamplingConfig(temperature=temperature),
        key=1,
        seq_id_offset=i * k,
      )
      responses += [tok.decode(res.completion(n)) for n in range(len(res.length))]
    by_steps = collections.defaultdict(list)
    first_step, kinds = collections.Counter(), collections.Counter()
    for n, response in enumerate(responses):
      ex = examples[n // k]
      right = task.check(response, ex["answer"])
      steps = ex["solution"].count(";") - 1  # the first line restates the start value
      by_steps[min(steps // 5, 3)].append(right)
      if not right:
        step, kind = classify(response, ex["solution"])
        first_step[min(step, 10)] += 1
        kinds[kind] += 1
    label = "greedy" if temperature == 0 else f"temperature {temperature:g}, {k} samples each"
    print(f"{label}: pass@1 {np.mean([x for v in by_steps.values() for x in v]):.3f}")
    names = {0: "<5", 1: "5-9", 2: "10-14", 3: ">=15"}
    for b, v in sorted(by_steps.items()):
      print(f"  {names[b]:>5} steps: {len(v):4d} responses, pass@1 {np.mean(v):.2f}")
    print("  first error at step:", dict(sorted(first_step.items())), "(10 = 10 or later)")
    print("  first error in:", dict(kinds))


if __name__ == "__main__":
  app.run(main)

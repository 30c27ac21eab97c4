r"""Per-token acceptance of three kinds of draft, from the same drafter, at depth 1.

On held-out rollouts of the policy (temperature `--temperature`), the drafter is run
teacher-forced on the target's own features (what it sees for the first draft token
of a round) and, per response position, with p the target's and q the drafter's
sampling distribution at that temperature:
  argmax draft   - the drafter's argmax x is accepted with probability p(x)
                   (coupled verification of a deterministic draft);
  coupled draft  - argmax(log q + g) with the verifier's Gumbel noise g is accepted iff
                   it equals argmax(log p + g) (what the engine does; Monte Carlo over g);
  sampled draft  - x ~ q accepted with probability min(1, p(x) / q(x)) (SpecInfer /
                   Leviathan rejection sampling): 1 - TV(p, q). Not token-identical to
                   plain decoding, so not built; this is what it would accept.
Greedy (temperature 0): the rate at which argmax q equals argmax p.

  python experiments/draft_acceptance.py --workdir=runs/sd_policy --drafters=drafter
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import load_policy  # noqa: E402
from experiments.host import host_record  # noqa: E402
from tlt_jax import checkpoint, configuration  # noqa: E402
from tlt_jax.data.tasks import format_prompt  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.drafter.training import batch_targets, make_training_batch  # noqa: E402
from tlt_jax.models.drafter import draft_logits, drafter_forward, init_drafter  # noqa: E402
from tlt_jax.rollout.engine import RolloutEngine  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sd_bench.py", "policy config")
_WORKDIR = flags.DEFINE_string("workdir", "runs/sd_policy", "warm_start/ and drafters live here")
_DRAFTERS = flags.DEFINE_list("drafters", ["drafter"], "drafter folders under the workdir")
_PROMPTS = flags.DEFINE_integer("prompts", 32, "held-out prompts rolled out")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "sampling temperature")
_NOISE = flags.DEFINE_integer("noise_samples", 64, "Gumbel draws per position (coupled draft)")


def main(argv):
  del argv
  config, workdir = _CONFIG.value, _WORKDIR.value
  print(host_record(), flush=True)
  policy = load_policy(config, workdir)
  tok, test_split = policy["tokenizer"], policy["test_split"]
  model_cfg, graphdef, params = policy["model_config"], policy["graphdef"], policy["params"]
  engine = RolloutEngine(graphdef, model_cfg, configuration.engine_config(config, tok))
  prompts = [tok.encode(format_prompt(ex), add_bos=True) for ex in list(test_split)]
  temp = _TEMPERATURE.value
  r = engine.generate(
    params, prompts[: _PROMPTS.value], key=7, sampling=SamplingConfig(temperature=temp)
  )
  batch = make_training_batch(r.tokens, r.hidden, r.prompt_len, r.length)
  mask = batch["loss_mask"] > 0
  dgraph, dparams0 = nnx.split(init_drafter(model_cfg, seed=0))
  out = {"temperature": temp, "positions": int(mask.sum()), "drafters": {}}
  for name in _DRAFTERS.value:
    dparams = checkpoint.restore_params(os.path.join(workdir, name), dparams0)
    h, _ = jax.jit(
      lambda dp, b: drafter_forward(
        dgraph,
        dp,
        graphdef,
        params,
        b["tokens"],
        b["features"],
        b["positions"],
        segment_ids=b["segment_ids"],
      )
    )(dparams, batch)
    q_logits = np.asarray(draft_logits(graphdef, params, h))[mask]
    targets = batch_targets(jnp.asarray(batch["features"]))
    p_logits = np.asarray(draft_logits(graphdef, params, targets))[mask]
    if temp == 0:
      agree = float(np.mean(q_logits.argmax(-1) == p_logits.argmax(-1)))
      out["drafters"][name] = {"greedy_agreement": agree}
    else:
      lq = np.asarray(jax.nn.log_softmax(q_logits / temp, axis=-1))
      lp = np.asarray(jax.nn.log_softmax(p_logits / temp, axis=-1))
      p, q = np.exp(lp), np.exp(lq)
      argmax = np.take_along_axis(p, q.argmax(-1)[:, None], axis=-1)[:, 0]
      sampled = np.minimum(p, q).sum(-1)
      g = np.asarray(jax.random.gumbel(jax.random.key(0), (_NOISE.value, *lp.shape)))
      coupled = ((lp + g).argmax(-1) == (lq + g).argmax(-1)).mean(0)
      out["drafters"][name] = {
        "argmax_draft": float(argmax.mean()),
        "coupled_draft": float(coupled.mean()),
        "sampled_draft_1_minus_tv": float(sampled.mean()),
        "target_max_prob": float(p.max(-1).mean()),
      }
    print(name, json.dumps(out["drafters"][name]), flush=True)
  with open(os.path.join(workdir, f"draft_acceptance_t{temp:g}.json"), "w") as f:
    json.dump(out, f, indent=2)


if __name__ == "__main__":
  app.run(main)

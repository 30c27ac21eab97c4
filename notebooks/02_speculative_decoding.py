# %% [markdown]
# # Speculative decoding, step by step
#
# A thin client of `tlt_jax` on a tiny config. A one-layer EAGLE drafter proposes
# tokens from the target's own features; the target checks a whole draft in one
# forward pass and keeps the longest prefix it agrees with. "Agrees" means: the draft
# token equals the token the target itself draws at that position, the argmax of its
# sampling logits plus Gumbel noise keyed by (sequence, position) (coupled sampling;
# greedy: no noise). So the output is not only distributed like the target's: it IS
# the target's output for the same key, at any temperature. Paired `# %%` script (the
# test suite runs it).

# %%
import dataclasses

import matplotlib

try:  # in Jupyter the figures show inline; as a plain script (the test suite) they do not
  get_ipython()  # noqa: F821
except NameError:
  matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.drafter import DrafterTrainConfig, OnlineDrafter
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.transformer import init_model
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine

cfg = ModelConfig(
  vocab_size=32, num_layers=2, d_model=32, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64
)
target_graphdef, target = nnx.split(init_model(cfg, seed=0))
drafter_graphdef, untrained = nnx.split(init_drafter(cfg, seed=1))
GREEDY = SamplingConfig(temperature=0.0)
base = EngineConfig(
  max_prompt_len=8, max_new_tokens=48, max_batch=8, chunk_steps=8, min_cache_bucket=64
)
prompts = [[1 + i, 2 + i, 3 + i] for i in range(8)]

# %% [markdown]
# 1. Plain decoding, with the target's features captured for every token: the
# drafter's training data (EAGLE pairs: next token + feature at t -> feature at t+1).

# %%
plain = RolloutEngine(target_graphdef, cfg, base, GREEDY)
reference = plain.generate(target, prompts, key=0)
drafter = OnlineDrafter(
  drafter_graphdef,
  untrained,
  DrafterTrainConfig(learning_rate=3e-3, warmup_steps=0, batch_rows=4),
  slots=base.slots,
  feature_dim=cfg.d_model,
)
drafter.observe(reference, step=0)
losses = [float(drafter.update(target)["loss"]) for _ in range(150)]
print(f"drafter loss {losses[0]:.3f} -> {losses[-1]:.3f} after {drafter.version} updates")

# %% [markdown]
# 2. Speculative decoding with a chain of 4 draft tokens per round, for the
# untrained and the trained drafter. Greedy output is token-for-token the plain one.

# %%
spec_cfg = dataclasses.replace(
  base, spec_threshold=8, spec_strategies=("chain4",), spec_adaptive=False
)
spec = RolloutEngine(target_graphdef, cfg, spec_cfg, GREEDY, drafter_graphdef=drafter_graphdef)
accept = {}
for name, params in (("untrained", untrained), ("trained", drafter.params)):
  out = spec.generate(target, prompts, key=0, drafter_params=params)
  assert np.array_equal(out.tokens, reference.tokens), "speculative decoding changed the output"
  accept[name] = out.spec_summary()["accept_length"]
  print(f"{name} drafter: {accept[name]:.2f} tokens per target forward (max 5)")

# %% [markdown]
# The same at temperature 1 with top-p: plain and speculative rollouts with the same key
# draw the same tokens (coupled sampling), whichever drafter proposes.

# %%
SAMPLED = SamplingConfig(temperature=1.0, top_p=0.95)
sampled_ref = RolloutEngine(target_graphdef, cfg, base, SAMPLED).generate(target, prompts, key=3)
spec_sampled = RolloutEngine(
  target_graphdef, cfg, spec_cfg, SAMPLED, drafter_graphdef=drafter_graphdef
)
out_sampled = spec_sampled.generate(target, prompts, key=3, drafter_params=drafter.params)
assert np.array_equal(out_sampled.tokens, sampled_ref.tokens), "sampled SD changed the output"
print(
  f"temperature 1: identical tokens, {out_sampled.spec_summary()['accept_length']:.2f} per round"
)

# %% [markdown]
# 3. Where the accepted tokens come from: per speculative chunk, tokens committed
# per row-round (the bonus/correction token included).

# %%
chunks = [e for e in out.timeline if e["phase"] == "spec"]
fig, ax = plt.subplots(figsize=(7, 3))
ax.bar(range(len(chunks)), [e["tokens"] / max(e["row_rounds"], 1) for e in chunks])
ax.axhline(1.0, color="gray", ls="--", label="plain decoding")
ax.set_xlabel("speculative chunk")
ax.set_ylabel("tokens per row-round")
ax.legend()
fig.tight_layout()

# %% [markdown]
# # The long tail of a GRPO rollout
#
# A thin client of `tlt_jax` on a tiny config: sample G answers per prompt from a
# (random-weight) policy whose per-row lengths follow the built-in arithmetic task's
# long-tailed solution lengths, and watch the active batch shrink. The engine compacts
# finished rows into smaller batch buckets, so the tail runs at small batch.
# Paired `# %%` script: runs as a plain Python file (the test suite executes it).

# %%
import matplotlib

try:  # in Jupyter the figures show inline; as a plain script (the test suite) they do not
  get_ipython()  # noqa: F821
except NameError:
  matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from tlt_jax.data import CharTokenizer, make_split
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine

# %% [markdown]
# Response lengths of the task: the longest answers are 10x the median or more.

# %%
tok = CharTokenizer()
examples = make_split(
  "arithmetic", "train", train_size=512, max_operand=9, max_value=99, style="labelled"
)
lengths = np.array([len(e["solution"]) + 1 for e in examples])
print(
  f"median {np.median(lengths):.0f}, p90 {np.percentile(lengths, 90):.0f}, "
  f"max {lengths.max()} tokens"
)

# %% [markdown]
# A tiny policy and the engine. Rows stop at their own length (here forced by
# per-row limits, as a trained policy would stop at its EOS).

# %%
cfg = ModelConfig(
  vocab_size=tok.vocab_size,
  num_layers=1,
  d_model=32,
  num_heads=2,
  num_kv_heads=1,
  head_dim=16,
  mlp_dim=64,
)
graphdef, params = nnx.split(init_model(cfg))
prompts = [tok.encode(e["question"], add_bos=True)[:16] for e in examples[:4]]
limits = np.random.default_rng(0).choice(lengths, 4 * 8).tolist()
engine = RolloutEngine(
  graphdef,
  cfg,
  EngineConfig(
    max_prompt_len=16,
    max_new_tokens=int(max(limits)),
    max_batch=32,
    chunk_steps=8,
    min_cache_bucket=32,
  ),
  SamplingConfig(temperature=1.0),
)
result = engine.generate(params, prompts, 8, key=0, max_new_tokens=limits)
print(f"{int(result.num_generated.sum())} tokens in {result.wall_seconds:.2f}s (incl. compiles)")

# %%
decode = [e for e in result.timeline if e["phase"] == "decode"]
fig, ax = plt.subplots(figsize=(7, 3))
ax.step(range(len(decode)), [e["active"] for e in decode], label="active sequences")
ax.step(range(len(decode)), [e["batch"] for e in decode], label="batch bucket", ls="--")
ax.set_xlabel("chunk")
ax.set_ylabel("rows")
ax.legend()
fig.tight_layout()
print("batch buckets used:", sorted({e["batch"] for e in decode}, reverse=True))

# %% [markdown]
# # The adaptive drafter over training
#
# RL moves the policy; a drafter fitted to the starting policy drifts out of date and
# its accepted length falls. TLT keeps training it on each step's own rollouts. Here a
# tiny policy "trains" by small random parameter moves (a stand-in for RL updates), and
# we compare a frozen drafter with one updated online from a `DrafterBuffer` of the
# newest rollouts. Paired `# %%` script (the test suite runs it).

# %%
import jax
import matplotlib

try:  # in Jupyter the figures show inline; as a plain script (the test suite) they do not
  get_ipython()  # noqa: F821
except NameError:
  matplotlib.use("Agg")
import matplotlib.pyplot as plt
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
graphdef, policy = nnx.split(init_model(cfg, seed=0))
dgraph, dparams = nnx.split(init_drafter(cfg, seed=1))
engine_cfg = EngineConfig(
  max_prompt_len=8,
  max_new_tokens=40,
  max_batch=8,
  chunk_steps=8,
  min_cache_bucket=64,
  spec_threshold=8,
  spec_strategies=("chain4",),
  spec_adaptive=False,  # always draft: we measure the drafter, not the bandit
)
engine = RolloutEngine(
  graphdef, cfg, engine_cfg, SamplingConfig(temperature=0.0), drafter_graphdef=dgraph
)
prompts = [[1 + i, 2 + i] for i in range(8)]


def make_drafter():
  train_cfg = DrafterTrainConfig(learning_rate=3e-3, warmup_steps=0, batch_rows=4, keep_steps=1)
  return OnlineDrafter(dgraph, dparams, train_cfg, slots=engine_cfg.slots, feature_dim=cfg.d_model)


online = make_drafter()
rollout = engine.generate(policy, prompts, key=0, drafter_params=online.params)
online.observe(rollout, step=0)
for _ in range(150):
  online.update(policy)
frozen = jax.tree.map(lambda x: x, online.params)

# %% [markdown]
# Ten "RL steps": the policy moves a little each step. The frozen drafter keeps its
# step-0 weights; the online one takes 40 updates on each step's rollouts.

# %%
history = {"frozen": [], "online": []}
for step in range(10):
  noise = jax.random.key(step)
  leaves, treedef = jax.tree.flatten(policy)
  keys = jax.random.split(noise, len(leaves))
  policy = jax.tree.unflatten(
    treedef, [x + 0.1 * x.std() * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  )
  for name, params in (("frozen", frozen), ("online", online.params)):
    out = engine.generate(policy, prompts, key=step, drafter_params=params)
    history[name].append(out.spec_summary()["accept_length"])
  online.observe(out, step=step + 1)
  for _ in range(40):
    online.update(policy)
print({k: [round(v, 2) for v in vs] for k, vs in history.items()})

# %%
fig, ax = plt.subplots(figsize=(6, 3))
for name, values in history.items():
  ax.plot(range(1, len(values) + 1), values, marker="o", label=f"{name} drafter")
ax.set_xlabel("policy step")
ax.set_ylabel("accepted tokens per round")
ax.legend()
fig.tight_layout()

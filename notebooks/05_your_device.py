# %% [markdown]
# # What TLT would do on a device: a real model size, measured, then simulated
#
# TLT pays where a decode step costs about the same for one row as for a few (the weights,
# not the arithmetic, bound it), where a verify forward of several draft tokens costs
# about one decode step, and where the rollout is most of an RL step. Whether that holds
# for a model on a device is a measurement: `experiments/real_sizes.py` times a published
# model's layer shapes there (random bfloat16 weights: shapes, bytes and kernels are what is
# measured, not acceptance), and the step simulator (`tlt_jax.sim`) replays the rollout
# engine's policy on DAPO-like response lengths with those costs.
#
# This notebook reads the committed measurements of Qwen3-8B's shapes on one H200
# (2026-12-04; so far batch 1 of the forward grid). For your device, run on it
#
#     python experiments/real_sizes.py --out=runs/real_sizes \
#       --stages=decode_b1,bandwidth,verify_b1,decode_grid,rounds
#
# and set `MEASURED` below to `runs/real_sizes/real_sizes.json`; every cell reads that file.
# Paired `# %%` script: runs as a plain Python file (the test suite executes it).

# %%
import json
import sys
from pathlib import Path

import matplotlib

try:  # in Jupyter the figures show inline; as a plain script (the test suite) they do not
  get_ipython()  # noqa: F821
except NameError:
  matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from tlt_jax.sim import (
  ACCEPT_FROZEN,
  ACCEPT_ONLINE,
  TableCost,
  device_roofline,
  project_step,
)

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "experiments/results").is_dir())
sys.path.insert(0, str(ROOT))
from experiments.common import published_shape  # noqa: E402

MEASURED = ROOT / "experiments/results/regime_curve_stage9_h200_2026-12-04/real_sizes.json"
SHAPE = "qwen3-8b"
measured = json.loads(MEASURED.read_text())
cfg = published_shape(SHAPE)
print(f"{SHAPE}: {cfg.num_params / 1e9:.2f}B parameters on {', '.join(measured['devices'])}")

# %% [markdown]
# **A decode step against its bound.** At one row a decode step reads every weight and the
# row's KV cache once; the bound is those bytes over the device's bandwidth: the measured
# copy rate (a copy reads and writes, so it understates reading alone) and the spec
# sheet's.

# %%
b1, bw = measured["decode_b1"], measured["bandwidth"]
read_gb = (b1["weight_bytes"] + b1["kv_bytes"]) / 1e9
copy_ms = read_gb / bw["gb_per_s"] * 1e3
spec_ms = read_gb / (bw["spec"][0] * 1e3) * 1e3 if bw.get("spec") else None
print(
  f"batch-1 decode at context {b1['context']}: {b1['ms_in_loop']:.2f} ms in a device loop, "
  f"{b1['ms_per_call']:.2f} ms one step a call; reads {read_gb:.1f} GB"
)
print(f"bound at the copy bandwidth ({bw['gb_per_s']:.0f} GB/s): {copy_ms:.2f} ms, ", end="")
print(f"{copy_ms / b1['ms_in_loop']:.0%} of it reached")
if spec_ms:
  print(
    f"bound at the spec sheet's {bw['spec'][0]} TB/s: {spec_ms:.2f} ms, "
    f"{spec_ms / b1['ms_in_loop']:.0%} of it reached"
  )

# %% [markdown]
# **Where a forward's time goes, by new tokens a row.** The verify forwards (5 and 9
# tokens: a chain of 4 or 8 draft tokens and the bonus) were traced and their kernels
# summed by kind (`experiments/traces.py`). On this GPU a decode step (1 token) runs about
# 1 ms of reductions that the multi-token forwards do not, so verifying a chain costs less
# than decoding one token. The next cell says why.

# %%
verify = {int(k.split("/")[-1]): c for k, c in measured["verify_b1"].items()}
tokens = sorted(verify)
kinds = ("products", "reductions", "element-wise", "other")
fig, ax = plt.subplots(figsize=(7, 3.6))
bottom = np.zeros(len(tokens))
for kind in kinds:
  ms = np.array([verify[t]["trace"]["by_kind_ms_per_step"].get(kind, 0.0) for t in tokens])
  ax.bar([str(t) for t in tokens], ms, bottom=bottom, label=f"kernels: {kind}")
  bottom += ms
ax.plot([str(t) for t in tokens], [verify[t]["ms"] for t in tokens], "ko", label="measured forward")
ax.axhline(copy_ms, color="grey", ls="--", label="bound at the copy bandwidth")
if spec_ms:
  ax.axhline(spec_ms, color="grey", ls=":", label="bound at the spec sheet's bandwidth")
ax.set_xlabel("new tokens a row (batch 1)")
ax.set_ylabel("ms a forward")
ax.set_title(f"{SHAPE} on {measured['devices'][0]}: a forward's kernels by kind")
ax.legend(fontsize=7, loc="lower right")
plt.tight_layout()
plt.show()
for t in tokens:
  print(f"{t:>2} tokens: {verify[t]['ms']:.2f} ms = {verify[t]['ms'] / verify[1]['ms']:.2f} steps")

# %% [markdown]
# **Why one token costs more than five: the kernels a step launches.** The same programs
# compiled for an H100 on a CPU host (`experiments/deviceless.py`, the CUDA plugin and no
# device; its 945 and 766 kernels for the 8B one- and five-token forwards match this
# device's traces, 959 and 780, less a call's 14 outside the loop): a product whose
# activation side is one row of one token becomes an elementwise product and a reduction
# in XLA's GPU compiler, so a one-row step launches more kernels, mostly reductions, and
# reads its weights' worth of products back. Two rows, or one row of two tokens, keep every
# projection a matrix product; the engine's one-row step on a GPU is therefore a two-token
# forward (`engine.one_row_step`). These counts are the code of that day; since then a
# one-row batch writes its KV cache in place instead of through a scatter, two kernels a
# layer fewer: the 50M policy's 1/2 cell 239, the 8B's 693 (experiments/RESULTS.md,
# 2026-12-05, "a one-row forward writes its KV cache in place").

# %%
KERNELS = ROOT / "experiments/results/deviceless_h100_hostL_2026-12-05/deviceless.json"
kernels = json.loads(KERNELS.read_text())
cells = ["1/1", "1/2", "2/1", "1/5"]
shapes = [("configs/sd_bench.py", "50M policy (float32)"), (SHAPE, "Qwen3-8B layers (bfloat16)")]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
for ax, (name, label) in zip(axes, shapes, strict=True):
  bottom = np.zeros(len(cells))
  for kind in kinds:
    n = np.array([kernels[f"{name}/{c}"]["by_kind"].get(kind, 0) for c in cells])
    ax.bar(cells, n, bottom=bottom, label=kind)
    bottom += n
  ax.set_title(label, fontsize=9)
  ax.set_xlabel("rows / new tokens a row")
axes[0].set_ylabel("kernels a step (an H100's program)")
axes[1].legend(fontsize=7)
plt.tight_layout()
plt.show()
for name, label in shapes:
  counts = ", ".join(f"{c}: {kernels[f'{name}/{c}']['kernels']}" for c in cells)
  print(f"{label}: {counts}")

# %% [markdown]
# **One row against two.** The weights are the same bytes at one row and two, so on a
# memory-bound device a second row should cost little more than its KV cache. On the grid
# of 2026-12-04 it did at one token, but two rows of 5 and 9 tokens cost 2.3 and 3.9 ms more
# than one row's: those cells took attention as a multiply-reduce (a rule measured on CPUs),
# which on a GPU reads the cache once per query row. On GPUs attention now takes the
# batched products (`models.attention.platform_form`); on a grid measured since, the two
# lines should lie close (experiments/RESULTS.md, 2026-12-05, "attention on a GPU takes the
# dots").

# %%
prefix = f"{SHAPE}/{b1['context']}/"
grid = {k[len(prefix) :]: c for k, c in measured["decode_grid"].items() if k.startswith(prefix)}
fig, ax = plt.subplots(figsize=(7, 3.2))
for rows in (1, 2):
  mine = [(int(k.split("/")[1]), c["ms"]) for k, c in grid.items() if k.startswith(f"{rows}/")]
  cells_r = sorted(mine)
  if cells_r:
    ax.plot(*zip(*cells_r, strict=True), "o-", label=f"{rows} row{'s' if rows > 1 else ''}")
ax.set_xlabel("new tokens a row")
ax.set_ylabel("ms a forward")
ax.set_title(f"{SHAPE} on {measured['devices'][0]}: one row against two")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()
for key, cell in grid.items():
  print(f"{key} (rows / new tokens): {cell['ms']:.2f} ms")

# %% [markdown]
# **Attention, fused.** At 16 and 64 rows of 5 new tokens, a verify forward's attention
# writes its float32 scores and bfloat16 probabilities to memory and reads them back:
# compiled for an H100, 1.13 GB of the 2.87 GB Qwen3-8B's forward writes a step at 16 rows,
# 4.53 GB of 7.19 at 64 (experiments/RESULTS.md, 2026-12-06, "cuDNN's fused attention").
# For a bfloat16 policy on an NVIDIA GPU, `attention_form("fused")` (`tlt_jax.models`) runs
# attention as cuDNN's one kernel a layer, the dots elsewhere. Whether it pays on your device
# is one command there, each cell's two programs' outputs compared before they are timed:
#
#     python experiments/bench_step_variants.py --compare=fused --shapes=qwen3-8b \
#       --cells=1x1,16x5,64x5 --context=1024

# %% [markdown]
# **The RL step, simulated.** The measured forwards become the simulator's cost table
# (`TableCost`, one row an instance where only batch 1 is measured); beside it, a roofline
# of the same device (its spec sheet, bandwidth at the measured copy rate). Response
# lengths are DAPO-like (median 470, p90 1,000, 32k cap), the accept lengths this project
# measured (frozen drafter for sd, online for tlt), the drafter's step as measured against
# the decode step, and the update at 40% of the device's peak.

# %%
table = TableCost.from_decode_grid(measured["decode_grid"], SHAPE)
roofline, peak = device_roofline(measured, cfg, overhead_s=5e-4)
step_ms = 1e3 * table.seconds(1, 1, table.context)
draft = measured["drafter_step"][f"{SHAPE}/1"] / step_ms
rows = max(table.batches)
per_instance = f"{rows} row{'s' if rows > 1 else ''} an instance"
print(f"drafter step {draft:.3f} of a decode step; {per_instance}")


def project(cost, **change):
  """TLT's and sd's projected end-to-end speedups on `cost`, one assumption changed."""
  settings = dict(rows=rows, draft=draft, mfu=0.4, accept=1.0, steps=10)
  pred = project_step(cost, cfg, peak, ACCEPT_FROZEN, ACCEPT_ONLINE, **{**settings, **change})
  return pred["sd"]["step_speedup"], pred["tlt"]["step_speedup"], pred


print("| cost model | rollout share | sd | tlt |")
print("|---|---|---|---|")
for label, cost in (("measured forwards", table), ("roofline of the same device", roofline)):
  sd, tlt, pred = project(cost)
  print(f"| {label} | {pred['baseline']['rollout_share']:.2f} | {sd:.2f}x | {tlt:.2f}x |")
# A what-if, not a measurement: the one-row step at the 5-token forward's time, as the
# engine's two-token step might run (no two-token forward of this shape is timed yet), the
# drafter's measured ms kept.
grid = json.loads(json.dumps(measured["decode_grid"]))
grid[f"{SHAPE}/{b1['context']}/1/1"] = grid[f"{SHAPE}/{b1['context']}/1/5"]
paired = TableCost.from_decode_grid(grid, SHAPE)
paired_ms = 1e3 * paired.seconds(1, 1, paired.context)
sd, tlt, pred = project(paired, draft=draft * step_ms / paired_ms)
print(
  f"| what if the one-row step cost the 5-token forward ({paired_ms:.2f} ms) | "
  f"{pred['baseline']['rollout_share']:.2f} | {sd:.2f}x | {tlt:.2f}x |"
)
print("| the paper (Qwen2.5-7B, 64 H100s, 128 rows an instance, against veRL) | - | - | 1.86x |")

# %% [markdown]
# **What moves the figure.** One assumption at a time: the drafter's cost against a
# decode step, and the accepted draft tokens (scaled from this project's measured accept
# lengths). A measured forward table and a roofline part where the verify forward's cost
# does: the roofline prices a verify at no less than a decode step, the measurement here
# at less.

# %%
drafts = np.array([0.25, 0.5, 1.0, 1.5, 2.0]) * draft
accepts = np.array([0.6, 0.8, 1.0, 1.2, 1.4])
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
for label, cost, style in (("measured", table, "-o"), ("roofline", roofline, "--s")):
  axes[0].plot(drafts, [project(cost, draft=d)[1] for d in drafts], style, label=label)
  axes[1].plot(accepts, [project(cost, accept=a)[1] for a in accepts], style, label=label)
for ax in axes:
  ax.axhline(1.86, color="grey", ls=":", label="the paper's 1.86x")
  ax.axhline(1.0, color="black", lw=0.5)
axes[0].set_xlabel("drafter step / decode step")
axes[1].set_xlabel("accepted draft tokens, x this project's")
axes[0].set_ylabel("tlt, end to end over baseline")
axes[0].legend(fontsize=8)
fig.suptitle(f"{SHAPE} on {measured['devices'][0]}, {per_instance}, DAPO-like lengths")
plt.tight_layout()
plt.show()

# %% [markdown]
# These are projections, not runs. Part of the measured lead is the one-token step's own
# cost (6.18 ms against 4.93 for five tokens): with that step as cheap as a two-token
# forward may make it, TLT's figure falls, as the what-if row shows. Also: one row an
# instance (the grid's larger batches are still to be measured), so every step is the long
# tail's small-batch phase, where the paper's 128 rows spend only part of theirs; a
# random-weight drafter's cost; accept lengths from this project's small policies; an
# update priced from an assumed MFU. The command-line version with the full one-at-a-time
# table is `python experiments/simulate.py --project --surface=<real_sizes.json>:<shape>`.

# %% [markdown]
# # TLT's figure from the committed runs: the same learning sooner, and what bounds it
#
# The learning curve inside TLT's regime (`configs/regime.py`: a 13M policy, 40 GRPO steps
# of 16 prompts x 8 samples, baseline, sd and tlt interleaved in blocks of 10 steps on a
# 2-core CPU) ran for four seeds; their per-step tables and metrics are committed under
# `experiments/results/`. This notebook trains nothing: it reads those tables, checks the
# claims the README makes from them, takes a step apart into its parts, and asks what
# would have to change for the paper's 1.7x.
# Paired `# %%` script: runs as a plain Python file (the test suite executes it).

# %%
import json
from pathlib import Path

import matplotlib

try:  # in Jupyter the figures show inline; as a plain script (the test suite) they do not
  get_ipython()  # noqa: F821
except NameError:
  matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from tlt_jax.curves import COLOURS, amdahl, quarter_rise, seeds_summary

MODES = ("baseline", "sd", "tlt")
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "experiments/results").is_dir())
RUNS = ROOT / "experiments/results/regime_curve_stage8_hostH_2026-11-29"
SEEDS = (0, 1, 2, 3)  # seed 3 started from the bfloat16-packed warm start the GPU run carries


def report(seed):
  """experiments/learning_curve.py's report of one seed (seed 0's file has no suffix)."""
  return json.loads((RUNS / f"learning_curve{f'_s{seed}' if seed else ''}.json").read_text())


def metrics(mode, seed):
  """The trainer's per-step metrics of one mode of one seed."""
  lines = (RUNS / f"metrics_{mode}_s{seed}.jsonl").read_text().splitlines()
  return [json.loads(line) for line in lines]


reports = {s: report(s) for s in SEEDS}
rows = {s: {m: reports[s]["rows"][f"{m}_s{s}"] for m in MODES} for s in SEEDS}

# %% [markdown]
# **The same learning.** Speculative rollouts are token-identical to plain ones, so the
# three modes draw the same samples and earn the same rewards at every step: the curves
# can differ only in their time axis. The rise is the training reward's last quarter over
# its first, with a bootstrap interval over steps (`tlt_jax.curves.quarter_rise`),
# recomputed here from the rows.

# %%
for s in SEEDS:
  rewards = {m: [r["reward"] for r in rows[s][m]] for m in MODES}
  equal = sum(len({rewards[m][i] for m in MODES}) == 1 for i in range(len(rewards["tlt"])))
  rise = quarter_rise(rewards["baseline"])
  held_out = [r["eval"] for r in rows[s]["baseline"] if r["eval"] != ""]
  warm = reports[s]["warm_start_eval"]["accuracy"]
  lo, hi = rise["interval"]
  print(
    f"seed {s}: rewards equal in all modes at {equal} of {len(rewards['tlt'])} steps; "
    f"reward {rise['first_quarter']:.3f} -> {rise['last_quarter']:.3f}, rise "
    f"{rise['rise']:+.3f} [{lo:+.3f}, {hi:+.3f}]; held-out greedy {warm:.2f} -> "
    + " / ".join(f"{a:.2f}" for a in held_out)
  )

# %% [markdown]
# **Sooner.** The training reward's 5-step moving average against wall-clock seconds
# (compiles and held-out evaluation left out), each seed thin and the seeds' mean bold
# (`tlt_jax.curves.seeds_summary`, the README figure's numbers).

# %%
summary = seeds_summary([reports[s] for s in SEEDS])
fig, ax = plt.subplots(figsize=(8, 4))
for mode, curve in summary["curves"].items():
  for seconds, reward in curve["per_seed"]:
    ax.plot(seconds, reward, color=COLOURS[mode], alpha=0.25, lw=1)
  ax.plot(curve["seconds"], curve["reward"], color=COLOURS[mode], lw=2.5, label=mode)
ax.set_xlabel("wall-clock seconds")
ax.set_ylabel("training reward (5-step mean)")
ax.set_title(f"four seeds, {summary['steps']} steps each")
ax.legend()
ax.grid(alpha=0.3)
plt.show()
for mode, curve in summary["curves"].items():
  print(f"{mode}: step {summary['steps']} reached at {curve['seconds'][-1]:.0f} s on average")

# %% [markdown]
# **Where a step's seconds go.** Per mode, the mean over every seed's steps 1-39 (step 0
# holds the first compiles): the rollout (generation, with tlt's drafter work inside its
# idle time), the policy update, the drafter's training outside the rollout, and the rest
# (rewards, bookkeeping). The update and the rest cost every mode the same; speculation
# shrinks only the rollout, so the rollout's share r of a baseline step and its speedup s
# bound the whole: Amdahl's 1 / ((1 - r) + r / s).


# %%
def parts(mode, seed):
  """Mean seconds a step, steps 1-39: rollout, update, drafter, rest."""
  out = []
  for row, m in zip(rows[seed][mode][1:], metrics(mode, seed)[1:]):
    update = m["time/update"] - m.get("time/train_compile", 0.0)
    drafter = m.get("time/drafter", 0.0)
    out.append(
      (row["rollout_s"], update, drafter, row["step_s"] - row["rollout_s"] - update - drafter)
    )
  return np.mean(out, axis=0)


table = {m: np.mean([parts(m, s) for s in SEEDS], axis=0) for m in MODES}
names = ("rollout", "update", "drafter", "rest")
fig, ax = plt.subplots(figsize=(7, 3))
left = np.zeros(len(MODES))
for i, name in enumerate(names):
  widths = np.array([table[m][i] for m in MODES])
  ax.barh(MODES, widths, left=left, label=name)
  left += widths
ax.set_xlabel("seconds a step (mean of four seeds, steps 1-39)")
ax.legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0))
plt.show()
for m in MODES:
  print(f"{m:8s} " + ", ".join(f"{n} {v:5.1f} s" for n, v in zip(names, table[m])))

base, tlt = table["baseline"], table["tlt"]
r = base[0] / base.sum()
s = base[0] / tlt[0]
print(
  f"r = {r:.2f}, s = {s:.2f}: Amdahl {amdahl(r, s):.2f}x; measured (mean steps) "
  f"{base.sum() / tlt.sum():.2f}x"
)

# %% [markdown]
# **What 1.7x would take here.** With the rollout sped up s times, the end-to-end figure
# is Amdahl's in r: below, each seed's measured paired speedup (median of its steps) at
# its own r, on the curve of the mean s. Solving 1.7 = 1 / ((1 - r) + r / s) for r gives
# the rollout share this CPU would need, and from it how much faster the update would have
# to run with the rollout as it is.

# %%
rs = np.linspace(0.3, 1.0, 71)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(rs, [amdahl(x, s) for x in rs], color="k", lw=1, label=f"Amdahl at s = {s:.2f}")
for seed in SEEDS:
  speed = reports[seed]["speed"]
  ax.plot(
    speed[f"baseline_s{seed}"]["rollout_share"],
    speed[f"tlt_s{seed}"]["step_speedup"]["median"],
    "o",
    color=COLOURS["tlt"],
  )
ax.axhline(1.7, ls="--", color="tab:red", label="the paper's 1.7x")
ax.set_xlabel("r: the rollout's share of a baseline step")
ax.set_ylabel("tlt's end-to-end speedup")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
plt.show()

needed_r = (1 - 1 / 1.7) / (1 - 1 / s)
rest_needed = base[0] * (1 - needed_r) / needed_r  # update + drafter + rest at that share
update_needed = rest_needed - base[2] - base[3]
print(
  f"1.7x at s = {s:.2f} needs r >= {needed_r:.2f} (now {r:.2f}): the update at "
  f"{update_needed:.1f} s a step instead of {base[1]:.1f} s, {base[1] / update_needed:.1f}x faster"
)

# %% [markdown]
# **The drafter keeps up.** sd runs the warm-start drafter frozen; tlt trains it online
# from the rollouts' own hidden states, inside its step time. Accepted tokens a round in
# each step's rollout (the mean over seeds), and tlt's drafter updates a step.

# %%
fig, ax = plt.subplots(figsize=(7, 3))
for mode in ("sd", "tlt"):
  accept = np.mean([[r["accept_length"] for r in rows[s][mode]] for s in SEEDS], axis=0)
  ax.plot(
    accept, ".-", color=COLOURS[mode], label=f"{mode} ({'online' if mode == 'tlt' else 'frozen'})"
  )
ax.set_xlabel("RL step")
ax.set_ylabel("accepted tokens a round")
ax.legend()
ax.grid(alpha=0.3)
plt.show()
updates = [r["drafter_updates"] for s in SEEDS for r in rows[s]["tlt"]]
print(f"drafter updates in each tlt step: {min(updates)}-{max(updates)} ({len(updates)} steps)")

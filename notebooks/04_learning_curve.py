# %% [markdown]
# # TLT's figure from the committed runs: the same learning sooner, and what bounds it
#
# The learning curve inside TLT's regime (`configs/regime.py`: a 13M policy, 40 GRPO steps
# of 16 prompts x 8 samples, baseline, sd and tlt interleaved in blocks of 10 steps on a
# 2-core CPU) ran for six seeds: seeds 0-3 on host H (2026-11-29), seeds 4 and 5 on host J
# (2026-12-02/03, seed 5 with the online drafter's later settings); their per-step tables
# are committed under `experiments/results/`. This notebook trains nothing: it reads those
# tables, checks the claims the README makes from them, takes a step apart into its parts,
# and asks what would have to change for the paper's 1.7x. Seconds are compared within a
# host only: host H's four seeds make the timing figures, host J's two sit beside them.
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
RESULTS = ROOT / "experiments/results"
RUNS = RESULTS / "regime_curve_stage8_hostH_2026-11-29"
# Each seed's report (experiments/learning_curve.py's JSON). Seeds 3-5 started from the
# bfloat16-packed warm start the GPU run carries.
REPORTS = {
  0: RUNS / "learning_curve.json",
  **{s: RUNS / f"learning_curve_s{s}.json" for s in (1, 2, 3)},
  4: RESULTS / "regime_curve_fusions_hostJ_2026-12-02/learning_curve.json",
  5: RESULTS / "regime_curve_current_s5_hostJ_2026-12-03/learning_curve.json",
}
SEEDS = tuple(REPORTS)
HOST_H = (0, 1, 2, 3)  # one host's seeds: the timing figures; their metrics are committed too
HOST_J = (4, 5)


def metrics(mode, seed):
  """The trainer's per-step metrics of one mode of one seed."""
  lines = (RUNS / f"metrics_{mode}_s{seed}.jsonl").read_text().splitlines()
  return [json.loads(line) for line in lines]


reports = {s: json.loads(REPORTS[s].read_text()) for s in SEEDS}
rows = {s: {m: reports[s]["rows"][f"{m}_s{s}"] for m in MODES} for s in SEEDS}

# %% [markdown]
# **The same learning.** Speculative rollouts are token-identical to plain ones, so the
# three modes draw the same samples and earn the same rewards at every step: the curves
# can differ only in their time axis. The rise is the training reward's last quarter over
# its first, with a bootstrap interval over steps (`tlt_jax.curves.quarter_rise`),
# recomputed here from the rows; beside it, the trained policy's lead over the warm start
# replayed on the same last-quarter prompts (learning, not an easier data order).

# %%
rises = []
for s in SEEDS:
  rewards = {m: [r["reward"] for r in rows[s][m]] for m in MODES}
  equal = sum(len({rewards[m][i] for m in MODES}) == 1 for i in range(len(rewards["tlt"])))
  rise = quarter_rise(rewards["baseline"])
  held_out = [r["eval"] for r in rows[s]["baseline"] if r["eval"] != ""]
  warm = reports[s]["warm_start_eval"]["accuracy"]
  lo, hi = rise["interval"]
  rises.append((rise["rise"], lo))
  replay = reports[s]["warm_start_replay"]
  print(
    f"seed {s}: rewards equal in all modes at {equal} of {len(rewards['tlt'])} steps; "
    f"reward {rise['first_quarter']:.3f} -> {rise['last_quarter']:.3f}, rise "
    f"{rise['rise']:+.3f} [{lo:+.3f}, {hi:+.3f}]; last quarter's prompts: warm start "
    f"{replay['warm_start_last_quarter']:.3f}, trained "
    f"{replay['trained_minus_warm_start']['mean']:+.3f}; held-out greedy {warm:.2f} -> "
    + " / ".join(f"{a:.2f}" for a in held_out)
  )
rise_values = np.array([r for r, _ in rises])
passed = sum(r >= 0.10 and lo > 0 for r, lo in rises)
print(
  f"rise over {len(SEEDS)} seeds: mean {rise_values.mean():+.3f}, "
  f"SD {rise_values.std(ddof=1):.3f}; "
  f"{passed} of {len(SEEDS)} seeds rise by >= 0.10 with an interval above 0"
)

# %% [markdown]
# **Sooner.** The training reward's 5-step moving average against wall-clock seconds
# (compiles and held-out evaluation left out), each seed thin and the seeds' mean bold
# (`tlt_jax.curves.seeds_summary`, the README figures' numbers), one panel a host.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
for ax, (host, seeds) in zip(axes, (("H", HOST_H), ("J", HOST_J))):
  summary = seeds_summary([reports[s] for s in seeds])
  for mode, curve in summary["curves"].items():
    for seconds, reward in curve["per_seed"]:
      ax.plot(seconds, reward, color=COLOURS[mode], alpha=0.25, lw=1)
    ax.plot(curve["seconds"], curve["reward"], color=COLOURS[mode], lw=2.5, label=mode)
    print(
      f"host {host}, {mode}: step {summary['steps']} reached at "
      f"{curve['seconds'][-1]:.0f} s on average"
    )
  ax.set_xlabel("wall-clock seconds")
  ax.set_title(f"host {host}: seeds {', '.join(map(str, seeds))}, {summary['steps']} steps each")
  ax.grid(alpha=0.3)
axes[0].set_ylabel("training reward (5-step mean)")
axes[0].legend()
plt.show()

# %% [markdown]
# **Where a step's seconds go.** Per mode, the mean over host H's seeds' steps 1-39
# (step 0 holds the first compiles; their per-step metrics are committed): the rollout
# (generation, with tlt's drafter work inside its idle time), the policy update, the
# drafter's training outside the rollout, and the rest (rewards, bookkeeping). The update
# and the rest cost every mode the same; speculation shrinks only the rollout, so the
# rollout's share r of a baseline step and its speedup s bound the whole: Amdahl's
# 1 / ((1 - r) + r / s).


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


table = {m: np.mean([parts(m, s) for s in HOST_H], axis=0) for m in MODES}
names = ("rollout", "update", "drafter", "rest")
fig, ax = plt.subplots(figsize=(7, 3))
left = np.zeros(len(MODES))
for i, name in enumerate(names):
  widths = np.array([table[m][i] for m in MODES])
  ax.barh(MODES, widths, left=left, label=name)
  left += widths
ax.set_xlabel("seconds a step (mean of host H's four seeds, steps 1-39)")
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
# its own r (circles host H, squares host J), on the curve of host H's mean s. Solving
# 1.7 = 1 / ((1 - r) + r / s) for r gives the rollout share this CPU would need, and from
# it how much faster the update would have to run with the rollout as it is.

# %%
rs = np.linspace(0.3, 1.0, 71)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(rs, [amdahl(x, s) for x in rs], color="k", lw=1, label=f"Amdahl at s = {s:.2f}")
for seed in SEEDS:
  speed = reports[seed]["speed"]
  ax.plot(
    speed[f"baseline_s{seed}"]["rollout_share"],
    speed[f"tlt_s{seed}"]["step_speedup"]["median"],
    "o" if seed in HOST_H else "s",
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
# from the rollouts' own hidden states, inside its step time. A round's accepted tokens
# depend on the chain the bandit chose as much as on the drafter (seed 5's tlt bandit ran
# chain4 for its first 12 steps), so each panel holds one chain: its accepted tokens a
# round in each step's rollout, averaged over the seeds' rounds (steps where a seed ran it
# fewer than 20 times left out). Seeds 0-4 trained the drafter at 2e-3 from whatever rows
# had finished; seed 5 at 1e-3, waiting for a step's rows (`configs/regime.py`,
# `drafter.min_rows`): its own line.


# %%
def arm_accept(mode, seeds, arm, min_rounds=20):
  """A chain's accepted tokens a round at each step: the mean over the seeds' rounds.

  Per step, not per data epoch as `tlt_jax.compare.arms_by_epoch`, and without a step's
  few-round arms, whose means swing by tokens (seed 4's chain8 gain reads -1.25 with them)."""
  out = []
  for step in range(len(rows[seeds[0]][mode])):
    pairs = []
    for s in seeds:
      row = rows[s][mode][step]
      rounds = json.loads(row["arm_row_rounds"]).get(arm, 0)
      if rounds >= min_rounds:
        pairs.append((json.loads(row["arm_accept"])[arm], rounds))
    accept, weight = zip(*pairs) if pairs else ((np.nan,), (1,))
    out.append(np.average(accept, weights=weight))
  return np.array(out)


lines = (
  ("sd", SEEDS, "sd (frozen), six seeds", "-"),
  ("tlt", SEEDS[:5], "tlt (online, 2e-3), seeds 0-4", "-"),
  ("tlt", (5,), "tlt (online, 1e-3 after a step's rows), seed 5", "--"),
)
fig, axes = plt.subplots(1, 2, figsize=(11, 3), sharey=True)
for ax, arm in zip(axes, ("chain8", "chain12")):
  for mode, seeds, label, style in lines:
    ax.plot(arm_accept(mode, seeds, arm), "." + style, color=COLOURS[mode], label=label)
  ax.set_title(arm)
  ax.set_xlabel("RL step")
  ax.grid(alpha=0.3)
axes[0].set_ylabel("accepted tokens a round")
axes[0].legend(fontsize=8)
plt.show()
for arm in ("chain8", "chain12"):
  gains = [
    np.nanmean(arm_accept("tlt", (s,), arm)[30:] - arm_accept("sd", (s,), arm)[30:]) for s in SEEDS
  ]
  by_seed = " / ".join(f"{g:+.2f}" for g in gains)
  print(f"{arm}, steps 30-39, online minus frozen by seed: {by_seed}")
updates = [r["drafter_updates"] for s in SEEDS for r in rows[s]["tlt"]]
print(f"drafter updates in each tlt step: {min(updates)}-{max(updates)} ({len(updates)} steps)")

# %% [markdown]
# **A longer tail, and a bandit that stopped looking.** The seeds above ran on a tail of
# 8-10x a step's median answer: their policy could not count down from more than 99. An
# eleventh SFT stage on the openings of long answers taught it, and the curve on that warm
# start (seed 0, host J, 2026-12-05) runs on a tail of about 14x. There tlt trailed sd in
# every block, with the better drafter: its bandit's batch-1 bucket had settled on plain
# decoding after one noisy warm-up chunk an arm, and a settled plain chunk (run to the end
# of its cache view) taught the bandit nothing, so no draft was tried there again. A gate
# reran sd and tlt from the curve's step-30 checkpoints, interleaved in one process, with
# settled chunks counted as pulls of plain at plain's mean, so the bucket aged and the
# drafts were retried (since then a settled chunk measures plain's speed instead,
# `rollout.decisions.measured`). Below: plain chunks a step
# (left) and tlt's step seconds over sd's (right), the curve's and the gate's.

# %%
STAGE11 = RESULTS / "regime_curve_stage11_s0_hostJ_2026-12-05"
GATE = RESULTS / "bandit_settled_gate_s0_hostJ_2026-12-05"
s11 = json.loads((STAGE11 / "learning_curve.json").read_text())
gate = json.loads((GATE / "learning_curve_partial.json").read_text())
curve_rows = {m: s11["rows"][f"{m}_s0"] for m in MODES}
gate_rows = {m: gate["rows"][f"{m}_s0"] for m in ("sd", "tlt")}
rise = quarter_rise([r["reward"] for r in curve_rows["baseline"]])
tail = [r["length_max"] / r["length_median"] for r in curve_rows["baseline"]]
print(
  f"stage 11, seed 0: rise {rise['rise']:+.3f} [{rise['interval'][0]:+.3f}, "
  f"{rise['interval'][1]:+.3f}]; tail (longest / median answer) median {np.median(tail):.1f}"
)


def plain_chunks(rs):
  return np.array([json.loads(r["arm_chunks"]).get("plain", 0) for r in rs])


def by_step(rs):
  return {r["step"]: r for r in rs}


def label_steps(ax, ylabel, ratio=False):
  """An axis over RL steps; `ratio`: a line at 1."""
  if ratio:
    ax.axhline(1.0, color="k", lw=0.8)
  ax.set_xlabel("RL step")
  ax.set_ylabel(ylabel)
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)


def print_tlt_over_sd(label, sd, tlt, steps, chunk_steps=None):
  """tlt's seconds over sd's (step and rollout, summed over `steps`) and tlt's plain chunks
  a step (over `chunk_steps`, default `steps`); `sd`, `tlt`: rows by step."""
  chunk_steps = chunk_steps or steps
  total, rollout = (
    sum(tlt[k][key] for k in steps) / sum(sd[k][key] for k in steps)
    for key in ("step_s", "rollout_s")
  )
  print(
    f"{label}, steps {steps[0]}-{steps[-1]}: tlt's seconds over sd's, step {total:.3f}, "
    f"rollout {rollout:.3f}; tlt's plain chunks a step (steps {chunk_steps[0]}-"
    f"{chunk_steps[-1]}) {np.mean(plain_chunks([tlt[k] for k in chunk_steps])):.1f}"
  )


fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3))
for label, rs, style in (
  ("sd, curve", curve_rows["sd"], "-"),
  ("tlt, curve", curve_rows["tlt"], "-"),
  ("tlt, gate (settled chunks age the bucket)", gate_rows["tlt"], "--"),
):
  colour = COLOURS[label.split(",")[0]]
  left.plot([r["step"] for r in rs], plain_chunks(rs), "." + style, color=colour, label=label)
label_steps(left, "plain chunks a step")
for label, pair, style in (
  ("curve", (curve_rows["sd"], curve_rows["tlt"]), "-"),
  ("gate", (gate_rows["sd"], gate_rows["tlt"]), "--"),
):
  sd, tlt = (by_step(rs) for rs in pair)
  steps = [k for k in sorted(tlt) if k in sd and k >= gate_rows["tlt"][0]["step"] + 1]
  ratio = [tlt[k]["step_s"] / sd[k]["step_s"] for k in steps]
  right.plot(steps, ratio, "o" + style, color=COLOURS["tlt"], label=label)
  print_tlt_over_sd(label, sd, tlt, steps)
label_steps(right, "tlt step s / sd step s", ratio=True)
plt.show()

# %% [markdown]
# **Settled chunks measured.** Aging the bucket left plain's warm-up figure in place: a
# retried draft had to beat it. A settled plain chunk, run to the end of its cache view, now
# measures plain's speed and teaches the bandit (`rollout.decisions.measured`). Seed 1 on
# the same warm start ran its 40 steps with that (host J, 2026-12-05). Below, both seeds'
# steps: tlt's plain chunks a step (left) and tlt's step seconds over sd's (right). The
# seeds' prompts differ, so the comparison is of what tlt's bandit does, not of equal
# work.

# %%
SEED1 = RESULTS / "regime_curve_stage11_s1_hostJ_2026-12-05"
s1 = json.loads((SEED1 / "learning_curve.json").read_text())
for label, report in (("seed 0", s11), ("seed 1", s1)):
  learnt, replay = report["learning"], report["warm_start_replay"]["trained_minus_warm_start"]
  ends = "; ".join(
    f"{mode.split('_')[0]} {t['step_speedup']['of_totals']:.2f}x"
    for mode, t in report["speed"].items()
    if "step_speedup" in t
  )
  print(
    f"stage 11, {label}: rise {learnt['rise']:+.3f} [{learnt['interval'][0]:+.3f}, "
    f"{learnt['interval'][1]:+.3f}], over the warm start {replay['mean']:+.3f}; end to end {ends}"
  )
both_seeds = {
  "seed 0 (settled chunks taught nothing)": {m: curve_rows[m] for m in ("sd", "tlt")},
  "seed 1 (settled chunks measured)": {m: s1["rows"][f"{m}_s1"] for m in ("sd", "tlt")},
}
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3))
for (label, rows), style in zip(both_seeds.items(), ("-", "--"), strict=True):
  sd, tlt = (by_step(rows[m]) for m in ("sd", "tlt"))
  every = [k for k in sorted(tlt) if k in sd]
  steps = every[1:]  # step 0's seconds carry compiles
  left.plot(every, plain_chunks([tlt[k] for k in every]), "o" + style, label=label)
  right.plot(steps, [tlt[k]["step_s"] / sd[k]["step_s"] for k in steps], "o" + style, label=label)
  print_tlt_over_sd(label, sd, tlt, steps, every)
label_steps(left, "tlt's plain chunks a step")
label_steps(right, "tlt step s / sd step s", ratio=True)
plt.show()

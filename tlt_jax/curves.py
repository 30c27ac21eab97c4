"""Learning curves against wall-clock time: TLT's figure, and the statistics behind it.

The paper's claim is a training-reward curve that TLT reaches sooner in wall-clock time:
the same learning (speculative rollouts are token-identical to plain ones, so the curves
coincide step by step) on a shorter time axis. `plot_learning_curves` draws it from the
per-step rows of interleaved runs (`compare.run_interleaved`); `quarter_rise` and
`paired_gap` say whether a run learnt, with bootstrap intervals over its steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# Modes in the order the figure draws them, with their colours.
COLOURS = {"baseline": "tab:blue", "sd": "tab:orange", "tlt": "tab:green"}


def bootstrap_interval(
  draw: Any, reps: int = 10_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
  """The central `level` interval of `draw(rng)` over `reps` bootstrap draws."""
  rng = np.random.default_rng(seed)
  stats = np.array([draw(rng) for _ in range(reps)])
  lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
  return float(lo), float(hi)


def quarter_rise(rewards: Sequence[float], reps: int = 10_000, seed: int = 0) -> dict[str, Any]:
  """Mean training reward over the last quarter of the steps minus the first quarter's,
  with a bootstrap interval over steps (each quarter's steps resampled on their own).

  Steps are the unit: a step's reward is the mean over its samples, so the interval is
  that of the step-to-step spread the curve shows (None below 8 steps: too few to resample).
  """
  r = np.asarray(rewards, dtype=np.float64)
  q = max(len(r) // 4, 1)
  if len(r) < 2:
    raise ValueError(f"quarter_rise needs >= 2 steps, got {len(r)}")
  first, last = r[:q], r[-q:]

  def draw(rng):
    return rng.choice(last, q).mean() - rng.choice(first, q).mean()

  interval = list(bootstrap_interval(draw, reps, seed)) if q >= 2 else None
  return {
    "steps_per_quarter": q,
    "first_quarter": float(first.mean()),
    "last_quarter": float(last.mean()),
    "rise": float(last.mean() - first.mean()),
    "interval": interval,
  }


def paired_gap(a: Sequence[float], b: Sequence[float], reps: int = 10_000, seed: int = 0) -> dict:
  """Mean of a - b over paired items (steps), with a bootstrap interval over the pairs
  (None for a single pair)."""
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  if d.size < 1:
    raise ValueError("paired_gap needs pairs")
  interval = None
  if d.size >= 2:
    interval = list(bootstrap_interval(lambda rng: rng.choice(d, d.size).mean(), reps, seed))
  return {"pairs": int(d.size), "mean": float(d.mean()), "interval": interval}


def ratio_spread(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
  """Per-pair ratios num / den: median, quartiles and extremes, and the ratio of sums."""
  ratios = np.asarray(num, np.float64) / np.asarray(den, np.float64)
  q = np.quantile(ratios, [0.0, 0.25, 0.5, 0.75, 1.0])
  return {
    "of_totals": float(np.sum(num) / np.sum(den)),
    "median": float(q[2]),
    "quartiles": [float(q[1]), float(q[3])],
    "range": [float(q[0]), float(q[4])],
  }


def amdahl(share: float, speedup: float) -> float:
  """The whole's speedup when a part of this share runs `speedup` times faster."""
  return 1.0 / ((1.0 - share) + share / speedup)


def update_throughput(rows: Sequence[dict[str, Any]], matmul_gflops: float) -> dict[str, Any]:
  """The policy update's model GFLOP/s over a run's steps (`compare.step_row`'s
  "update_gflops"; steps that updated nothing are left out): median, quartiles and
  extremes, the median over the host's matmul rate `matmul_gflops` (measured in the same
  run), and the median padding share of the micro-batches computed. {} when no step
  updated."""
  updated = [r for r in rows if r.get("update_gflops") not in ("", None)]
  if not updated:
    return {}
  rates = [r["update_gflops"] for r in updated]
  q = np.quantile(np.asarray(rates, np.float64), [0.0, 0.25, 0.5, 0.75, 1.0])
  padding = [r["update_padding"] for r in updated if r.get("update_padding") not in ("", None)]
  return {
    "steps": len(rates),
    "median_gflops": float(q[2]),
    "quartiles": [float(q[1]), float(q[3])],
    "range": [float(q[0]), float(q[4])],
    "of_matmul": float(q[2] / matmul_gflops),
    "computed_padding": float(np.median(padding)) if padding else None,
  }


def _interval(x: dict[str, Any], key: str) -> str:
  lo_hi = x.get("interval")
  return f"{x[key]:+.3f}" + (f" [{lo_hi[0]:+.3f}, {lo_hi[1]:+.3f}]" if lo_hi else "")


def report_markdown(
  report: dict[str, Any], rows: Sequence[dict[str, Any]], notes: Sequence[str]
) -> str:
  """A learning-curve report (experiments/learning_curve.py's JSON) as a short Markdown
  page: hosts, whether the policy learnt, held-out pass@1 at each evaluation of the
  baseline's `rows` (`compare.step_row`), and the modes' speed lines `notes`."""
  learn, replay = report["learning"], report.get("warm_start_replay") or {}
  equal, steps = report["rewards_equal_steps"]
  # Runs since 2026-12-03 record each row's token digest: the modes compared token for token.
  same, compared = report.get("tokens_equal_steps") or (0, 0)
  tokens = f", every row's tokens at {same} of {compared}" if compared else ""
  host = lambda h: f"{h['time']}, {h['cpu']}, {h['matmul_GFLOPs']} GFLOP/s, {h['read_GBps']} GB/s"  # noqa: E731
  lines = [
    "# Learning curve",
    "",
    f"Host at the start: {host(report['host_start'])}; at the end: {host(report['host_end'])}.",
    f"Rewards equal in every mode at {equal} of {steps} steps{tokens}; parameter digests "
    f"differing at {len(report['params_mismatches'])} evaluations.",
    "",
    "## Learning",
    "",
    f"- Training reward, first quarter {learn['first_quarter']:.3f} -> last "
    f"{learn['last_quarter']:.3f}: rise {_interval(learn, 'rise')} "
    f"({learn['steps_per_quarter']} steps a quarter).",
  ]
  if replay.get("trained_minus_warm_start"):
    lines.append(
      "- Over the warm start on the last quarter's prompts: "
      f"{_interval(replay['trained_minus_warm_start'], 'mean')}."
    )
  warm = report.get("warm_start_eval")
  evals = [(r["step"], r["eval"], r["eval_sampled"]) for r in rows if r.get("eval") != ""]
  if warm or evals:
    pair = lambda g, m: f"{g:.3f}" + (f" / {m:.3f}" if m not in ("", None) else "")  # noqa: E731
    points = [f"warm start {pair(warm['accuracy'], warm.get('sampled_accuracy'))}"] if warm else []
    points += [f"step {s}: {pair(g, m)}" for s, g, m in evals]
    lines.append("- Held-out pass@1, greedy / sampled: " + "; ".join(points) + ".")
  lines += ["", "## Speed", "", *[f"- {n}" for n in notes], ""]
  return "\n".join(lines)


def elapsed(rows: Sequence[dict[str, Any]]) -> np.ndarray:
  """Wall-clock seconds at the end of each step: the running sum of the steps' times
  (compiles and held-out evaluation left out, as `compare.step_row` does)."""
  return np.cumsum([r["step_s"] for r in rows])


def smooth(values: Sequence[float], window: int) -> np.ndarray:
  """Trailing moving average over up to `window` steps (a noisy per-step curve's trend)."""
  v = np.asarray(values, np.float64)
  c = np.concatenate([[0.0], np.cumsum(v)])
  idx = np.arange(1, len(v) + 1)
  lo = np.maximum(idx - window, 0)
  return (c[idx] - c[lo]) / (idx - lo)


def plot_learning_curves(
  runs: dict[str, list[dict[str, Any]]],
  path: str,
  *,
  title: str = "",
  notes: Sequence[str] = (),
  window: int = 5,
  warm_eval: dict[str, float] | None = None,
) -> None:
  """Training reward (per step, and its `window`-step moving average) and held-out
  pass@1 against wall-clock seconds, one colour per mode; beside it the step times.

  `runs`: mode -> its step rows in order (`compare.step_row`), with "eval" /
  "eval_sampled" where held-out accuracy was measured. `warm_eval`: the warm start's
  held-out accuracy ({"accuracy", "sampled_accuracy"}), drawn at time 0. `notes`: lines
  printed under the figure (the speedups, r and s).
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax, bx) = plt.subplots(
    1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2.2, 1]}, squeeze=True
  )
  for mode, rows in runs.items():
    colour = COLOURS.get(mode.split("_s")[0])
    t = elapsed(rows)
    reward = [r["reward"] for r in rows]
    ax.plot(t, reward, ".", color=colour, alpha=0.35)
    ax.plot(t, smooth(reward, window), "-", color=colour, lw=2, label=f"{mode}: train reward")
    ev = [(ti, r) for ti, r in zip(t, rows) if r.get("eval", "") != ""]
    if ev:
      xs = [0.0] + [ti for ti, _ in ev] if warm_eval else [ti for ti, _ in ev]
      for key, style, name in (("eval", "o--", "greedy"), ("eval_sampled", "s:", "sampled")):
        ys = [r[key] for _, r in ev if r.get(key, "") != ""]
        if len(ys) != len(ev):
          continue
        if warm_eval:
          ys = [warm_eval["accuracy" if key == "eval" else "sampled_accuracy"]] + ys
        ax.plot(xs, ys, style, color=colour, ms=5, label=f"{mode}: held-out {name}")
    bx.plot([r["step"] for r in rows], [r["step_s"] for r in rows], ".-", color=colour, label=mode)
  ax.set_xlabel("wall-clock seconds (RL steps; compiles and held-out evaluation left out)")
  ax.set_ylabel("reward / pass@1")
  ax.set_title(title or "training reward against wall-clock time")
  ax.legend(fontsize=7, ncol=2)
  ax.grid(alpha=0.3)
  bx.set_xlabel("RL step")
  bx.set_ylabel("step seconds")
  bx.set_title("step time by mode")
  bx.legend(fontsize=8)
  bx.grid(alpha=0.3)
  if notes:
    fig.text(0.01, 0.01, "\n".join(notes), fontsize=8, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, 0.04 + 0.025 * len(notes), 1, 1))
  else:
    fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def seeds_summary(reports: Sequence[dict[str, Any]], window: int = 5) -> dict[str, Any]:
  """Several seeds' learning-curve reports (experiments/learning_curve.py's JSON) as one
  curve per mode: the seeds' mean wall-clock seconds at the end of each step and their
  mean `window`-step moving average of the training reward, over the steps every seed ran;
  per seed, each mode's paired per-step speedup over baseline and Amdahl's bound.

  The modes' rewards are equal step by step within a seed (token-identical rollouts), so
  the mean curves differ only in their time axis: the paper's figure, averaged over seeds."""
  if not reports:
    raise ValueError("seeds_summary needs at least one report")
  per_mode: dict[str, list[list[dict[str, Any]]]] = {}
  for report in reports:
    for label, rows in report["rows"].items():
      per_mode.setdefault(label.split("_s")[0], []).append(rows)
  missing = [m for m, runs in per_mode.items() if len(runs) != len(reports)]
  if missing:
    raise ValueError(f"modes {missing} are not in every report")
  steps = min(len(rows) for runs in per_mode.values() for rows in runs)
  curves_out = {
    mode: {
      "seconds": np.mean([elapsed(rows[:steps]) for rows in runs], axis=0),
      "reward": np.mean([smooth([r["reward"] for r in rows[:steps]], window) for rows in runs], 0),
      "per_seed": [
        (elapsed(rows[:steps]), smooth([r["reward"] for r in rows[:steps]], window))
        for rows in runs
      ],
    }
    for mode, runs in per_mode.items()
  }
  speedups = {
    mode: [
      {
        "median": t["step_speedup"]["median"],
        "quartiles": t["step_speedup"]["quartiles"],
        "of_totals": t["step_speedup"]["of_totals"],
        "amdahl": t["amdahl"],
      }
      for report in reports
      for label, t in report["speed"].items()
      if label.split("_s")[0] == mode
    ]
    for mode in per_mode
    if mode != "baseline"
  }
  return {"steps": steps, "curves": curves_out, "speedups": speedups}


def seed_label(report: dict[str, Any]) -> str:
  """ "seed N" from a report's run labels ("baseline_sN"), else its first label."""
  label = next(iter(report["rows"]))
  return f"seed {label.rsplit('_s', 1)[1]}" if "_s" in label else label


def plot_seeds(
  reports: Sequence[dict[str, Any]],
  path: str,
  *,
  labels: Sequence[str] = (),
  title: str = "",
  window: int = 5,
) -> dict[str, Any]:
  """`seeds_summary`'s figure: the training reward's moving average against wall-clock
  seconds, each seed thin and the seeds' mean bold, one colour per mode; beside it each
  seed's paired per-step speedup over baseline (median, quartiles) with Amdahl's bound.
  `labels`: one per report (default: `seed_label`). Returns the summary drawn."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  summary = seeds_summary(reports, window)
  labels = list(labels) or [seed_label(r) for r in reports]
  if len(labels) != len(reports):
    raise ValueError(f"{len(labels)} labels for {len(reports)} reports")
  fig, (ax, bx) = plt.subplots(
    1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2.2, 1]}, squeeze=True
  )
  for mode, c in summary["curves"].items():
    colour = COLOURS.get(mode)
    for seconds, reward in c["per_seed"]:
      ax.plot(seconds, reward, "-", color=colour, lw=0.8, alpha=0.35)
    ax.plot(c["seconds"], c["reward"], "-", color=colour, lw=2.5, label=f"{mode}: mean")
  ax.set_xlabel("wall-clock seconds (RL steps; compiles and held-out evaluation left out)")
  ax.set_ylabel(f"training reward ({window}-step moving average)")
  ax.set_title(title or f"training reward against wall-clock time, {len(reports)} seeds")
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  modes = list(summary["speedups"])
  for j, mode in enumerate(modes):
    x = np.arange(len(reports)) + (j - (len(modes) - 1) / 2) * 0.25
    s = summary["speedups"][mode]
    med = np.array([p["median"] for p in s])
    q = np.array([p["quartiles"] for p in s])
    bx.errorbar(
      x,
      med,
      yerr=[med - q[:, 0], q[:, 1] - med],
      fmt="o",
      color=COLOURS.get(mode),
      capsize=4,
      label=f"{mode}: paired step speedup",
    )
    bx.plot(x, [p["amdahl"] for p in s], "_", color=COLOURS.get(mode), ms=16, mew=2)
  bx.plot([], [], "_", color="grey", ms=16, mew=2, label="Amdahl's bound (r, s)")
  bx.axhline(1.0, color="grey", lw=0.8)
  bx.set_xticks(np.arange(len(reports)), labels)
  bx.set_ylabel("baseline's step / the mode's")
  bx.set_title("end to end, per seed")
  bx.legend(fontsize=8)
  bx.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return summary

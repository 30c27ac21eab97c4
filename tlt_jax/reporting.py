"""What the default job shows: response-length statistics, the rollout and RL plots,
and the terminal summary."""

from __future__ import annotations

from typing import Any

import numpy as np

from tlt_jax.rollout.result import RolloutResult


def length_stats(lengths: np.ndarray) -> dict[str, float]:
  p = lambda q: float(np.percentile(lengths, q))
  median = p(50)
  return {
    "min": float(lengths.min()),
    "median": median,
    "p90": p(90),
    "p99": p(99),
    "max": float(lengths.max()),
    "max_over_median": float(lengths.max()) / max(median, 1),
  }


def plot_rollout(result: RolloutResult, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
  a.hist(result.num_generated, bins=40, color="tab:blue")
  a.set_xlabel("response length (tokens)")
  a.set_ylabel("sequences")
  a.set_title("response lengths: the long tail")
  steps = [e for e in result.timeline if e["phase"] == "decode"]
  t = np.array([e["t"] + e["dt"] for e in steps])
  b.step(t, [e["active"] for e in steps], where="pre", label="active sequences")
  b.step(t, [e["batch"] for e in steps], where="pre", label="batch bucket", linestyle="--")
  b.set_xlabel("time (s)")
  b.set_ylabel("rows")
  b.set_title("active batch over the rollout")
  b.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_rl(rows: list[dict[str, Any]], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 3.8))
  ax.plot([r["step"] for r in rows], [r["reward_mean"] for r in rows], label="train reward")
  evals = [r for r in rows if "eval" in r]
  ax.plot(
    [r["step"] for r in evals],
    [r["eval"]["accuracy"] for r in evals],
    marker="o",
    label="held-out pass@1 (greedy)",
  )
  sampled = [r for r in evals if "sampled_accuracy" in r["eval"]]
  if sampled:
    ax.plot(
      [r["step"] for r in sampled],
      [r["eval"]["sampled_accuracy"] for r in sampled],
      marker="s",
      label="held-out pass@1 (sampled, mean of k)",
    )
  ax.set_xlabel("RL step")
  ax.set_ylabel("reward / accuracy")
  ax.set_title("GRPO from the warm start")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _rl_line(rl: dict[str, Any], e: dict[str, Any]) -> str:
  """The summary's RL line: held-out pass@1 after RL beside the warm start's, and how many
  of the steps updated the policy (a step whose groups all had equal rewards takes no
  optimizer step under dynamic sampling: it is a step only in name)."""
  final = rl["final_eval"] or {}
  steps, idle = rl["steps"], rl.get("steps_without_update", 0)
  if idle == steps and steps:
    done = f"after {steps} GRPO steps, none of which updated the policy"
  elif idle:
    done = f"after {steps} GRPO steps ({steps - idle} of them updated the policy)"
  else:
    done = f"after {steps} GRPO steps"
  text = (
    f"{done}: held-out pass@1 (greedy) "
    f"{final.get('accuracy', float('nan')):.3f} (warm start {e['accuracy']:.3f})"
  )
  if "sampled_accuracy" in final and "sampled_accuracy" in e:
    text += f", sampled {final['sampled_accuracy']:.3f} (warm start {e['sampled_accuracy']:.3f})"
  text += f"; rollout {100 * rl['rollout_share']:.0f}% of step time"
  if idle:
    text += (
      f"\n  {idle} of the {steps} steps took no optimizer step: every group's rewards were "
      "equal (all right or all wrong), and dynamic sampling drops such groups; an easier or "
      "harder task, a larger group_size or more rl.max_refills give them signal"
    )
  if rl.get("skipped_updates"):
    text += f"\n  {rl['skipped_updates']} updates skipped by the non-finite guard"
  return text


def format_summary(summary: dict[str, Any]) -> str:
  e, w = summary["eval"], summary["warm_start"]
  held_out = f"held-out pass@1 (greedy): {e['accuracy']:.3f} on {e['num_examples']} problems"
  if "sampled_accuracy" in e:
    held_out += f", sampled {e['sampled_accuracy']:.3f} (at the rollout temperature)"
  policy = f"policy: {summary['model_params'] / 1e6:.2f}M params, warm start from {w['source']}"
  if "sft_seconds" in w:
    policy += f" ({w['sft_steps']} SFT steps, {w['sft_seconds']:.0f}s)"
  lines = [policy, held_out]
  if "rl" in summary:
    lines.append(_rl_line(summary["rl"], e))
  if "rollout" in summary:
    r = summary["rollout"]
    lines += [
      f"rollout: {r['sequences']} sequences, {r['generated_tokens']} tokens in "
      f"{r['wall_seconds']:.2f}s, {r['tokens_per_second']:.0f} tokens/s without its "
      f"{r['compile_seconds']:.2f}s of lazy compiles; mean reward {r['mean_reward']:.3f}",
      "response lengths: "
      + ", ".join(
        f"{k} {v:.0f}" if k != "max_over_median" else f"max/median {v:.1f}x"
        for k, v in r["lengths"].items()
      ),
      f"batch buckets used: {r['batch_buckets_used']}; {r['executables']} executables in the "
      f"pool ({r['executable_temp_MB']:.0f} MB of XLA temporaries in all), "
      f"{r['compiled_during_rollout']} of them compiled during this rollout",
    ]
  if summary.get("reference"):
    ref = summary["reference"]
    lines.append(
      f"this config's measured ranges ({ref['runs']}): warm start {ref['warm_start']}; "
      f"after RL {ref['after_rl']}; RL's sampled gain {ref['rl_gain_sampled']}"
    )
  return "\n".join(lines)

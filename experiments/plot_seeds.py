r"""Several seeds of the learning curve in one figure: TLT's figure averaged over seeds.

Reads the reports experiments/learning_curve.py writes (learning_curve.json, one a seed),
draws the training reward's moving average against wall-clock seconds for every mode
(each seed thin, the seeds' mean bold) beside each seed's paired per-step speedup with
Amdahl's bound (`tlt_jax.curves.plot_seeds`), and prints per seed the rise of the training
reward and the speedups.

  python experiments/plot_seeds.py --out=runs/seeds.png \
    --reports=runs/lc2/learning_curve.json,runs/lcS1/learning_curve.json,runs/lcS2/learning_curve.json
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import curves  # noqa: E402

_REPORTS = flags.DEFINE_list("reports", None, "learning_curve.json files, one a seed")
_LABELS = flags.DEFINE_list("labels", [], "a label a report (default: seed N, from its run labels)")
_OUT = flags.DEFINE_string("out", "runs/seeds.png", "the figure (PNG)")
_TITLE = flags.DEFINE_string("title", "", "the figure's title")
_WINDOW = flags.DEFINE_integer("window", 5, "steps in the reward's moving average")


def main(argv):
  del argv
  if not _REPORTS.value:
    raise app.UsageError("--reports: one learning_curve.json a seed")
  reports = []
  for path in _REPORTS.value:
    with open(path) as f:
      reports.append(json.load(f))
  labels = _LABELS.value or [curves.seed_label(r) for r in reports]
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  summary = curves.plot_seeds(
    reports, _OUT.value, labels=labels, title=_TITLE.value, window=_WINDOW.value
  )
  for i, (label, report) in enumerate(zip(labels, reports, strict=True)):
    rise = report["learning"]
    lo, hi = rise["interval"] or (float("nan"), float("nan"))
    line = f"{label}: reward {rise['first_quarter']:.3f} -> {rise['last_quarter']:.3f}, "
    line += f"rise {rise['rise']:+.3f} [{lo:.3f}, {hi:.3f}]"
    for mode, per_seed in summary["speedups"].items():
      p = per_seed[i]
      line += f"; {mode} {p['median']:.2f}x [{p['quartiles'][0]:.2f}-{p['quartiles'][1]:.2f}]"
      line += f" (Amdahl {p['amdahl']:.2f}x)"
    print(line)
  end = {mode: c["seconds"][-1] for mode, c in summary["curves"].items()}
  print(
    f"mean seconds to step {summary['steps']}: "
    + ", ".join(f"{mode} {s:.0f}" for mode, s in end.items())
    + "".join(f"; {m} {end['baseline'] / end[m]:.2f}x" for m in end if m != "baseline")
  )
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)

"""Command line: `python -m tlt_jax.main --config=configs/default.py --workdir=DIR`.

A thin absl wrapper; the work is in `tlt_jax.train.train_and_evaluate`.
Overrides: `--config.sampling.temperature=0.7`; a misspelt field fails.
"""

from absl import app, flags
from ml_collections import config_flags

from tlt_jax.train import format_summary, train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Path to a config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, plots.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  summary = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  print(format_summary(summary))
  print(f"outputs in {_WORKDIR.value}: summary.json, timeline.json, rollout.png")


if __name__ == "__main__":
  app.run(main)

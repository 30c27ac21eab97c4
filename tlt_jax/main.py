"""Command line: `python -m tlt_jax.main --config=configs/default.py --workdir=DIR`.

A thin absl wrapper; the work is in `tlt_jax.train.train_and_evaluate`.
Overrides: `--config.sampling.temperature=0.7`; a misspelt field fails.
`--compare=baseline,tlt` runs those modes side by side from one warm start
(`tlt_jax.compare`: <workdir>/shared, <workdir>/<mode>) and prints their step times
beside their rewards.

The terminal shows progress bars and the summary. Library logs (tfds, orbax, this
project's INFO lines) go to a file in the workdir (`tlt_jax.*.log.INFO.*`); errors still
reach the terminal, and `--alsologtostderr` shows everything there as well. A config
field misspelt or given a bad value is reported in one line naming the field, with exit
status 2.
"""

import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from tlt_jax import compare
from tlt_jax.configuration import ConfigError
from tlt_jax.reporting import format_summary
from tlt_jax.train import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Path to a config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, plots.")
_COMPARE = flags.DEFINE_list(
  "compare", [], "modes to run side by side from one warm start, e.g. baseline,tlt"
)
flags.mark_flags_as_required(["config", "workdir"])


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with every failure reported in one line and exit status 2: a
  misspelt `--config.` field (ml_collections raises a KeyError or AttributeError that
  names the missing key, often with a suggestion), a value of the wrong type, an unknown
  or missing flag. Any other error (a bug in a config file, say) keeps its traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
  except (AttributeError, KeyError) as e:
    text = str(e).replace("\\", "")
    missing = re.search(r"'(\w+)'", text)
    overrides = [a.split("=")[0] for a in argv if a.startswith("--config.")]
    where = [f for f in overrides if missing and missing.group(1) in f.split(".")]
    if not where:
      raise
    hint = re.search(r'Did you mean "(\w+)"', text)
    print(
      f"error: {where[0]}: the config has no field {missing.group(1)!r}"
      + (f' (did you mean "{hint.group(1)}"?)' if hint else ""),
      file=sys.stderr,
    )
  sys.exit(2)


def _logs_to_workdir(workdir: str) -> None:
  """absl's handler writes to a file in the workdir; the terminal keeps errors only,
  unless --logtostderr / --alsologtostderr / --stderrthreshold say otherwise."""
  if flags.FLAGS["logtostderr"].value:
    return
  logging.get_absl_handler().use_absl_log_file("tlt_jax", workdir)
  if not flags.FLAGS["stderrthreshold"].present:
    flags.FLAGS.stderrthreshold = "error"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  workdir = _WORKDIR.value
  if _COMPARE.value:
    try:
      compare.check_modes(_COMPARE.value)
    except compare.ModesError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
  os.makedirs(workdir, exist_ok=True)
  _logs_to_workdir(workdir)
  config = _CONFIG.value
  try:
    if _COMPARE.value:
      results, rows = compare.run_modes(config, workdir, _COMPARE.value, [int(config.seed)])
    else:
      summary = train_and_evaluate(config, workdir)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if _COMPARE.value:
    print(compare.side_by_side(compare.mode_table(results, rows), rows))
    print(f"outputs in {workdir}/<mode>: metrics.jsonl, rl.png, summary.json")
    return
  print(format_summary(summary))
  print(f"outputs in {workdir}: summary.json, timeline.json, rollout.png")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)

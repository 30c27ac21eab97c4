"""Command line: `python -m tlt_jax.main --config=configs/default.py --workdir=DIR`.

A thin absl wrapper; the work is in `tlt_jax.train.train_and_evaluate`.
Overrides: `--config.sampling.temperature=0.7`; a misspelt field fails.
`--compare=baseline,tlt` runs those modes side by side from one warm start
(`tlt_jax.compare`: <workdir>/shared, <workdir>/<mode>) and prints their step times
beside their rewards.

The terminal shows progress bars and the summary. Library logs (tfds, orbax, this
project's INFO lines) go to a file in the workdir (`tlt_jax.*.log.INFO.*`); errors still
reach the terminal, and `--alsologtostderr` shows everything there as well.

What the user gave is checked before anything is built or written (`configuration.
job_inputs`): a config field misspelt or given a bad value, a missing or incomplete
checkpoint, a config.json the loader does not understand, a malformed data row, a row
without the configured keys, reference answers the checker cannot read. Each is reported
in one line (exit status 2), and the workdir is left byte for byte as it was. Then the job
takes the workdir's lock (`tlt_jax.workdir`) for its whole run: a second job on the same
workdir is refused in one line naming the holder (exit status 2).
"""

import contextlib
import logging as std_logging
import re
import sys
from collections.abc import Iterator
from logging.handlers import MemoryHandler
from typing import NoReturn

from absl import app, flags, logging
from ml_collections import config_flags

from tlt_jax import compare, configuration
from tlt_jax import workdir as workdir_lock
from tlt_jax.configuration import UserError
from tlt_jax.reporting import format_summary
from tlt_jax.train import train_and_evaluate
from tlt_jax.utils import collector, compile_cache

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


@contextlib.contextmanager
def _logs_held() -> Iterator[MemoryHandler]:
  """Keeps the library's log records (JAX's backend lines, say) while the inputs are
  checked: the workdir's log file does not exist yet, and must not until they pass.
  `_logs_to_workdir` then writes them there (`_release`); a failed check drops them."""
  handler = logging.get_absl_handler()
  held = MemoryHandler(capacity=1 << 20, flushLevel=std_logging.CRITICAL + 1)
  root = std_logging.getLogger()
  root.removeHandler(handler)
  root.addHandler(held)
  try:
    yield held
  finally:
    root.removeHandler(held)
    root.addHandler(handler)


def _release(held: MemoryHandler) -> None:
  held.setTarget(logging.get_absl_handler())
  held.flush()
  held.close()


def _fail(error: Exception) -> NoReturn:
  """A user error: its message in one line on stderr, exit status 2."""
  text = " ".join(part.strip() for part in str(error).splitlines() if part.strip())
  print(f"error: {text}", file=sys.stderr)
  sys.exit(2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  workdir = _WORKDIR.value
  config = _CONFIG.value
  try:
    # Every check first, while nothing in the workdir has been touched: a run that fails
    # one leaves it byte for byte as it was (no config.json, log file or lock written).
    with _logs_held() as held:
      if _COMPARE.value:
        compare.check_inputs(config, _COMPARE.value)
      else:
        configuration.job_inputs(config)
        configuration.check_same_recipe(config, workdir, configuration.OTHER_WORKDIR)
  except (compare.ModesError, UserError) as e:
    _fail(e)
  try:
    with workdir_lock.hold(workdir):
      _logs_to_workdir(workdir)
      _release(held)
      compile_cache.enable(config.compile_cache_dir)
      collector.settle_heap()  # what is alive now (imports, the config) lives to the end
      if _COMPARE.value:
        results, rows = compare.run_modes(config, workdir, _COMPARE.value, [int(config.seed)])
      else:
        summary = train_and_evaluate(config, workdir)
  except UserError as e:
    _fail(e)
  if _COMPARE.value:
    print(compare.side_by_side(compare.mode_table(results, rows), rows))
    print(f"outputs in {workdir}/<mode>: metrics.jsonl, rl.png, summary.json")
    return
  print(format_summary(summary))
  print(f"outputs in {workdir}: summary.json, timeline.json, rollout.png")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)

"""Host time of the bandit's per-chunk work: `StrategyBandit.select` and `update`.

The adaptive engine calls both between device calls, so on an accelerator (a chunk of 8
rounds of the 50M policy takes ~20 ms on an H200) their cost shows in the rollout. The
bandit is the one the engine builds for a chain pool (`rollout.config.bandit_settings`:
plain and chain arms), fed synthetic chunks in several buckets, then timed over many
select / update pairs, interleaved in repetitions.

  python experiments/bench_bandit.py --chains=4,8,12 --buckets=1,2,4,8,16 --pairs=300
  python experiments/bench_bandit.py --compare=/tmp/old_bandit.py   # another version, same run
"""

import dataclasses
import importlib.util
import os
import statistics
import sys
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.host import host_record  # noqa: E402
from tlt_jax.rollout import bandit as bandit_module  # noqa: E402
from tlt_jax.rollout.config import EngineConfig, bandit_settings  # noqa: E402

_CHAINS = flags.DEFINE_list("chains", ["4", "8", "12"], "chain depths (arms: plain + these)")
_BUCKETS = flags.DEFINE_list("buckets", ["1", "2", "4", "8", "16"], "batch buckets fed")
_FEED = flags.DEFINE_integer("feed", 60, "chunks fed to each bucket before timing")
_PAIRS = flags.DEFINE_integer("pairs", 300, "timed select/update pairs per repetition")
_REPS = flags.DEFINE_integer("reps", 5, "repetitions (interleaved when comparing)")
_COMPARE = flags.DEFINE_string("compare", "", "path of another bandit.py to time beside this one")


def _load(path: str):
  spec = importlib.util.spec_from_file_location("other_bandit", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _bandit(module, arms, settings):
  """`module`'s bandit with `settings`; a bandit.py from before `BanditSettings` takes
  them as keywords."""
  if hasattr(module, "BanditSettings"):
    return module.StrategyBandit(arms, module.BanditSettings(**dataclasses.asdict(settings)))
  return module.StrategyBandit(arms, **dataclasses.asdict(settings))


def _time(module, seed: int) -> tuple[float, float]:
  """Median ms of select and of update on a bandit fed like the engine's."""
  depths = [int(d) for d in _CHAINS.value]
  config = EngineConfig(spec_threshold=64, spec_strategies=tuple(f"chain{d}" for d in depths))
  arms, settings = bandit_settings(config)
  b = _bandit(module, arms, settings)
  rng = np.random.default_rng(seed)

  def feed(bucket: int):
    arm = b.select(bucket)
    t = time.perf_counter()
    b.update(bucket, arm, float(rng.uniform(50, 60)))
    return time.perf_counter() - t

  buckets = [int(x) for x in _BUCKETS.value]
  for bucket in buckets:
    for _ in range(_FEED.value):
      feed(bucket)
  selects, updates = [], []
  for i in range(_PAIRS.value):
    bucket = buckets[i % len(buckets)]
    t = time.perf_counter()
    b.select(bucket)
    selects.append(time.perf_counter() - t)
    updates.append(feed(bucket))
  return 1e3 * statistics.median(selects), 1e3 * statistics.median(updates)


def main(argv):
  del argv
  print(host_record(), flush=True)
  versions = {"this": bandit_module}
  if _COMPARE.value:
    versions["compare"] = _load(_COMPARE.value)
  results = {name: [] for name in versions}
  for rep in range(_REPS.value):
    for name, module in versions.items():
      results[name].append(_time(module, seed=rep))
  for name, rows in results.items():
    sel = sorted(r[0] for r in rows)
    upd = sorted(r[1] for r in rows)
    print(
      f"{name:8s} select ms {statistics.median(sel):.3f} [{sel[0]:.3f}-{sel[-1]:.3f}]  "
      f"update ms {statistics.median(upd):.3f} [{upd[0]:.3f}-{upd[-1]:.3f}]"
    )


if __name__ == "__main__":
  app.run(main)

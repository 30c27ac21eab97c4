r"""A comparison's warm starts, packed small enough to travel to a remote accelerator.

The regime's policy warm start took about three hours of SFT on a CPU host
(experiments/regime_warm_start.sh); a device sitting has fifteen minutes, so the GPU run of
the same learning curve (`configs/regime.py:gpu`) starts from this one, carried over. A
machine call carries at most 64 MiB with the repository and the wheels, and the policy's
float32 weights are 50 MB: they travel as bfloat16 (a relative rounding of at most 2^-8),
and `checkpoint.restore_params` casts them back to the model's float32 when they are
restored, so training runs on float32 master weights as everywhere else. The drafter's
warm start (3 MB) travels as it is. The summary's held-out evaluation is dropped: it was
of the unrounded policy, on another host, so `learning_curve.py` evaluates the packed warm
start again where it runs.

  python experiments/pack_warm_start.py --shared=runs/curve/shared --out=.gpuwarm
  WARM_START=.gpuwarm bash experiments/gpu_curve.sh runs/gc gpu     # on the device

The regime's own, packed so, is committed: experiments/warm_starts/ (gpu_curve.sh's default).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import pack_warm_starts  # noqa: E402

_SHARED = flags.DEFINE_string("shared", None, "a comparison's <out>/shared folder", required=True)
_OUT = flags.DEFINE_string("out", None, "the folder to write (replaced)", required=True)
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "the policy's weights")


def _megabytes(path: str) -> float:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 1e6


def main(argv):
  del argv
  pack_warm_starts(_SHARED.value, _OUT.value, _DTYPE.value)
  print(f"{_OUT.value}: {_megabytes(_OUT.value):.1f} MB")
  for piece in ("warm_start", "drafter_warm_start"):
    print(f"  {piece}: {_megabytes(os.path.join(_OUT.value, piece)):.1f} MB")


if __name__ == "__main__":
  app.run(main)

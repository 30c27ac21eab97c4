"""Which of XLA:CPU's library fusions a program is compiled with.

XLA:CPU hands parts of a program to YNNPACK as "library fusions": the dots, and by its
default list also fusions of elementwise ops and reductions. Which of those pay depends on
the program: the policy update's and SFT's many small reductions (softmax and norm
backward passes over packed rows) ran faster with XLA emitting them itself, while the
engine's multiply-reduce attention over a few new tokens a row ran many times slower that
way, and its one-row decode chunk slower too (`experiments/bench_fusions.py`;
experiments/RESULTS.md, 2026-12-02). So the choice is made per program, through
`jax.jit(..., compiler_options=...)`, not with the process-wide XLA_FLAGS: the rollout's
programs keep XLA's default.

Settings:
  "xla"   nothing passed: XLA's own default list;
  "dots"  YNNPACK for the dots only, XLA's own emitters for the rest.

The option is experimental in XLA; where this jaxlib does not know it, or the backend is
not a CPU, every setting compiles as "xla" (said once, as a warning).
"""

from __future__ import annotations

import functools
import warnings

import jax

CPU_FUSIONS = ("xla", "dots")
_OPTION = "xla_cpu_experimental_ynn_fusion_type"
_VALUES = {"dots": "LIBRARY_FUSION_TYPE_DOT"}


def checked_cpu_fusions(setting: str) -> str:
  """`setting` if it is one of CPU_FUSIONS, else ValueError."""
  if setting not in CPU_FUSIONS:
    raise ValueError(f"cpu_fusions must be one of {CPU_FUSIONS}, got {setting!r}")
  return setting


def compiler_options(setting: str) -> dict[str, str]:
  """`jax.jit`'s compiler_options for a program compiled under `setting` (one of
  CPU_FUSIONS): {} for "xla", off a CPU backend, or where XLA lacks the option."""
  if checked_cpu_fusions(setting) == "xla" or jax.default_backend() != "cpu":
    return {}
  return {_OPTION: _VALUES[setting]} if _option_known() else {}


@functools.cache
def _option_known() -> bool:
  """Whether this jaxlib's XLA compiles a program with the option (once a process)."""
  try:
    jax.jit(lambda x: x + 1, compiler_options={_OPTION: _VALUES["dots"]}).lower(1.0).compile()
  except Exception as err:  # an XLA without the option: every program takes its default
    warnings.warn(
      f"this XLA does not take the compile option {_OPTION} ({str(err)[:200]}); "
      "programs compile with XLA's default library fusions",
      stacklevel=3,
    )
    return False
  return True

"""experiments/deviceless.py where neither the CUDA plugin nor libtpu is installed (this
project's own environment, CI's): it stops at once and says what it needs, rather than
counting a CPU's kernels as a GPU's or a TPU's; and its engine cells, compiled for this CPU.
Its counting is tests/test_traces.py's (`loop_kernels`, `trip_kernels`)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
  "target,needs", [("h100", "needs the CUDA plugin"), ("v6e:2x2", "needs libtpu")]
)
def test_without_the_plugin_it_says_what_it_needs(tmp_path, target, needs):
  cmd = [sys.executable, "experiments/deviceless.py", f"--target={target}", f"--out={tmp_path}"]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode != 0
  assert needs in done.stderr, done.stderr[-2000:]
  assert not os.listdir(tmp_path)


def test_a_rounds_kernels_grow_with_its_drafter_steps():
  """The engine cells compile on any target: here this CPU's, for the regime's tiny policy.
  A chain round runs its drafter's steps out (`trip_kernels`): chain4 launches more than a
  step, chain8 more than chain4, and no inner loop's trips are unknown. (In a process of
  its own: the script's absl flags would clash with other experiments'.)"""
  cells = _on_this_cpu(
    ["--context=16"],
    "cells = {s: d.spec_cell('configs/regime.py:tiny', s, cpu) for s in ('chain4', 'chain8')}\n"
    "cells['step'] = d.engine_cell('configs/regime.py:tiny', True, cpu)",
  )
  four, eight, step = cells["chain4"], cells["chain8"], cells["step"]
  assert four["unknown_trips"] == eight["unknown_trips"] == 0
  assert step["kernels"] < four["kernels"] < eight["kernels"]
  assert sum(four["by_kind"].values()) == four["kernels"]


def test_engine_cells_take_the_weights_in_the_compute_dtype():
  """The engine's programs get the policy and drafter as `RolloutEngine.generate` hands them
  over, in the compute dtype (a bfloat16 policy's float32 weights cast once a rollout, not
  in every step of the compiled loop); `--engine_dtype` makes a config's policy bfloat16."""
  statements = (
    "dtypes = lambda tree: sorted({str(x.dtype) for x in jax.tree.leaves(tree)})\n"
    "e = d._engine('configs/regime.py:tiny', cpu)\n"
    "cells = {'params': dtypes(e['params']), 'drafter': dtypes(e['dparams'])}\n"
    "cells['step'] = d.engine_cell('configs/regime.py:tiny', True, cpu)['kernels']"
  )
  cells = _on_this_cpu(["--context=16", "--engine_dtype=bfloat16"], statements)
  assert cells["params"] == cells["drafter"] == ["bfloat16"]
  assert cells["step"] > 0


def test_programs_are_traced_with_the_targets_platform_settings():
  """This host's backend is a CPU, whose "auto" takes the multiply-reduce attention form for
  a decode of 16 rows, a float32 head and one-row products as they are: the cells for a GPU
  or TPU trace the target's choices (a TPU's attention follows the CPU's rule,
  `attention.platform_form`)."""
  statements = (
    "from tlt_jax.models import attention, precision, products\n"
    "def now():\n"
    "  form = attention.current_attention_form()\n"
    "  return [attention.reduces(16, 1, form), precision.current_head_precision(),\n"
    "          products.current_row_products()]\n"
    "cells = {'here': now()}\n"
    "for target in ('h100', 'v6e:2x2'):\n"
    "  with d.target_settings(target):\n"
    "    cells[target] = now()"
  )
  cells = _on_this_cpu([], statements)
  assert cells == {
    "here": [True, "auto", "auto"],
    "h100": [False, "compute", "paired"],
    "v6e:2x2": [True, "compute", "single"],
  }


def test_drafter_update_cells_report_the_logit_chunks_bytes():
  """`--drafter_updates` compiles the online drafter's update per batch and logit chunk,
  here for this CPU at the tiny shape: chunks of 16 positions take fewer temporary bytes
  than the whole batch's logits (the attention remat: tests/test_model.py); each cell has
  the memory plan's bytes beside XLA's."""
  flags = ["--drafter_shape=tiny", "--drafter_updates=2x128", "--drafter_settings=0,16,16/remat"]
  cells = _on_this_cpu(flags, "cells = d.drafter_updates(cpu, 'cpu')")
  whole, chunked = cells["drafter_update/2x128/0"], cells["drafter_update/2x128/16"]
  assert (whole["rows"], whole["width"], chunked["logit_chunk"]) == (2, 128, 16)
  assert 0 < chunked["temp_bytes"] < whole["temp_bytes"] < whole["compiled_bytes"]
  assert 0 < chunked["planned_bytes"] < whole["planned_bytes"]  # parallel.memory's plan beside
  assert cells["drafter_update/2x128/16/remat"]["remat_attention"]


def _on_this_cpu(flags: list[str], statements: str) -> dict:
  """`statements` (which set `cells`) run with the script imported as `d`, its absl flags
  parsed from `flags` and `cpu` this host's device, in a process of its own (the script's
  flags would clash with other experiments' in this one); returns `cells`."""
  code = (
    "import json, jax\n"
    "from absl import flags\n"
    "import experiments.deviceless as d\n"
    f"flags.FLAGS(['x', *{flags!r}])\n"
    "cpu = jax.sharding.SingleDeviceSharding(jax.devices('cpu')[0])\n"
    f"{statements}\n"
    "print(json.dumps(cells))\n"
  )
  done = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])

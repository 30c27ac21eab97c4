"""Sharded rollout and updates on 8 forced CPU devices, and a two-process jax.distributed run.

Each check runs in its own Python process: the device count is fixed when JAX starts.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "mesh_checks.py")


def _env(devices: int) -> dict[str, str]:
  env = dict(os.environ)
  # Keep the suite's compile flags (conftest.py), add the device count.
  flags = env.get("XLA_FLAGS", "")
  env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  return env


# Checks grouped by what they build, so a group's checks share one start of JAX (seconds
# each) and the programs its first check compiles; the groups run in parallel.
CHECKS = {
  "rollouts": ["placement", "sharded_rollout", "tensor_rollout", "fsdp_forward_and_rollout"],
  "updates": ["sharded_update", "fsdp_update", "trainer_fsdp", "trainer_tensor_rollout"],
  "freed_devices": [
    "trainer_on_mesh",
    "drafter_on_freed_devices",
    "freed_meshes_prepared_before_rollout",
    "freed_sets_share_one_head_copy",
    "tlt_on_freed_devices",
    "trainer_fsdp_tlt",
  ],
}


@pytest.mark.parametrize("group", list(CHECKS))
def test_on_eight_devices(group):
  checks = CHECKS[group]
  out = subprocess.run(
    [sys.executable, SCRIPT, *checks], env=_env(8), capture_output=True, text=True, timeout=900
  )
  passed = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("ok ")]
  assert out.returncode == 0, f"passed {passed}; then:\n{out.stderr[-4000:]}"
  assert passed == checks


def test_every_check_is_in_a_group():
  with open(SCRIPT) as f:
    defined = {
      line[len("def check_") :].split("(")[0] for line in f if line.startswith("def check_")
    }
  grouped = [c for checks in CHECKS.values() for c in checks]
  assert sorted(grouped) == sorted(defined)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_with_jax_distributed(tmp_path):
  """Two processes x 2 devices: each rolls out its prompts on its own devices, then one
  policy update runs over all 4 devices; both processes end with the same params, equal
  to a single-process update on the same 16 rows."""
  port = _free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, SCRIPT, "distributed", str(i), str(port), str(tmp_path)],
      env=_env(2),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (_, se) in zip(procs, outs):
    assert p.returncode == 0, se[-4000:]
  got = [np.load(tmp_path / f"process{i}.npz") for i in range(2)]
  params = [k for k in got[0].files if k.startswith("param:")]
  assert params
  for k in params:
    np.testing.assert_array_equal(got[0][k], got[1][k])  # replicas never diverge
  np.testing.assert_allclose(got[0]["loss"], got[1]["loss"])

  # The reference: one process, one device, the same prompts and the same 16 rows.
  import dataclasses

  import jax
  from flax import nnx

  sys.path.insert(0, os.path.join(ROOT, "tests"))
  import mesh_checks as mc

  tg, tp, _, _ = mc._models()
  engine = mc.RolloutEngine(tg, mc.MODEL, dataclasses.replace(mc.ENGINE, max_batch=8), mc.GREEDY)
  for i in range(2):
    ref = engine.generate(tp, mc.PROMPTS[i::2], 4, key=0, max_new_tokens=mc.LIMITS[i::2])
    np.testing.assert_array_equal(got[i]["tokens"], ref.tokens)
  half = mc._update_inputs(tp, rows=8)
  full = {k: np.concatenate([v, v]) for k, v in half.items()}
  ref_params, ref_m, _ = mc._policy_update(tg, tp, full)
  flat = {
    "/".join(map(str, k)): np.asarray(v)
    for k, v in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(ref_params))
  }
  for k, v in flat.items():
    np.testing.assert_allclose(got[0][f"param:{k}"], v, atol=2e-5)
    # FSDP over both processes: Adam's first step is ~lr * sign(g), so reduction-order
    # noise on tiny gradients moves a few entries by a fraction of lr (1e-2).
    for g in got:
      np.testing.assert_allclose(g[f"fsdp:{k}"], v, atol=5e-4)
  np.testing.assert_allclose(got[0]["loss"], float(ref_m["loss"]), rtol=1e-5)
  np.testing.assert_allclose(got[0]["fsdp_loss"], float(ref_m["loss"]), rtol=1e-5)

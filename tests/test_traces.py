"""The real-sizes script's device facts: spec sheets by device kind (GPU and TPU names as
their runtimes report them) and the profiler-trace summary on GPU-, TPU- and CPU-shaped
traces (kernels counted once, span lines left out of the kinds)."""

import os
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments.host import spec_sheet  # noqa: E402
from experiments.traces import summarise_events  # noqa: E402


@pytest.mark.parametrize(
  "kind,expected",
  [
    ("NVIDIA H100 80GB HBM3", (3.35, 989.0)),
    ("NVIDIA H200", (4.8, 989.0)),
    ("TPU v5 lite", (0.819, 197.0)),  # a v5e
    ("TPU v5", (2.765, 459.0)),  # a v5p, not the v5e its name starts like
    ("TPU v6 lite", (1.638, 918.0)),
    ("TPU v4", (1.2, 275.0)),
    ("cpu", None),
    ("TPU v99", None),
  ],
)
def test_spec_sheet_by_device_kind(kind, expected):
  assert spec_sheet(kind) == expected


def test_the_tpu_extra_installs_libtpu_for_the_pinned_jax():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  (jax_pin,) = [d for d in project["dependencies"] if d.startswith("jax==")]
  assert project["optional-dependencies"]["tpu"] == [jax_pin.replace("jax", "jax[tpu]", 1)]


def _meta(pid, name, tid=None):
  if tid is None:
    return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}
  return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def _span(pid, tid, name, ms):
  return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": 0, "dur": 1e3 * ms}


def test_a_tpu_trace_counts_its_op_line_not_the_steps_and_modules_spanning_it():
  events = [
    _meta(1, "/device:TPU:0"),
    _meta(1, "Steps", 1),
    _meta(1, "XLA Modules", 2),
    _meta(1, "XLA Ops", 3),
    _meta(9, "/host:CPU"),
    _meta(10, "/device:CUSTOM:Megascale Trace"),
    _span(10, 1, "MegaScale: fusion", 7.0),
    _span(1, 1, "0", 10.0),
    _span(1, 2, "jit_run(123)", 9.0),
    _span(1, 3, "fusion.1", 3.0),
    _span(1, 3, "convolution.2", 5.0),
    _span(9, 1, "PjitFunction(run)", 12.0),  # the host's: not a device line
  ]
  got = summarise_events(events, steps=2)
  assert got["device_processes"] == ["/device:TPU:0"]
  assert got["kernels_per_step"] == 1.0
  assert got["busy_ms_per_step"] == pytest.approx(4.0)
  assert got["by_kind_ms_per_step"] == {"element-wise": 1.5, "products": 2.5}
  assert got["lines_ms_per_step"] == {
    "/device:TPU:0/Steps": 5.0,
    "/device:TPU:0/XLA Modules": 4.5,
    "/device:TPU:0/XLA Ops": 4.0,
  }


def test_a_gpu_trace_counts_its_streams_once():
  events = [
    _meta(1, "/device:GPU:0"),
    _meta(1, "Stream #13(Compute)", 13),
    _meta(1, "XLA Ops", 20),  # the same kernels, named by op: not counted twice
    _span(1, 13, "sm90_xmma_gemm_bf16", 2.0),
    _span(1, 13, "loop_fusion_3", 1.0),
    _span(1, 20, "dot.4", 2.0),
    _span(1, 20, "fusion.3", 1.0),
  ]
  got = summarise_events(events, steps=1)
  assert got["busy_ms_per_step"] == pytest.approx(3.0) and got["kernels_per_step"] == 2
  assert got["by_kind_ms_per_step"] == {"products": 2.0, "element-wise": 1.0}


def test_a_cpu_trace_counts_every_event_but_pythons_frames():
  events = [
    _meta(7, "/host:CPU"),
    # libtpu's profiler adds this process wherever libtpu is installed: not an accelerator
    _meta(8, "/device:CUSTOM:Megascale Trace"),
    _span(7, 1, "$main.py:10 run", 50.0),
    _span(7, 2, "ThunkExecutor::Execute", 4.0),
    _span(7, 2, "reduce.7", 1.0),
  ]
  got = summarise_events(events, steps=1)
  assert got["device_processes"] == [] and got["kernels_per_step"] == 2
  assert got["by_kind_ms_per_step"] == {"other": 4.0, "reductions": 1.0}

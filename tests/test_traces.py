"""The real-sizes script's device facts: spec sheets by device kind (GPU and TPU names as
their runtimes report them) and the profiler-trace summary on GPU-, TPU- and CPU-shaped
traces (kernels counted once, span lines left out of the kinds), and the costliest kernels
described from the compiled module's text."""

import os
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments.host import spec_sheet  # noqa: E402
from experiments.traces import (  # noqa: E402
  describe_kernels,
  kernel_name,
  loop_kernels,
  program_summary,
  summarise_events,
  trip_kernels,
)


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
  jax_pins = [d for d in project["dependencies"] if d.startswith("jax==")]
  assert jax_pins  # one a Python version
  tpu = [pin.replace("jax", "jax[tpu]", 1) for pin in jax_pins]
  assert project["optional-dependencies"]["tpu"] == tpu


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


def test_a_traced_step_is_summarised_by_program(tmp_path):
  """`program_summary` (a traced RL step, `GRPOConfig.profile_steps`): each module's device
  time and runs from the device's "XLA Modules" line (runs of one module summed, kernels
  not), each jitted function's dispatch on the host (JAX's two nested spans a call counted
  once), the host's waits for device buffers, and the wall from first span to last."""
  import gzip
  import json

  def at(event, ts):
    return {**event, "ts": 1e3 * ts}

  events = [
    _meta(1, "/device:GPU:0"),
    _meta(1, "XLA Modules", 2),
    _meta(1, "Stream #13(Compute)", 13),
    _meta(9, "/host:CPU"),
    _meta(9, "python", 1),
    at(_span(1, 2, "jit_update(41)", 30.0), 10.0),
    at(_span(1, 2, "jit_update(42)", 30.0), 50.0),
    at(_span(1, 2, "jit_decode_chunk(7)", 5.0), 0.0),
    at(_span(1, 13, "sm90_xmma_gemm_bf16", 20.0), 12.0),  # a kernel: not a module
    at(_span(9, 1, "PjitFunction(update)", 2.0), 9.0),
    at(_span(9, 1, "PjitFunction(update)", 1.5), 9.2),  # nested in the one above
    at(_span(9, 1, "PjitFunction(update)", 2.0), 49.0),
    at(_span(9, 1, "CommonPjRtBuffer::Await", 35.0), 45.0),
    at(_span(9, 1, "$trainer.py:1 step", 500.0), 0.0),  # Python's frames are left out
  ]
  folder = tmp_path / "plugins" / "profile" / "run"
  folder.mkdir(parents=True)
  with gzip.open(folder / "host.trace.json.gz", "wt") as f:
    json.dump({"traceEvents": events}, f)
  got = program_summary(str(tmp_path))
  assert got["device_ms_by_program"] == {
    "jit_update": {"calls": 2, "ms": 60.0},
    "jit_decode_chunk": {"calls": 1, "ms": 5.0},
  }
  assert got["device_busy_ms"] == 65.0
  assert got["host_dispatch_ms_by_function"] == {"update": {"calls": 2, "ms": 4.0}}
  assert got["host_wait_ms"] == 35.0 and got["wall_ms"] == 80.0
  assert "error" in program_summary(str(tmp_path / "nothing"))


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


# An optimised module's text in XLA's print format, cut to what matters: a kernel named
# after a fusion, whose computation reads a bfloat16 matrix and reduces it.
_HLO = "\n".join(
  [
    "HloModule jit_run, is_scheduled=true",
    "",
    "%fused_reduce.3 (param_0: f32[1,4096], param_1: bf16[4096,151936]) -> f32[1,151936] {",
    "  %param_0 = f32[1,4096]{1,0} parameter(0)",
    "  %param_1 = bf16[4096,151936]{1,0} parameter(1)",
    "  %convert.2 = f32[4096,151936]{1,0} convert(%param_1)",
    "  %broadcast.1 = f32[4096,151936]{1,0} broadcast(%param_0), dimensions={0}",
    "  %multiply.4 = f32[4096,151936]{1,0} multiply(%broadcast.1, %convert.2)",
    "  %constant.7 = f32[] constant(0)",
    "  ROOT %reduce.5 = f32[1,151936]{1,0} reduce(%multiply.4, %constant.7), dimensions={0}, "
    "to_apply=%add",
    "}",
    "",
    "ENTRY %main.9 (h.1: f32[1,4096], w.2: bf16[4096,151936]) -> f32[1,151936] {",
    '  %h.1 = f32[1,4096]{1,0} parameter(0), metadata={op_name="h"}',
    '  %w.2 = bf16[4096,151936]{1,0} parameter(1), metadata={op_name="w"}',
    "  ROOT %input_reduce_fusion.180 = f32[1,151936]{1,0} fusion(%h.1, %w.2), kind=kInput, "
    'calls=%fused_reduce.3, metadata={op_name="jit(run)/while/body/dot_general" '
    "stack_frame_id=4}",
    "}",
  ]
)


def test_a_kernel_is_described_by_its_instruction_in_the_compiled_module():
  """A GPU kernel carries its fusion's name with '.' written '_': the description gives its
  shapes, what the fused computation does (not the plumbing) and the JAX op it came from;
  names with no instruction (a library's kernel) are left out."""
  described = describe_kernels(_HLO, ["input_reduce_fusion_180", "sm90_xmma_gemm_bf16"])
  assert described == {
    "input_reduce_fusion_180": "fusion f32[1,151936] <- f32[1,4096], bf16[4096,151936] "
    "[convert broadcast multiply reduce] (jit(run)/while/body/dot_general)"
  }


def test_the_compiled_text_of_this_jax_is_parsed():
  """XLA's printed module as this jax writes it: a loop's instruction is found by its
  kernel-style name and described with its fused product inside."""
  import jax
  import jax.numpy as jnp

  def run(x, w):
    return jax.lax.fori_loop(0, 3, lambda i, x: jnp.tanh(x @ w), x)

  text = jax.jit(run).lower(jnp.ones((2, 8)), jnp.ones((8, 8))).compile().as_text()
  loops = [line.split(" = ")[0].split("%")[-1] for line in text.splitlines() if " while(" in line]
  assert loops, text[-2000:]
  described = describe_kernels(text, [kernel_name(loops[0])])
  assert described[kernel_name(loops[0])].startswith("while (s32[], f32[2,8]")


# A GPU module's loop, cut to what matters: the body launches a Triton product, a reduction,
# an elementwise fusion and a library call between its plumbing; the condition and the
# entry's own fusion are outside the trip.
_LOOP = "\n".join(
  [
    "HloModule jit_run, is_scheduled=true",
    "",
    "%body.4 (arg.1: (s32[], f32[1,8])) -> (s32[], f32[1,8]) {",
    "  %arg.1 = (s32[], f32[1,8]{1,0}) parameter(0)",
    "  %get-tuple-element.2 = s32[] get-tuple-element(%arg.1), index=0",
    "  %get-tuple-element.3 = f32[1,8]{1,0} get-tuple-element(%arg.1), index=1",
    "  %constant.5 = s32[] constant(1)",
    "  %gemm_fusion_dot.6 = f32[1,8]{1,0} fusion(%get-tuple-element.3), kind=kCustom, calls=%g",
    "  %input_reduce_fusion.7 = f32[8]{0} fusion(%gemm_fusion_dot.6), kind=kInput, calls=%r",
    "  %bitcast.8 = f32[1,8]{1,0} bitcast(%input_reduce_fusion.7)",
    "  %loop_add_fusion = s32[] fusion(%get-tuple-element.2, %constant.5), kind=kLoop, calls=%a",
    '  %custom-call.9 = f32[1,8]{1,0} custom-call(%bitcast.8), custom_call_target="__cublas$gemm"',
    "  ROOT %tuple.10 = (s32[], f32[1,8]{1,0}) tuple(%loop_add_fusion, %custom-call.9)",
    "}",
    "",
    "%cond.11 (arg.12: (s32[], f32[1,8])) -> pred[] {",
    "  %arg.12 = (s32[], f32[1,8]{1,0}) parameter(0)",
    "  ROOT %loop_compare_fusion = pred[] fusion(%arg.12), kind=kLoop, calls=%c",
    "}",
    "",
    "ENTRY %main.13 (x.14: f32[1,8]) -> (s32[], f32[1,8]) {",
    "  %x.14 = f32[1,8]{1,0} parameter(0)",
    "  %loop_broadcast_fusion = s32[] fusion(), kind=kLoop, calls=%b",
    "  %tuple.15 = (s32[], f32[1,8]{1,0}) tuple(%loop_broadcast_fusion, %x.14)",
    "  ROOT %while.16 = (s32[], f32[1,8]{1,0}) while(%tuple.15), condition=%cond.11, "
    'body=%body.4, backend_config={"known_trip_count":{"n":"16"}}',
    "}",
  ]
)


def test_a_loops_kernels_are_its_bodys_launches_by_kind():
  """One trip's kernels: the body's fusions and library calls, by the kind a trace would
  sort their kernels into, without plumbing, the condition or what runs before the loop;
  a module without a loop has none."""
  got = loop_kernels(_LOOP)
  assert got["names"] == [
    "gemm_fusion_dot.6",
    "input_reduce_fusion.7",
    "loop_add_fusion",
    "custom-call.9",
  ]
  assert got["kernels"] == 4
  assert got["by_kind"] == {"products": 1, "reductions": 1, "element-wise": 1, "other": 1}
  # Their results: three float32 [1, 8] or [8] and an int32 scalar.
  assert got["written_bytes"] == 3 * 32 + 4
  # A KV cache's in-place writes add their kernels, not their buffers' bytes.
  cache = "bf16[1,8,64,16]{3,2,1,0}"
  writes = "".join(
    f"  %{name} = {cache} fusion(%get-tuple-element.3), kind=kLoop, calls=%w\n"
    for name in ("loop_dynamic_update_slice_fusion.30", "input_scatter_fusion.70")
  )
  more = loop_kernels(_LOOP.replace("  %loop_add_fusion =", writes + "  %loop_add_fusion =", 1))
  assert (more["kernels"], more["written_bytes"]) == (6, got["written_bytes"])
  assert loop_kernels(_HLO) == {}


def test_the_outermost_loop_is_counted_though_a_nested_body_comes_first():
  """A loop inside the loop (a drafter's steps inside a speculative round): its body,
  printed before the outer one, is not taken for the trip; it counts once there."""
  inner = "\n".join(
    [
      "%inner.20 (arg.21: (s32[], f32[1,8])) -> (s32[], f32[1,8]) {",
      "  %arg.21 = (s32[], f32[1,8]{1,0}) parameter(0)",
      "  %loop_add_fusion.22 = s32[] fusion(%arg.21), kind=kLoop, calls=%a",
      "  ROOT %tuple.23 = (s32[], f32[1,8]{1,0}) tuple(%loop_add_fusion.22, %arg.21)",
      "}",
      "",
    ]
  )
  nested = _LOOP.replace("%body.4 (", inner + "%body.4 (", 1).replace(
    "  ROOT %tuple.10",
    "  %while.24 = (s32[], f32[1,8]{1,0}) while(%tuple.15), condition=%cond.11, "
    "body=%inner.20\n  ROOT %tuple.10",
  )
  got = loop_kernels(nested)
  assert got["names"][-1] == "while.24" and got["kernels"] == 5
  # Run out: the inner body's one kernel times its trip count, or once where XLA does not
  # know the count (then said).
  counted = nested.replace(
    "body=%inner.20", 'body=%inner.20, backend_config={"known_trip_count":{"n":"3"}}'
  )
  assert trip_kernels(counted) == {
    "kernels": 7,
    "by_kind": {"products": 1, "reductions": 1, "element-wise": 4, "other": 1},
    "unknown_trips": 0,
    "written_bytes": 3 * 32 + 4 + 3 * 4,  # the inner body's int32 scalar, three times
  }
  assert trip_kernels(nested)["kernels"] == 5 and trip_kernels(nested)["unknown_trips"] == 1
  assert trip_kernels(_LOOP)["kernels"] == loop_kernels(_LOOP)["kernels"]
  assert trip_kernels(_HLO) == {}


def test_a_loop_compiled_by_this_jax_is_counted():
  """The module text this jax prints: a loop of a product and a tanh launches at least one
  kernel a trip and no more than its instructions."""
  import jax
  import jax.numpy as jnp

  def run(x, w):
    return jax.lax.fori_loop(0, 3, lambda i, x: jnp.tanh(x @ w), x)

  text = jax.jit(run).lower(jnp.ones((2, 8)), jnp.ones((8, 8))).compile().as_text()
  got = loop_kernels(text)
  assert 1 <= got["kernels"] <= 6 and sum(got["by_kind"].values()) == got["kernels"], got

"""experiments/real_sizes.py rehearsed on tiny shapes: every stage runs, writes its results,
and a second sitting resumes (finished stages skipped, a stage out of time kept partial)."""

import json
import os
import subprocess
import sys

import pytest

from tlt_jax.sim import TableCost

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
  "--shapes=tiny",
  "--contexts=16",
  "--tokens=1,2,5",
  "--accept=chain4=3.0",
  "--max_batch=2",
  "--copy_gb=0.01",
  "--update_rows=4",
  "--update_width=16",
  "--reps=2",
  "--steps=2",
  "--policies=configs/sd_bench.py:tiny",
]


def _run(out, *flags, env=None):
  cmd = [sys.executable, "experiments/real_sizes.py", f"--out={out}", *TINY, *flags]
  env = {**os.environ, **(env or {})}
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(os.path.join(out, "real_sizes.json")) as f:
    return json.load(f), done.stdout


def test_every_stage_runs_on_tiny_shapes_and_a_second_sitting_resumes(tmp_path):
  out = str(tmp_path)
  # First sitting: out of time in the grid (no cell may start), so later stages wait; the
  # rounds, priced from the grid, are not final while it is partial.
  first, _ = _run(out, "--stages=decode_b1,bandwidth,decode_grid,rounds", "--stage_s=0")
  assert first["done"] == ["decode_b1", "bandwidth"]
  b1 = first["decode_b1"]
  assert b1["ms_in_loop"] > 0 and b1["ms_per_call"] > 0 and b1["bound_fraction"] > 0
  assert b1["ms_in_loop_until_done"] > 0
  assert os.path.isdir(b1["trace"]) and not first.get("decode_grid")
  # An earlier sitting's batch-1 cell, which this sitting's verify_b1 measures again: the
  # new measurement replaces it (sittings' cells of one program have differed 2.8-4.1x).
  first["decode_grid"] = {"tiny/16/1/5": {"ms": 1e6, "compile_s": 1.0}}
  with open(os.path.join(out, "real_sizes.json"), "w") as f:
    json.dump(first, f)
  # Second sitting: the finished stages are skipped, the rest run. The overhead stage A/Bs
  # XLA flags, each setting in a process of its own: one the CPU's XLA takes (and ignores),
  # one it refuses (recorded, and the stage goes on). Two compile threads, as a device's
  # host has (one on a CPU): a stage's programs compiled two at a time, then timed.
  settings = ["--xla_gpu_enable_command_buffer=", "--xla_no_such_flag=1"]
  overhead = [*(f"--overhead_setting={x}" for x in settings), "--overhead_tokens=5"]
  second, printed = _run(out, *overhead, env={"TLT_COMPILE_WORKERS": "2"})
  assert "decode_b1: done in an earlier sitting" in printed
  assert second["decode_b1"] == b1
  assert second["done"] == [
    "decode_b1",
    "bandwidth",
    "overhead",
    "policy_overhead",
    "decode_b1_profile",
    "verify_b1",
    "decode_grid",
    "rounds",
    "engine_rounds",
    "update",
    "update_unrolled",
    "update_compile",
  ]
  took, refused = (second["overhead"][x] for x in settings)
  assert took["ms_in_loop"] > 0 and took["ms_per_call"] > 0 and took["compile_s"] > 0
  # Beside the decode, the 5-token forward under the same flags, in decode steps.
  five = took["forwards"]["5"]
  assert list(took["forwards"]) == ["5"] and five["ms"] > 0 and five["compile_s"] > 0
  assert five["steps"] == five["ms"] / took["ms_in_loop"]
  assert "xla_no_such_flag" in refused["error"]
  row = "| batch-1 decode, XLA_FLAGS += `--xla_gpu_enable_command_buffer=` | "
  assert row in printed and "; 5-token forward " in printed.split(row)[1].splitlines()[0]
  # This project's own policy (a config file, its dtypes) under the same settings, each
  # setting's loop traced and summarised; a CPU trace has no device line, so no busy ratio.
  policy = second["policy_overhead"]["configs/sd_bench.py:tiny"]
  took, refused = (policy[x] for x in settings)
  assert took["ms_in_loop"] > 0 and took["context"] == 192 and took["weight_bytes"] > 0
  assert took["trace"]["kernels_per_step"] > 0 and "over_busy" not in took
  # The costliest kernels described from the compiled module, where a trace's names are
  # its instructions' (tests/test_traces.py; on a CPU most are the runtime's).
  assert isinstance(took["trace"]["top_hlo"], dict)
  assert "xla_no_such_flag" in refused["error"]
  row = "| configs/sd_bench.py:tiny batch-1 decode, XLA_FLAGS += `--xla_gpu_enable_command_buff"
  assert row in printed
  # The batch-1 decode loop profiled under three attention forms (cuDNN's "fused" runs the
  # dots off a GPU), with the head in float32
  # (until 2026-12-06), as the engine's two-token step and with one-row products unpaired
  # (until 2026-12-06), its costliest kernels described.
  variants = [
    "auto",
    "reduce",
    "fused",
    "auto, the head in float32",
    "auto, the step as two tokens",
    "auto, one-row products unpaired",
  ]
  assert list(second["decode_b1_profile"]) == variants
  for variant, profile in second["decode_b1_profile"].items():
    assert profile["shape"] == "tiny" and profile["kernels_per_step"] > 0 and profile["ms"] > 0
    assert isinstance(profile["top_hlo"], dict) and profile["compile_s"] > 0
    assert f"| tiny batch-1 decode, attention form {variant} | " in printed
  # The verify forwards, each traced and its trace summarised (no folder comes back).
  assert set(second["verify_b1"]) == {"tiny/16/1/1", "tiny/16/1/2", "tiny/16/1/5"}
  for cell in second["verify_b1"].values():
    assert cell["ms"] > 0 and cell["trace"]["kernels_per_step"] > 0
    assert sum(cell["trace"]["by_kind_ms_per_step"].values()) > 0
  assert len(second["xla_flags"]) == 2  # one entry a sitting
  assert set(second["decode_grid"]) == {f"tiny/16/{b}/{t}" for b in (1, 2) for t in (1, 2, 5)}
  assert all(c["ms"] > 0 and c["compile_s"] > 0 for c in second["decode_grid"].values())
  # The three cells not taken over from verify_b1 compiled two, then one, at a time; each
  # windowed stage's compiles summed beside their wall seconds.
  assert [second["decode_grid"][f"tiny/16/2/{t}"]["compiled_with"] for t in (1, 2, 5)] == [2, 2, 1]
  compiles = second["compiles"]
  assert {k: v["programs"] for k, v in compiles.items()} == {
    "decode_b1_profile": 6,
    "verify_b1": 3,
    "decode_grid": 3,
    "rounds": 2,
  }
  assert all(c["wall_s"] > 0 and c["sum_s"] > 0 for c in compiles.values())
  assert {c["workers"] for c in compiles.values()} == {2}
  assert "| decode_grid: compiles | 3 programs compiled in " in printed
  # Each cell names its attention form (on a CPU the multiply-reduce for 2+ rows of 2+ tokens).
  forms = {k: c["attention"] for k, c in second["decode_grid"].items()}
  assert forms["tiny/16/2/5"] == forms["tiny/16/2/2"] == "reduce"
  assert forms["tiny/16/1/5"] == forms["tiny/16/2/1"] == "dots"
  # The same cells: taken over, not re-timed, the earlier sitting's replaced.
  for key, cell in second["verify_b1"].items():
    kept = {"ms": cell["ms"], "compile_s": cell["compile_s"], "attention": cell["attention"]}
    assert second["decode_grid"][key] == kept
  rounds = second["rounds"]
  assert {"tiny/chain4/1", "tiny/chain4/2", "tiny/chain4/crossover"} <= set(rounds)
  # A round composed of this sitting's cells: four drafter steps and a 5-token verify, in
  # decode steps (timings of tiny programs on a shared CPU: their ratio is not asserted).
  grid, drafter = second["decode_grid"], second["drafter_step"]
  composed = (4 * drafter["tiny/1"] + grid["tiny/16/1/5"]["ms"]) / grid["tiny/16/1/1"]["ms"]
  assert rounds["tiny/chain4/1"]["round_steps"] == pytest.approx(composed)
  # The engine's own round at one row, timed whole, beside that composition.
  (engine,) = second["engine_rounds"].values()
  assert engine["round_steps"] == pytest.approx(engine["round_ms"] / engine["step_ms"])
  assert engine["step_ms"] > 0 and engine["rounds"] == 2  # as many a call as the loops' steps
  assert engine["composed_round_steps"] == rounds["tiny/chain4/1"]["round_steps"]
  assert "| tiny/chain4/1: the engine's round | " in printed
  # The update with its layers scanned (the default) and unrolled: an A/B of compiles.
  for key, scanned in (("update", True), ("update_unrolled", False)):
    update = second[key]
    assert 0 < update["mfu"] < 1 and update["peak_bytes"] > 0 and update["planned_bytes"] > 0
    assert update["scan_layers"] is scanned and update["compile_s"] > 0
  # The same programs compiled from shapes alone (the timed stages run what that compiles):
  # XLA's bytes near the plan's.
  for label in ("scanned", "unrolled"):
    compiled = second["update_compile"][label]
    ran = second["update" if label == "scanned" else "update_unrolled"]
    assert compiled["planned_bytes"] == ran["planned_bytes"] and compiled["compile_s"] > 0
    assert 0.5 <= compiled["compiled_bytes"] / compiled["planned_bytes"] <= 2.0
    assert f"| tiny update compiled from shapes on cpu, 4 x 16 tokens, layers {label} |" in printed
  assert "| tiny update, 4 x 16 tokens, layers scanned | MFU" in printed
  assert "| tiny update, 4 x 16 tokens, layers unrolled | MFU" in printed
  # The grid is the simulator's measured table: its cells come back as they were measured,
  # and experiments/simulate.py projects from it.
  table = TableCost.from_decode_grid(second["decode_grid"], "tiny")
  assert table.batches == (1, 2) and table.tokens == (1, 2, 5) and table.context == 16
  cell = second["decode_grid"]["tiny/16/2/5"]["ms"]
  assert abs(table.seconds(2, 5, 16) - cell / 1e3) < 1e-12
  surface = f"--surface={os.path.join(out, 'real_sizes.json')}:tiny"
  lengths = ["--lognormal=20,40,100,4", "--engine_max_batch=4", "--steps=1"]
  cmd = [sys.executable, "experiments/simulate.py", surface, *lengths]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "| tlt |" in done.stdout
  # The projection from the measured forwards (the real-sizes goal), beside the same device's
  # roofline and the paper, and the assumption that moves it most.
  cmd = [sys.executable, "experiments/simulate.py", "--project", surface, "--steps=1"]
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  rows = ("| measured forwards | 2 |", "| roofline of the same device | 2 |", "| the paper")
  # With two-token forwards measured, also as the engine runs a one-row step on a GPU.
  for row in (*rows, "| measured forwards, one-row steps as two tokens | 2 |"):
    assert row in done.stdout
  assert "moves TLT's figure most: " in done.stdout


def test_the_device_sittings_script_rehearses_these_shapes():
  """experiments/device_sitting.sh (real sizes, the copy's benchmark and the curve, in one
  device call) is valid bash and rehearses real sizes on a CPU with this file's tiny flags.
  Its whole rehearsal (`bash experiments/device_sitting.sh /tmp/sitting tiny`, ~3 minutes)
  is in experiments/RESULTS.md, not here."""
  path = os.path.join(ROOT, "experiments", "device_sitting.sh")
  assert subprocess.run(["bash", "-n", path]).returncode == 0
  with open(path) as f:
    text = f.read()
  tiny = text.split('if [ "$VARIANT" = tiny ]; then', 1)[1].split("args=(", 1)[1]
  assert set(tiny.split(")", 1)[0].split()) == {*TINY, "--overhead_tokens=5"}
  assert os.access(path, os.X_OK)


def test_a_device_traced_policy_cell_says_how_far_its_step_is_over_its_kernels():
  """On a device the policy cells carry the loop's step over its kernels' busy time (what
  launches and the loop add); the summary says it beside the kernel count. (In a process
  of its own: the script's absl flags would clash with other experiments' in this one.)"""
  cell = {
    "ms_in_loop": 0.9,
    "ms_in_loop_until_done": 1.0,
    "ms_per_call": 1.8,
    "trace": {"busy_ms_per_step": 0.3, "kernels_per_step": 180.0},
    "over_busy": 3.0,
  }
  code = (
    "import json, sys\n"
    "from experiments.real_sizes import summary\n"
    "print(summary({'policy_overhead': {'configs/sd_bench.py': {'': json.loads(sys.argv[1])}}}))"
  )
  done = subprocess.run(
    [sys.executable, "-c", code, json.dumps(cell)], cwd=ROOT, capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr[-2000:]
  row = (
    "| configs/sd_bench.py batch-1 decode, XLA_FLAGS += `(nothing)` | 0.90 ms in a device "
    "loop; 1.00 ms in the engine's kind of loop; 1.80 ms a call; kernels busy 0.300 ms a step "
    "(180 of them), the loop's step 3.00x that |"
  )
  assert row in done.stdout.splitlines()


def test_forwards_compiled_together_on_threads_run_as_each_compiled_alone():
  """`compile_together` (a stage's programs lowered here, compiled on two threads): each
  program computes what it computes compiled alone, the attention form it was lowered under
  included. (A process of its own, as above.)"""
  code = """
import jax, jax.numpy as jnp
from experiments.common import published_shape, random_params
from experiments.forwards import Forward, compile_together
from tlt_jax.models.attention import attention_form
cfg = published_shape("tiny")
graphdef, params = random_params(cfg)
cells = [(1, 1, "dots"), (2, 5, "reduce"), (2, 5, "dots"), (1, 2, None)]
def made(batch, tokens, form):
  fwd = Forward(graphdef, cfg, batch, tokens, 16, 2)
  if form:
    with attention_form(form):
      fwd.lower(params)
  return fwd
alone = [made(*cell) for cell in cells]
for fwd in alone:
  assert fwd.compile(params) > 0 and fwd.compiled_with == 1
together = [made(*cell) for cell in cells]
info = compile_together(together, params, workers=2)
assert info["programs"] == 4 and info["workers"] == 2, info
assert 0 < info["wall_s"] and abs(info["sum_s"] - sum(f.compile_s for f in together)) < 1e-9
texts = [f.compiled.as_text() for f in together]
assert texts[1] != texts[2]  # the two forms' programs differ
for a, b in zip(alone, together):
  assert b.compiled_with == 4 and b.compile_s > 0
  same = jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a.first(params), b.first(params))
  assert all(jax.tree.leaves(same))
  assert a.ms(params, 2) > 0 and b.ms(params, 2) > 0
# A compile XLA refuses beside others is tried again alone; one that fails alone raises.
class Refusing:
  def __init__(self, lowered, refusals):
    self.lowered, self.refusals = lowered, refusals
  def compile(self):
    if self.refusals:
      self.refusals -= 1
      raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory while autotuning")
    return self.lowered.compile()
again = [made(1, 1, None), made(1, 2, None)]
for fwd in again:
  fwd.lower(params)
again[0].lowered = Refusing(again[0].lowered, 1)
assert compile_together(again, params, workers=2)["programs"] == 2
assert all(f.compiled is not None for f in again)
never = made(1, 1, None)
never.lower(params)
never.lowered = Refusing(never.lowered, 2)
try:
  compile_together([never, made(1, 2, None)], params, workers=2)
  raise AssertionError("a compile refused twice must raise")
except jax.errors.JaxRuntimeError:
  pass
print("ok")
"""
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip().endswith("ok")


def test_a_program_the_device_refuses_becomes_its_cells_error():
  """`compile_window`: where one of a window's programs fails to lower or compile (cuDNN's
  kernel on a device that refuses it, a shape), the others still compile, one at a time,
  and the failure comes back as that cell's error: a stage keeps it as its cell, so the
  next sitting neither stops there nor tries it again; the summary prints it. A stage that
  raises is recorded and left for the next stages. (A process of its own, as above.)"""
  code = """
from experiments.common import published_shape, random_params
from experiments.forwards import Forward
from experiments.real_sizes import compile_window, summary
cfg = published_shape("tiny")
graphdef, params = random_params(cfg)
class Refused(Forward):
  def lower(self, params):
    raise NotImplementedError("cuDNN: no kernel for this graph")
part = [("a", Forward(graphdef, cfg, 1, 1, 16, 2), None),
        ("b", Refused(graphdef, cfg, 1, 2, 16, 2), "fused"),
        ("c", Forward(graphdef, cfg, 2, 1, 16, 2), "dots")]
compiles, failed = compile_window(part, params)
assert list(failed) == ["b"] and "NotImplementedError: cuDNN" in failed["b"], failed
assert compiles["programs"] == 2 and part[0][1].compiled and part[2][1].compiled
assert part[0][1].ms(params, 1) > 0
cells = {"fused": {"error": failed["b"]}}
assert "| batch-1 decode, attention form fused | NotImplementedError" in summary(
  {"decode_b1_profile": cells})
# A stage that raises is recorded, and tried again in later sittings twice at most.
import sys, tempfile
import experiments.real_sizes as r
r.Stages.boom = lambda self, start: 1 / 0
out = tempfile.mkdtemp()
for sitting in range(3):
  r.Stages(out).run("boom")
failures = r.Stages(out).results["failures"]["boom"]
assert len(failures) == 2 and failures[0].startswith("ZeroDivisionError"), failures
assert "| boom: failed 2 times | ZeroDivisionError" in summary({"failures": {"boom": failures}})
print("ok")
"""
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip().endswith("ok")

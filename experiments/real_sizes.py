r"""Real model sizes on an accelerator: decode steps, speculative rounds and the policy update
at Qwen3-8B and Qwen2.5-1.5B layer shapes, with random bfloat16 weights (shapes, bytes and
kernels are what is measured; acceptance is not), in stages of a few minutes. Each stage
writes its results to <out>/real_sizes.json as it ends, and each measured cell is kept, so a
sitting returns what it reached and the next one resumes where it stopped.

  python experiments/real_sizes.py --out=runs/real_sizes                  # a GPU sitting
  python experiments/real_sizes.py --out=/tmp/rs --shapes=tiny --copy_gb=0.05   # CPU rehearsal

On a TPU the same command is meant to run unchanged after `pip install -e '.[tpu]'` (libtpu;
never run on one so far): the spec sheet (`host.spec_sheet`) knows TPU v4-v6e, and the
traces' summary (`experiments/traces.py`) reads a TPU's op line.

Stages, in priority order (`--stages`; finished ones are skipped):
  decode_b1    batch-1 decode of the first shape at the first context: ms a step inside one
               device loop and one step a call (the difference is launches and host round
               trips), a profiler trace of a few looped steps (<out>/trace)
  bandwidth    the device's copy bandwidth (read + write of a `--copy_gb` array): the HBM
               bound of a decode step is its weight and KV bytes over it; the spec sheet's
               figure is printed beside
  overhead     batch-1 decode of the first shape, and its forwards of each `--overhead_tokens`
               count in decode steps, under each `--overhead_setting` of XLA_FLAGS (XLA's
               default / GEMM autotuning off / command buffers off / the loop's while and
               conditionals captured too), each in a fresh process since XLA reads its flags
               once: what the device loop's per-step overhead gives back to each, and
               whether the multi-token forwards' cost follows the GEMMs' tuning
  policy_overhead  the same per `--policies` entry: this project's own policies (a config
               file, its dtypes, random weights) at `--policy_context`, each setting's
               counted loop traced too and summarised (kernels a step, the ms they keep the
               device busy): a step's time over that busy time is what launches and the loop
               add, the part of the 50M policy's 1.3-1.9 ms step on the H200 (2026-11-26, one
               forward a call) that is neither weights nor arithmetic
  decode_b1_profile  the first shape's batch-1 decode loop under each `--profile_forms`
               attention form (the engine's "auto" takes batched products there; "fused":
               cuDNN's kernel, `models.attention.attend_fused`), and with
               the head's product in float32 as it ran until 2026-12-06
               (`models.precision.head_precision("float32")`), as two tokens (the engine's
               one-row step on a GPU), and with one-row products unpaired as they ran until
               2026-12-06 (`models.products.one_row_products("single")`), timed and traced: its
               kernels by kind and its costliest kernels described from the compiled module
               (result and operand shapes, the fused ops, the JAX op): what holds the step
               above its bound
  verify_b1    batch-1 forwards of each `--tokens` count (1: a decode step; 5 / 9: verifying
               a chain of 4 / 8) of the first shape, timed and traced in one process under one
               set of XLA flags, each trace summarised here by kernel kind (products,
               reductions, element-wise, other: `experiments/traces.py`), since a trace
               folder is too deep to come back from a device sitting
  decode_grid  per shape: one forward by batch (1 .. the largest whose KV cache fits beside
               the weights) x new tokens per row (1: a decode step; 5 / 9 / 17: verifying a
               chain of 4 / 8 / 16) at each context; compile seconds per program (the batch-1
               cells verify_b1 measured are taken over)
  rounds       a chain round's cost in decode steps (depth drafter steps of a random
               one-layer drafter + one verify forward) by batch, and the batch where a round
               of depth 4 / 8 stops paying at `--accept` (this project's measured accept
               lengths)
  engine_rounds  the engine's own chain round of the first shape (drafting, verification,
               commit and the drafter cache's extension in one program; a random drafter),
               timed whole at `--engine_round_batches` rows beside a plain decode step of
               the same rows: the check of `rounds`' composition
  update       the 1.5B shape's policy update (float32 masters, bfloat16 products,
               rematerialised layers, the layers as one scan unless --noupdate_scan): model
               FLOPs utilisation over the spec sheet's (or, on a CPU, the measured matmul)
               rate; peak memory beside parallel.memory's plan; compile seconds
  update_unrolled  the same update with its layers unrolled: what the scan saves in
               compile seconds on the device, and what it costs a step
  update_compile  both update programs compiled from their shapes alone (nothing
               allocated): XLA's bytes beside the plan, and compile seconds, on any host;
               the CPU's rehearsal of the 1.5B update, whose float32 masters and Adam state
               do not fit a 24 GiB host

The decode grid is the simulator's measured cost table (`sim.TableCost.from_decode_grid`):
  python experiments/simulate.py --surface=runs/real_sizes/real_sizes.json:qwen3-8b

A stage that raises is recorded (`failures` in the results, printed in the summary) and the
next stages run; later sittings try it again, twice at most. A cell whose program the device
refuses (cuDNN's kernel, a shape) is kept as that cell's error and not tried again.

A stage stops adding cells once it has run `--stage_s` seconds (the cells it measured are
kept; the rest wait for the next sitting). Beside an accelerator a stage's programs compile
several at a time (`experiments.forwards.compile_together`, as many as the rollout's
compile threads: `rollout.pool.default_compile_workers()`, TLT_COMPILE_WORKERS), then are
timed one by one, no compile running beside a timing: an 8B program compiled in 8-14 s on
the H200's host, longer than its timing. `compiles` in the results gives each stage's
compile seconds summed beside their wall seconds; the log's lines carry the seconds since
the process started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import json_child, published_shape, random_params  # noqa: E402
from experiments.forwards import (  # noqa: E402
  Forward,
  UpdateProgram,
  compile_together,
  decode_shape,
  kv_bytes,
  weight_bytes,
)
from experiments.host import matmul_flops, spec_sheet  # noqa: E402
from experiments.traces import describe_kernels, trace_summary  # noqa: E402
from tlt_jax.decode.sampling import SamplingConfig  # noqa: E402
from tlt_jax.models.attention import attention_form, reduces  # noqa: E402
from tlt_jax.models.drafter import init_drafter  # noqa: E402
from tlt_jax.parallel.memory import measured_bytes  # noqa: E402
from tlt_jax.rollout import EngineConfig, RolloutEngine  # noqa: E402
from tlt_jax.rollout.pool import default_compile_workers  # noqa: E402
from tlt_jax.rollout.profile import round_costs  # noqa: E402

_OUT = flags.DEFINE_string("out", "runs/real_sizes", "output folder (results resume from it)")
_STAGES = flags.DEFINE_list(
  "stages",
  [
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
  ],
  "stages, in order",
)
_SHAPES = flags.DEFINE_list("shapes", ["qwen3-8b", "qwen2.5-1.5b"], "decode shapes (or tiny)")
_UPDATE_SHAPE = flags.DEFINE_string("update_shape", "", "update stage's shape (default: last)")
_CONTEXTS = flags.DEFINE_list("contexts", ["1024", "4096"], "cache lengths of the grid")
_TOKENS = flags.DEFINE_list(
  "tokens",
  ["1", "2", "5", "9", "17"],
  "new tokens per row (2: the engine's one-row step on a GPU, EngineConfig.one_row_step)",
)
_MAX_BATCH = flags.DEFINE_integer("max_batch", 256, "largest batch tried")
_STEPS = flags.DEFINE_integer("steps", 16, "forwards per device loop")
_REPS = flags.DEFINE_integer("reps", 5, "timed repetitions (median kept)")
_COPY_GB = flags.DEFINE_float("copy_gb", 4.0, "bandwidth stage's array size, GB")
_STAGE_S = flags.DEFINE_float("stage_s", 300.0, "seconds a stage may add cells for")
_ACCEPT = flags.DEFINE_list("accept", ["chain4=3.93", "chain8=6.13"], "accept lengths")
_ENGINE_ROUND_BATCHES = flags.DEFINE_list(
  "engine_round_batches", ["1"], "engine_rounds stage: rows of the engine's own rounds"
)
_UPDATE_ROWS = flags.DEFINE_integer("update_rows", 8, "update rows (micro-batches of 2)")
_UPDATE_WIDTH = flags.DEFINE_integer("update_width", 1024, "update row length")
_UPDATE_SCAN = flags.DEFINE_bool(
  "update_scan",
  True,
  "the update's layers as one scan (UpdateConfig.scan_layers): one layer's body to compile",
)
_OVERHEAD_SETTINGS = flags.DEFINE_multi_string(
  "overhead_setting",
  [
    "",
    "--xla_gpu_autotune_level=0",
    "--xla_gpu_enable_command_buffer=",
    "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE,CONDITIONAL",
  ],
  "overhead stage: XLA_FLAGS additions to compare (repeat the flag), each in its own process",
)
_OVERHEAD_TOKENS = flags.DEFINE_list(
  "overhead_tokens",
  ["2", "5", "9"],
  "overhead stage: batch-1 forwards of these new-token counts timed beside each setting's decode "
  "(2: a one-row step whose products stay matrix products on a GPU, experiments/deviceless.py)",
)
_POLICIES = flags.DEFINE_list(
  "policies",
  ["configs/sd_bench.py"],
  "policy_overhead stage: config files (':variant' as on a command line) of the policies",
)
_PROFILE_FORMS = flags.DEFINE_list(
  "profile_forms",
  ["auto", "reduce", "fused"],
  "decode_b1_profile stage: attention forms (models.attention.ATTENTION_FORMS) profiled",
)
_PROFILE_FLOAT32_HEAD = flags.DEFINE_bool(
  "profile_float32_head",
  True,
  "decode_b1_profile stage: also the auto form with the head's product in float32 (until "
  "2026-12-06)",
)
_POLICY_CONTEXT = flags.DEFINE_integer("policy_context", 192, "policy_overhead stage's context")
_CHILD = flags.DEFINE_bool("child", False, "internal: print batch-1 decode costs as JSON")
_CHILD_TRACE = flags.DEFINE_bool("child_trace", False, "internal: the child traces its loop")
_MEMORY_GIB = flags.DEFINE_float("memory_gib", 0.0, "device memory where it cannot be read")


_STARTED = time.perf_counter()


def say(text: str) -> None:
  """A log line with the seconds since this process started: where a sitting's time went."""
  print(f"+{time.perf_counter() - _STARTED:.1f}s {text}", flush=True)


def compiled_words(compiles: dict) -> str:
  """`compile_together`'s figures in a log line."""
  return (
    f"{compiles['programs']} programs compiled in {compiles['wall_s']:.1f} s on "
    f"{compiles['workers']} threads ({compiles['sum_s']:.1f} s of compiles, lowering "
    f"{compiles['lower_s']:.1f} s of it)"
  )


def device_memory() -> float:
  """Bytes the default device can hold (`--memory_gib` where the runtime does not say)."""
  stats = jax.devices()[0].memory_stats() or {}
  if "bytes_limit" in stats:
    return float(stats["bytes_limit"])
  return _MEMORY_GIB.value * 2**30 if _MEMORY_GIB.value else 8 * 2**30


def batch1_decode(
  graphdef, cfg, params, context: int, also=(), looped_alone: bool = False
) -> tuple[Forward, dict]:
  """Batch-1 decode: ms a step inside one counted device loop of `--steps`, inside the
  engine's kind of loop (stopping on a device value: `Forward`'s `until_done`), one step a
  call (the differences are host round trips and launches), and the counted loop over two
  rows (`ms_in_loop_two_rows`: one row and a pad, as an engine whose smallest batch bucket
  is 2 runs it; on a GPU XLA turns a one-row step's products into elementwise products and
  reductions, experiments/deviceless.py); returns the counted Forward too. The Forwards in
  `also` are compiled with these, for the caller to time. `looped_alone`: the counted loop
  compiled before the rest, on its own, its GEMM autotuning alone on the device (the
  reference the overhead stage's processes, which compile theirs together, are checked
  against)."""
  looped = Forward(graphdef, cfg, 1, 1, context, _STEPS.value)
  until_done = Forward(graphdef, cfg, 1, 1, context, _STEPS.value, until_done=True)
  single = Forward(graphdef, cfg, 1, 1, context, 1)
  two_rows = Forward(graphdef, cfg, 2, 1, context, _STEPS.value)
  programs = (looped, until_done, single, two_rows)
  if looped_alone:
    looped.compile(params)
  compiles = compile_together([*programs, *also], params)
  compile_s = sum(f.compile_s for f in programs)
  # Both loops must run all `--steps` trips: the same tokens and cache, bit for bit.
  same = jax.tree.map(
    lambda a, b: bool(jnp.array_equal(a, b)), looped.first(params), until_done.first(params)
  )
  if not all(jax.tree.leaves(same)):
    raise RuntimeError("the engine's kind of loop did not run the counted loop's trips")
  return looped, {
    "ms_in_loop": looped.ms(params, _REPS.value),
    "ms_in_loop_until_done": until_done.ms(params, _REPS.value),
    "ms_per_call": single.ms(params, _REPS.value * _STEPS.value),
    "ms_in_loop_two_rows": two_rows.ms(params, _REPS.value),
    "compile_s": compile_s,
    "compiles": compiles,
  }


def traced_ms(fwd: Forward, params, calls: int = 2) -> dict:
  """`fwd` timed under the profiler, its trace summarised (`experiments/traces.py`), its
  costliest kernels described from the compiled module (`top_hlo`: which product or
  reduction each is), and the folder removed: a trace folder is too deep to come back from
  a device sitting."""
  trace, began = tempfile.mkdtemp(prefix="tlt_trace_"), time.perf_counter()
  try:
    with jax.profiler.trace(trace, create_perfetto_trace=True):
      fwd.ms(params, calls)
    # `ms` runs a warm-up call, then `calls` timed ones, each of the loop's forwards.
    summary = trace_summary(trace, steps=(calls + 1) * fwd.n)
    top = summary.get("top_ms_per_step", {})
    summary["top_hlo"] = describe_kernels(fwd.compiled.as_text(), list(top))
    return {**summary, "trace_s": time.perf_counter() - began}
  finally:
    shutil.rmtree(trace, ignore_errors=True)


def overhead_cell() -> dict:
  """The overhead stages' measurements in this process: the first shape's batch-1 decode
  (`batch1_decode`; under `--child_trace` its counted loop's trace summary too, and the ms
  a step over the ms its kernels keep the device busy) and its forward of each
  `--overhead_tokens` count, in decode steps."""
  cfg, context = decode_shape(_SHAPES.value[0]), int(_CONTEXTS.value[0])
  graphdef, params = random_params(cfg)
  forwards = {
    tokens: Forward(graphdef, cfg, 1, tokens, context, _STEPS.value)
    for tokens in sorted({int(t) for t in _OVERHEAD_TOKENS.value})
  }
  looped, cell = batch1_decode(graphdef, cfg, params, context, also=forwards.values())
  cell["context"] = context
  cell["weight_bytes"], cell["kv_bytes"] = weight_bytes(params), kv_bytes(cfg, 1, context)
  if _CHILD_TRACE.value:
    cell["trace"] = traced_ms(looped, params)
    busy = cell["trace"].get("busy_ms_per_step")
    # Only a device's kernel line is busy time: a CPU trace's spans nest and overlap.
    if busy and cell["trace"].get("device_processes"):
      cell["over_busy"] = cell["ms_in_loop"] / busy
  cell["forwards"] = {}
  for tokens, fwd in forwards.items():
    timed = timed_cell(fwd, params)
    cell["forwards"][str(tokens)] = {**timed, "steps": timed["ms"] / cell["ms_in_loop"]}
  return cell


def timed_cell(fwd: Forward, params) -> dict:
  """A grid cell of a compiled Forward: its ms a forward, its compile seconds (with how
  many programs compiled at once, `compile_together`) and the attention form it took
  (`attention.reduces`: it differs by platform)."""
  return {
    "ms": fwd.ms(params, _REPS.value),
    "compile_s": fwd.compile_s,
    "compiled_with": fwd.compiled_with,
    "attention": "reduce" if reduces(fwd.batch, fwd.tokens) else "dots",
  }


class Stages:
  """The results file and each stage's measurements (see the module docstring)."""

  # A stage computed from another's results is final only once that one is (an older
  # results file may say otherwise: then it is computed again).
  DERIVED_FROM = {"rounds": "decode_grid"}
  # A stage that raised (out of the device's memory, a program refused) is recorded in
  # `failures` and left for the next stages; tried again in later sittings up to TRIES times.
  TRIES = 2

  def __init__(self, out: str):
    self.out, self.path = out, os.path.join(out, "real_sizes.json")
    self.results = {}
    if os.path.exists(self.path):
      with open(self.path) as f:
        self.results = json.load(f)
    self.results.setdefault("devices", [str(d) for d in jax.devices()])
    # Each sitting's XLA flags: kernels (and GEMM autotuning) differ with them.
    self.results.setdefault("xla_flags", []).append(os.environ.get("XLA_FLAGS", ""))
    self.models = {}

  def save(self) -> None:
    with open(self.path, "w") as f:
      json.dump(self.results, f, indent=1)

  def model(self, name):
    if name not in self.models:
      self.models.clear()  # one shape's weights on the device at a time
      cfg, began = published_shape(name), time.perf_counter()
      self.models[name] = (cfg, *random_params(cfg))
      say(f"{name}: random weights made in {time.perf_counter() - began:.1f} s")
    return self.models[name]

  def run(self, stage: str) -> None:
    done = self.results.setdefault("done", [])
    source = self.DERIVED_FROM.get(stage)
    if source and source not in done and stage in done:
      done.remove(stage)
    if stage in done:
      print(f"{stage}: done in an earlier sitting", flush=True)
      return
    failures = self.results.setdefault("failures", {}).setdefault(stage, [])
    if len(failures) >= self.TRIES:
      say(f"{stage}: failed {len(failures)} times, not tried again ({failures[-1][:200]})")
      return
    start, self.stage = time.perf_counter(), stage
    say(f"{stage}: started")
    try:
      complete = getattr(self, stage)(start)
    except Exception as e:  # the next stages still run; a later sitting tries it once more
      failures.append(error_words(e))
      self.save()
      say(f"{stage}: failed ({failures[-1][:300]})")
      return
    self.results.setdefault("stage_s", {})[stage] = time.perf_counter() - start
    complete = complete and (source is None or source in done)
    if complete:
      done.append(stage)
    self.save()
    say(f"{stage}: {'done' if complete else 'partial'}")

  def _late(self, start, reserve: float = 0.0) -> bool:
    return time.perf_counter() - start + reserve > _STAGE_S.value

  def _windows(self, start, cells: dict, todo, params, measure) -> bool:
    """`todo` ([(key, Forward, attention form or None)]) in windows of as many programs as
    there are compile threads (`rollout.pool.default_compile_workers()`): a window's
    programs lowered (each under its form) and compiled together (`compile_together`), then
    each measured (`measure(fwd, params)`: its cell) into `cells` and saved, so no compile runs
    beside a timing. A window starts only while the last one's seconds still fit the
    stage's; False when the stage ran out of time. Compile seconds summed and wall go into
    the results' `compiles`, by stage."""
    window, last = default_compile_workers(), 0.0
    for i in range(0, len(todo), window):
      if self._late(start, reserve=last):
        return False
      began, part = time.perf_counter(), todo[i : i + window]
      compiles, failed = compile_window(part, params)
      say(f"{self.stage}: {compiled_words(compiles)}")
      add_compiles(self.results.setdefault("compiles", {}).setdefault(self.stage, {}), compiles)
      for key, fwd, _ in part:
        if key not in failed and self._late(start):
          return False
        try:
          cells[key] = {"error": failed[key]} if key in failed else measure(fwd, params)
        except Exception as e:  # kept as the cell: a later sitting does not try it again
          cells[key] = {"error": error_words(e)}
        print(key, json.dumps(cells[key]), flush=True)
        self.save()
      last = time.perf_counter() - began
    return True

  # ------------------------------------------------------------------ stages
  def decode_b1(self, start) -> bool:
    name, context = _SHAPES.value[0], int(_CONTEXTS.value[0])
    cfg, graphdef, params = self.model(name)
    looped, costs = batch1_decode(graphdef, cfg, params, context, looped_alone=True)
    out = {
      "shape": name,
      "context": context,
      **costs,
      "weight_bytes": weight_bytes(params),
      "kv_bytes": kv_bytes(cfg, 1, context),
    }
    say(f"decode_b1: {compiled_words(costs['compiles'])}, then timed")
    trace = os.path.join(self.out, "trace")
    with jax.profiler.trace(trace):
      looped.ms(params, 2)
    say("decode_b1: traced")
    out["trace"] = trace
    self.results["decode_b1"] = out
    print(json.dumps(out, indent=1), flush=True)
    return True

  def decode_b1_profile(self, start) -> bool:
    """The first shape's batch-1 decode loop under each `--profile_forms` attention form,
    with the head's product in float32 (as before 2026-12-06), as the engine's step runs it
    on a GPU (two tokens: `EngineConfig.one_row_step`), and with one-row products unpaired
    (as before 2026-12-06: `models.products`), timed, traced, its kernels by kind and the
    costliest described (`traced_ms`): which products and reductions hold the step above
    its bound, what the bfloat16 head, the two-token step and the paired products give
    back."""
    name, context = _SHAPES.value[0], int(_CONTEXTS.value[0])
    cfg, graphdef, params = self.model(name)
    cells = self.results.setdefault("decode_b1_profile", {})
    variants = [(form, form, {}, 1) for form in _PROFILE_FORMS.value]
    if _PROFILE_FLOAT32_HEAD.value:
      variants.append(("auto, the head in float32", "auto", {"float32_head": True}, 1))
    variants.append(("auto, the step as two tokens", "auto", {}, 2))
    variants.append(("auto, one-row products unpaired", "auto", {"single_row_products": True}, 1))
    todo = [
      (key, Forward(graphdef, cfg, 1, tokens, context, _STEPS.value, **choices), form)
      for key, form, choices, tokens in variants
      if key not in cells
    ]

    def measure(fwd, params):
      cell = {"shape": name, "context": context, "compile_s": fwd.compile_s}
      return {**cell, "ms": fwd.ms(params, _REPS.value), **traced_ms(fwd, params)}

    return self._windows(start, cells, todo, params, measure)

  def bandwidth(self, start) -> bool:
    n = int(_COPY_GB.value * 1e9) // 2
    x = jnp.ones((n,), jnp.bfloat16)
    copy = jax.jit(lambda x: x + jnp.bfloat16(1))
    jax.block_until_ready(copy(x))
    times = []
    for _ in range(_REPS.value):
      t = time.perf_counter()
      jax.block_until_ready(copy(x))
      times.append(time.perf_counter() - t)
    gbs = 2 * n * 2 / float(np.median(times)) / 1e9  # read and write
    self.results["bandwidth"] = {"copy_gb": _COPY_GB.value, "gb_per_s": gbs, "spec": spec_sheet()}
    b1 = self.results.get("decode_b1")
    if b1:
      bound_ms = (b1["weight_bytes"] + b1["kv_bytes"]) / (gbs * 1e9) * 1e3
      b1["bound_ms"], b1["bound_fraction"] = bound_ms, bound_ms / b1["ms_in_loop"]
    print(json.dumps(self.results["bandwidth"]), flush=True)
    return True

  def overhead(self, start) -> bool:
    cells = self.results.setdefault("overhead", {})
    return self._settings(start, cells, _SHAPES.value[0], int(_CONTEXTS.value[0]), trace=False)

  def policy_overhead(self, start) -> bool:
    cells = self.results.setdefault("policy_overhead", {})
    for policy in _POLICIES.value:
      policy_cells = cells.setdefault(policy, {})
      if not self._settings(start, policy_cells, policy, _POLICY_CONTEXT.value, trace=True):
        return False
    return True

  def _settings(self, start, cells: dict, shape: str, context: int, trace: bool) -> bool:
    """`shape`'s batch-1 decode (`overhead_cell`) under each `--overhead_setting`, each in a
    process of its own, into `cells` by setting."""
    for setting in _OVERHEAD_SETTINGS.value:
      if setting in cells:
        continue
      if self._late(start):
        return False
      self.models.clear()  # the child needs the device's memory for its own weights
      argv = [
        os.path.abspath(__file__),
        "--child",
        f"--child_trace={trace}",
        f"--shapes={shape}",
        f"--contexts={context}",
        f"--overhead_tokens={','.join(_OVERHEAD_TOKENS.value)}",
        f"--steps={_STEPS.value}",
        f"--reps={_REPS.value}",
      ]
      # A setting XLA refuses comes back as {"error": ...}: recorded, and the stage goes on.
      cells[setting] = json_child(argv, f"{os.environ.get('XLA_FLAGS', '')} {setting}".strip())
      print(f"{shape}, XLA_FLAGS += {setting!r}: {json.dumps(cells[setting])[:400]}", flush=True)
      self.save()
    return True

  def verify_b1(self, start) -> bool:
    name, context = _SHAPES.value[0], int(_CONTEXTS.value[0])
    cells = self.results.setdefault("verify_b1", {})
    cfg, graphdef, params = self.model(name)
    todo = [
      (
        f"{name}/{context}/1/{tokens}",
        Forward(graphdef, cfg, 1, tokens, context, _STEPS.value),
        None,
      )
      for tokens in map(int, _TOKENS.value)
      if f"{name}/{context}/1/{tokens}" not in cells
    ]
    measure = lambda fwd, params: {**timed_cell(fwd, params), "trace": traced_ms(fwd, params)}
    return self._windows(start, cells, todo, params, measure)

  def decode_grid(self, start) -> bool:
    grid = self.results.setdefault("decode_grid", {})
    # verify_b1's cells are this grid's batch-1 cells (the same programs, timed the same
    # way): taken over rather than compiled and timed again on the device, and over an
    # earlier sitting's (the H200's 5- and 9-token cells of 2026-11-28 read 2.8-4.1x
    # today's, under the same flags: RESULTS.md, 2026-12-04).
    for key, cell in self.results.get("verify_b1", {}).items():
      grid[key] = {k: cell[k] for k in ("ms", "compile_s", "attention") if k in cell}
    for name in _SHAPES.value:
      cfg, graphdef, params = self.model(name)
      room = 0.85 * device_memory() - weight_bytes(params)
      todo = []
      for context in map(int, _CONTEXTS.value):
        batch = 1
        while batch <= _MAX_BATCH.value and kv_bytes(cfg, batch, 2 * context) <= room:
          for tokens in map(int, _TOKENS.value):
            key = f"{name}/{context}/{batch}/{tokens}"
            if key not in grid:
              todo.append((key, Forward(graphdef, cfg, batch, tokens, context, _STEPS.value), None))
          batch *= 2
      if not self._windows(start, grid, todo, params, timed_cell):
        return False
    return True

  def rounds(self, start) -> bool:
    """Round ms = depth x drafter step + the verify forward of depth + 1 tokens, both from
    this sitting's measurements (the drafter as a one-layer model of the target's width)."""
    grid = self.results.get("decode_grid", {})
    accept = {k: float(v) for k, v in (a.split("=") for a in _ACCEPT.value)}
    drafter = self.results.setdefault("drafter_step", {})
    out = self.results.setdefault("rounds", {})
    for name in _SHAPES.value:
      cfg = published_shape(name)
      one = dataclasses.replace(cfg, num_layers=1)
      dgraph, dparams = random_params(one)
      context = int(_CONTEXTS.value[0])
      batches = sorted({int(k.split("/")[2]) for k in grid if k.startswith(f"{name}/{context}/")})
      todo = [
        (f"{name}/{batch}", Forward(dgraph, one, batch, 1, context, _STEPS.value), None)
        for batch in batches
        if f"{name}/{batch}" not in drafter
      ]
      if not self._windows(start, drafter, todo, dparams, lambda f, p: f.ms(p, _REPS.value)):
        return False
      for batch in batches:
        key = f"{name}/{batch}"
        step = grid.get(f"{name}/{context}/{batch}/1", {}).get("ms")
        for arm, length in accept.items():
          depth = int(arm.removeprefix("chain"))
          verify = grid.get(f"{name}/{context}/{batch}/{depth + 1}", {}).get("ms")
          if step and verify:
            steps = (depth * drafter[key] + verify) / step
            out[f"{name}/{arm}/{batch}"] = {"round_steps": steps, "pays": steps < length}
      self.save()
      for arm in accept:
        paying = [b for b in batches if out.get(f"{name}/{arm}/{b}", {}).get("pays")]
        out[f"{name}/{arm}/crossover"] = max(paying) if paying else None
    return True

  def engine_rounds(self, start) -> bool:
    """The engine's own speculative round of the first shape (`rollout.profile.round_costs`,
    the round timed whole) with a random drafter, at each `--engine_round_batches` row count
    and each `--accept` chain, after prompts of the first context: ms a round beside ms a
    plain decode step of the same rows, the round in decode steps; beside it the `rounds`
    stage's composition of the same (drafter steps + a verify forward), which it checks."""
    name, context = _SHAPES.value[0], int(_CONTEXTS.value[0])
    cfg, graphdef, params = self.model(name)
    drafter = nnx.split(init_drafter(cfg))
    cells = self.results.setdefault("engine_rounds", {})
    rng = np.random.default_rng(0)
    for batch in map(int, _ENGINE_ROUND_BATCHES.value):
      for arm in (a.split("=")[0] for a in _ACCEPT.value):
        key = f"{name}/{arm}/{batch}"
        if key in cells:
          continue
        if self._late(start):
          return False
        engine = RolloutEngine(
          graphdef,
          cfg,
          EngineConfig(
            max_prompt_len=context,
            max_batch=batch,
            spec_threshold=batch,
            spec_strategies=(arm,),
            spec_adaptive=False,
            matmul_precision=None,  # the platform's default, as the grid's loops run
          ),
          drafter_graphdef=drafter[0],
        )
        prompts = rng.integers(1, cfg.vocab_size, (batch, context)).tolist()
        began = time.perf_counter()
        # As many rounds a call as the composition's loops have forwards: a loop's per-call
        # work is spread over as many steps in both (RESULTS.md, 2026-12-05).
        prof = round_costs(
          engine,
          params,
          drafter[1],
          prompts,
          SamplingConfig(),
          arm,
          rounds=_STEPS.value,
          reps=_REPS.value,
          stages=(),
        )
        cells[key] = {
          **{k: prof[k] for k in ("step_ms", "round_ms", "round_steps", "view", "rounds")},
          "composed_round_steps": self.results.get("rounds", {}).get(key, {}).get("round_steps"),
          "seconds": time.perf_counter() - began,
        }
        print(key, json.dumps(cells[key]), flush=True)
        self.save()
    return True

  def update(self, start) -> bool:
    return self._update("update", _UPDATE_SCAN.value)

  def update_unrolled(self, start) -> bool:
    return self._update("update_unrolled", False)

  def _update(self, key: str, scan: bool) -> bool:
    self.models.clear()
    program = UpdateProgram(
      _UPDATE_SHAPE.value or _SHAPES.value[-1], _UPDATE_ROWS.value, _UPDATE_WIDTH.value, scan
    )
    compiled, opt, compile_s = program.compile()
    params = random_params(program.cfg)[1]
    rows, width = _UPDATE_ROWS.value, _UPDATE_WIDTH.value
    batch = {
      "tokens": jax.random.randint(jax.random.key(0), (rows, width), 0, program.cfg.vocab_size),
      "mask": jnp.ones((rows, width), jnp.float32),
      "advantages": jnp.linspace(-1.0, 1.0, rows, dtype=jnp.float32),
    }
    state = opt.init(params)
    params, state, _ = jax.block_until_ready(compiled(params, state, batch, None))
    times = []
    for _ in range(max(_REPS.value // 2, 2)):
      t = time.perf_counter()
      params, state, _ = jax.block_until_ready(compiled(params, state, batch, None))
      times.append(time.perf_counter() - t)
    seconds = float(np.median(times))
    spec = spec_sheet()
    peak = spec[1] * 1e12 if spec else matmul_flops()
    stats = jax.devices()[0].memory_stats() or {}
    self.results[key] = {
      **program.facts(),
      "seconds": seconds,
      "mfu": 6 * program.cfg.num_params * rows * width / seconds / peak,
      "peak_flops": peak,
      "peak_bytes": stats.get("peak_bytes_in_use", measured_bytes(compiled)),
      "compile_s": compile_s,
    }
    print(json.dumps(self.results[key], indent=1), flush=True)
    return True

  def update_compile(self, start) -> bool:
    """The update stages' programs (scanned layers, then unrolled) compiled from their
    shapes alone, nothing allocated: XLA's bytes for each beside the plan, and compile
    seconds, on any host (a CPU's rehearsal of the 1.5B update, whose float32 masters and
    Adam state do not fit its memory)."""
    cells = self.results.setdefault("update_compile", {})
    for label, scan in (("scanned", True), ("unrolled", False)):
      if label in cells:
        continue
      if self._late(start):
        return False
      program = UpdateProgram(
        _UPDATE_SHAPE.value or _SHAPES.value[-1], _UPDATE_ROWS.value, _UPDATE_WIDTH.value, scan
      )
      compiled, _, compile_s = program.compile()
      cells[label] = {
        **program.facts(),
        "platform": jax.devices()[0].platform,
        "compiled_bytes": measured_bytes(compiled),
        "compile_s": compile_s,
      }
      print(f"update_compile {label}: {json.dumps(cells[label])}", flush=True)
      self.save()
    return True


def error_words(e: Exception) -> str:
  return f"{type(e).__name__}: {e}"[:1000]


def compile_window(part, params) -> tuple[dict, dict]:
  """`part`'s programs ([(key, Forward, attention form or None)]) lowered, each under its
  form (read when its loop is traced), and compiled together (`compile_together`); where
  that fails (a program the device refuses: cuDNN's kernel, a shape), each alone, and those
  failing again kept as their errors. Returns the compiles' figures and {key: error}."""

  def lower(fwd, form):
    if fwd.lowered is None:
      with attention_form(form) if form else contextlib.nullcontext():
        fwd.lower(params)

  try:
    for _, fwd, form in part:
      lower(fwd, form)
    return compile_together([fwd for _, fwd, _ in part], params), {}
  except Exception as e:
    say(f"compiling {len(part)} together failed ({error_words(e)[:200]}): one at a time")
  compiles, failed = add_compiles({}, None), {}
  for key, fwd, form in (p for p in part if p[1].compiled is None):
    try:
      lower(fwd, form)
      add_compiles(compiles, compile_together([fwd], params))
    except Exception as e:
      failed[key] = error_words(e)
  return compiles, failed


def add_compiles(total: dict, compiles: dict | None) -> dict:
  """`compile_together`'s figures summed into `total` (filled in where empty): programs and
  seconds added, workers the most any compile had."""
  for field, zero in _NO_COMPILES.items():
    total.setdefault(field, zero)
  if compiles is not None:
    for field in _NO_COMPILES.keys() - {"workers"}:
      total[field] += compiles[field]
    total["workers"] = max(total["workers"], compiles["workers"])
  return total


_NO_COMPILES = {"programs": 0, "workers": 1, "lower_s": 0.0, "sum_s": 0.0, "wall_s": 0.0}


def _until_done(cell: dict) -> str:
  # Cells of sittings before 2026-12-02 (2026-12-05 for two rows) have no such figure.
  ms, two = cell.get("ms_in_loop_until_done"), cell.get("ms_in_loop_two_rows")
  text = "" if ms is None else f"{ms:.2f} ms in the engine's kind of loop; "
  return text + ("" if two is None else f"{two:.2f} ms as two rows (one a pad); ")


def _decode(cell: dict) -> str:
  """An overhead cell's figures in words (`overhead_cell`)."""
  if "ms_in_loop" not in cell:
    return "XLA refused the flags"
  value = (
    f"{cell['ms_in_loop']:.2f} ms in a device loop; {_until_done(cell)}"
    f"{cell['ms_per_call']:.2f} ms a call"
  )
  busy = cell.get("trace", {}).get("busy_ms_per_step")
  if "over_busy" in cell:
    value += (
      f"; kernels busy {busy:.3f} ms a step ({cell['trace']['kernels_per_step']:.0f} of them),"
      f" the loop's step {cell['over_busy']:.2f}x that"
    )
  for tokens, forward in cell.get("forwards", {}).items():
    value += f"; {tokens}-token forward {forward['steps']:.2f} steps"
  return value


def summary(results: dict) -> str:
  """The README's "at real sizes" rows from what the stages measured so far."""
  lines = ["| figure | value |", "|---|---|"]
  b1 = results.get("decode_b1")
  if b1:
    bound = (
      f", {100 * b1['bound_fraction']:.0f}% of the HBM bound" if "bound_fraction" in b1 else ""
    )
    lines.append(
      f"| {b1['shape']} batch-1 decode step, context {b1['context']} | {b1['ms_in_loop']:.2f} ms "
      f"in a device loop{bound}; {_until_done(b1)}{b1['ms_per_call']:.2f} ms a call |"
    )
  for setting, cell in results.get("overhead", {}).items():
    lines.append(f"| batch-1 decode, XLA_FLAGS += `{setting or '(nothing)'}` | {_decode(cell)} |")
  for policy, cells in results.get("policy_overhead", {}).items():
    for setting, cell in cells.items():
      lines.append(
        f"| {policy} batch-1 decode, XLA_FLAGS += `{setting or '(nothing)'}` | {_decode(cell)} |"
      )
  for variant, cell in results.get("decode_b1_profile", {}).items():
    if "ms" not in cell:
      lines.append(f"| batch-1 decode, attention form {variant} | {cell['error'][:200]} |")
      continue
    kinds = ", ".join(f"{k} {ms:.3f}" for k, ms in cell.get("by_kind_ms_per_step", {}).items())
    lines.append(
      f"| {cell['shape']} batch-1 decode, attention form {variant} | {cell['ms']:.2f} ms a step; "
      f"kernels ms a step: {kinds or cell.get('error', '-')} |"
    )
  bw = results.get("bandwidth")
  if bw:
    spec = f" (spec sheet {bw['spec'][0]} TB/s)" if bw.get("spec") else ""
    lines.append(f"| copy bandwidth | {bw['gb_per_s']:.0f} GB/s{spec} |")
  for key, value in results.get("rounds", {}).items():
    if key.endswith("/crossover"):
      lines.append(f"| {key.removesuffix('/crossover')}: last batch where a round pays | {value} |")
  for key, cell in results.get("engine_rounds", {}).items():
    composed = cell.get("composed_round_steps")
    composed = f"; composed from its parts {composed:.2f}" if composed else ""
    lines.append(
      f"| {key}: the engine's round | {cell['round_steps']:.2f} decode steps "
      f"({cell['round_ms']:.2f} ms, a step {cell['step_ms']:.2f} ms){composed} |"
    )
  for key in ("update", "update_unrolled"):
    up = results.get(key)
    if up:
      layers = "layers scanned" if up.get("scan_layers") else "layers unrolled"
      lines.append(
        f"| {up['shape']} update, {up['rows']} x {up['width']} tokens, {layers} | MFU "
        f"{up['mfu']:.2f}, peak {up['peak_bytes'] / 2**30:.1f} GiB (planned "
        f"{up['planned_bytes'] / 2**30:.1f}), compile {up['compile_s']:.0f} s |"
      )
  for label, cell in results.get("update_compile", {}).items():
    lines.append(
      f"| {cell['shape']} update compiled from shapes on {cell['platform']}, {cell['rows']} x "
      f"{cell['width']} tokens, layers {label} | XLA {cell['compiled_bytes'] / 2**30:.1f} GiB, "
      f"planned {cell['planned_bytes'] / 2**30:.1f}; compile {cell['compile_s']:.0f} s |"
    )
  for stage, compiles in results.get("compiles", {}).items():
    lines.append(f"| {stage}: compiles | {compiled_words(compiles)} |")
  for stage, failures in results.get("failures", {}).items():
    if failures:
      lines.append(f"| {stage}: failed {len(failures)} times | {failures[-1][:200]} |")
  return "\n".join(lines)


def main(argv):
  del argv
  # Allocate device memory as used, not 75% of it up front: the overhead stage's processes
  # share the device with this one (read when the backend starts, after this line).
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  if _CHILD.value:  # the overhead stage's process: XLA_FLAGS as inherited
    print(json.dumps(overhead_cell()))
    return
  os.makedirs(_OUT.value, exist_ok=True)
  stages = Stages(_OUT.value)
  print(f"devices: {jax.devices()}", flush=True)
  for stage in _STAGES.value:
    if not hasattr(Stages, stage) or stage.startswith("_"):
      raise app.UsageError(f"unknown stage {stage!r}")
    stages.run(stage)
  print(summary(stages.results), flush=True)


if __name__ == "__main__":
  app.run(main)

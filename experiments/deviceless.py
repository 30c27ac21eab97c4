r"""This project's programs compiled for a device this host does not have, an H100 or a TPU,
and what one step of them launches counted from the compiled module: where a small model's
decode step goes on a GPU (one launch is a few microseconds whatever the kernel does), and
whether the programs compile and fit there, checked before a device sitting rather than in
one.

XLA compiles for a GPU it is only told about (a target description: an H100 SXM here)
through the CUDA plugin, with no driver and no device, and for a TPU topology through
libtpu. The plugins (several GB for CUDA) go in an environment of their own; the project
itself needs nothing of them (the jax the devices in experiments/RESULTS.md ran; on Python
3.11, "jax[cuda13]==0.10.2"):

  python3.12 -m venv /tmp/gpu && /tmp/gpu/bin/pip install -e . "jax[cuda13]==0.11.2"
  /tmp/gpu/bin/python experiments/deviceless.py --out=runs/deviceless_h100
  python3 -m venv /tmp/tpu && /tmp/tpu/bin/pip install -e '.[tpu]'
  /tmp/tpu/bin/python experiments/deviceless.py --target=v6e:2x2 --out=runs/deviceless_v6e

`--target`: "h100", or a TPU topology ("v5e:2x2", "v6e:2x2"), whose first chip compiles.
On a GPU each counted instruction is a kernel launch; a TPU runs a program without
launches, so there the count is of its fused ops, comparable between programs, not with a
GPU's.

Each cell: `--steps` forwards of `tokens` new tokens per row at `batch` rows
(`experiments.forwards.Forward`, the loop experiments/real_sizes.py times on a device),
compiled; its loop body's kernels by kind and the bytes they write
(`experiments.traces.loop_kernels`), and XLA's temporary bytes. GEMM autotuning needs a
device, so products keep XLA's default tilings: counts, not speeds. Attention, the head and
the layers' products take what "auto" takes on the target's platform (`target_settings`: the
dots on a GPU, a bfloat16 policy's head in bfloat16, one-row products paired on a GPU:
`models.products`; `--row_products=single` traces them unpaired; `--attention=fused`
traces cuDNN's fused attention, `models.attention.attend_fused`). `--layer` prints the
kernels of a cell's first layer with what each computes. `--engines` compiles the rollout
engine's own plain chunk at one row (`rollout.programs.decode_chunk`: sampling, stop check
and hidden capture included, at the engine's matmul precision) of a config file's policy and
engine, its step as one token and as two (`EngineConfig.one_row_step`), and one round of
each `--spec` strategy at one row (`rollout.speculative.spec_decode_chunk`, a random
drafter's shapes; the drafter's steps run out, `experiments.traces.trip_kernels`), in
two-token steps (`--engine_dtype=bfloat16`: the policy computing in bfloat16 over its
float32 weights, cast once a rollout as `RolloutEngine.generate` casts them). `--updates`
compiles the policy update at `--update_shape` too
(real_sizes.py's `update` program: float32 masters, micro-batches of 2 rows, rematerialised
layers) with its layers scanned and unrolled: the bytes XLA's GPU compiler gives it beside
the memory plan (`parallel.memory.plan_memory`), and its compile seconds on this host.
`--drafter_updates` compiles mode tlt's online drafter update at `--drafter_shape`'s width
for each batch (rows x row length) and `--drafter_settings` entry
(`DrafterTrainConfig.logit_chunk`, and `remat_attention`): its bytes and temporaries.

  /tmp/gpu/bin/python experiments/deviceless.py --shapes= --engines= \
      --drafter_updates=4x2048,16x2048,4x8192 --out=runs/deviceless_drafter
"""

from __future__ import annotations

import os

# No accelerator is looked for (the plugins only compile), and the CUDA plugin's check of
# its libraries' versions, which asks the driver, is skipped: both before jax is imported.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.forwards import (  # noqa: E402
  DrafterUpdateProgram,
  Forward,
  UpdateProgram,
  config_file,
  decode_shape,
)
from experiments.traces import describe_kernels, loop_kernels, trip_kernels  # noqa: E402
from tlt_jax import configuration  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.models.attention import ATTENTION_FORMS, attention_form  # noqa: E402
from tlt_jax.models.drafter import Drafter, init_drafter_cache  # noqa: E402
from tlt_jax.models.platform import platform_choices  # noqa: E402
from tlt_jax.models.precision import compute_params  # noqa: E402
from tlt_jax.models.products import one_row_products  # noqa: E402
from tlt_jax.models.transformer import Transformer  # noqa: E402
from tlt_jax.parallel.memory import measured_bytes  # noqa: E402
from tlt_jax.rollout import programs  # noqa: E402
from tlt_jax.rollout.engine import EnginePrograms  # noqa: E402
from tlt_jax.rollout.speculative import SpecStrategy  # noqa: E402
from tlt_jax.rollout.state import round_up  # noqa: E402

_OUT = flags.DEFINE_string("out", "runs/deviceless", "output folder (deviceless.json)")
_SHAPES = flags.DEFINE_list(
  "shapes",
  ["configs/sd_bench.py", "qwen3-8b"],
  "published shapes or this project's config files (`experiments.forwards.decode_shape`)",
)
_BATCHES = flags.DEFINE_list("batches", ["1", "2"], "rows")
_TOKENS = flags.DEFINE_list("tokens", ["1", "5"], "new tokens per row")
_CONTEXT = flags.DEFINE_integer("context", 1024, "cached tokens before the first forward")
_STEPS = flags.DEFINE_integer("steps", 16, "forwards in the loop")
_LAYER = flags.DEFINE_string("layer", "", "shape/batch/tokens whose first layer is printed")
_ENGINES = flags.DEFINE_list(
  "engines", ["configs/sd_bench.py"], "config files whose engine's one-row chunk is compiled"
)
_ENGINE_DTYPE = flags.DEFINE_string(
  "engine_dtype", "", "the --engines policies' compute dtype ('': the config file's; bfloat16)"
)
_SPEC = flags.DEFINE_list(
  "spec", ["chain4", "chain8"], "speculative strategies whose one-row round --engines compile"
)
_UPDATES = flags.DEFINE_list("updates", [], "update programs: scanned, unrolled")
_UPDATE_SHAPE = flags.DEFINE_string("update_shape", "qwen2.5-1.5b", "the update's shape")
_UPDATE_ROWS = flags.DEFINE_integer("update_rows", 8, "update rows (micro-batches of 2)")
_UPDATE_WIDTH = flags.DEFINE_integer("update_width", 1024, "update row length")
_DRAFTER_UPDATES = flags.DEFINE_list(
  "drafter_updates", [], "online drafter update batches, rows x row length (4x8192)"
)
_DRAFTER_SHAPE = flags.DEFINE_string("drafter_shape", "qwen3-8b", "the drafter's target shape")
_DRAFTER_SETTINGS = flags.DEFINE_list(
  "drafter_settings",
  ["0", "1024", "1024/remat"],
  "the drafter updates' `logit_chunk` (0: none), '/remat' with `remat_attention`",
)
_TARGET = flags.DEFINE_string("target", "h100", "h100, or a TPU topology (v5e:2x2, v6e:2x2)")
_ROW_PRODUCTS = flags.DEFINE_string(
  "row_products",
  "",
  "the layers' one-row products (models.products.ROW_PRODUCTS; empty: the target's choice)",
)
_ATTENTION = flags.DEFINE_enum(
  "attention",
  "",
  ["", *ATTENTION_FORMS],
  "attention's form (models.attention.ATTENTION_FORMS; '': what 'auto' takes on the target)",
)
_TARGET_CONFIG = flags.DEFINE_string(
  "target_config", "", "--target=h100: a GpuTargetConfig in text form (default: H100_SXM)"
)

# NVIDIA H100 SXM5 as XLA's GPU compiler reads a device (xla.GpuTargetConfig, text form):
# 132 SMs at 1.98 GHz, 228 KiB shared memory an SM (227 opt-in a block), 50 MiB L2,
# 3.35 TB/s, 80 GB; the CUDA and cuDNN versions of the plugin pinned above.
H100_SXM = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 28 }
runtime_version { major: 13 minor: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


def target_sharding(target: str) -> tuple[jax.sharding.NamedSharding, str]:
  """`--target`'s device (a TPU topology's first chip) as a one-device sharding, and its
  name: arguments placed there compile for it."""
  from jax.experimental import topologies

  if target == "h100":
    config = H100_SXM
    if _TARGET_CONFIG.value:
      with open(_TARGET_CONFIG.value) as f:
        config = f.read()
    needs = "the CUDA plugin (see this script's docstring)"
    describe = dict(platform="cuda", target_config=config, topology="1x1x1")
  else:
    needs = f"libtpu (pip install -e '.[tpu]') and a TPU topology it knows, not {target!r}"
    describe = dict(platform="tpu", topology_name=target)
  try:
    device = topologies.get_topology_desc(**describe).devices[0]
  except Exception as e:  # jax says only "topology not implemented" without the plugin
    raise SystemExit(f"compiling for {target} here needs {needs}: {e}") from e
  mesh = jax.sharding.Mesh([device], ("device",))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), device.device_kind


def placed(tree, sharding):
  """`tree`'s shapes on `sharding`'s device: a program lowered from them compiles for it."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def compiled_cell(shape: str, batch: int, tokens: int, sharding) -> tuple[dict, str]:
  """One cell (see the module docstring) and its compiled module's text."""
  cfg = decode_shape(shape)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  fwd = Forward(graphdef, cfg, batch, tokens, _CONTEXT.value, _STEPS.value)
  start = time.perf_counter()
  compiled = fwd.fn.lower(*placed((abstract, *fwd.abstract), sharding)).compile()
  seconds = time.perf_counter() - start
  text = compiled.as_text()
  counted = loop_kernels(text)
  return {
    "kernels": counted["kernels"],
    "by_kind": counted["by_kind"],
    "written_bytes": counted["written_bytes"],
    "layers": cfg.num_layers,
    "compile_s": round(seconds, 2),
    "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
  }, text


def first_layer(text: str, layers: int) -> dict[str, str]:
  """The loop body's kernels up to one layer's share, each described from the module."""
  names = loop_kernels(text)["names"]
  return describe_kernels(text, names[: -(-len(names) // layers) + 4])


class _Compiler:
  """An `ExecutablePool` stand-in: compiles each program it is asked for for the target
  (its inputs placed there), and keeps none."""

  def __init__(self, sharding):
    self.sharding = sharding

  def get(self, key, fn, args, donate_argnums=(), compiler_options=None, on_miss="compile"):
    del key, on_miss  # every program compiles here, for the target
    jitted = jax.jit(fn, donate_argnums=donate_argnums, compiler_options=compiler_options)
    return jitted.lower(*placed(args, self.sharding)).compile()


def _engine(name: str, sharding, **changes) -> dict:
  """Config file `name`'s engine programs (`rollout.engine.EnginePrograms`, its config with
  `changes`) compiling for the target, with what its one-row programs take: the policy and
  a drafter (abstract, in the compute dtype), a one-row state after a prefill, and the
  cache view that holds `--context` tokens."""
  config = config_file(name)
  if _ENGINE_DTYPE.value:
    config.model.dtype = _ENGINE_DTYPE.value
  tokenizer = get_tokenizer(config.task.tokenizer)
  cfg = configuration.model_config(config, tokenizer)
  engine = dataclasses.replace(configuration.engine_config(config, tokenizer), **changes)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  dgraph, dparams = nnx.split(nnx.eval_shape(lambda: Drafter(cfg, rngs=nnx.Rngs(0))))
  # In the compute dtype, as `RolloutEngine.generate` hands them to its programs.
  params, dparams = jax.eval_shape(lambda p: compute_params(p, cfg), (params, dparams))
  made = EnginePrograms(graphdef, cfg, engine, _Compiler(sharding), drafter_graphdef=dgraph)
  sampling = configuration.sampling_config(config)
  one = jax.ShapeDtypeStruct((1,), jnp.int32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  prefill = functools.partial(
    programs.prefill,
    graphdef,
    static=made.static(sampling),
    slots=engine.slots,
    cache_slots=engine.cache_slots,
  )
  prompts = jax.ShapeDtypeStruct((1, engine.prompt_buckets[0]), jnp.int32)
  state = jax.eval_shape(prefill, params, prompts, one, one, one, one, key)
  view = round_up(min(_CONTEXT.value, engine.cache_slots), engine.view_buckets)
  dcache = jax.eval_shape(lambda: init_drafter_cache(cfg, 1, engine.drafter_slots))
  return dict(
    made=made,
    sampling=sampling,
    params=params,
    dparams=dparams,
    dcache=dcache,
    state=state,
    key=key,
    view=view,
    one=one,
  )


def engine_cell(name: str, paired: bool, sharding) -> dict:
  """The engine's plain chunk of config file `name` at one row (see the module docstring),
  at the cache view that holds `--context` tokens."""
  e = _engine(name, sharding, one_row_step="paired" if paired else "single")
  args = (e["params"], e["state"], e["key"], jax.ShapeDtypeStruct((), jnp.int32))
  counted = loop_kernels(e["made"].decode(e["sampling"], e["view"], args).as_text())
  keep = ("kernels", "by_kind", "written_bytes")
  return {**{k: counted[k] for k in keep}, "view": e["view"]}


def spec_cell(name: str, strategy: str, sharding) -> dict:
  """The engine's speculative chunk of config file `name` at one row: one round of
  `strategy` (a random drafter's shapes), the drafter's steps run out
  (`experiments.traces.trip_kernels`)."""
  e = _engine(name, sharding)
  scalar = jax.ShapeDtypeStruct((), jnp.int32)
  args = (e["params"], e["dparams"], e["state"], e["dcache"], e["one"], None, e["key"], scalar)
  compiled = e["made"].spec(e["sampling"], SpecStrategy.parse(strategy), e["view"], args)
  return {**trip_kernels(compiled.as_text()), "view": e["view"]}


def updates(sharding, device: str) -> dict:
  """`--updates`' programs compiled for the target: XLA's bytes beside the plan's, or, where
  XLA finds they do not fit the device's memory, what it said."""
  cells = {}
  for label in _UPDATES.value:
    if label not in ("scanned", "unrolled"):
      raise app.UsageError(f"--updates takes scanned and unrolled, got {label!r}")
    program = UpdateProgram(
      _UPDATE_SHAPE.value, _UPDATE_ROWS.value, _UPDATE_WIDTH.value, label == "scanned", sharding
    )
    cell = program.facts()
    what = f"{cell['shape']} update, {cell['rows']} x {cell['width']} tokens, layers {label}"
    planned = cell["planned_bytes"] / 2**30
    try:
      compiled, _, seconds = program.compile()
    except jax.errors.JaxRuntimeError as e:  # a TPU's compiler refuses what does not fit
      cells[f"update/{label}"] = {**cell, "error": str(e)[:400]}
      print(f"{what}: not compiled for {device} (planned {planned:.1f} GiB): {str(e)[:200]}")
      continue
    cell.update(compiled_bytes=measured_bytes(compiled), compile_s=round(seconds, 1))
    cells[f"update/{label}"] = cell
    gib = cell["compiled_bytes"] / 2**30
    print(
      f"{what}: XLA for {device} {gib:.1f} GiB, planned {planned:.1f} ({gib / planned:.2f}x); "
      f"compiled in {seconds:.0f} s here",
      flush=True,
    )
  return cells


def drafter_updates(sharding, device: str) -> dict:
  """`--drafter_updates`' online drafter updates (`experiments.forwards.DrafterUpdateProgram`)
  compiled for the target under each `--drafter_settings`: XLA's bytes and temporaries."""
  cfg = decode_shape(_DRAFTER_SHAPE.value)
  cells = {}
  for label in _DRAFTER_UPDATES.value:
    rows, width = map(int, label.split("x"))
    for setting in _DRAFTER_SETTINGS.value:
      program = DrafterUpdateProgram(cfg, rows, width, setting, placed_on=sharding)
      compiled, seconds = program.compile()
      temp = compiled.memory_analysis().temp_size_in_bytes
      cell = dict(shape=_DRAFTER_SHAPE.value, rows=rows, width=width)
      cell.update(logit_chunk=program.logit_chunk, remat_attention=program.remat_attention)
      cell.update(compiled_bytes=measured_bytes(compiled), temp_bytes=temp)
      cell.update(planned_bytes=program.planned().total)
      cells[f"drafter_update/{label}/{setting}"] = {**cell, "compile_s": round(seconds, 1)}
      print(
        f"{_DRAFTER_SHAPE.value} drafter update, {rows} x {width} positions, {setting}: XLA "
        f"for {device} {cell['compiled_bytes'] / 2**30:.1f} GiB (temporaries "
        f"{temp / 2**30:.1f}; planned {cell['planned_bytes'] / 2**30:.1f}); compiled in "
        f"{seconds:.0f} s here",
        flush=True,
      )
  return cells


def main(argv):
  del argv
  sharding, device = target_sharding(_TARGET.value)
  print(f"compiling for {device}", flush=True)
  os.makedirs(_OUT.value, exist_ok=True)
  products, form = _ROW_PRODUCTS.value, _ATTENTION.value
  with (
    target_settings(_TARGET.value),
    one_row_products(products) if products else contextlib.nullcontext(),
    attention_form(form) if form else contextlib.nullcontext(),
  ):
    cells = compile_cells(sharding, device)
  with open(os.path.join(_OUT.value, "deviceless.json"), "w") as f:
    settings = {"row_products": products or "auto", "attention": form or "auto"}
    json.dump({"target": device, **settings, **cells}, f, indent=1)


def target_settings(target: str):
  """A scope where programs trace what "auto" takes on `target`'s platform, not on this
  host's CPU (`models.platform_choices`: the dots on a GPU, a bfloat16 policy's head in
  bfloat16 off a CPU, one-row products paired on a GPU)."""
  return platform_choices("gpu" if target == "h100" else "tpu")


def _written_mb(cell: dict) -> str:
  """A cell's MB written a step (`experiments.traces.loop_kernels`), on a GPU only: a TPU's
  module does not name its in-place updates as a GPU's does, so there the sum counts whole
  buffers a step writes a few slots of."""
  return f"{cell['written_bytes'] / 1e6:.1f}" if _TARGET.value == "h100" else "-"


def compile_cells(sharding, device: str) -> dict:
  """Every cell the flags name, compiled for the target and printed as it ends."""
  cells = {}
  print("| program | kernels a step | a layer | by kind | MB written a step | compile s |")
  print("|---|---|---|---|---|---|")
  for shape in _SHAPES.value:
    for batch in map(int, _BATCHES.value):
      for tokens in map(int, _TOKENS.value):
        key = f"{shape}/{batch}/{tokens}"
        cell, text = compiled_cell(shape, batch, tokens, sharding)
        cells[key] = cell
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(cell["by_kind"].items()))
        print(
          f"| {key} | {cell['kernels']} | {cell['kernels'] / cell['layers']:.1f} | {kinds} | "
          f"{_written_mb(cell)} | {cell['compile_s']:.1f} |",
          flush=True,
        )
        if key == _LAYER.value:
          for name, what in first_layer(text, cell["layers"]).items():
            print(f"    {name}: {what}")
  for name in _ENGINES.value:
    for paired in (False, True):
      cell = engine_cell(name, paired, sharding)
      cells[f"engine/{name}/{'paired' if paired else 'single'}"] = cell
      kinds = ", ".join(f"{k} {n}" for k, n in sorted(cell["by_kind"].items()))
      step = "two tokens" if paired else "one token"
      print(
        f"{name}'s engine, one row, its step as {step}: {cell['kernels']} kernels ({kinds}), "
        f"{_written_mb(cell)} MB written"
      )
    step = cells[f"engine/{name}/paired"]["kernels"]
    for strategy in _SPEC.value:
      cell = spec_cell(name, strategy, sharding)
      cells[f"engine/{name}/{strategy}"] = cell
      kinds = ", ".join(f"{k} {n}" for k, n in sorted(cell["by_kind"].items()))
      print(
        f"{name}'s engine, one row, a {strategy} round: {cell['kernels']} kernels ({kinds}), "
        f"{cell['kernels'] / step:.2f} two-token steps' worth, "
        f"{_written_mb(cell)} MB written"
        + (
          f"; {cell['unknown_trips']} inner loops of unknown trips" if cell["unknown_trips"] else ""
        )
      )
  cells.update(updates(sharding, device))
  cells.update(drafter_updates(sharding, device))
  return cells


if __name__ == "__main__":
  app.run(main)

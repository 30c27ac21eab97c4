"""The programs this project's device measurements time and count: `Forward` (a model's
cached forwards of a few new tokens per row, looped in one program), `decode_shape` (a
published layer shape or one of this project's policies), the bytes a decode step reads,
and the policy update at a published shape (`UpdateProgram`). experiments/real_sizes.py
times them on a device; experiments/deviceless.py compiles them for a GPU on a host
without one."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import importlib
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from experiments.common import published_shape
from tlt_jax import configuration
from tlt_jax.data import get_tokenizer
from tlt_jax.drafter import drafter_optimizer, make_drafter_update
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.drafter import Drafter, target_head_graphdef, target_head_params
from tlt_jax.models.precision import head_precision
from tlt_jax.models.products import one_row_products
from tlt_jax.models.transformer import KVCache, Transformer
from tlt_jax.parallel.memory import (
  DrafterPlan,
  compiled_update,
  plan_drafter_update,
  plan_memory,
)
from tlt_jax.rollout.pool import default_compile_workers


def kv_bytes(cfg: ModelConfig, batch: int, slots: int) -> int:
  return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * slots * batch * 2


def weight_bytes(params) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))


class Forward:
  """`n` cached forwards of `tokens` new tokens per row in one device loop (each feeding
  its argmax to the next, so none is loop-invariant), at a cache view covering `context`
  and every new token; compile seconds recorded.

  `until_done`: the loop the engine runs (`rollout.programs`), whose condition reads a
  device value (there: whether every row has finished), so XLA cannot count its trips; on
  a GPU such a loop copies its condition to the host and waits for the device at every
  trip (XLA's WhileThunk), where a counted loop's trips are queued without waiting.
  `float32_head`: traced under `models.precision.head_precision("float32")` (a bfloat16
  policy's head as it ran on every platform until 2026-12-06; "auto" keeps it on CPUs).
  `single_row_products`: traced under `models.products.one_row_products("single")` (a
  one-row product as XLA takes it, as on every platform until 2026-12-06; "auto" pairs its
  row on a GPU).
  `options`: the program's jax.jit compiler_options (`utils.cpu_fusions.compiler_options`)."""

  def __init__(
    self,
    graphdef,
    cfg,
    batch,
    tokens,
    context,
    n,
    until_done: bool = False,
    float32_head: bool = False,
    single_row_products: bool = False,
    options=None,
  ):
    self.view = 1 << math.ceil(math.log2(context + n * tokens))
    self.batch, self.tokens, self.context, self.n = batch, tokens, context, n
    self.float32_head, self.single_row_products = float32_head, single_row_products

    def run(params, cache, toks):
      model = nnx.merge(graphdef, params)

      def body(i, carry):
        cache, toks = carry
        start = context + i * tokens
        pos = start + jnp.broadcast_to(jnp.arange(tokens), (batch, tokens))
        h, cache, _ = model(
          toks, pos, cache=cache, cache_len=jnp.full((batch,), start), view_len=self.view
        )
        nxt = jnp.argmax(model.logits(h), axis=-1).astype(jnp.int32)
        return cache, nxt

      if not until_done:
        return lax.fori_loop(0, n, body, (cache, toks))

      def cond(carry):  # argmax is never negative, which XLA cannot know
        i, _, toks = carry
        return (i < n) & jnp.all(toks >= 0)

      step = lambda carry: (carry[0] + 1, *body(carry[0], carry[1:]))
      return lax.while_loop(cond, step, (jnp.int32(0), cache, toks))[1:]

    cache = jax.eval_shape(lambda: KVCache.zeros(cfg, batch, self.view))
    toks = jax.ShapeDtypeStruct((batch, tokens), jnp.int32)
    self.cfg = cfg
    self.fn = jax.jit(run, donate_argnums=1, compiler_options=options or None)
    self.abstract = (cache, toks)
    self.lowered = self.compiled = None

  def lower(self, params) -> None:
    """Traces and lowers the loop (Python work: on the caller's thread, under its settings,
    e.g. `models.attention.attention_form`); `compile_together` compiles it."""
    t = time.perf_counter()
    with contextlib.ExitStack() as scopes:
      if self.float32_head:
        scopes.enter_context(head_precision("float32"))
      if self.single_row_products:
        scopes.enter_context(one_row_products("single"))
      self.lowered = self.fn.lower(params, *self.abstract)
    self.lower_s = time.perf_counter() - t

  def compile(self, params) -> float:
    """Lowers and compiles; returns (and keeps, as `compile_s`) the seconds."""
    compile_together([self], params)
    return self.compile_s

  def first(self, params):
    """The loop's outputs from a fixed random cache (the first call `ms` times from)."""
    cache = jax.tree.map(
      lambda x: jax.random.normal(jax.random.key(1), x.shape, x.dtype),
      KVCache.zeros(self.cfg, self.batch, self.view),
    )
    toks = jnp.ones((self.batch, self.tokens), jnp.int32)
    return jax.block_until_ready(self.compiled(params, cache, toks))

  def runner(self, params):
    """A callable running the loop once from where its last call left the cache and
    tokens (the first call from `first`'s outputs): calls to time, alone or interleaved
    with another program's."""
    carry = list(self.first(params))

    def call():
      carry[:] = jax.block_until_ready(self.compiled(params, *carry))

    return call

  def ms(self, params, reps: int) -> float:
    """Median ms per forward."""
    call, times = self.runner(params), []
    for _ in range(reps):
      t = time.perf_counter()
      call()
      times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)) / self.n


def compile_together(forwards, params, workers: int | None = None) -> dict:
  """Compiles `forwards` (those not compiled yet) at once: each lowered on this thread
  (those not lowered yet; tracing holds the GIL), then XLA's compiles on up to `workers`
  threads (`rollout.pool.default_compile_workers()`: one on a CPU, up to 8 beside an
  accelerator, whose compiles are host work the device waits on). Each keeps `compile_s`
  (its lowering and its own compile, which overlapped the others') and `compiled_with`
  (the programs compiled at once). Returns {"programs", "workers", "lower_s" (their
  lowerings, one after another on this thread), "sum_s" (their `compile_s`), "wall_s" (from
  the first lowering, here or by the caller, to the last compile's end)}."""
  forwards = [f for f in forwards if f.compiled is None]
  start = time.perf_counter()
  lowered_before = sum(f.lower_s for f in forwards if f.lowered is not None)  # by the caller
  for fwd in forwards:
    if fwd.lowered is None:
      fwd.lower(params)
  workers = max(1, min(workers or default_compile_workers(), len(forwards)))

  def finish(fwd):
    t = time.perf_counter()
    fwd.compiled, fwd.lowered = fwd.lowered.compile(), None
    fwd.compile_s = fwd.lower_s + time.perf_counter() - t
    fwd.compiled_with = len(forwards)

  with concurrent.futures.ThreadPoolExecutor(workers, "compile") as pool:
    futures = [pool.submit(finish, fwd) for fwd in forwards]
  # A compile XLA refused beside others (e.g. the device's memory for GEMM autotuning) is
  # tried again alone; one that fails alone raises.
  for fwd, done in zip(forwards, futures, strict=True):
    if isinstance(done.exception(), jax.errors.JaxRuntimeError) and workers > 1:
      finish(fwd)
    else:
      done.result()
  return {
    "programs": len(forwards),
    "workers": workers,
    "lower_s": sum(f.lower_s for f in forwards),
    "sum_s": sum(f.compile_s for f in forwards),
    "wall_s": lowered_before + time.perf_counter() - start,
  }


def config_file(name: str):
  """One of this project's config files by path, a variant after ":" as on a command line
  ("configs/regime.py:gpu"): its ml_collections config."""
  path, _, variant = name.partition(":")
  module = importlib.import_module(path.removesuffix(".py").replace(os.sep, "."))
  return module.get_config(variant)


def decode_shape(name: str) -> ModelConfig:
  """A published shape (`published_shape`), or the policy of one of this project's config
  files (`config_file`: "configs/sd_bench.py") in its dtypes."""
  if ".py" not in name:
    return published_shape(name)
  config = config_file(name)
  return configuration.model_config(config, get_tokenizer(config.task.tokenizer))


class UpdateProgram:
  """The policy update at a published shape, as experiments/real_sizes.py measures it:
  float32 master weights (as the update keeps them) and the shape's bfloat16 products,
  AdamW, micro-batches of 2 rows, rematerialised layers (as one scan or unrolled), one
  optimiser step on policy; on `sharding`'s device (default: this host's)."""

  MICRO = 2

  def __init__(self, name: str, rows: int, width: int, scan: bool, sharding=None):
    self.name, self.rows, self.width, self.scan = name, rows, width, scan
    self.cfg = dataclasses.replace(published_shape(name), param_dtype="float32")
    self.sharding = sharding

  def compile(self):
    """(the program compiled from shapes, its optimizer, compile seconds):
    `parallel.memory.compiled_update`, nothing allocated."""
    t = time.perf_counter()
    compiled, opt = compiled_update(
      self.cfg,
      self.rows,
      self.width,
      remat=True,
      micro_batch=self.MICRO,
      scan_layers=self.scan,
      on_policy=True,
      sharding=self.sharding,
    )
    return compiled, opt, time.perf_counter() - t

  def facts(self) -> dict:
    """The program's description and the memory plan's update bytes for it."""
    plan = plan_memory(
      self.cfg,
      devices=1,
      micro_batch_rows=self.MICRO,
      row_len=self.width,
      rollout_rows=0,
      slots=self.width,
      remat=True,
      micro_batches=self.rows // self.MICRO,
    )
    return {
      "shape": self.name,
      "rows": self.rows,
      "width": self.width,
      "scan_layers": self.scan,
      "planned_bytes": plan.update_peak,
    }


class DrafterUpdateProgram:
  """Mode tlt's online drafter update (`drafter.make_drafter_update`) for a target of shape
  `cfg`: the drafter's float32 parameters and AdamW state, the target's embedding, final
  norm and head (`models.drafter.target_head_params`: what the update reads, in the shape's
  own dtype), a [rows, width] batch of bfloat16 features, under
  `logit_chunk` and `remat_attention` (`drafter.DrafterTrainConfig`); on `placed_on`'s
  device (default: this host's)."""

  def __init__(self, cfg: ModelConfig, rows: int, width: int, setting: str, placed_on=None):
    self.cfg, self.rows, self.width, self.sharding = cfg, rows, width, placed_on
    self.logit_chunk, self.remat_attention = self.parse(setting)
    target = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))[1]
    target = target_head_params(target)
    self.target_graphdef = target_head_graphdef(cfg)
    self.graphdef, drafter = nnx.split(nnx.eval_shape(lambda: Drafter(cfg, rngs=nnx.Rngs(0))))
    drafter = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), drafter)
    self.optimizer = drafter_optimizer(1e-3, 10)
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=placed_on)  # noqa: E731
    batch = {k: spec((rows, width), jnp.int32) for k in ("tokens", "positions", "segment_ids")}
    batch["loss_mask"] = spec((rows, width), jnp.float32)
    batch["features"] = spec((rows, width, cfg.d_model), jnp.bfloat16)
    state = (drafter, jax.eval_shape(self.optimizer.init, drafter), target)
    self.abstract = (*jax.tree.map(lambda x: spec(x.shape, x.dtype), state), batch)
    self.update = make_drafter_update(
      self.graphdef,
      self.target_graphdef,
      self.optimizer,
      donate=False,
      logit_chunk=self.logit_chunk,
      remat_attention=self.remat_attention,
    )

  @staticmethod
  def parse(setting: str) -> tuple[int, bool]:
    """ "1024/remat" -> (logit_chunk 1024, remat_attention True); "0": neither."""
    chunk, _, remat = setting.partition("/")
    if not chunk.isdigit() or remat not in ("", "remat"):
      raise ValueError(f"a drafter update setting is <logit_chunk>[/remat], got {setting!r}")
    return int(chunk), remat == "remat"

  def planned(self) -> DrafterPlan:
    """`parallel.memory.plan_drafter_update` for this program (one device)."""
    return plan_drafter_update(
      dataclasses.replace(self.cfg, param_dtype="float32"),
      rows=self.rows,
      width=self.width,
      logit_chunk=self.logit_chunk,
      remat_attention=self.remat_attention,
      head_dtype=self.cfg.param_dtype,
    )

  def compile(self):
    """(the program compiled from shapes, compile seconds), nothing allocated."""
    t = time.perf_counter()
    compiled = self.update.lower(*self.abstract).compile()
    return compiled, time.perf_counter() - t

  def random_args(self, seed: int = 0) -> tuple:
    """Random arguments of the program's shapes, made on its device: normal weights and
    features (scale 0.02), rows packed with samples of 512 positions, loss on all."""
    leaves, treedef = jax.tree.flatten(self.abstract)
    keys = jax.random.split(jax.random.key(seed), len(leaves))

    def fill(key, x):
      if jnp.issubdtype(x.dtype, jnp.floating):
        return (0.02 * jax.random.normal(key, x.shape, jnp.float32)).astype(x.dtype)
      return jnp.zeros(x.shape, x.dtype)

    args = jax.tree.unflatten(treedef, [fill(k, x) for k, x in zip(keys, leaves, strict=True)])
    *state, batch = args
    column = jnp.arange(self.width)
    batch["tokens"] = jnp.broadcast_to(column % self.cfg.vocab_size, (self.rows, self.width))
    batch["positions"] = jnp.broadcast_to(column % 512, (self.rows, self.width))
    batch["segment_ids"] = jnp.broadcast_to(column // 512 + 1, (self.rows, self.width))
    batch["loss_mask"] = jnp.ones((self.rows, self.width), jnp.float32)
    return jax.device_put((*state, batch), self.sharding) if self.sharding else (*state, batch)

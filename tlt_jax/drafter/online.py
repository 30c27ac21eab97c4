"""The drafter as a trainable, versioned object: params, optax state, buffer, update.

`OnlineDrafter.update(target_params)` runs one optax step on a batch sampled
from its `DrafterBuffer` and bumps `version`; the rollout engine picks the new
params up at its next chunk boundary. The same object trains the drafter
offline (a warm-start: many updates on the warm-start policy's rollouts) and
online (a few updates per RL step, fitted into idle slices by
`tlt_jax.scheduler.SliceScheduler`). One process holds one copy of the drafter
and every update is one program over the full batch, so replicas cannot drift
(under a mesh, jit keeps the params replicated).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from tlt_jax.drafter.buffer import DrafterBuffer
from tlt_jax.drafter.training import drafter_optimizer, make_drafter_update
from tlt_jax.models.drafter import target_head_graphdef, target_head_params
from tlt_jax.models.precision import compute_params
from tlt_jax.parallel.meshes import replicated, rows_sharding
from tlt_jax.utils.cpu_fusions import checked_cpu_fusions


@dataclasses.dataclass(frozen=True)
class DrafterTrainConfig:
  """Online drafter training.

  Attributes:
    learning_rate: AdamW peak rate.
    warmup_steps: linear warm-up updates.
    decay_steps: 0: the rate stays at its peak after the warm-up (online training has no
      end); > 0: a cosine to a tenth of it at this many updates (an offline fit).
    logit_weight: weight of the soft cross-entropy to the target's next-token
      distribution beside the feature regression (EAGLE's 0.1; 1.0 distils harder).
    teacher_temperature: temperature of that distribution (1: the policy's; 0: one-hot on
      its argmax, for a drafter that serves greedy rollouts).
    logit_chunk: > 0: that term over a batch's positions this many at a time (0, or a
      batch of no more positions: all at once). A batch of 4 x 8,192 positions at a 152k
      vocabulary holds 18.5 GiB in each of its float32 logits arrays: a real model's
      drafter needs chunks.
    remat_attention: recompute the drafter's attention scores a query block at a time in
      the backward pass (`models.attention.rematerialised_blocks`) rather than keep every
      block's, for rows of thousands of positions (experiments/RESULTS.md, 2026-12-06).
    weight_decay, grad_clip: AdamW weight decay, global-norm clip.
    batch_rows, row_len: a packed update batch is [batch_rows, row_len] pairs
      (row_len 0: the engine's cache slots).
    buffer_rows: rows the buffer holds, at most (see buffer_bytes).
    buffer_bytes: host memory the buffer may take: its rows' tokens (buffer_rows x slots
      int32s) and their features packed, each row's own positions (length - 1) end to end
      (`DrafterBuffer`); when the rows outgrow it, the oldest go first. 2 GiB holds about
      262,000 positions of a 4096-wide bfloat16 feature (some 130 rows of 2,000 tokens,
      where whole rows of 8,192 slots would hold 32).
    buffer_dtype: the features' storage dtype ("bfloat16" halves float32's bytes; the
      drafter's loss upcasts).
    keep_steps: RL steps of rollouts the buffer samples from (newest first).
    min_rows: updates wait until the buffer holds this many rows it may sample: a step's
      first engine calls hold the samples of a prompt or two, and updates on those alone
      fit them and cost accept length everywhere else (1: update as soon as a row is in).
    seed: batch sampling.
    cpu_fusions: XLA:CPU's library fusions of the update's program (`utils.cpu_fusions`):
      "dots" (YNNPACK for its products only) or "xla" (XLA's default); ignored off a CPU.
  """

  learning_rate: float = 1e-3
  warmup_steps: int = 10
  decay_steps: int = 0
  logit_weight: float = 0.1
  teacher_temperature: float = 1.0
  logit_chunk: int = 0
  remat_attention: bool = False
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  batch_rows: int = 4
  row_len: int = 0
  buffer_rows: int = 512
  buffer_bytes: int = 2**31
  buffer_dtype: str = "bfloat16"
  keep_steps: int = 2
  min_rows: int = 1
  seed: int = 0
  cpu_fusions: str = "dots"

  def __post_init__(self):
    checked_cpu_fusions(self.cpu_fusions)
    if not (self.learning_rate > 0):
      raise ValueError(f"DrafterTrainConfig.learning_rate must be > 0, got {self.learning_rate}")
    for name in ("batch_rows", "buffer_rows", "keep_steps", "min_rows"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 1:
        raise ValueError(f"DrafterTrainConfig.{name} must be a positive int, got {v!r}")
    if not isinstance(self.buffer_bytes, int) or self.buffer_bytes < 1:
      raise ValueError(
        f"DrafterTrainConfig.buffer_bytes must be a positive int, got {self.buffer_bytes!r}"
      )
    if self.buffer_dtype not in ("float32", "bfloat16", "float16"):
      raise ValueError(
        "DrafterTrainConfig.buffer_dtype must be float32, bfloat16 or float16, got "
        f"{self.buffer_dtype!r}"
      )
    if not isinstance(self.remat_attention, bool):
      raise ValueError(
        f"DrafterTrainConfig.remat_attention must be a bool, got {self.remat_attention!r}"
      )
    if not self.logit_weight >= 0:
      raise ValueError(f"DrafterTrainConfig.logit_weight must be >= 0, got {self.logit_weight}")
    if not self.teacher_temperature >= 0:
      raise ValueError(
        f"DrafterTrainConfig.teacher_temperature must be >= 0, got {self.teacher_temperature}"
      )
    for name in ("warmup_steps", "row_len", "decay_steps", "logit_chunk"):
      v = getattr(self, name)
      if not isinstance(v, int) or v < 0:
        raise ValueError(f"DrafterTrainConfig.{name} must be an int >= 0, got {v!r}")
    if self.decay_steps and not 0 <= self.warmup_steps < self.decay_steps:
      raise ValueError(
        f"DrafterTrainConfig.decay_steps={self.decay_steps} must exceed warmup_steps="
        f"{self.warmup_steps} (or be 0: no decay)"
      )


def buffer_positions(cfg: DrafterTrainConfig, slots: int, feature_dim: int) -> int:
  """Packed feature positions of the drafter's buffer: what `buffer_bytes` holds beside
  `buffer_rows` rows' tokens (`DrafterBuffer` keeps no more than those rows could fill)."""
  token_bytes = cfg.buffer_rows * slots * 4
  position_bytes = feature_dim * np.dtype(jnp.dtype(cfg.buffer_dtype)).itemsize
  positions = (cfg.buffer_bytes - token_bytes) // position_bytes
  if positions < slots:
    raise ValueError(
      f"DrafterTrainConfig.buffer_bytes={cfg.buffer_bytes} holds {cfg.buffer_rows} rows' "
      f"tokens ({token_bytes} bytes) and {max(positions, 0)} feature positions, fewer than "
      f"one full row's {slots} ({position_bytes} bytes each): raise it or lower buffer_rows"
    )
  return int(positions)


class OnlineDrafter:
  """Params, optimizer state, data buffer and version counter of one drafter."""

  def __init__(
    self,
    graphdef: nnx.GraphDef,
    params: nnx.State,
    config: DrafterTrainConfig,
    *,
    slots: int,
    feature_dim: int,
  ):
    self.graphdef, self.config = graphdef, config
    self.row_len = config.row_len or slots
    self.buffer = DrafterBuffer(
      config.buffer_rows,
      slots,
      feature_dim,
      config.keep_steps,
      dtype=jnp.dtype(config.buffer_dtype),
      positions=buffer_positions(config, slots, feature_dim),
    )
    self.optimizer = drafter_optimizer(
      config.learning_rate,
      config.warmup_steps,
      config.decay_steps or None,
      weight_decay=config.weight_decay,
      grad_clip=config.grad_clip,
    )
    # The target's config is the drafter's (`models.drafter.Drafter`). Updates read the part
    # of the target it uses (`target_reads`): freed devices hold only that.
    self.target_config = nnx.merge(graphdef, params).config
    # Not donated: the rollout engine may still hold the previous version's arrays.
    self._update = make_drafter_update(
      graphdef,
      target_head_graphdef(self.target_config),
      self.optimizer,
      logit_weight=config.logit_weight,
      cpu_fusions=config.cpu_fusions,
      teacher_temperature=config.teacher_temperature,
      logit_chunk=config.logit_chunk,
      remat_attention=config.remat_attention,
      donate=False,
    )
    self._compiled: dict[Any, Any] = {}  # the update's executables by argument layout
    self.compile_seconds = 0.0  # spent compiling them (callers leave it out of timings)
    # Host seconds building update batches from the buffer (inside every update's time; at
    # a real model's width a batch is hundreds of MiB: RESULTS.md, 2026-12-05).
    self.sample_seconds = 0.0
    # Two batches' arrays, refilled in turn once the update that read one has finished
    # (fresh arrays of hundreds of MiB cost more to fault in than to fill).
    self._batches: list[dict[str, np.ndarray] | None] = [None, None]
    self._batch_readers: list[Any] = [None, None]  # each batch's last update's outputs
    self._turn = 0
    self.params = params
    self.opt_state = self.optimizer.init(params)
    self.version = 0  # optimizer updates applied
    self._rng = np.random.default_rng(config.seed)
    self.last_metrics: dict[str, jax.Array] = {}

  def ready(self) -> bool:
    """Whether the buffer holds enough rows to train on (`config.min_rows`)."""
    return len(self.buffer) >= self.config.min_rows

  def observe(self, result: Any, step: int) -> int:
    """Adds a RolloutResult's rows (tokens + target features) from RL step `step`."""
    return self.buffer.add(result.tokens, result.hidden, result.prompt_len, result.length, step)

  def update(self, target_params: nnx.State, mesh: Mesh | None = None) -> dict[str, jax.Array]:
    """One optax step on a fresh buffer batch; dispatched asynchronously (returns device
    arrays). The sampling rng is re-seeded from the version, so resume repeats batches.

    With `mesh` (the devices a rollout's long tail left free) the drafter state moves
    there, replicated, and the batch's rows are split over it when they divide evenly:
    one SPMD program, so the replicas cannot drift apart."""
    self.params, self.opt_state, target_params, batch = self._placed(
      self.params, self.opt_state, target_params, mesh
    )
    self.params, self.opt_state, metrics = self._run_update(
      self.params, self.opt_state, target_params, batch
    )
    self.version += 1
    self.last_metrics = metrics
    return metrics

  def dry_run(self, target_params: nnx.State, mesh: Mesh | None = None) -> dict[str, jax.Array]:
    """`update`'s program on `mesh` and the next batch, its results thrown away: compiles
    (first call per mesh) and times an update without changing the drafter (params,
    optimizer state, version, buffer). The optimizer state is copied first: the update
    donates it."""
    opt_state = jax.tree.map(jnp.copy, self.opt_state)
    params, opt_state, target_params, batch = self._placed(
      self.params, opt_state, target_params, mesh
    )
    return self._run_update(params, opt_state, target_params, batch)[2]

  def _run_update(self, *args):
    """The update on `args`, compiled ahead for each new layout of them (shapes, dtypes,
    placements) with the seconds counted in `compile_seconds`: a first update, or one on
    newly freed devices, costs a compile that a step's timing must not charge to TLT."""
    leaves, treedef = jax.tree.flatten(args)
    key = (treedef, *((x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves))
    fn = self._compiled.get(key)
    if fn is None:
      t = time.perf_counter()
      fn = self._compiled[key] = self._update.lower(*args).compile()
      self.compile_seconds += time.perf_counter() - t
    outputs = fn(*args)
    self._batch_readers[self._turn] = outputs[2]
    return outputs

  def _placed(self, params, opt_state, target_params, mesh: Mesh | None):
    """(params, opt_state, the target's part the update reads, batch) on `mesh` (None: as
    they are), the batch sampled for the current version."""
    if not self.ready():
      raise ValueError(
        f"the drafter buffer holds {len(self.buffer)} rows it may sample, fewer than "
        f"min_rows={self.config.min_rows}: observe rollouts before updating"
      )
    rng = np.random.default_rng([self.config.seed, self.version])
    self._turn ^= 1
    jax.block_until_ready(self._batch_readers[self._turn])  # done reading these arrays
    t = time.perf_counter()
    batch = self.buffer.sample(
      rng, self.config.batch_rows, self.row_len, out=self._batches[self._turn]
    )
    self._batches[self._turn] = batch
    self.sample_seconds += time.perf_counter() - t
    target_params = self.target_reads(target_params)
    if mesh is not None:
      rep = replicated(mesh)
      params, opt_state, target_params = jax.device_put((params, opt_state, target_params), rep)
      fits = self.config.batch_rows % mesh.devices.size == 0
      batch = jax.device_put(batch, rows_sharding(mesh) if fits else rep)
    else:
      batch = jax.device_put(batch)
    return params, opt_state, target_params, batch

  def target_reads(self, target_params: nnx.State) -> nnx.State:
    """What an update reads of the target: its params outside the layers
    (`models.drafter.target_head_params`) in the compute dtype, as the rollout's drafts read
    them (`models.precision.compute_params`; leaves already cast stay the same arrays)."""
    return compute_params(target_head_params(target_params), self.target_config)

  # ---------------------------------------------------------------- checkpoints
  def state_dict(self) -> dict[str, Any]:
    """Host copies of everything resume needs: "train" (params and optimizer state),
    "buffer" (the data buffer's arrays) and "meta" (JSON: version, the buffer's meta); safe
    to write asynchronously while training goes on (later updates replace, and donate, the
    device arrays; the buffer is overwritten in place)."""
    tree = {"params": nnx.to_pure_dict(self.params), "opt_state": self.opt_state}
    tree = jax.tree.map(np.array, tree)  # copies (np.asarray may alias a CPU device buffer)
    arrays, meta = self.buffer.state_dict()
    return {"train": tree, "buffer": arrays, "meta": {"version": self.version, "buffer": meta}}

  def abstract_state(self) -> dict[str, Any]:
    """The shapes, dtypes and shardings `state_dict()["train"]` restores into."""
    tree = {"params": nnx.to_pure_dict(self.params), "opt_state": self.opt_state}
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Restores what `state_dict` saved."""
    nnx.replace_by_pure_dict(self.params, state["train"]["params"])
    self.opt_state = state["train"]["opt_state"]
    self.version = int(state["meta"]["version"])
    self.buffer.load_state_dict(dict(state["buffer"]), state["meta"]["buffer"])

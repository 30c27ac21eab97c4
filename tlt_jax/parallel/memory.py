"""Per-device memory of an RL job, before running it: parameters, optimizer, activations,
logits and the rollout's KV cache, for a model, a mesh and the batch shapes.

The estimate is arithmetic on the shapes (`plan_memory`); `experiments/memory_plan.py`
prints it for real model sizes and compares it with what XLA reports for compiled
programs on this machine. Conventions:
- the policy update holds the master parameters, their gradients and Adam's two moments
  (all in `param_dtype`), split over every device with FSDP, over "tensor" otherwise; a
  step that sums its gradient over several micro-batches of a narrower compute dtype holds
  up to one more gradient's bytes (jaxlib 0.10's compiled updates: 0.2-0.8 of one more at
  four micro-batches than at one, none in float32 throughout; jaxlib 0.11's: none;
  experiments/RESULTS.md, 2026-12-05 and 2026-12-06), counted whole, so the plan stays an
  upper bound under both. That is the update with its layers as one scan: unrolled, XLA
  kept 1.28x the plan at Qwen2.5-1.5B's shape (jaxlib 0.10);
- the forward reads a compute-dtype copy, split like the masters, plus one layer gathered;
- saved activations per layer and token: the residual stream and norm outputs (4 x d), the
  attention projections (q, o: 2 x heads x head_dim; k, v: 2 x kv_heads x head_dim), the
  MLP's gate, up and product (3 x mlp), in the compute dtype, and the attention
  probabilities (heads x row_len, float32), split over "tensor"; with remat, only each
  layer's input (d) and one layer's activations;
- the loss's float32 logits: tokens x vocabulary three times (logits, log-softmax, their
  gradient), or tokens x chunk with `vocab_chunk`;
- the rollout holds the weights in the compute dtype (split over its tensor group), a
  KV cache of rows x slots x layers x 2 x kv_heads x head_dim, its rows split over the
  data replicas, and per row and slot its token, log-prob and (`capture_hidden`, every
  mode by default) last-layer hidden state in the compute dtype, plus in modes sd and tlt
  the drafter's one-layer cache;
- mode tlt's online drafter update (`plan_drafter_update`) runs beside the rollout, on its
  devices or on those its long tail frees, which still hold the rollout's weights and cache.

The drafter update's plan is checked against XLA's programs for an H100 at Qwen3-8B's width
(experiments/deviceless.py --drafter_updates; experiments/RESULTS.md, 2026-12-06).
"""

from __future__ import annotations

import dataclasses

from tlt_jax.models.config import ModelConfig

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes per device. The update and the rollout run one after the other; the master
  parameters and optimizer state stay resident through both."""

  params: int
  grads: int
  grad_sum: int
  optimizer: int
  compute_params: int
  activations: int
  logits: int
  rollout_params: int
  kv_cache: int
  rollout_state: int  # tokens, log-probs, hidden states, the drafter's cache
  drafter: int = 0  # mode tlt's drafter update (`plan_drafter_update`), beside the rollout

  @property
  def resident(self) -> int:
    return self.params + self.optimizer

  @property
  def update_peak(self) -> int:
    transient = self.grads + self.grad_sum + self.compute_params + self.activations
    return self.resident + transient + self.logits

  @property
  def rollout_peak(self) -> int:
    return self.resident + self.rollout_params + self.kv_cache + self.rollout_state

  @property
  def peak(self) -> int:
    return max(self.update_peak, self.rollout_peak + self.drafter)

  def rows(self) -> list[tuple[str, int]]:
    peaks = [("update peak", self.update_peak), ("rollout peak", self.rollout_peak)]
    if self.drafter:
      peaks.append(("drafter peak", self.rollout_peak + self.drafter))
    return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)] + peaks


def _itemsize(dtype: str) -> int:
  return 4 if dtype == "float32" else 2


def layer_params(model: ModelConfig) -> int:
  d, h, kv, hd = model.d_model, model.num_heads, model.num_kv_heads, model.head_dim
  attn = d * h * hd + 2 * d * kv * hd + h * hd * d
  return attn + 3 * d * model.mlp_dim


def plan_memory(
  model: ModelConfig,
  *,
  devices: int,
  tensor: int = 1,
  fsdp: bool = True,
  micro_batch_rows: int,
  row_len: int,
  rollout_rows: int,
  slots: int,
  vocab_chunk: int = 0,
  rollout_tensor: int = 1,
  remat: bool = False,
  micro_batches: int = 1,
  capture_hidden: bool = True,
  speculative: bool = False,
  drafter: DrafterPlan | None = None,
) -> MemoryPlan:
  """Per-device bytes of one GRPO step's update and rollout (see the module docstring).

  Args:
    model: the policy.
    devices: devices of the update's mesh (data x tensor).
    tensor: the update mesh's tensor axis.
    fsdp: parameters and optimizer split over every device (else over "tensor" only).
    micro_batch_rows, row_len: one micro-batch of the update (packed rows x width).
    rollout_rows, slots: the rollout's batch and cache slots per row.
    vocab_chunk: the loss's vocabulary chunk (0: the whole vocabulary at once).
    rollout_tensor: the rollout's tensor group (1: weights whole on every device).
    remat: layers recompute their activations in the backward pass: every layer's input
      (the residual stream) is saved and one layer's activations live at a time.
    micro_batches: micro-batches one optimiser step sums its gradient over.
    capture_hidden: the rollout keeps every position's hidden state (`EngineConfig`).
    speculative: the rollout drafts (modes sd and tlt): a one-layer drafter cache per row.
    drafter: mode tlt's drafter update (`plan_drafter_update`; None: modes without one).
  """
  if devices % tensor or devices % rollout_tensor:
    raise ValueError(f"tensor={tensor} / rollout_tensor={rollout_tensor} must divide {devices}")
  data = devices // tensor
  pb, cb = _itemsize(model.param_dtype), _itemsize(model.dtype)
  n = model.num_params
  split = devices if fsdp else tensor
  params = n * pb // split
  tokens = -(-micro_batch_rows * row_len // data)  # per data shard
  d, h, kv, hd = model.d_model, model.num_heads, model.num_kv_heads, model.head_dim
  per_token = (4 * d + 2 * h * hd + 2 * kv * hd + 3 * model.mlp_dim) * cb + h * row_len * 4
  if remat:
    activations = model.num_layers * tokens * d * cb + tokens * per_token // tensor
  else:
    activations = model.num_layers * tokens * per_token // tensor
  width = min(vocab_chunk, model.vocab_size) if vocab_chunk else model.vocab_size
  logits = 3 * tokens * width * 4 // (1 if vocab_chunk else tensor)
  kv_rows = -(-rollout_rows // (devices // rollout_tensor))
  kv_heads_split = rollout_tensor if kv % rollout_tensor == 0 else 1
  kv_cache = kv_rows * slots * model.num_layers * 2 * kv * hd * cb // kv_heads_split
  per_slot = 8 + (d * cb if capture_hidden else 0) + (2 * kv * hd * cb if speculative else 0)
  return MemoryPlan(
    params=params,
    grads=params,
    grad_sum=params if micro_batches > 1 and model.dtype != model.param_dtype else 0,
    optimizer=2 * params,
    compute_params=n * cb // split + layer_params(model) * cb // tensor,
    activations=activations,
    logits=logits,
    rollout_params=n * cb // rollout_tensor,
    kv_cache=kv_cache,
    rollout_state=kv_rows * slots * per_slot,
    drafter=drafter.total if drafter is not None else 0,
  )


@dataclasses.dataclass(frozen=True)
class DrafterPlan:
  """Bytes per device of one online drafter update (`drafter.make_drafter_update`)."""

  state: int  # its params before and after, AdamW's two moments and the gradient
  head: int  # the target's embedding and head it reads: one copy, cast before the rollout
  batch: int  # features and the index columns
  activations: int  # its one layer's, kept for the backward pass, attention scores among them
  logits: int  # float32 logits of the loss's head products, the whole batch's or a chunk's

  @property
  def total(self) -> int:
    return self.state + self.head + self.batch + self.activations + self.logits


def plan_drafter_update(
  model: ModelConfig,
  *,
  rows: int,
  width: int,
  devices: int = 1,
  logit_chunk: int = 0,
  remat_attention: bool = False,
  feature_dtype: str = "bfloat16",
  head_dtype: str | None = None,
  causal_block: int = 128,
) -> DrafterPlan:
  """Per-device bytes of mode tlt's drafter update for a target `model` (the drafter's own
  params are in `model.param_dtype`, like the policy's masters it starts beside).

  Args:
    rows, width: the update's packed batch (`DrafterTrainConfig.batch_rows`, `row_len`),
      its rows split over `devices` when they divide evenly (`OnlineDrafter.update`).
    logit_chunk, remat_attention: `DrafterTrainConfig`'s memory settings.
    feature_dtype: the batch's features (`DrafterTrainConfig.buffer_dtype`).
    head_dtype: the target's embedding and head as the update reads them (default
      `model.dtype`: `OnlineDrafter.target_reads` casts the policy's masters).
    causal_block: `models.attention`'s query block.

  Activations: the fc's input and output, the layer's as the policy's (see the module
  docstring), and the causal attention's scores, float32 and in the compute dtype, for
  every query and the keys before it; with `remat_attention` one query block's scores at a
  time and the rows' [width, width] masks. Logits: two [positions, vocabulary] float32
  arrays for the whole batch, or three of a chunk's positions and the chunks' gradient
  ([positions, D], `drafter.training`)."""
  pb, cb = _itemsize(model.param_dtype), _itemsize(model.dtype)
  d, h, v = model.d_model, model.num_heads, model.vocab_size
  params = 2 * d * d + layer_params(model) + 4 * d  # fc, the layer, its norms
  local_rows = rows // devices if rows % devices == 0 else rows
  tokens = local_rows * width
  per_token = (6 * d + 2 * h * model.head_dim + 2 * model.num_kv_heads * model.head_dim) * cb
  per_token += 3 * model.mlp_dim * cb
  block = min(causal_block, width)
  if remat_attention:
    scores = local_rows * width * (width + h * block * (4 + cb))
  else:
    scores = tokens * h * (width + block) // 2 * (4 + cb)
  if logit_chunk and logit_chunk < tokens:
    logits = 3 * logit_chunk * v * 4 + tokens * d * cb
  else:
    logits = 2 * tokens * v * 4
  head = (1 if model.tie_embeddings else 2) * v * d * _itemsize(head_dtype or model.dtype)
  return DrafterPlan(
    state=5 * params * pb,
    head=head,
    batch=tokens * (d * _itemsize(feature_dtype) + 16),
    activations=tokens * per_token + scores,
    logits=logits,
  )


def format_plan(plan: MemoryPlan, capacity_gib: float | None = None) -> str:
  """A two-column table in GiB; with `capacity_gib`, whether the peak fits."""
  lines = [f"{name:>16}  {value / GIB:9.2f} GiB" for name, value in plan.rows()]
  if capacity_gib is not None:
    fits = plan.peak <= capacity_gib * GIB
    lines.append(f"{'fits':>16}  {'yes' if fits else 'NO'} ({capacity_gib:g} GiB per device)")
  return "\n".join(lines)


def qwen25(size: str) -> ModelConfig:
  """Qwen2.5's published shapes (config.json of the Hugging Face releases), bf16 compute
  over float32 masters."""
  shapes = {
    "1.5B": dict(num_layers=28, d_model=1536, num_heads=12, num_kv_heads=2, mlp_dim=8960),
    "7B": dict(num_layers=28, d_model=3584, num_heads=28, num_kv_heads=4, mlp_dim=18944),
    "32B": dict(num_layers=64, d_model=5120, num_heads=40, num_kv_heads=8, mlp_dim=27648),
  }
  if size not in shapes:
    raise ValueError(f"size must be one of {sorted(shapes)}, got {size!r}")
  return ModelConfig(
    vocab_size=151936 if size == "1.5B" else 152064,
    head_dim=128,
    qkv_bias=True,
    tie_embeddings=size == "1.5B",
    dtype="bfloat16",
    param_dtype="float32",
    rope_theta=1e6,
    max_position=32768,
    **shapes[size],
  )


def compiled_update(
  model: ModelConfig,
  rows: int,
  width: int,
  vocab_chunk: int = 0,
  remat: bool = False,
  micro_batch: int | None = None,
  scan_layers: bool = False,
  on_policy: bool = False,
  sharding=None,
):
  """One policy update (AdamW) of `rows` x `width` tokens on one device in micro-batches of
  `micro_batch` rows (default: one of all `rows`), compiled from shapes alone: nothing is
  allocated, so real sizes compile on a small host (`make_policy_update`'s options).
  `sharding`: the one device every input is placed on (default: this host's); a GPU's or a
  TPU's compiles it for that device from a host without one (experiments/deviceless.py).
  Returns the compiled program and its optimizer (whose `init` makes the state it takes)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from tlt_jax.models.transformer import Transformer
  from tlt_jax.rl import PolicyLossConfig, UpdateConfig, make_optimizer, make_policy_update

  graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(model, rngs=nnx.Rngs(0))))
  ucfg = UpdateConfig(micro_batch=micro_batch or rows)
  opt = make_optimizer(ucfg)
  loss_cfg = PolicyLossConfig(vocab_chunk=vocab_chunk)
  update = make_policy_update(
    graphdef,
    opt,
    loss_cfg,
    ucfg.micro_batch,
    remat=remat,
    on_policy=on_policy,
    scan_layers=scan_layers,
  )
  batch = {
    "tokens": jax.ShapeDtypeStruct((rows, width), jnp.int32),
    "mask": jax.ShapeDtypeStruct((rows, width), jnp.float32),
    "advantages": jax.ShapeDtypeStruct((rows,), jnp.float32),
  }
  if not on_policy:  # an update that takes its old log-probs from the rollout
    batch["old_logp"] = jax.ShapeDtypeStruct((rows, width), jnp.float32)
  state = jax.eval_shape(opt.init, params)
  args = (params, state, batch)
  if sharding is not None:
    args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), args)
  return update.lower(*args, None).compile(), opt


def compiled_update_bytes(model: ModelConfig, rows: int, width: int, *args, **kwargs) -> int:
  """XLA's bytes for `compiled_update`'s program (the same arguments), for checking
  `plan_memory` against the compiler."""
  return measured_bytes(compiled_update(model, rows, width, *args, **kwargs)[0])


def measured_bytes(compiled) -> int:
  """Bytes XLA reports for a compiled program: arguments + outputs + temporaries, less
  aliased (donated) outputs."""
  m = compiled.memory_analysis()
  return int(
    m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
  )

"""One jitted policy-gradient step: log-probs, loss, micro-batched gradients,
a non-finite guard and the optimizer update.

The step recomputes log-probs exactly as the sampler recorded them: of the
distribution tokens are drawn from, tempered and top-k / top-p truncated
(decode.sampling.sampling_log_probs), so on the first update after a rollout the
ratio new / old is 1 up to float error, and the ratio always refers to the policy
that generated the data. The KL reference alone is scored untruncated (token_logprobs).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jaxtyping import Array, Float, Int

from tlt_jax.decode.sampling import SamplingConfig, sampling_log_probs
from tlt_jax.models.attention import checked_key_windows
from tlt_jax.models.attention import key_windows as attention_key_windows
from tlt_jax.models.precision import compute_model
from tlt_jax.rl.logprobs import chunked_logprobs
from tlt_jax.rl.loss import PolicyLossConfig, policy_loss
from tlt_jax.utils.cpu_fusions import checked_cpu_fusions, compiler_options
from tlt_jax.utils.optim import FROZEN, clipped_adamw, grouped_clipped_adamw
from tlt_jax.utils.trees import path_name

BATCH_KEYS = ("tokens", "mask", "old_logp", "advantages")
# A packed batch (rl/packing.py) has these too: several samples per row.
PACKED_KEYS = ("positions", "segment_ids", "weights")
# Optional: the rollout engine's recorded log-probs, compared with the update's own
# (metrics["rollout_logp_gap"]).
ROLLOUT_KEY = "rollout_logp"
# The log-prob given to a token outside the truncated kept set (probability 0 under the
# sampled distribution; see token_logprobs).
OUT_OF_SET_LOGP = -30.0


def token_logprobs(
  graphdef: nnx.GraphDef,
  params: nnx.State,
  tokens: Int[Array, "B T"],
  temperature: float | Float[Array, ""],
  *,
  top_k: int = 0,
  top_p: float = 1.0,
  with_entropy: bool = False,
  positions: Int[Array, "B T"] | None = None,
  segment_ids: Int[Array, "B T"] | None = None,
  vocab_chunk: int = 0,
  remat: bool = False,
  scan_layers: bool = False,
) -> tuple[Float[Array, "B T"], Float[Array, "B T"] | None]:
  """Log-prob of each token given its prefix under the sampled distribution: the
  policy tempered, then top-k / top-p truncated and renormalised, as the rollout draws
  (decode.sampling.sampling_log_probs).

  Rows start at position 0 (the rollout layout: prompt then completion);
  whatever follows a row's length cannot change earlier log-probs (causal).
  Packed rows (rl/packing.py) give `positions` and `segment_ids`: each sample
  then sees only itself, and the first token of a sample gets a meaningless
  value (it is a prompt token: never counted).

  Args:
    graphdef: the model's static structure.
    params: its parameters.
    tokens: [B, T] int32.
    temperature: > 0; logits are divided by it before log_softmax. May be traced
      (one compiled program for every temperature); only a concrete value is checked.
    top_k, top_p: the truncation applied after the temperature (static; 0 and 1: none,
      the full tempered policy, e.g. the KL reference). The kept set is chosen without
      gradient (it is piecewise constant): only the kept logits are differentiated.
      A token outside the kept set (probability 0: the policy moved since the rollout,
      PPO mini-batch 2+, or float error at the set's boundary) scores OUT_OF_SET_LOGP
      = -30, a constant (zero gradient), instead of about -1e30: its ratio against a
      kept token's log-prob stays within e^+-30 (~1e13), so the ratio, its gradient and
      square, approx_kl and a k3 KL stay finite in float32 in either direction (a floor
      like -1e4 would overflow exp() when the old log-prob is the floored one). Kept
      tokens are never clamped.
    with_entropy: also return the entropy of each predictive distribution (of the
      truncated one: tokens outside the kept set contribute exactly 0).
    vocab_chunk: > 0: the head and its log-sum-exp run over vocabulary chunks of this
      size (`rl.logprobs.chunked_logprobs`; untruncated only), so no [B, T, vocab] float32
      array is built; 0: one pass over the whole vocabulary.
    remat: recompute each layer's activations in the backward pass (`Transformer`'s
      remat): less memory for a gradient through these log-probs, one more forward.
    scan_layers: the layers as one scan over their stacked weights (`Transformer`'s scan):
      one layer's body in the program instead of num_layers.

  The forward reads the parameters in the model's compute dtype (models.precision), as
  the rollout does; gradients reach the stored (master) parameters through that cast.

  Returns:
    logp [B, T] with logp[:, t] = log p(tokens[:, t] | tokens[:, :t]) for t >= 1
    and logp[:, 0] = 0 (no prediction); entropy [B, T] aligned the same way
    (entropy[:, 0] = 0), or None.
  """
  if isinstance(temperature, int | float) and not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature!r}")
  # Temperature is applied here (it may be traced); the config truncates only.
  truncation = SamplingConfig(temperature=1.0, top_k=top_k, top_p=top_p)
  truncated = top_k > 0 or top_p < 1.0
  if vocab_chunk and truncated:
    raise ValueError(
      f"vocab_chunk={vocab_chunk} needs the untruncated distribution (top_k=0, top_p=1): "
      f"a top-k / top-p kept set depends on a row's whole vocabulary (got top_k={top_k}, "
      f"top_p={top_p})"
    )
  model = compute_model(graphdef, params)
  b, t = tokens.shape
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  hidden, _, _ = model(tokens, positions, segment_ids=segment_ids, remat=remat, scan=scan_layers)
  pad = lambda x: jnp.pad(x, ((0, 0), (1, 0)))
  if vocab_chunk:
    flat = hidden[:, :-1].reshape(b * (t - 1), -1)
    logp, ent = chunked_logprobs(
      model, flat, tokens[:, 1:].reshape(-1), temperature, vocab_chunk, with_entropy
    )
    unflat = lambda x: pad(x.reshape(b, t - 1))
    return unflat(logp), (unflat(ent) if with_entropy else None)
  # Position t - 1 predicts token t.
  logits = model.logits(hidden[:, :-1]).astype(jnp.float32) / temperature
  logp_all = sampling_log_probs(logits, truncation)
  logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
  if truncated:  # outside the kept set: about -1e30 - logsumexp; a where, so no gradient
    logp = jnp.where(logp > -1e29, logp, OUT_OF_SET_LOGP)
  if not with_entropy:
    return pad(logp), None
  # exp(-1e30) is exactly 0 and 0 * -1e30 = 0: truncated tokens add nothing, nor NaN.
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return pad(logp), pad(entropy)


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
  """Optimizer and batching of the policy update.

  Attributes:
    learning_rate: peak learning rate (after warmup).
    warmup_steps: linear warmup from 0, in optimizer steps; < total_steps.
    total_steps: the cosine decay reaches 0 here.
    weight_decay: AdamW decoupled weight decay.
    grad_clip: global-norm gradient clipping threshold.
    micro_batch: rows per micro-batch (gradient accumulation); the trainer packs
      samples into rows (rl/packing.py) and pads the rows to a multiple of it.
    pow2_rows: pad packed rows further, to micro_batch x a power of two: at most
      log2(rows / micro_batch) + 1 update (and old-log-prob) programs per row width
      to compile, for up to twice the rows. False: any multiple of micro_batch.
    min_rows: pad packed rows to at least this many: every rollout batch that fits them
      shares one update program (the micro-batches of padding skip their forward and
      backward). 0: no floor. On a GPU, where an update program of a 12-layer policy takes
      most of a minute to compile (RESULTS.md, 2026-11-28), one program instead of three.
    mini_batches: optimizer steps per rollout batch (PPO mini-batches): the batch's
      samples are shuffled and split into this many equal parts, each one update
      against the same old log-probs, so the clipped ratio does its job. 1: one
      on-policy step per rollout (ratio 1, the clip never binds).
    epochs: passes over the rollout batch (each reshuffled).
    b1, b2: Adam moment decay rates.
    trainable: a regular expression over parameter paths ("layers/3/mlp/down_proj/kernel",
      "embed/embedding", "final_norm/scale"; re.search): only matching parameters are
      updated, the rest stay frozen. "": all parameters.
    remat: recompute each layer's activations in the backward pass (less memory per
      micro-batch row, one more forward; `make_policy_update`).
    scan_layers: the policy's layers as one scan in the update's forward and backward
      (`make_policy_update`): one layer's body in the program instead of num_layers.
    lr_multipliers: per-group learning rates, "regex=multiplier" pairs separated by commas
      ("final_norm=30,embed=3"): a trained parameter takes the multiplier of the first
      pattern its path matches (re.search, paths as `trainable` sees them; a pattern cannot
      itself hold a comma), x1 when none does. Each group's warmup-cosine schedule is the
      base one times its multiplier; frozen parameters stay frozen and the gradient is
      clipped by the global norm of all trained parameters, as without groups. "": one
      learning rate (`make_optimizer`).
    pack_width: > 0: packed update rows are this many columns whenever the batch's
      longest sample fits (else the cache's full width): at most two row widths, so two
      families of update programs to compile (an accelerator sitting's budget). 0: the
      longest sample rounded up to 128 (least padding, a program per width met).
    key_windows: the update's forward under `models.attention.key_windows`: a query
      block of a packed row reads only the last w keys up to its end (w the smallest of
      these, in tokens, that holds its samples' keys), else all. Rows of many short samples
      then pay attention by sample length, not row width. (): every block reads all keys.
    cpu_fusions: which of XLA:CPU's library fusions the update program is compiled with
      (`utils.cpu_fusions`): "dots" (YNNPACK for its dots only) or "xla" (XLA's default).
      How fast it runs, not what it computes (float rounding aside); ignored off a CPU.
  """

  learning_rate: float = 1e-6
  warmup_steps: int = 0
  total_steps: int = 1000
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  micro_batch: int = 8
  pow2_rows: bool = True
  min_rows: int = 0
  mini_batches: int = 1
  epochs: int = 1
  b1: float = 0.9
  b2: float = 0.999
  trainable: str = ""
  remat: bool = False
  scan_layers: bool = False
  lr_multipliers: str = ""
  pack_width: int = 0
  key_windows: tuple[int, ...] = ()
  cpu_fusions: str = "dots"

  def __post_init__(self):
    # A config's list (ml_collections, a command line) becomes the tuple a frozen field keeps.
    object.__setattr__(self, "key_windows", checked_key_windows(self.key_windows))
    checked_cpu_fusions(self.cpu_fusions)
    if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
      raise ValueError(f"learning_rate must be a finite number > 0, got {self.learning_rate!r}")
    if not isinstance(self.total_steps, int) or self.total_steps <= 0:
      raise ValueError(f"total_steps must be a positive int, got {self.total_steps!r}")
    if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps < self.total_steps:
      raise ValueError(
        f"warmup_steps must be an int in [0, total_steps={self.total_steps}), "
        f"got {self.warmup_steps!r}"
      )
    if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
      raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
    if not (self.grad_clip > 0 and math.isfinite(self.grad_clip)):
      raise ValueError(f"grad_clip must be a finite number > 0, got {self.grad_clip!r}")
    if not isinstance(self.min_rows, int) or self.min_rows < 0:
      raise ValueError(f"min_rows must be an int >= 0, got {self.min_rows!r}")
    if not isinstance(self.pack_width, int) or self.pack_width < 0:
      raise ValueError(f"pack_width must be an int >= 0, got {self.pack_width!r}")
    for name in ("micro_batch", "mini_batches", "epochs"):
      v = getattr(self, name)
      if not isinstance(v, int) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    for name in ("b1", "b2"):
      v = getattr(self, name)
      if not 0.0 <= v < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {v!r}")
    _compile_trainable(self.trainable)
    parse_lr_multipliers(self.lr_multipliers)

  def mini_batch_samples(self, samples: int) -> int:
    """Samples per optimizer step for a rollout batch of `samples` (mini_batches must divide it)."""
    if samples <= 0 or samples % self.mini_batches:
      raise ValueError(
        f"mini_batches ({self.mini_batches}) must divide the batch's samples ({samples})"
      )
    return samples // self.mini_batches


def _compile_trainable(pattern: str) -> re.Pattern:
  try:
    return re.compile(pattern)
  except re.error as e:
    raise ValueError(f"trainable is not a regular expression: {pattern!r} ({e})") from e


def trainable_mask(params: Any, pattern: str) -> Any:
  """A pytree of bools like `params`: True where the leaf's path matches `pattern`
  (re.search; "" matches every path). Raises if it matches none."""
  regex = _compile_trainable(pattern)
  mask = jax.tree_util.tree_map_with_path(
    lambda path, _: bool(regex.search(path_name(path))), params
  )
  if not any(jax.tree.leaves(mask)):
    raise ValueError(f"trainable={pattern!r} matches no parameter path")
  return mask


def parse_lr_multipliers(spec: str) -> tuple[tuple[str, float], ...]:
  """("regex", multiplier) pairs of an `UpdateConfig.lr_multipliers` string, in order.

  Raises ValueError naming the field for an entry that is not "regex=multiplier", a
  pattern that is empty or not a regular expression, or a multiplier that is not a finite
  number > 0.
  """
  if not spec.strip():
    return ()
  out = []
  for item in spec.split(","):
    pattern, sep, value = item.strip().rpartition("=")
    if not sep or not pattern:
      raise ValueError(
        f"lr_multipliers: {item.strip()!r} is not 'regex=multiplier' (in {spec!r}, e.g. "
        "'final_norm=30,embed=3')"
      )
    try:
      m = float(value)
    except ValueError:
      m = float("nan")
    if not (m > 0 and math.isfinite(m)):
      raise ValueError(
        f"lr_multipliers: the multiplier of {pattern!r} must be a finite number > 0, got {value!r}"
      )
    try:
      re.compile(pattern)
    except re.error as e:
      raise ValueError(f"lr_multipliers: {pattern!r} is not a regular expression ({e})") from e
    out.append((pattern, m))
  return tuple(out)


def lr_group_labels(params: Any, trainable: str, groups: tuple[tuple[str, float], ...]) -> Any:
  """A pytree of labels like `params`: "frozen" (utils.optim.FROZEN) where `trainable`
  does not match, "group<i>" for the first of `groups` whose pattern matches a trained
  path, "base" for the other trained ones. Raises if a group's pattern takes no trained
  parameter (none matches, or only frozen ones, or an earlier pattern took them all)."""
  trained = trainable_mask(params, trainable) if trainable else jax.tree.map(lambda _: True, params)
  regexes = [re.compile(pattern) for pattern, _ in groups]
  taken = set()

  def label(path, train):
    if not train:
      return FROZEN
    name = path_name(path)
    for i, regex in enumerate(regexes):
      if regex.search(name):
        taken.add(i)
        return f"group{i}"
    return "base"

  labels = jax.tree_util.tree_map_with_path(label, trained)
  for i, (pattern, _) in enumerate(groups):
    if i not in taken:
      raise ValueError(
        f"lr_multipliers: {pattern!r} matches no trained parameter path (none at all, only "
        f"ones frozen by trainable={trainable!r}, or only ones an earlier pattern took)"
      )
  return labels


def make_optimizer(cfg: UpdateConfig) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW on a linear-warmup cosine schedule; with
  `cfg.trainable`, parameters whose paths do not match get zero updates; with
  `cfg.lr_multipliers`, each group's schedule is scaled by its multiplier
  (`utils.optim.grouped_clipped_adamw`)."""
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, cfg.learning_rate, cfg.warmup_steps, cfg.total_steps, end_value=0.0
  )
  opts = dict(grad_clip=cfg.grad_clip, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
  groups = parse_lr_multipliers(cfg.lr_multipliers)
  if groups:
    multipliers = {"base": 1.0, **{f"group{i}": m for i, (_, m) in enumerate(groups)}}
    labels = lambda params: lr_group_labels(params, cfg.trainable, groups)  # noqa: E731
    return grouped_clipped_adamw(schedule, multipliers, labels, **opts)
  # Without groups the optimizer (and so its state, in checkpoints) is as it always was.
  adamw = clipped_adamw(schedule, **opts)
  if not cfg.trainable:
    return adamw

  def labels(params):
    mask = trainable_mask(params, cfg.trainable)
    return jax.tree.map(lambda m: "train" if m else "freeze", mask)

  # Clipping sits inside the trained branch: frozen gradients do not scale the others.
  return optax.multi_transform({"train": adamw, "freeze": optax.set_to_zero()}, labels)


def _all_finite(tree: Any) -> jax.Array:
  leaves = jax.tree.leaves(tree)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def _checked_batch(
  batch: dict[str, Any], loss_cfg: PolicyLossConfig, on_policy: bool, micro_batch: int
) -> tuple[dict[str, jax.Array], bool]:
  """The keys of `batch` the update reads, as arrays, and whether it is packed; raises
  naming what is missing or inconsistent."""
  needed = tuple(k for k in BATCH_KEYS if not (on_policy and k == "old_logp"))
  missing = [k for k in needed if k not in batch]
  if loss_cfg.tis_cap and ROLLOUT_KEY not in batch:
    missing.append(ROLLOUT_KEY)  # the truncated IS weights compare against it
  if missing:
    raise ValueError(f"batch lacks {missing}; needs {needed}")
  packed = [k for k in PACKED_KEYS if k in batch]
  if packed and len(packed) != len(PACKED_KEYS):
    raise ValueError(f"a packed batch needs all of {PACKED_KEYS}; got only {packed}")
  keys = needed + (PACKED_KEYS if packed else ()) + ((ROLLOUT_KEY,) * (ROLLOUT_KEY in batch))
  rows = batch["tokens"].shape[0]
  if rows % micro_batch:
    raise ValueError(f"micro_batch ({micro_batch}) must divide the batch rows ({rows})")
  return {k: jnp.asarray(batch[k]) for k in keys}, bool(packed)


@dataclasses.dataclass(frozen=True)
class _Objective:
  """What the update differentiates: the policy's log-probs of a set of rows (of the
  sampled, truncated distribution, as old_logp is), the reference's (untruncated), and
  `policy_loss` over them. The same for a micro-batch and for the full batch."""

  graphdef: nnx.GraphDef
  cfg: PolicyLossConfig
  trainable: str
  remat: bool
  scan_layers: bool
  on_policy: bool
  packed: bool

  @property
  def with_entropy(self) -> bool:
    """Entropy in the loss, or as a diagnostic (entropy collapse) if entropy_metric."""
    return self.cfg.entropy_coef > 0 or self.cfg.entropy_metric

  def _layout(self, rows: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {k: rows[k] for k in ("positions", "segment_ids")} if self.packed else {}

  def reference_logp(self, ref_params: nnx.State, rows: dict[str, jax.Array]) -> jax.Array:
    """The reference untruncated (tempered only): it is > 0 everywhere, so KL(sampled
    policy || reference) is finite; a truncated reference would score tokens outside its
    own kept set at -30 (and its set is not the policy's)."""
    logp, _ = token_logprobs(
      self.graphdef,
      ref_params,
      rows["tokens"],
      self.cfg.temperature,
      vocab_chunk=self.cfg.vocab_chunk,
      scan_layers=self.scan_layers,
      **self._layout(rows),
    )
    return jax.lax.stop_gradient(logp)

  def policy_logp(self, params: nnx.State, rows: dict[str, jax.Array], train_mask: Any):
    """(logp, entropy or None); frozen parameters (train_mask False) are constants, so no
    backward pass reaches them."""
    if train_mask is not None:
      params = jax.tree.map(lambda x, m: x if m else jax.lax.stop_gradient(x), params, train_mask)
    logp, ent = token_logprobs(
      self.graphdef,
      params,
      rows["tokens"],
      self.cfg.temperature,
      top_k=self.cfg.top_k,
      top_p=self.cfg.top_p,
      vocab_chunk=self.cfg.vocab_chunk,
      with_entropy=self.with_entropy,
      remat=self.remat,
      scan_layers=self.scan_layers,
      **self._layout(rows),
    )
    if ent is not None and self.cfg.entropy_coef == 0:
      ent = jax.lax.stop_gradient(ent)  # metric only: no backward through it
    return logp, ent

  def loss(self, logp, ent, ref_logp, rows: dict[str, jax.Array]):
    """`policy_loss` of these rows; on policy, the old log-probs are logp's own values."""
    return policy_loss(
      logp,
      jax.lax.stop_gradient(logp) if self.on_policy else rows["old_logp"],
      rows["advantages"],
      rows["mask"],
      self.cfg,
      ref_logp=ref_logp,
      entropy=ent,
      token_weights=rows["weights"] if self.packed else None,
      rollout_logp=rows.get(ROLLOUT_KEY),
      segment_ids=rows["segment_ids"] if self.packed else None,
    )


def _micro_batch_weights(mask: jax.Array, packed: bool, aggregation: str) -> jax.Array:
  """[n_mb] weights that make the micro-batches' summed gradients the full batch's:
  packed batches carry global per-token weights (plain sum); "token-mean" weighs a slice
  by its share of the masked tokens; per-row aggregations weigh equal slices equally."""
  n_mb = mask.shape[0]
  if packed:
    return jnp.ones((n_mb,))
  if aggregation == "token-mean":
    tokens = jnp.sum(mask.astype(jnp.float32), axis=(1, 2))
    return tokens / jnp.maximum(jnp.sum(tokens), 1.0)
  return jnp.full((n_mb,), 1.0 / n_mb)


def _accumulate_gradients(
  objective: _Objective,
  params: nnx.State,
  ref_params: nnx.State | None,
  batch: dict[str, jax.Array],
  micro_batch: int,
  train_mask: Any,
):
  """The full batch's gradient as a weighted sum over slices of `micro_batch` rows (a
  scan), and every row's (logp, entropy, reference logp) without gradient."""
  rows = batch["tokens"].shape[0]
  split = lambda x: x.reshape(rows // micro_batch, micro_batch, *x.shape[1:])
  slices = {k: split(v) for k, v in batch.items()}
  weights = _micro_batch_weights(slices["mask"], objective.packed, objective.cfg.aggregation)

  def counted(grad_acc, mb, w):
    ref_logp = None if ref_params is None else objective.reference_logp(ref_params, mb)

    def loss_fn(p):
      logp, ent = objective.policy_logp(p, mb, train_mask)
      return objective.loss(logp, ent, ref_logp, mb)[0], (logp, ent)

    (_, (logp, ent)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    grad_acc = jax.tree.map(lambda a, g: a + w * g.astype(a.dtype), grad_acc, grads)
    return grad_acc, (jax.lax.stop_gradient(logp), jax.lax.stop_gradient(ent), ref_logp)

  def padding(grad_acc, mb, w):
    zero = jnp.zeros(mb["tokens"].shape, jnp.float32)
    ent = zero if objective.with_entropy else None
    return grad_acc, (zero, ent, None if ref_params is None else zero)

  def micro_step(grad_acc, xs):
    mb, w = xs
    # Rows padded to micro_batch x 2^k (pow2_rows) leave whole micro-batches without a
    # counted token: their gradient is exactly 0, so their forward and backward are
    # skipped (a quarter of a regime update's time at 3 -> 4 rows). Their log-probs come
    # back 0, which the masked metrics never read.
    return jax.lax.cond(jnp.any(mb["mask"] > 0), counted, padding, grad_acc, mb, w)

  # Gradients accumulate in float32 (whatever the parameters' dtype), then take theirs.
  zeros = jax.tree.map(
    lambda x: jnp.zeros(x.shape, jnp.promote_types(x.dtype, jnp.float32)), params
  )
  grads, per_row = jax.lax.scan(micro_step, zeros, (slices, weights))
  grads = jax.tree.map(lambda g, x: g.astype(x.dtype), grads, params)
  merge = lambda x: None if x is None else x.reshape(rows, *x.shape[2:])
  return grads, tuple(merge(x) for x in per_row)


def _apply_if(ok, optimizer, grads, params, opt_state):
  """The optimizer step where `ok` (finite loss and gradient); else both unchanged."""

  def apply(operands):
    p, s = operands
    updates, s = optimizer.update(grads, s, p)
    return optax.apply_updates(p, updates), s

  return jax.lax.cond(ok, apply, lambda ops: ops, (params, opt_state))


def make_policy_update(
  graphdef: nnx.GraphDef,
  optimizer: optax.GradientTransformation,
  loss_cfg: PolicyLossConfig,
  micro_batch: int,
  trainable: str = "",
  param_sharding: Any = None,
  remat: bool = False,
  on_policy: bool = False,
  key_windows: tuple[int, ...] = (),
  scan_layers: bool = False,
  cpu_fusions: str = "dots",
) -> Callable[..., tuple[nnx.State, optax.OptState, dict[str, jax.Array]]]:
  """A jitted `(params, opt_state, batch, ref_params) -> (params, opt_state, metrics)`.

  params and opt_state are donated: keep no other reference to them. batch holds
  tokens [B, T] int32, mask [B, T] (1 on response tokens whose log-prob counts),
  old_logp [B, T] and advantages [B]; other keys are ignored. A packed batch
  (rl/packing.py: several samples per row) adds positions, segment_ids and
  weights [B, T] and has per-token advantages [B, T]; the weights carry the
  aggregation. ref_params is the reference policy's params, or None (then
  loss_cfg.kl_coef must be 0).

  Log-probs and entropy are of the distribution the rollout samples (loss_cfg's
  temperature, top_k and top_p: `token_logprobs`), so old_logp must be too; the KL
  reference's are of the untruncated tempered reference policy (> 0 everywhere, so the KL
  stays finite; with truncation it starts above 0, at about -log(kept mass) per token).

  The gradient is accumulated over slices of `micro_batch` rows with a scan,
  weighted so it equals the full-batch gradient: by each slice's share of the
  masked tokens for "token-mean", equally for the per-row aggregations, and as a
  plain sum for packed batches (their weights are global). A non-finite loss or
  gradient skips the step: params and opt_state come back unchanged and
  metrics["skipped"] is 1.

  `trainable` (UpdateConfig.trainable; "": all) differentiates only the parameters whose
  paths match: the others are held constant inside the loss (stop_gradient), so their
  gradients are exact zeros and the backward pass stops where no trained parameter lies
  upstream (the final norm alone: a much cheaper update step, experiments/bench_update.py).
  Pair it with an optimizer that freezes the same parameters (make_optimizer does, for the
  same pattern).

  `param_sharding` (a pytree of shardings like params, e.g. FSDP's from
  `parallel.sharding.param_shardings`): the gradients and the updated params are held to
  it, so XLA reduce-scatters gradients rather than replicating them.

  `remat` (UpdateConfig.remat): the policy's layers recompute their activations in the
  backward pass (one more forward; a micro-batch then holds every layer's input and one
  layer's activations, so longer rows fit).

  `scan_layers` (UpdateConfig.scan_layers): the policy's layers run as one scan over their
  stacked weights (`Transformer`'s scan): one layer's body in the program instead of
  num_layers, the same gradients (tests/test_model.py, tests/test_rl_update.py).

  `on_policy`: the batch was sampled by these very params and this is its only optimizer
  step (one mini-batch, one epoch), so its old log-probs are the forward's own: the loss
  takes stop_gradient(logp) as old_logp (ratio exactly 1, the clip never binds, the
  gradient is the plain policy gradient) and the batch needs no "old_logp" (a separate
  old-log-prob pass is then redundant).

  `key_windows` (UpdateConfig.key_windows): the forward's attention under
  `models.attention.key_windows` (packed short samples read only their own keys).

  `cpu_fusions` (UpdateConfig.cpu_fusions): the XLA:CPU library fusions the program is
  compiled with (`utils.cpu_fusions.compiler_options`).

  A batch with "rollout_logp" [B, T] (the engine's recorded log-probs) adds
  metrics["rollout_logp_gap"]: the largest |update forward - rollout| log-prob over the
  masked tokens, the rollout-vs-trainer check without a pass of its own.

  Metrics: loss, grad_norm (of the trained parameters, before clipping), skipped, and
  policy_loss's metrics, all of the pre-update policy on the full batch.
  """
  step = policy_update_step(
    graphdef,
    optimizer,
    loss_cfg,
    micro_batch,
    trainable,
    param_sharding,
    remat,
    on_policy,
    key_windows,
    scan_layers,
  )
  return jax.jit(step, donate_argnums=(0, 1), compiler_options=compiler_options(cpu_fusions))


def policy_update_step(
  graphdef: nnx.GraphDef,
  optimizer: optax.GradientTransformation,
  loss_cfg: PolicyLossConfig,
  micro_batch: int,
  trainable: str = "",
  param_sharding: Any = None,
  remat: bool = False,
  on_policy: bool = False,
  key_windows: tuple[int, ...] = (),
  scan_layers: bool = False,
) -> Callable[..., tuple[nnx.State, optax.OptState, dict[str, jax.Array]]]:
  """`make_policy_update`'s step before `jax.jit`, for a caller that compiles it itself
  (`rollout.pool.ExecutablePool`, with `cpu_fusions.compiler_options` of its own)."""
  if not isinstance(micro_batch, int) or micro_batch <= 0:
    raise ValueError(f"micro_batch must be a positive int, got {micro_batch!r}")
  if on_policy:
    # At ratio exactly 1 a clip bound of 1 (clip_low or clip_high 0) would tie in
    # jnp.clip / jnp.maximum and halve the gradient there; bounds strictly around 1 cannot
    # bind at ratio 1, so they change nothing else.
    loss_cfg = dataclasses.replace(
      loss_cfg, clip_low=max(loss_cfg.clip_low, 0.5), clip_high=max(loss_cfg.clip_high, 0.5)
    )
  _compile_trainable(trainable)  # a bad pattern fails here, not at the first trace
  key_windows = checked_key_windows(key_windows)

  def step(params, opt_state, batch, ref_params):
    with attention_key_windows(key_windows):  # read while the step is traced
      return windowed_step(params, opt_state, batch, ref_params)

  def windowed_step(params, opt_state, batch, ref_params):
    if loss_cfg.kl_coef > 0 and ref_params is None:
      raise ValueError("loss_cfg.kl_coef > 0 needs ref_params")
    batch, packed = _checked_batch(batch, loss_cfg, on_policy, micro_batch)
    objective = _Objective(graphdef, loss_cfg, trainable, remat, scan_layers, on_policy, packed)
    train_mask = trainable_mask(params, trainable) if trainable else None
    grads, (logp, ent, ref_logp) = _accumulate_gradients(
      objective, params, ref_params, batch, micro_batch, train_mask
    )
    if param_sharding is not None:
      grads = jax.lax.with_sharding_constraint(grads, param_sharding)
    # Loss and metrics once on the full batch: exact whatever the slicing.
    loss, metrics = objective.loss(logp, ent, ref_logp, batch)
    ok = jnp.isfinite(loss) & _all_finite(grads)
    params, opt_state = _apply_if(ok, optimizer, grads, params, opt_state)
    if param_sharding is not None:
      params = jax.lax.with_sharding_constraint(params, param_sharding)
    if ROLLOUT_KEY in batch:
      gap = jnp.abs(logp - batch[ROLLOUT_KEY].astype(jnp.float32))
      metrics["rollout_logp_gap"] = jnp.max(jnp.where(batch["mask"] > 0, gap, 0.0))
    metrics = {
      **metrics,
      "loss": loss,
      "grad_norm": optax.global_norm(grads),
      "skipped": jnp.logical_not(ok).astype(jnp.int32),
    }
    return params, opt_state, metrics

  return step

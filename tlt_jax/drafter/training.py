"""Training the EAGLE drafter on the target's own rollouts.

Data: a rollout row holds tokens x_0..x_{L-1} (prompt + completion) and the
target features f_t = hidden[t] for t <= L - 2. Training pair t is

  input (x_{t+1}, f_t)  ->  target f_{t+1},   t = 0 .. L - 3,

the alignment the drafter sees at inference (EAGLE). Every pair is context;
the loss covers pairs whose target feature follows a response token
(t + 1 >= prompt_len): those are the features the drafter is asked to predict
during generation. Samples are packed into rows with per-sample segment ids
and positions restarting at 0, so packed samples never attend to each other.
A sample's segment holds all its features f_0..f_{L-2}, one column more than its
pairs: each column's target is the next column's features (`batch_targets`, on the
device), so a batch carries every feature once (at a real model's width a batch is
hundreds of MiB to build on the host and copy to the device); a segment's last
column is a pair without a target, outside the loss.

Loss (EAGLE): 1.0 * SmoothL1(h, f_{t+1}) (mean over D) + 0.1 * soft cross-entropy
between softmax(head(f_{t+1})) and log_softmax(head(h)), both a masked mean over
loss tokens. The head is the target's, frozen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jaxtyping import Array, Float

from tlt_jax.models.attention import rematerialised_blocks
from tlt_jax.models.drafter import draft_logits, drafter_forward
from tlt_jax.utils.cpu_fusions import compiler_options
from tlt_jax.utils.optim import clipped_adamw

Batch = dict[str, Any]


# A packed batch's [rows, row_len] arrays (beside its [rows, row_len, D] features).
_INDEX_DTYPES = {
  "tokens": np.int32,
  "positions": np.int32,
  "segment_ids": np.int32,
  "loss_mask": np.float32,
}


def make_training_batch(
  tokens: np.ndarray,
  hidden: np.ndarray,
  prompt_len: np.ndarray,
  length: np.ndarray,
  *,
  row_len: int | None = None,
  num_rows: int | None = None,
  skip_overflow: bool = False,
  out: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
  """Packs aligned drafter training pairs from rollouts into rows (host side, numpy).

  Args:
    tokens: [B, S] int, tokens[n, :length[n]] = prompt + completion.
    hidden: [B, S, D] captured target features, hidden[n, t] = f_t (t <= length - 2), or
      a list of B per-row arrays [L_n, D] holding at least f_0 .. f_{length_n - 2} (a packed
      buffer's rows, read without a dense copy).
    prompt_len: [B] prompt tokens per sample.
    length: [B] tokens per sample.
    row_len: columns per packed row, a sample taking `sample_columns` (its pairs + 1);
      default the widest sample's.
    num_rows: pad the output to this many rows (static shapes across calls);
      default as many as the packing needs.
    skip_overflow: leave out samples longer than row_len or beyond num_rows
      instead of raising (online training fills a fixed-shape batch from a
      buffer holding more than fits).
    out: an earlier batch of the same shapes to overwrite (every element is written): at
      a real model's width fresh arrays cost the host more to fault in than to fill.

  Returns:
    A dict of [R, row_len] arrays: tokens (x_{t+1}), positions (t, per sample),
    segment_ids (1, 2, ... per row; 0 = padding), loss_mask (float32), and
    [R, row_len, D] features (f_t; the targets f_{t+1} are `batch_targets(features)`).

  Raises:
    ValueError: a sample does not fit in row_len, the rows exceed num_rows, or
      no sample has a response pair.
  """
  tokens = np.asarray(tokens)
  prompt_len, length = np.asarray(prompt_len), np.asarray(length)
  if np.any(length > tokens.shape[1]) or np.any(prompt_len < 1) or np.any(prompt_len > length):
    raise ValueError("need 1 <= prompt_len <= length <= S for every sample")
  pairs = np.maximum(length - 2, 0)
  if not isinstance(hidden, list | tuple):
    hidden = np.asarray(hidden)
    if hidden.ndim != 3 or hidden.shape[:2] != tokens.shape:
      raise ValueError(f"hidden {hidden.shape} must be [B, S, D] for tokens {tokens.shape}")
  elif len(hidden) != tokens.shape[0] or any(
    h.ndim != 2 or h.shape[0] < pairs[n] + 1 for n, h in enumerate(hidden)
  ):
    raise ValueError(f"hidden rows must be [>= length - 1, D], one per sample of {tokens.shape}")
  # Samples without a response pair carry no loss; skip them.
  use = [n for n in range(tokens.shape[0]) if pairs[n] >= prompt_len[n]]
  if not use:
    raise ValueError("no sample has a response pair (length - 2 >= prompt_len)")
  cols = sample_columns(length)
  widest = int(max(cols[n] for n in use))
  row_len = widest if row_len is None else row_len
  if skip_overflow:
    use = [n for n in use if cols[n] <= row_len]
  elif widest > row_len:
    raise ValueError(f"a sample takes {widest} columns (pairs + 1), more than row_len={row_len}")

  rows = _first_fit_decreasing(use, cols, row_len, num_rows if skip_overflow else None)
  num_rows = len(rows) if num_rows is None else num_rows
  if len(rows) > num_rows:
    raise ValueError(f"packing needs {len(rows)} rows of {row_len} columns, num_rows={num_rows}")
  d, dtype = hidden[0].shape[-1], hidden[0].dtype
  shapes = {k: ((num_rows, row_len), np.dtype(t)) for k, t in _INDEX_DTYPES.items()}
  shapes["features"] = ((num_rows, row_len, d), np.dtype(dtype))
  if out is None:
    out = {k: np.empty(shape, t) for k, (shape, t) in shapes.items()}
  elif (held := {k: (v.shape, v.dtype) for k, v in out.items()}) != shapes:
    raise ValueError(f"out holds {held}, this batch needs {shapes}")
  for r in range(num_rows):
    col = 0
    for seg, n in enumerate(rows[r] if r < len(rows) else (), start=1):
      c, p = int(cols[n]), int(prompt_len[n])
      span, t = slice(col, col + c), np.arange(c)
      out["tokens"][r, span] = tokens[n, 1 : c + 1]
      out["features"][r, span] = hidden[n][:c]
      out["positions"][r, span] = t
      out["segment_ids"][r, span] = seg
      out["loss_mask"][r, span] = (t + 1 >= p) & (t < c - 1)  # the last column: no target
      col += c
    for v in out.values():
      v[r, col:] = 0  # padding (`out` may hold an earlier batch)
  return out


def _first_fit_decreasing(
  use: list[int], cols: np.ndarray, row_len: int, max_rows: int | None
) -> list[list[int]]:
  """Samples `use` (taking `cols[n]` columns each) packed into rows of `row_len` columns,
  widest first, each into the first row with room: few rows, deterministic. With
  `max_rows`, samples that would open a row beyond it are left out."""
  rows: list[list[int]] = []
  free: list[int] = []
  for n in sorted(use, key=lambda n: (-cols[n], n)):
    for r, room in enumerate(free):
      if room >= cols[n]:
        rows[r].append(n)
        free[r] -= cols[n]
        break
    else:
      if max_rows is not None and len(rows) == max_rows:
        continue  # no room left for this sample
      rows.append([n])
      free.append(row_len - cols[n])
  return rows


def sample_columns(length: np.ndarray) -> np.ndarray:
  """Columns a sample of `length` tokens takes in a packed batch: its features
  f_0..f_{length-2}, one more than its pairs (the last is the previous pair's target)."""
  return np.maximum(np.asarray(length) - 1, 1)


def batch_targets(features: jax.Array) -> jax.Array:
  """Each column's target features f_{t+1}: the next column's features (zeros after the
  last). Only the loss's columns read one that belongs to their own sample."""
  return jnp.pad(features[:, 1:], ((0, 0), (0, 1), (0, 0)))


def _smooth_l1(x: Float[Array, ...]) -> Float[Array, ...]:
  # Huber with beta = 1 (PyTorch SmoothL1Loss default, as in EAGLE).
  a = jnp.abs(x)
  return jnp.where(a < 1.0, 0.5 * x * x, a - 0.5)


def drafter_loss(
  drafter_graphdef: nnx.GraphDef,
  drafter_params: nnx.State,
  target_graphdef: nnx.GraphDef,
  target_params: nnx.State,
  batch: Batch,
  *,
  feature_weight: float = 1.0,
  logit_weight: float = 0.1,
  teacher_temperature: float = 1.0,
  logit_chunk: int = 0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """EAGLE loss on a packed batch from `make_training_batch`; returns (loss, metrics).

  The logit term is the cross-entropy to the target's next-token distribution at
  `teacher_temperature` (1: the policy's own; 0: one-hot on its argmax, the token a greedy
  verification accepts, so near-ties no longer split the drafter's mass). With
  `logit_chunk` > 0 that term runs over the batch's positions `logit_chunk` at a time (the
  same values, up to float rounding; a batch of no more positions takes them at once): at a
  150k vocabulary the whole batch's float32 logits are tens of GiB.

  The target's params enter behind `stop_gradient` (inside `drafter_forward` /
  `draft_logits`): differentiating w.r.t. them yields zeros.
  """
  h, _ = drafter_forward(
    drafter_graphdef,
    drafter_params,
    target_graphdef,
    target_params,
    batch["tokens"],
    batch["features"],
    batch["positions"],
    segment_ids=batch["segment_ids"],
  )
  target = batch_targets(batch["features"])
  mask = batch["loss_mask"].astype(jnp.float32)
  denom = jnp.maximum(mask.sum(), 1.0)
  masked_mean = lambda x: (x * mask).sum() / denom

  f_loss = masked_mean(_smooth_l1(h.astype(jnp.float32) - target.astype(jnp.float32)).mean(-1))
  terms = lambda h, t: _logit_terms(target_graphdef, target_params, h, t, teacher_temperature)
  if not logit_chunk or logit_chunk >= mask.size:  # [R, L, V] float32 logits, several
    ce, agree = terms(h, target)
    l_loss, agreement = masked_mean(ce), masked_mean(agree)
  else:
    ce_sum, agree_sum = _chunked_sums(terms, h, target, mask, logit_chunk)
    l_loss, agreement = ce_sum / denom, agree_sum / denom
  loss = feature_weight * f_loss + logit_weight * l_loss
  metrics = {
    "loss": loss,
    "feature_loss": f_loss,
    "logit_loss": l_loss,
    "top1_agreement": agreement,
    "loss_tokens": mask.sum(),
  }
  return loss, metrics


def _logit_terms(
  target_graphdef: nnx.GraphDef,
  target_params: nnx.State,
  h: Float[Array, "... D"],
  target: Float[Array, "... D"],
  teacher_temperature: float,
) -> tuple[jax.Array, jax.Array]:
  """Per position: the cross-entropy of the draft logits to the teacher's distribution,
  and whether their top tokens agree (float32)."""
  draft = draft_logits(target_graphdef, target_params, h)
  teacher = jax.lax.stop_gradient(draft_logits(target_graphdef, target_params, target))
  if teacher_temperature == 0:
    p_teacher = jax.nn.one_hot(jnp.argmax(teacher, -1), teacher.shape[-1], dtype=teacher.dtype)
  else:
    p_teacher = jax.nn.softmax(teacher / teacher_temperature, axis=-1)
  ce = -(p_teacher * jax.nn.log_softmax(draft, axis=-1)).sum(-1)
  agree = (jnp.argmax(draft, -1) == jnp.argmax(teacher, -1)).astype(jnp.float32)
  return ce, agree


def _chunked_sums(
  terms: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]],
  h: Float[Array, "R L D"],
  target: Float[Array, "R L D"],
  mask: Float[Array, "R L"],
  chunk: int,
) -> tuple[jax.Array, jax.Array]:
  """The masked sums of `terms`' two per-position values, `chunk` positions at a time, so
  the [positions, vocabulary] logits exist for one chunk at once.

  The first sum's gradient is taken chunk by chunk in the forward pass and kept ([positions,
  D], the size of `h`); the backward pass only scales it by the sum's cotangent. Every head
  product then runs once forward and once backward, as on the whole batch, where
  rematerialising each chunk would run the forward's products twice. The second sum (top-1
  agreement) has no gradient."""
  d, n = h.shape[-1], mask.size
  chunks = -(-n // chunk)
  pad = chunks * chunk - n
  split = lambda x, w: jnp.pad(x.reshape(n, *w), [(0, pad)] + [(0, 0)] * len(w)).reshape(
    chunks, chunk, *w
  )

  def sums_and_grad(hs, ts, ms):
    def body(sums, xs):
      hc, tc, mc = xs
      (ce, agree), pullback = jax.vjp(lambda x: terms(x, tc), hc)
      (dh,) = pullback((mc, jnp.zeros_like(agree)))  # d sum(ce * mask) / d h
      return (sums[0] + (ce * mc).sum(), sums[1] + (agree * mc).sum()), dh

    zero = jnp.zeros((), jnp.float32)
    return jax.lax.scan(body, (zero, zero), (hs, ts, ms))

  @jax.custom_vjp
  def sums(hs, ts, ms):
    return sums_and_grad(hs, ts, ms)[0]

  def backward(dh, cotangents):
    return (cotangents[0] * dh.astype(jnp.float32)).astype(dh.dtype), None, None

  sums.defvjp(sums_and_grad, backward)
  return sums(split(h, (d,)), jax.lax.stop_gradient(split(target, (d,))), split(mask, ()))


def drafter_optimizer(
  lr: float,
  warmup: int,
  total_steps: int | None = None,
  *,
  weight_decay: float = 0.01,
  grad_clip: float = 1.0,
) -> optax.GradientTransformation:
  """AdamW (b1 0.9, b2 0.95) with global-norm clipping and a linear warm-up, then a cosine
  to lr / 10 at `total_steps` (offline training), or constant (None: online training has
  no end)."""
  if total_steps is None:
    schedule = optax.linear_schedule(0.0, lr, max(warmup, 1))
  else:
    if not 0 <= warmup < total_steps:
      raise ValueError(f"need 0 <= warmup < total_steps, got warmup={warmup}, total={total_steps}")
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total_steps, end_value=lr * 0.1)
  return clipped_adamw(schedule, grad_clip=grad_clip, b2=0.95, weight_decay=weight_decay)


def make_drafter_update(
  drafter_graphdef: nnx.GraphDef,
  target_graphdef: nnx.GraphDef,
  optimizer: optax.GradientTransformation,
  *,
  feature_weight: float = 1.0,
  logit_weight: float = 0.1,
  teacher_temperature: float = 1.0,
  donate: bool = True,
  cpu_fusions: str = "dots",
  logit_chunk: int = 0,
  remat_attention: bool = False,
) -> Callable[..., tuple[nnx.State, Any, dict[str, jax.Array]]]:
  """A jitted `(drafter_params, opt_state, target_params, batch) -> (drafter_params,
  opt_state, metrics)`; drafter params and opt_state are donated (unless `donate`
  is False: a rollout may still read the old params), the target's params are
  read only (never differentiated, never returned). `cpu_fusions`: XLA:CPU's library
  fusions of the program (`utils.cpu_fusions`); `logit_chunk`: `drafter_loss`'s;
  `remat_attention`: the drafter's attention under `models.attention.rematerialised_blocks`
  (long rows)."""

  def update(drafter_params, opt_state, target_params, batch):
    def loss_fn(dp):
      return drafter_loss(
        drafter_graphdef,
        dp,
        target_graphdef,
        target_params,
        batch,
        feature_weight=feature_weight,
        logit_weight=logit_weight,
        teacher_temperature=teacher_temperature,
        logit_chunk=logit_chunk,
      )

    with rematerialised_blocks() if remat_attention else contextlib.nullcontext():
      (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(drafter_params)
    updates, opt_state = optimizer.update(grads, opt_state, drafter_params)
    drafter_params = optax.apply_updates(drafter_params, updates)
    return drafter_params, opt_state, {**metrics, "grad_norm": optax.global_norm(grads)}

  donated = (0, 1) if donate else (1,)
  return jax.jit(update, donate_argnums=donated, compiler_options=compiler_options(cpu_fusions))

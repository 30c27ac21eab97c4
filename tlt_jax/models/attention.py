"""Attention: which keys each query sees (the masks) and how it reads them.

`attend` is grouped-query attention with a boolean visibility mask, in one of three forms
(batched matrix products; a multiply fused into a reduction for a few new tokens a row;
cuDNN's fused attention on NVIDIA GPUs, opt-in);
`attend_causal` is the full-sequence path (training, log-probs, SFT), in query blocks that
read only the keys up to their end, and under `key_windows` only the last keys their
packed samples reach. The scoped settings (`attention_form`, `causal_block`,
`key_windows`) are read when a program is traced, so benchmarks can time whole programs
under each and the executable pool keys its programs by them.

Shape letters as in `models.transformer`: B batch, T new tokens, S keys (cache slots),
H query heads, K kv heads, G = H // K, E head dim.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from tlt_jax.utils.scoped import scoped

_NEG_INF = -1e30


# The forms `attend` takes: "auto" (`reduces` decides), or always "dots" or "reduce", or
# "fused" (`attend_fused`: cuDNN's kernel where the program runs on an NVIDIA GPU).
ATTENTION_FORMS = ("auto", "dots", "reduce", "fused")
_FORM = contextvars.ContextVar("attention_form", default="auto")


def _checked_form(form: str) -> str:
  if form not in ATTENTION_FORMS:
    raise ValueError(f"attention form must be one of {ATTENTION_FORMS}, got {form!r}")
  return form


@contextlib.contextmanager
def attention_form(form: str) -> Iterator[None]:
  """Within: `attend` takes `form` (one of ATTENTION_FORMS) wherever its caller passes
  none, so experiments/bench_decode_attention.py can time whole programs under each form.
  Read when a program is traced: `rollout.pool.ExecutablePool` keys its programs by
  `current_attention_form()`, so a program traced under another form is never reused."""
  with scoped(_FORM, _checked_form(form)):
    yield


def current_attention_form() -> str:
  """The form `attend` takes where its caller passes none ("auto" outside `attention_form`)."""
  return _FORM.get()


def platform_form(platform: str) -> str:
  """The form "auto" takes on `platform` (a JAX backend name): the dots on a GPU, where
  XLA's reduction fusions read the cache again for every query row of a kv head (G x T of
  them) while a GEMM reads it once (experiments/RESULTS.md, 2026-12-05, "attention on a
  GPU takes the dots"); elsewhere "auto", the rule in `reduces`."""
  return "dots" if platform == "gpu" else "auto"


def reduces(batch: int, new_tokens: int, form: str | None = None) -> bool:
  """Whether `attend` takes the multiply-reduce form (else the dots) under `form` (default:
  `current_attention_form()`). "auto" on a GPU: the dots (`platform_form`); on a CPU, one
  new token over at least 16 rows (decode of a larger batch), or 2-31 new tokens over at
  least 2 rows (draft verification, extends): where the multiply-reduce ran faster on
  XLA:CPU (`experiments/bench_decode_attention.py --parts=attention`; the timings are in
  experiments/RESULTS.md, "the README's former results section"). Never under "fused"."""
  form = _checked_form(current_attention_form() if form is None else form)
  if form == "auto":
    form = platform_form(jax.default_backend())
  if form != "auto":
    return form == "reduce"
  if new_tokens == 1:
    return batch >= 16
  return batch >= 2 and new_tokens < 32


def attend(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K S E"],
  v: Float[Array, "B K S E"],
  mask: Bool[Array, "B T S"],
  form: str | None = None,
) -> Float[Array, "B T H E"]:
  """Grouped-query attention with a boolean visibility mask, softmax in float32, in the
  form `reduces` picks under `form` (default: `current_attention_form()`), or, under
  "fused", `attend_fused`."""
  if _checked_form(current_attention_form() if form is None else form) == "fused":
    return attend_fused(q, k, v, mask)
  if reduces(q.shape[0], q.shape[1], form):
    return attend_reduce(q, k, v, mask)
  return attend_dots(q, k, v, mask)


def attend_dots(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K S E"],
  v: Float[Array, "B K S E"],
  mask: Bool[Array, "B T S"],
) -> Float[Array, "B T H E"]:
  """`attend` as two batched matrix products per (row, kv head).

  The query rows of one kv head (its G heads x T tokens) are merged into one matrix
  dimension first: with (G, T) left as two free dimensions of the einsum, XLA:CPU ran the
  products slower (experiments/RESULTS.md has the measurements).
  """
  b, t, h, e = q.shape
  kv = k.shape[1]
  g = h // kv
  q = q.reshape(b, t, kv, g, e).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, e)
  scores = jnp.einsum("bkqe,bkse->bkqs", q, k, preferred_element_type=jnp.float32)
  scores = scores.reshape(b, kv, g, t, -1) * (e**-0.5)
  scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kv, g * t, -1)
  out = jnp.einsum("bkqs,bkse->bkqe", probs, v).reshape(b, kv, g, t, e)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, e)


def attend_reduce(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K S E"],
  v: Float[Array, "B K S E"],
  mask: Bool[Array, "B T S"],
) -> Float[Array, "B T H E"]:
  """`attend` as multiply-reduce, for a few new tokens per row.

  With few query rows per (batch, kv head), the dots are thousands of [G T, E] x [E, S]
  products, which XLA:CPU runs as tiny batched GEMMs well below the cache-read bound; a
  multiply fused into a reduction streams the cache instead. Same math, summed in another
  order (float rounding).
  """
  b, t, h, e = q.shape
  kv, dtype = k.shape[1], v.dtype
  prec = jnp.promote_types(k.dtype, jnp.float32)
  q = q.reshape(b, t, kv, h // kv, e).transpose(0, 2, 3, 1, 4).astype(prec)  # [B, K, G, T, E]
  k = k[:, :, None, None, :, :].astype(prec)  # [B, K, 1, 1, S, E]
  scores = jnp.sum(q[:, :, :, :, None, :] * k, axis=-1) * (e**-0.5)  # [B, K, G, T, S]
  scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1)
  v = v[:, :, None, None, :, :].astype(prec)
  out = jnp.sum(probs[..., None] * v, axis=-2)  # [B, K, G, T, E]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, e).astype(dtype)


def cudnn_module():
  """JAX's cuDNN attention module where this JAX can reach cuDNN (its CUDA plugin is
  installed), else None: without the plugin no program of this process runs on a GPU."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn

  try:
    cudnn.check_cudnn_version()
  except RuntimeError:
    return None
  return cudnn


def attend_cudnn(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K S E"],
  v: Float[Array, "B K S E"],
  mask: Bool[Array, "B T S"],
  cudnn: Any = None,
) -> Float[Array, "B T H E"]:
  """`attend` as one call of cuDNN's fused attention (`cudnn`: JAX's module,
  `cudnn_module()` by default), which runs only on an NVIDIA GPU. It takes the cache's
  [B, K, S, E] as it is, the layout cuDNN calls "BNTH" (JAX's public
  `jax.nn.dot_product_attention` takes [B, S, K, E]: a copy of the cache a layer); query
  head h reads kv head h // G, as in `attend_dots`; the boolean mask becomes an additive
  bias of the operands' dtype. Each row's keys end at its last visible slot (cuDNN's
  padding mask: a row of a long-tailed batch reads its own length of the view, not the
  whole view; the slots past it are masked for all its queries anyway); a row that sees no
  slot reads one, masked (its output, never read, stays finite)."""
  cudnn = cudnn_module() if cudnn is None else cudnn
  b, t, _, e = q.shape
  seen = jnp.any(mask, axis=1)  # [B, S]
  keys = jnp.maximum(seen.shape[1] - jnp.argmax(seen[:, ::-1], axis=1), 1)
  out = cudnn.dot_product_attention(
    q.transpose(0, 2, 1, 3),
    k,
    v,
    mask=mask[:, None],
    q_seqlen=jnp.full((b,), t, jnp.int32),
    kv_seqlen=keys.astype(jnp.int32),
    scale=e**-0.5,
    mask_type=cudnn.MaskType.PADDING,
    qkv_layout="BNTH",
  )
  return out.transpose(0, 2, 1, 3)


def attend_fused(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K S E"],
  v: Float[Array, "B K S E"],
  mask: Bool[Array, "B T S"],
) -> Float[Array, "B T H E"]:
  """`attend` as one cuDNN kernel (`attend_cudnn`) where the program runs on an NVIDIA GPU:
  the scores and probabilities stay on chip, where the dots write them out and read them
  back (at 64 rows of 5 new tokens over 2,048 slots, most of what a verify forward of the
  8B shape writes: experiments/RESULTS.md, 2026-12-06). The dots elsewhere (CPUs, TPUs, a
  JAX without its CUDA plugin), for float32 operands (cuDNN's kernel takes 16-bit floats)
  and for shapes cuDNN refuses (head dims not a multiple of 8 or past its limit).

  cuDNN's entry point is JAX's own module, not its public API (the pinned jax versions
  have it). Differentiated, the forward is still cuDNN's and the gradient the dots' (their
  forward recomputed): cuDNN's backward under a mask takes even lengths only.
  """
  cudnn = cudnn_module()
  if cudnn is None or not q.dtype == k.dtype == v.dtype or q.dtype.itemsize != 2:
    return attend_dots(q, k, v, mask)
  kernel = lambda q, k, v, mask: attend_cudnn(q, k, v, mask, cudnn)
  try:
    jax.eval_shape(kernel, q, k, v, mask)  # cuDNN's checks of the shapes, at trace time
  except NotImplementedError:
    return attend_dots(q, k, v, mask)

  @jax.custom_vjp
  def fused(q, k, v, mask):
    return jax.lax.platform_dependent(q, k, v, mask, cuda=kernel, default=attend_dots)

  def forward(q, k, v, mask):
    return fused(q, k, v, mask), (q, k, v, mask)

  def backward(res, g):
    q, k, v, mask = res
    return (*jax.vjp(lambda q, k, v: attend_dots(q, k, v, mask), q, k, v)[1](g), None)

  fused.defvjp(forward, backward)
  return fused(q, k, v, mask)


# Query block of the causal path: a block attends only to keys up to its own end.
_CAUSAL_BLOCK = contextvars.ContextVar("causal_block", default=128)


@contextlib.contextmanager
def causal_block(block: int) -> Iterator[None]:
  """Within: `attend_causal` takes query blocks of `block` tokens (default 128) wherever its
  caller passes none, so experiments/bench_attention.py can time block sizes. Read when a
  program is traced (the executable pool keys programs by `current_causal_block()`)."""
  if not isinstance(block, int) or block < 1:
    raise ValueError(f"causal block must be a positive int, got {block!r}")
  with scoped(_CAUSAL_BLOCK, block):
    yield


def current_causal_block() -> int:
  """The query block `attend_causal` takes where its caller passes none."""
  return _CAUSAL_BLOCK.get()


# Whether the causal path's query blocks are rematerialised (see `rematerialised_blocks`).
_BLOCK_REMAT = contextvars.ContextVar("block_remat", default=False)


@contextlib.contextmanager
def rematerialised_blocks() -> Iterator[None]:
  """Within: each of `attend_causal`'s query blocks is rematerialised (`jax.checkpoint`), so
  a backward pass keeps the blocks' inputs, not their [rows, heads, block, keys] scores, and
  recomputes those a block at a time: for one-layer programs over long rows (the online
  drafter's update at 8,192 positions a row), where remat of whole layers saves nothing.
  Read when a program is traced."""
  with scoped(_BLOCK_REMAT, True):
    yield


# Key windows of the causal path, in tokens: () is off (see `key_windows`).
_KEY_WINDOWS = contextvars.ContextVar("key_windows", default=())


def checked_key_windows(windows: Any) -> tuple[int, ...]:
  """`windows` (a list or tuple of positive ints, tokens) as a sorted tuple, or ValueError."""
  if isinstance(windows, str | bytes) or not hasattr(windows, "__iter__"):
    raise ValueError(f"key_windows must be a tuple of positive ints, got {windows!r}")
  windows = tuple(windows)
  if not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in windows):
    raise ValueError(f"key_windows must be positive ints, got {windows!r}")
  return tuple(sorted(set(windows)))


@contextlib.contextmanager
def key_windows(windows: Sequence[int]) -> Iterator[None]:
  """Within: `attend_causal` lets a query block read only the last w keys up to its end,
  for the smallest w of `windows` that holds every key its queries see (picked on the
  device from the mask, `lax.switch`), else all of them. Rows packed with short samples
  (segment ids) then pay attention by their samples' lengths, not the row's width. Read
  when a program is traced (a program keeps the setting it was traced under); () is off.
  """
  with scoped(_KEY_WINDOWS, checked_key_windows(windows)):
    yield


def current_key_windows() -> tuple[int, ...]:
  """The key windows `attend_causal` may take (() outside `key_windows`: off)."""
  return _KEY_WINDOWS.get()


def key_window(mask: Bool[Array, "B T S"], widths: Sequence[int]) -> Int[Array, ""]:
  """Which of `widths` (ascending, each < S), as an index, is the narrowest span of last
  keys holding every key any query of `mask` sees; len(widths) when none is (all S keys).
  Queries that see no key do not count."""
  s = mask.shape[-1]
  seen = jnp.any(mask, axis=-1)
  first = jnp.min(jnp.where(seen, jnp.argmax(mask, axis=-1), s))
  return jnp.sum(jnp.asarray(widths) < s - first)


def _attend_last_keys(q, k, v, mask, widths: Sequence[int]):
  """`attend` reading only the last `widths[key_window(...)]` keys (all of them when none
  holds the mask's visible keys): the same result up to float rounding, since the keys
  left out are masked for every query.

  The backward pass picks its branch again and recomputes that branch's forward: JAX's own
  derivative of `lax.switch` carries every branch's residuals out of whichever ran (zeros
  for the rest), which cost the windows their whole gain in the backward pass.
  """
  s = k.shape[2]

  def last(w):
    return lambda q, k, v, m: attend(q, k[:, :, s - w :], v[:, :, s - w :], m[:, :, s - w :])

  branches = [last(w) for w in widths] + [last(s)]

  def pullback(branch):
    def grads(q, k, v, mask, g):
      return jax.vjp(lambda q, k, v: branch(q, k, v, mask), q, k, v)[1](g)

    return grads

  def run(q, k, v, mask):
    return jax.lax.switch(key_window(mask, widths), branches, q, k, v, mask)

  windowed = jax.custom_vjp(run)

  def forward(q, k, v, mask):
    return run(q, k, v, mask), (q, k, v, mask)

  def backward(res, g):
    q, k, v, mask = res
    pullbacks = [pullback(b) for b in branches]
    return (*jax.lax.switch(key_window(mask, widths), pullbacks, q, k, v, mask, g), None)

  windowed.defvjp(forward, backward)
  return windowed(q, k, v, mask)


def attend_causal(
  q: Float[Array, "B T H E"],
  k: Float[Array, "B K T E"],
  v: Float[Array, "B K T E"],
  mask: Bool[Array, "B T T"],
  block: int | None = None,
) -> Float[Array, "B T H E"]:
  """`attend` over one causal sequence (mask[:, i, j] is False for j > i), in query blocks.

  Query block [s, s + n) reads keys [0, s + n) only: the keys after it are masked anyway, so
  the result is `attend`'s up to float rounding, at ~(nb + 1) / (2 nb) of its score work for
  nb blocks (SFT rows of 448 tokens: 4 blocks, 10/16). Rows with no visible key (padding)
  differ. Smaller blocks cost more than they save on CPU (experiments/bench_attention.py).
  Under `key_windows`, a block whose queries all see keys within the last w of [0, s + n)
  reads only those (packed short samples); under `rematerialised_blocks` each block is
  rematerialised. `block`: the query block (default: `current_causal_block()`).
  """
  t, block = q.shape[1], current_causal_block() if block is None else block
  if t <= block:
    return attend(q, k, v, mask)
  windows = current_key_windows()
  outs = []
  for s in range(0, t, block):
    e = min(s + block, t)
    widths = [w for w in windows if e - s <= w < e]

    def one(q, k, v, mask, s=s, e=e, widths=widths):
      args = (q[:, s:e], k[:, :, :e], v[:, :, :e], mask[:, s:e, :e])
      return _attend_last_keys(*args, widths) if widths else attend(*args)

    # Rematerialised, the block's residuals are the whole q, k, v and mask, which every
    # block shares, not its slices of them.
    outs.append((jax.checkpoint(one) if _BLOCK_REMAT.get() else one)(q, k, v, mask))
  return jnp.concatenate(outs, axis=1)


def full_mask(
  positions_valid: Bool[Array, "B T"], segment_ids: Int[Array, "B T"] | None
) -> Bool[Array, "B T T"]:
  """Causal mask over one sequence; packed samples (segment ids) do not see each other, and
  padding (segment 0) sees only itself: its outputs are never read, and a padding run
  that saw itself whole would make `key_windows` read back to the run's start."""
  t = positions_valid.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))[None]
  mask = causal & positions_valid[:, None, :]
  if segment_ids is not None:
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    mask = mask & same & ((segment_ids[:, :, None] > 0) | jnp.eye(t, dtype=bool)[None])
  return mask


def cache_mask(
  cache_len: Int[Array, " B"],
  num_new: int,
  view_len: int,
  new_mask: Bool[Array, "T T"] | None = None,
) -> Bool[Array, "B T S"]:
  """Visibility for T new tokens written at slots [len, len + T) of a cache view.

  Old slots (< len) are visible to every new token; among the new tokens the
  mask is causal by default or `new_mask` (a tree's ancestor mask).
  """
  slots = jnp.arange(view_len)
  if new_mask is None and num_new == 1:  # plain decode: the cheap special case
    return (slots[None, :] <= cache_len[:, None])[:, None, :]
  if new_mask is None:
    new_mask = jnp.tril(jnp.ones((num_new, num_new), bool))
  rel = slots[None, :] - cache_len[:, None]  # [B, S]
  in_new = (rel >= 0) & (rel < num_new)
  new_vis = new_mask[:, jnp.clip(rel, 0, num_new - 1)]  # [T, B, S]
  new_vis = jnp.transpose(new_vis, (1, 0, 2)) & in_new[:, None, :]
  return (rel < 0)[:, None, :] | new_vis


def tree_cache_mask(
  cache_len: Int[Array, " B"], visible: Bool[Array, "B T R"], view_len: int
) -> Bool[Array, "B T S"]:
  """Per-row tree visibility over a cache view: committed slots (< cache_len) plus, in
  the tree region [cache_len, cache_len + R), the slots `visible` lets each new node see
  (its ancestors and itself). `cache_mask` with `new_mask` is the one-tree-for-all-rows
  case."""
  r = visible.shape[2]
  rel = jnp.arange(view_len)[None, :] - cache_len[:, None]  # [B, S]
  idx = jnp.broadcast_to(jnp.clip(rel, 0, r - 1)[:, None, :], visible.shape[:2] + (view_len,))
  in_tree = jnp.take_along_axis(visible, idx, axis=2) & ((rel >= 0) & (rel < r))[:, None, :]
  return (rel < 0)[:, None, :] | in_tree

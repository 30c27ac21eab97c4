"""Device programs of the rollout engine: prefill, decode chunk, compaction, harvest.

Each is a pure function of plain pytrees; the engine jits them per bucket
combination through the executable pool. The model enters as (graphdef,
params): graphdef is static, params are traced so new policy weights never
trigger a recompile.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Int

from tlt_jax.decode.sampling import SamplingConfig, sample_tokens
from tlt_jax.models.transformer import KVCache, Transformer
from tlt_jax.rollout.state import RolloutState


@dataclasses.dataclass(frozen=True)
class DecodeStatic:
  """Static parameters of the decode programs (hashable: part of the pool key)."""

  sampling: SamplingConfig
  stop_tokens: tuple[int, ...]
  capture_hidden: bool


def is_stop(tokens: jax.Array, stop_tokens: tuple[int, ...]) -> jax.Array:
  """True where a token is one of the stop tokens."""
  if not stop_tokens:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(stop_tokens, jnp.int32))


def _read_rows(buf: jax.Array, index: jax.Array) -> jax.Array:
  """buf[b, index[b]] for every row b (index clamped into range)."""
  take = lambda row, i: jax.lax.dynamic_index_in_dim(row, i, axis=0, keepdims=False)
  return jax.vmap(take)(buf, index)


def _write_rows(buf: jax.Array, values: jax.Array, index: jax.Array) -> jax.Array:
  """buf[b, index[b]] = values[b] for every row b (index clamped into range)."""
  put = lambda row, v, i: jax.lax.dynamic_update_index_in_dim(row, v, i, axis=0)
  return jax.vmap(put)(buf, values, index)


def prefill(
  graphdef: nnx.GraphDef,
  params: nnx.State,
  prompts: Int[Array, "P Tp"],
  prompt_len: Int[Array, " P"],
  row_prompt: Int[Array, " B"],
  seq_id: Int[Array, " B"],
  max_new: Int[Array, " B"],
  key: jax.Array,
  *,
  static: DecodeStatic,
  slots: int,
  cache_slots: int | None = None,
) -> RolloutState:
  """Prefills each distinct prompt once and shares its cache with its samples.

  Row b of the returned state is a sample of prompt `row_prompt[b]`; rows with
  seq_id < 0 are padding and start done. The first new token of every row is
  sampled here from the prompt's last-position logits, keyed by its own seq id.
  `slots` sizes the token buffers, `cache_slots` (default: slots) the KV cache.
  """
  model: Transformer = nnx.merge(graphdef, params)
  cfg = model.config
  p, tp = prompts.shape
  cache = KVCache.zeros(cfg, p, slots if cache_slots is None else cache_slots)
  positions = jnp.broadcast_to(jnp.arange(tp, dtype=jnp.int32), (p, tp))
  hidden, cache, _ = model(
    prompts, positions, cache=cache, cache_len=jnp.zeros((p,), jnp.int32), view_len=tp
  )
  last = jnp.take_along_axis(hidden, (prompt_len - 1)[:, None, None], axis=1)[:, 0]
  last_logits = model.logits(last)  # [P, V]

  # Broadcast the prompt's cache and outputs to its G sample rows.
  cache = cache.take_rows(row_prompt)
  b = row_prompt.shape[0]
  plen = prompt_len[row_prompt]
  tokens = jnp.zeros((b, slots), jnp.int32).at[:, :tp].set(prompts[row_prompt])
  first, first_lp = sample_tokens(last_logits[row_prompt], static.sampling, key, seq_id, plen)
  rows = jnp.arange(b)
  tokens = tokens.at[rows, plen].set(first)
  logprobs = jnp.zeros((b, slots), jnp.float32).at[rows, plen].set(first_lp)
  if static.capture_hidden:
    hid = jnp.zeros((b, slots, cfg.d_model), hidden.dtype).at[:, :tp].set(hidden[row_prompt])
  else:
    hid = jnp.zeros((b, 0, cfg.d_model), hidden.dtype)
  length = plen + 1
  max_len = plen + max_new
  done = (seq_id < 0) | is_stop(first, static.stop_tokens) | (length >= max_len)
  return RolloutState(
    cache=cache,
    tokens=tokens,
    logprobs=logprobs,
    hidden=hid,
    length=length,
    prompt_len=plen,
    max_len=max_len,
    done=done,
    seq_id=seq_id,
  )


def decode_chunk(
  graphdef: nnx.GraphDef,
  params: nnx.State,
  state: RolloutState,
  key: jax.Array,
  num_steps: jax.Array,
  *,
  static: DecodeStatic,
  view_len: int,
  paired: bool = False,
) -> tuple[RolloutState, jax.Array]:
  """Runs up to `num_steps` (a traced scalar) single-token decode steps in a device loop.

  Attention reads the first `view_len` cache slots only (the cache bucket);
  the host guarantees every active row stays inside it for the whole chunk.
  Finished rows are carried along unchanged until the host compacts them away.
  `paired` (`EngineConfig.one_row_step`): each step's token goes in twice, at the same
  position, and the first copy's output is taken: the products see two rows. The copy
  writes the slot after the token's, which lies inside the view (an active row grows into
  it) and which the next step writes over before anything reads it.
  Returns the new state and the number of steps actually run.
  """
  model: Transformer = nnx.merge(graphdef, params)
  rows = jnp.arange(state.batch)

  def step(carry):
    st, i = carry
    pos = st.length - 1
    inp, at = st.tokens[rows, pos][:, None], pos[:, None]
    if paired:  # the token twice at its position (see the docstring)
      inp, at = jnp.repeat(inp, 2, axis=1), jnp.repeat(at, 2, axis=1)
    hidden, cache, _ = model(inp, at, cache=st.cache, cache_len=pos, view_len=view_len)
    h = hidden[:, 0]
    tok, lp = sample_tokens(model.logits(h), static.sampling, key, st.seq_id, st.length)
    active = ~st.done
    # Inactive rows write back what they already hold, so nothing changes for
    # them. Row writes are per-row dynamic_update_slices: far cheaper than a
    # general scatter on CPU. A finished row may sit at length == S; the slice
    # index is then clamped to S - 1 for both the read and the write-back, so
    # the row still does not change.
    tok = jnp.where(active, tok, _read_rows(st.tokens, st.length))
    lp = jnp.where(active, lp, _read_rows(st.logprobs, st.length))
    tokens = _write_rows(st.tokens, tok, st.length)
    logprobs = _write_rows(st.logprobs, lp, st.length)
    hid = st.hidden
    if static.capture_hidden:
      hid = _write_rows(hid, jnp.where(active[:, None], h, _read_rows(hid, pos)), pos)
    length = st.length + active.astype(jnp.int32)
    done = st.done | (active & (is_stop(tok, static.stop_tokens) | (length >= st.max_len)))
    st = st.replace(
      cache=cache, tokens=tokens, logprobs=logprobs, hidden=hid, length=length, done=done
    )
    return st, i + 1

  def cond(carry):
    st, i = carry
    return (i < num_steps) & ~jnp.all(st.done)

  state, steps = jax.lax.while_loop(cond, step, (state, jnp.int32(0)))
  return state, steps


def take_rows(state: RolloutState, rows: Int[Array, " B2"], valid: jax.Array) -> RolloutState:
  """Gathers rows into a (smaller) batch bucket; invalid rows become done pads."""
  out = jax.tree.map(lambda x: jnp.take(x, rows, axis=0), state)
  return out.replace(done=out.done | ~valid, seq_id=jnp.where(valid, out.seq_id, -1))


def harvest(
  state: RolloutState,
  rows: Int[Array, " B"],
  count: Int[Array, ""],
  positions: int,
  dtype: str = "float32",
) -> dict[str, jax.Array]:
  """The per-sequence outputs of `rows` (the first `count` of them are the harvested rows;
  no cache), for transfer to host; with `positions` > 0 also those rows' hidden states,
  cast to `dtype` and packed: every position before each row's length, row after row, in
  a [positions, D] block (the rest zeros; `EngineConfig.harvest_sizes`)."""
  pick = lambda x: jnp.take(x, rows, axis=0)
  out = {
    "tokens": pick(state.tokens),
    "logprobs": pick(state.logprobs),
    "length": pick(state.length),
    "prompt_len": pick(state.prompt_len),
    "seq_id": pick(state.seq_id),
  }
  if positions:
    lengths = jnp.where(jnp.arange(rows.shape[0]) < count, out["length"], 0)
    ends = jnp.cumsum(lengths)
    i = jnp.arange(positions, dtype=ends.dtype)
    # Packed position i belongs to the first row whose end is past it.
    j = jnp.minimum(jnp.searchsorted(ends, i, side="right"), rows.shape[0] - 1)
    held = i < ends[-1]
    at = jnp.where(held, i - (ends[j] - lengths[j]), 0)
    hidden = state.hidden[rows[j], at]
    out["hidden"] = jnp.where(held[:, None], hidden, 0).astype(dtype)
  return out

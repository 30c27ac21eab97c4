"""Speculative-decoding device program of the rollout engine: draft, verify, commit.

One round per row: the EAGLE drafter proposes a chain or tree of N nodes from
the root (the last committed token), the target scores all N nodes in ONE
forward pass, verification picks the accepted path, and the commit moves the
accepted nodes' K/V into consecutive cache slots and appends the emitted
tokens, log-probs and target features to the rollout state. In greedy mode the
result equals `programs.decode_chunk` token for token.

Capacity (guaranteed by the host for every active row, all rounds):
  target: length - 1 + N <= view_len <= cache slots (the N nodes are written at
    slots [length - 1, length - 1 + N), so the engine gives the cache N - 1
    slots more than the token buffers: a row one token short of the buffer
    end still has room for a full draft);
  drafter cache: drafter_len + max(depth + 1, tree_slots(depth, topk)) <=
    drafter view (default: all its slots), with drafter_len = length - 2.
  token buffers: only length <= slots. The max_emit-wide token/feature
    windows the drafter's extension reads may reach past the buffer end; they
    are read realigned (`_read_aligned`), never shifted, and the entries past
    the end belong to pairs that are not committed.
Finished rows may sit anywhere; their token, log-prob and feature buffers and their
drafter cache are restored unchanged every round. Their target cache is restored by
tree rounds only: chain rounds leave the forward's writes (a finished row's cache is
never read again; outputs are harvested from the buffers).

Shape letters: B batch, N draft nodes, S cache slots, D model width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from jaxtyping import Array, Bool, Int

from tlt_jax.decode import drafting
from tlt_jax.decode.drafting import Draft
from tlt_jax.decode.group_drafts import (
  DEFAULT_MATCH,
  GroupCorpus,
  GroupMatch,
  choose_drafts,
  group_chain,
  hybrid_choice,
)
from tlt_jax.decode.tree import ancestor_mask
from tlt_jax.decode.verify import VerifyResult, verify_chain, verify_sampling
from tlt_jax.models.attention import tree_cache_mask
from tlt_jax.models.transformer import KVCache, Transformer
from tlt_jax.rollout import programs
from tlt_jax.rollout.programs import DecodeStatic
from tlt_jax.rollout.state import RolloutState

# draft_fn(state, drafter_cache, drafter_len) -> (draft, drafter_cache): replaces the
# drafter (tests plug in an oracle; the engine leaves it None).
DraftFn = Callable[[RolloutState, KVCache, jax.Array], tuple[Draft, KVCache]]


KINDS = ("chain", "tree", "group", "hybrid")


@dataclasses.dataclass(frozen=True)
class SpecStrategy:
  """How drafts are shaped (static: part of the program's cache key).

  Attributes:
    kind: "chain" (top-1 chain of `depth` tokens), "tree" (EAGLE-2 tree), "group" (a
      chain read off the group's own text, `decode.group_drafts`; no drafter runs) or
      "hybrid" (per row, the group chain where its match is long, the drafter's chain
      otherwise).
    depth: draft depth (tokens after the root on the longest path).
    topk: tree branching (children proposed per expanded node); ignored by chains.
    num_nodes: tree size, root included; ignored by chains (depth + 1).
    coupled: when sampling, propose the drafter's Gumbel-max under the verifier's
      noise (`drafting.Coupling`; the default) instead of its argmax (name suffix
      "-argmax"). Either way the output is the target's; only acceptance differs.
  """

  kind: str = "chain"
  depth: int = 3
  topk: int = 1
  num_nodes: int = 0
  coupled: bool = True

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
    if self.kind == "group" and not self.coupled:
      raise ValueError("group drafts use no drafter: there is no '-argmax' variant")
    if not isinstance(self.depth, int) or self.depth < 1:
      raise ValueError(f"depth must be an int >= 1, got {self.depth!r}")
    if self.kind == "tree":
      if not isinstance(self.topk, int) or self.topk < 1:
        raise ValueError(f"topk must be an int >= 1, got {self.topk!r}")
      pool = self.topk + (self.depth - 1) * self.topk * self.topk
      if not isinstance(self.num_nodes, int) or not 2 <= self.num_nodes <= pool + 1:
        raise ValueError(f"num_nodes must be in [2, {pool + 1}], got {self.num_nodes!r}")

  @classmethod
  def parse(cls, name: str) -> SpecStrategy:
    """From a name: "chain<depth>" (e.g. "chain4"), "tree<depth>x<topk>x<nodes>"
    (e.g. "tree5x4x16": depth 5, top-4 expansion, 16 nodes verified), "group<depth>" or
    "hybrid<depth>"; drafter strategies optionally followed by "-argmax" (uncoupled
    drafts, see `coupled`)."""
    if isinstance(name, SpecStrategy):
      return name
    if not isinstance(name, str):
      raise ValueError(f"a strategy name must be a str, got {name!r}")
    base, argmax = name.removesuffix("-argmax"), name.endswith("-argmax")
    if m := re.fullmatch(r"(chain|group|hybrid)(\d+)", base):
      return cls(m[1], depth=int(m[2]), coupled=not argmax)
    if m := re.fullmatch(r"tree(\d+)x(\d+)x(\d+)", base):
      return cls("tree", depth=int(m[1]), topk=int(m[2]), num_nodes=int(m[3]), coupled=not argmax)
    raise ValueError(
      f"unknown speculative strategy {name!r}: expected 'chain<depth>' (e.g. 'chain4'), "
      f"'tree<depth>x<topk>x<nodes>' (e.g. 'tree5x4x16'), 'group<depth>' or "
      f"'hybrid<depth>', optionally with '-argmax'"
    )

  @property
  def name(self) -> str:
    """The strategy's name, inverse of `parse`."""
    if self.kind != "tree":
      base = f"{self.kind}{self.depth}"
    else:
      base = f"tree{self.depth}x{self.topk}x{self.num_nodes}"
    return base if self.coupled else f"{base}-argmax"

  @property
  def nodes(self) -> int:
    """N: draft nodes scored by the target per round, root included."""
    return self.num_nodes if self.kind == "tree" else self.depth + 1

  @property
  def max_emit(self) -> int:
    """Most tokens one round can emit: the longest path plus the bonus token."""
    return min(self.depth, self.nodes - 1) + 1

  @property
  def drafter_slots(self) -> int:
    """Drafter cache slots a round uses beyond drafter_len (drafting or extending)."""
    if self.kind == "group":
      return 0
    draft = drafting.tree_slots(self.depth, self.topk) if self.kind == "tree" else self.depth
    return max(draft, self.max_emit)

  @property
  def is_chain(self) -> bool:
    """Drafts are chains (every kind but trees): causal forward, vectorised verification."""
    return self.kind != "tree"

  @property
  def uses_drafter(self) -> bool:
    return self.kind != "group"

  @property
  def uses_group(self) -> bool:
    return self.kind in ("group", "hybrid")


# The stages of a round, in order (`RoundStages`; profiling times rounds cut after each).
STAGES = ("draft", "forward", "verify", "commit", "extend")


@flax.struct.dataclass
class SpecStats:
  """What a chunk of rounds did (the bandit's reward signal).

  Attributes:
    rounds: scalar int32, rounds run.
    accepted: [B] int32, draft tokens accepted per row (before stop/max_len truncation).
    emitted: [B] int32, tokens committed per row.
    row_rounds: [B] int32, rounds in which the row was active.
  """

  rounds: jax.Array
  accepted: jax.Array
  emitted: jax.Array
  row_rounds: jax.Array

  @classmethod
  def zeros(cls, batch: int) -> SpecStats:
    zeros = jnp.zeros((batch,), jnp.int32)
    return cls(jnp.int32(0), zeros, zeros, zeros)

  def add_round(self, active: jax.Array, accepted: jax.Array, emitted: jax.Array) -> SpecStats:
    """One more round in which `active` rows accepted and emitted these counts."""
    act = active.astype(jnp.int32)
    return SpecStats(
      rounds=self.rounds + 1,
      accepted=self.accepted + act * accepted,
      emitted=self.emitted + emitted,
      row_rounds=self.row_rounds + act,
    )


def _read_window(buf: jax.Array, start: jax.Array, width: int, axis: int = 1) -> jax.Array:
  """buf[b, start[b] : start[b] + width] along `axis` (start clamped into range)."""
  read = lambda row, i: lax.dynamic_slice_in_dim(row, i, width, axis - 1)
  return jax.vmap(read)(buf, start)


def _read_aligned(buf: jax.Array, start: jax.Array, width: int, axis: int = 1) -> jax.Array:
  """buf[b, start[b] + j] for j < width along `axis`, positions past either buffer end
  clipped to it (the caller must not use those entries).

  Unlike `_read_window`, whose clamped start shifts the whole window when it would
  cross the buffer end, entry j always comes from position start + j: the window
  is read from the clamped start and realigned, as `_commit_window` does.
  """
  size = buf.shape[axis]
  if width > size:
    raise ValueError(f"window width {width} exceeds the buffer's {size} slots")
  w0 = jnp.clip(start, 0, size - width)
  win = jnp.moveaxis(_read_window(buf, w0, width, axis), axis, 1)
  rel = jnp.clip(start[:, None] - w0[:, None] + jnp.arange(width), 0, width - 1)  # [B, W]
  win = jnp.take_along_axis(win, rel.reshape(rel.shape + (1,) * (win.ndim - 2)), axis=1)
  return jnp.moveaxis(win, 1, axis)


def _commit_window(
  buf: jax.Array, values: jax.Array, start: jax.Array, count: jax.Array, axis: int = 1
) -> jax.Array:
  """buf[b, start[b] + j] = values[b, j] for j < count[b] along `axis`; the rest kept.

  One read-modify-write of a `width`-slot window per row: per-row dynamic slices
  are far cheaper than a general scatter. The window start is clamped so it
  never leaves the buffer; values are realigned to it, so writes that would
  fall outside the buffer are dropped instead of overwriting history.
  """
  size, width = buf.shape[axis], values.shape[axis]
  w0 = jnp.clip(start, 0, size - width)
  win = jnp.moveaxis(_read_window(buf, w0, width, axis), axis, 1)
  vals = jnp.moveaxis(values, axis, 1)
  rel = w0[:, None] + jnp.arange(width) - start[:, None]  # [B, W]: index into values
  keep = (rel >= 0) & (rel < count[:, None])
  vals = jnp.take_along_axis(
    vals, jnp.clip(rel, 0, width - 1).reshape(rel.shape + (1,) * (vals.ndim - 2)), axis=1
  )
  keep = keep.reshape(keep.shape + (1,) * (vals.ndim - 2))
  win = jnp.moveaxis(jnp.where(keep, vals, win), 1, axis)
  write = lambda row, w, i: lax.dynamic_update_slice_in_dim(row, w, i, axis - 1)
  return jax.vmap(write)(buf, win, w0)


def _commit_cache(
  old: KVCache,
  new: KVCache,
  path: Int[Array, "B N"],
  start: Int[Array, " B"],
  count: Int[Array, " B"],
  active: Bool[Array, " B"],
) -> KVCache:
  """Moves the path's K/V to consecutive slots start.. start + count; restores inactive rows.

  The target forward wrote node i at slot start + i (clamped like `_commit_window`
  for inactive rows), so the node window is read back from the same clamped start;
  nodes off the path stay beyond the new length, invisible.
  """
  n = path.shape[1]
  w0 = jnp.clip(start, 0, old.slots - n)
  idx = jnp.maximum(path, 0)[:, None, :, None]  # [B, 1, N, 1]: gather along slots

  def one(old_buf, new_buf):
    old_win = _read_window(old_buf, w0, n, axis=2)
    new_win = jnp.take_along_axis(_read_window(new_buf, w0, n, axis=2), idx, axis=2)
    win = jnp.where(active[:, None, None, None], new_win, old_win)
    # Inactive rows write their whole old window back where the forward wrote.
    return _commit_window(
      new_buf, win, jnp.where(active, start, w0), jnp.where(active, count, n), axis=2
    )

  return KVCache(
    k=tuple(one(o, w) for o, w in zip(old.k, new.k, strict=True)),
    v=tuple(one(o, w) for o, w in zip(old.v, new.v, strict=True)),
  )


@dataclasses.dataclass(frozen=True)
class RoundStages:
  """One speculative round's stages over a batch, in the order the algorithm reads: draft
  from the root, one target forward over the draft's N nodes, verify, commit the accepted
  path, extend the drafter's cache with the new pairs. Built inside a traced program
  (`RoundStages.build`): `spec_decode_chunk` runs `full_round`; the cost profile
  (`rollout.profile`) composes a prefix of the stages.

  See `spec_decode_chunk` for the arguments it is built from.
  """

  model: Transformer
  dfwd: tuple  # (drafter graphdef, drafter params, target graphdef, target params)
  static: DecodeStatic
  strategy: SpecStrategy
  key: jax.Array
  view_len: int
  drafter_view_len: int | None
  draft_fn: DraftFn | None
  corpus: GroupCorpus | None
  group_match: GroupMatch

  @classmethod
  def build(
    cls,
    target_graphdef: nnx.GraphDef,
    target_params: nnx.State,
    drafter_graphdef: nnx.GraphDef,
    drafter_params: nnx.State,
    drafter_cache: KVCache | None,
    key: jax.Array,
    *,
    static: DecodeStatic,
    strategy: SpecStrategy,
    view_len: int,
    cache_slots: int,
    drafter_view_len: int | None = None,
    draft_fn: DraftFn | None = None,
    corpus: GroupCorpus | None = None,
    group_match: GroupMatch = DEFAULT_MATCH,
  ) -> RoundStages:
    """Checks the arguments (errors name them) and merges the target model."""
    if strategy.uses_group and corpus is None:
      raise ValueError(f"strategy {strategy.name} drafts from the group's text: pass a corpus")
    if not static.capture_hidden:
      raise ValueError("speculative decoding needs static.capture_hidden (the drafter's input)")
    if not strategy.nodes <= view_len <= cache_slots:
      raise ValueError(
        f"need {strategy.nodes} <= view_len <= {cache_slots}, got view_len={view_len}"
      )
    if drafter_view_len is None and drafter_cache is not None:
      drafter_view_len = drafter_cache.slots
    return cls(
      model=nnx.merge(target_graphdef, target_params),
      dfwd=(drafter_graphdef, drafter_params, target_graphdef, target_params),
      static=static,
      strategy=strategy,
      key=key,
      view_len=view_len,
      drafter_view_len=drafter_view_len,
      draft_fn=draft_fn,
      corpus=corpus,
      group_match=group_match,
    )

  @property
  def _vectorised_chain(self) -> bool:
    """Chains from the engine's own drafters: a causal forward, verification of every node
    at once (`verify_chain`) and accepted nodes already in consecutive cache slots. A
    plugged-in `draft_fn` may propose any tree, so it takes the general path."""
    return self.strategy.is_chain and self.draft_fn is None

  def draft(self, st: RolloutState, dcache: KVCache, dlen: jax.Array) -> tuple[Draft, KVCache]:
    """The round's draft from each row's root (its last committed token)."""
    strategy = self.strategy
    if self.draft_fn is not None:
      return self.draft_fn(st, dcache, dlen)
    if strategy.uses_group:
      group, match_len = group_chain(
        st.tokens, st.length, self.corpus, depth=strategy.depth, match=self.group_match
      )
      if strategy.kind == "group":
        return group, dcache
    root_tok, root_feat = drafting.draft_roots(st.tokens, st.hidden, st.length)
    coupling = None
    if strategy.coupled:
      coupling = drafting.Coupling(self.key, st.seq_id, st.length - 1, self.static.sampling)
    common = dict(view_len=self.drafter_view_len, coupling=coupling, depth=strategy.depth)
    if not strategy.is_chain:
      return drafting.draft_tree(
        *self.dfwd,
        root_tok,
        root_feat,
        dcache,
        dlen,
        topk=strategy.topk,
        num_nodes=strategy.num_nodes,
        **common,
      )
    eagle, dcache = drafting.draft_chain(*self.dfwd, root_tok, root_feat, dcache, dlen, **common)
    if strategy.kind == "hybrid":
      use_group = hybrid_choice(match_len, group, eagle, self.group_match)
      return choose_drafts(use_group, group, eagle), dcache
    return eagle, dcache

  def forward(self, st: RolloutState, dr: Draft) -> tuple[jax.Array, KVCache]:
    """One target pass over the N nodes at cache slots [length - 1, length - 1 + N):
    their features [B, N, D] and the cache with their K/V written."""
    base = st.length - 1  # the root's position and cache slot
    positions = base[:, None] + dr.depth
    mask = None  # a chain's ancestor mask is causal: the model's default suffices
    if not self.strategy.is_chain:
      mask = tree_cache_mask(base, ancestor_mask(dr.parents), self.view_len)
    h, cache, _ = self.model(
      dr.tokens, positions, cache=st.cache, cache_len=base, view_len=self.view_len, mask=mask
    )
    return h, cache

  def verify(self, st: RolloutState, dr: Draft, h: jax.Array) -> VerifyResult:
    """The accepted path and the emitted tokens, as the target alone would sample them."""
    logits, base = self.model.logits(h), st.length - 1
    args = (self.static.sampling, self.key, st.seq_id, base)
    if self._vectorised_chain:
      return verify_chain(dr.tokens, logits, *args, valid=dr.valid)
    return verify_sampling(dr.tokens, dr.parents, logits, *args, valid=dr.valid)

  def commit(
    self, st: RolloutState, h: jax.Array, cache: KVCache, vr: VerifyResult
  ) -> tuple[RolloutState, jax.Array]:
    """Appends the emitted tokens, their log-probs and features, truncated at the first stop
    token and at max_len; moves the accepted path's K/V to consecutive slots. Returns the
    new state and the tokens committed per row (0 for finished rows)."""
    active, base, n = ~st.done, st.length - 1, self.strategy.nodes
    cols = jnp.arange(n)[None]
    stop = programs.is_stop(vr.emitted, self.static.stop_tokens) & (cols < vr.num_emitted[:, None])
    first_stop = jnp.where(stop.any(axis=1), jnp.argmax(stop, axis=1), n)
    count = jnp.minimum(jnp.minimum(vr.num_emitted, first_stop + 1), st.max_len - st.length)
    count = jnp.where(active, jnp.maximum(count, 0), 0).astype(jnp.int32)
    length = st.length + count
    # The features of the root and the kept path nodes: f_base .. f_{length - 2}.
    feats = jnp.take_along_axis(h, jnp.maximum(vr.path, 0)[:, :, None], axis=1)
    if self._vectorised_chain:
      # A chain's accepted nodes already sit in consecutive slots from the root's: nothing
      # to move. Finished rows keep the forward's writes (module docstring).
      committed = cache
    else:
      committed = _commit_cache(st.cache, cache, vr.path, base, count, active)
    new_st = st.replace(
      cache=committed,
      tokens=_commit_window(st.tokens, vr.emitted, st.length, count),
      logprobs=_commit_window(st.logprobs, vr.logprobs, st.length, count),
      hidden=_commit_window(st.hidden, feats.astype(st.hidden.dtype), base, count),
      length=length,
      done=st.done | (active & ((first_stop < count) | (length >= st.max_len))),
    )
    return new_st, count

  def extend(
    self,
    st: RolloutState,
    new_st: RolloutState,
    dcache_drafted: KVCache,
    dcache: KVCache,
    dlen: jax.Array,
  ) -> tuple[KVCache, jax.Array]:
    """Commits the new drafter pairs (x_{t+1}, f_t), t = length_old - 2 .. length - 3, to
    the drafter cache the draft wrote into; finished rows keep `dcache` bit for bit."""
    active = ~st.done
    # The max_emit-wide windows may reach past the buffer end (a row within max_emit of
    # `slots`): aligned reads keep pair j at drafter position dlen + j.
    t = self.strategy.max_emit
    _, dcache_ext = drafting.extend_drafter_cache(
      *self.dfwd,
      _read_aligned(new_st.tokens, st.length - 1, t),
      _read_aligned(new_st.hidden, st.length - 2, t),
      dcache_drafted,
      dlen,
      view_len=self.drafter_view_len,
    )
    # Finished rows keep their drafter cache (their writes may have clamped).
    keep = lambda new, old: jnp.where(active[:, None, None, None], new, old)
    return jax.tree.map(keep, dcache_ext, dcache), jnp.where(active, new_st.length - 2, dlen)

  def full_round(self, carry: RoundCarry) -> RoundCarry:
    """Draft, forward, verify, commit, extend; the chunk's statistics updated."""
    st, dcache, dlen, stats = carry
    dr, dcache_drafted = self.draft(st, dcache, dlen)
    h, cache = self.forward(st, dr)
    vr = self.verify(st, dr, h)
    new_st, count = self.commit(st, h, cache, vr)
    stats = stats.add_round(~st.done, vr.num_accepted, count)
    if not self.strategy.uses_drafter:
      return new_st, dcache, dlen, stats
    return new_st, *self.extend(st, new_st, dcache_drafted, dcache, dlen), stats


# (state, drafter cache, drafter lengths, statistics so far): a device loop's carry.
RoundCarry = tuple[RolloutState, KVCache, jax.Array, SpecStats]


def run_rounds(
  round_fn: Callable[[RoundCarry], RoundCarry],
  state: RolloutState,
  drafter_cache: KVCache,
  drafter_len: jax.Array | None,
  num_rounds: jax.Array,
) -> RoundCarry:
  """Up to `num_rounds` (traced) applications of `round_fn` in a device loop, stopping
  once every row is done; statistics start at zero."""

  def cond(carry: RoundCarry) -> jax.Array:
    st, _, _, stats = carry
    return (stats.rounds < num_rounds) & ~jnp.all(st.done)

  dlen0 = None if drafter_len is None else drafter_len.astype(jnp.int32)
  init = (state, drafter_cache, dlen0, SpecStats.zeros(state.batch))
  return lax.while_loop(cond, round_fn, init)


def spec_decode_chunk(
  target_graphdef: nnx.GraphDef,
  target_params: nnx.State,
  drafter_graphdef: nnx.GraphDef,
  drafter_params: nnx.State,
  state: RolloutState,
  drafter_cache: KVCache,
  drafter_len: Int[Array, " B"],
  key: jax.Array,
  num_rounds: jax.Array,
  *,
  static: DecodeStatic,
  strategy: SpecStrategy,
  view_len: int,
  drafter_view_len: int | None = None,
  draft_fn: DraftFn | None = None,
  corpus: GroupCorpus | None = None,
  group_match: GroupMatch = DEFAULT_MATCH,
) -> tuple[RolloutState, KVCache, jax.Array, SpecStats]:
  """Runs up to `num_rounds` (traced) speculative rounds in a device loop.

  Stops early once every row is done. See the module docstring for the capacity
  the host must guarantee. Needs `static.capture_hidden` (the drafter reads the
  target's features).

  Args:
    drafter_cache: the drafter's one-layer cache, committed up to drafter_len.
    drafter_len: [B] committed drafter positions, length - 2 for active rows.
    key: base PRNG key, as for `decode_chunk` (randomness is keyed per sequence
      and position).
    view_len: target cache slots attention reads (the cache bucket).
    drafter_view_len: drafter cache slots read (default: all).
    draft_fn: replaces the drafter's proposals (tests); None uses the drafter.
    corpus: the group's text (group and hybrid strategies, `decode.group_drafts`).
    group_match: the match settings of group drafts.

  Group strategies run no drafter: the drafter arguments may be None, and the drafter
  cache comes back as it went in (stale: the caller rebuilds it before a drafter round).

  Returns:
    (state, drafter_cache, drafter_len, stats).
  """
  stages = RoundStages.build(
    target_graphdef,
    target_params,
    drafter_graphdef,
    drafter_params,
    drafter_cache,
    key,
    static=static,
    strategy=strategy,
    view_len=view_len,
    cache_slots=state.cache.slots,
    drafter_view_len=drafter_view_len,
    draft_fn=draft_fn,
    corpus=corpus,
    group_match=group_match,
  )
  return run_rounds(stages.full_round, state, drafter_cache, drafter_len, num_rounds)

"""The long-tail rollout engine: host control between compiled device chunks.

A rollout of P prompts x G samples:
1. prefill every distinct prompt once; its cache is broadcast to its G rows;
2. run chunks of single-token decode steps in a device while-loop;
3. between chunks the host (a) compacts the batch into a smaller bucket once
   enough rows have finished, so the long tail runs at small batch, and (b)
   picks the smallest cache bucket that holds every active row for the next
   chunk, so attention reads only what is needed.
Every chunk is recorded in a timeline (time, active rows, buckets, tokens).

Speculative decoding (when `spec_threshold` > 0 and drafter params are given):
once the batch bucket is at or below the threshold, each chunk is either plain
decode or rounds of draft-and-verify (`rollout.speculative`) with one of the
configured strategies, chosen per batch bucket by a bandit on measured
tokens/s (or fixed). The drafter's cache is built from the hidden states the
target already captured, so switching in either direction never re-runs the
target; a plain chunk leaves the drafter cache behind and the next
speculative chunk rebuilds it.

All programs come from an `ExecutablePool` through `EnginePrograms` (the engine's
`programs`, which `rollout.run` and `rollout.profile` call); `warmup()` compiles every bucket
combination before the first rollout (`spec=True` adds the speculative ones),
otherwise they compile on first use, and the bandit ignores chunks that compiled.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from tlt_jax.decode import drafting
from tlt_jax.decode.group_drafts import GroupCorpus
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.drafter import check_drafter_matches
from tlt_jax.models.precision import compute_params
from tlt_jax.models.transformer import KVCache
from tlt_jax.parallel.meshes import BatchPlacement
from tlt_jax.rollout import programs
from tlt_jax.rollout.bandit import StrategyBandit
from tlt_jax.rollout.config import EngineConfig, bandit_settings
from tlt_jax.rollout.history import PromptHistory
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.rollout.result import RolloutResult
from tlt_jax.rollout.run import RolloutRun
from tlt_jax.rollout.speculative import SpecStrategy, spec_decode_chunk
from tlt_jax.rollout.state import RolloutState, round_up
from tlt_jax.utils.keys import folded_key


class EnginePrograms:
  """The rollout engine's compiled programs and where their inputs live.

  Each program method (`prefill`, `decode`, `spec`, `drafter_prefill`, `take`,
  `drafter_take`, `harvest`) returns the pool's executable for `args` (compiled on first
  use; the pool key holds every static input, so engines with different configs can share
  one pool); call it with the same `args`. `decode` donates the state, `spec` the state and
  the drafter cache. Placement (identity without a mesh): `rows` puts per-row state on its
  batch bucket's devices, `replicate` keys, `weights` policy or drafter params. `run_prefill`
  and `assemble` are a rollout's first and last steps (`rollout.run.RolloutRun` calls them).
  """

  def __init__(
    self,
    graphdef: nnx.GraphDef,
    model_config: ModelConfig,
    config: EngineConfig,
    pool: ExecutablePool,
    placement: BatchPlacement | None = None,
    drafter_graphdef: nnx.GraphDef | None = None,
  ):
    self.graphdef, self.drafter_graphdef = graphdef, drafter_graphdef
    self.model_config, self.config = model_config, config
    self.pool, self.placement = pool, placement

  def at_precision(self, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` traced under the config's matmul precision (a static part of its program)."""
    precision = self.config.matmul_precision
    if precision is None:
      return fn

    @functools.wraps(fn)
    def traced(*args):
      with jax.default_matmul_precision(precision):
        return fn(*args)

    return traced

  def rows(self, tree: Any) -> Any:
    """Per-row state onto its batch bucket's devices (identity without a mesh)."""
    if self.placement is None or tree is None:
      return tree
    batch = jax.tree.leaves(tree)[0].shape[0]
    return self.placement.rows(tree, batch)

  def replicate(self, tree: Any, batch: int) -> Any:
    """Keys replicated on the devices of a `batch`-row bucket."""
    if self.placement is None or tree is None:
      return tree
    return self.placement.replicate(tree, batch)

  def weights(self, tree: Any, batch: int) -> Any:
    """Policy or drafter params on the devices of a `batch`-row bucket (replicated, or
    split over a tensor group)."""
    if self.placement is None or tree is None:
      return tree
    return self.placement.weights(tree, batch)

  def read_weights(self, tree: Any) -> Any:
    """Policy or drafter params as a rollout's programs read them: floating leaves in the
    compute dtype and, without a mesh, device arrays. Host leaves (a checkpoint's or a
    copy's NumPy arrays) are copied once here, explicitly, where each program call would
    copy them again implicitly (what `GRPOConfig.transfer_guard` refuses); with a mesh
    `weights` copies them onto each bucket's devices."""
    tree = compute_params(tree, self.model_config)
    if self.placement is None:
      tree = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else jax.device_put(x), tree)
    return tree

  def static(self, sampling: SamplingConfig) -> programs.DecodeStatic:
    """The static inputs of the decode programs for `sampling`."""
    return programs.DecodeStatic(
      sampling=sampling,
      stop_tokens=self.config.stop_tokens,
      capture_hidden=self.config.capture_hidden,
    )

  def prefill(self, sampling, args):
    """(params, prompts [P, T], prompt lengths [P], row prompts [B], seq ids [B], max new
    tokens [B], key) -> the rows' `RolloutState` (`programs.prefill`)."""
    p, tp = args[1].shape
    b = args[3].shape[0]
    static = self.static(sampling)
    fn = functools.partial(programs.prefill, self.graphdef, static=static, slots=self.config.slots)
    cfg = self.config
    fn = functools.partial(fn, cache_slots=cfg.cache_slots)
    key = ("prefill", p, tp, b, cfg.slots, cfg.cache_slots, static, self.model_config)
    key += (cfg.matmul_precision,)
    return self.pool.get(key, self.at_precision(fn), args)

  def decode_key(self, sampling: SamplingConfig, view_len: int, batch: int) -> tuple:
    """The pool key of the plain decode program of a `batch`-row bucket over `view_len`
    slots (`decode`; `key in pool` says whether it is compiled)."""
    cfg = self.config
    paired = cfg.pairs_step(batch)
    static = self.static(sampling)
    return (
      "decode",
      batch,
      view_len,
      paired,
      cfg.slots,
      cfg.cache_slots,
      static,
      self.model_config,
      cfg.matmul_precision,
    )

  def decode(self, sampling, view_len, args, on_miss: str = "compile"):
    """(params, state, key, steps) -> (state, steps run): plain decode over the first
    `view_len` cache slots (`programs.decode_chunk`). `on_miss`: `ExecutablePool.get`'s."""
    key = self.decode_key(sampling, view_len, args[1].batch)
    fn = functools.partial(
      programs.decode_chunk,
      self.graphdef,
      static=self.static(sampling),
      view_len=view_len,
      paired=key[3],
    )
    # The state is donated: the cache is updated in place, never copied.
    return self.pool.get(key, self.at_precision(fn), args, donate_argnums=(1,), on_miss=on_miss)

  def spec_key(
    self, sampling: SamplingConfig, strategy: SpecStrategy, view_len: int, batch: int
  ) -> tuple:
    """The pool key of `strategy`'s program for a `batch`-row bucket over `view_len` slots
    (`spec`)."""
    cfg = self.config
    return (
      "spec",
      batch,
      view_len,
      min(view_len + cfg.drafter_margin, cfg.drafter_slots),
      strategy,
      cfg.slots,
      cfg.cache_slots,
      cfg.drafter_slots,
      self.static(sampling),
      self.model_config,
      self.drafter_graphdef if strategy.uses_drafter else None,
      (cfg.group_match, cfg.group_siblings, cfg.group_reference_len)
      if strategy.uses_group
      else None,
      cfg.matmul_precision,
    )

  def spec(self, sampling, strategy: SpecStrategy, view_len: int, args, on_miss: str = "compile"):
    """(params, drafter params, state, drafter cache, drafter length, corpus, key, rounds)
    -> (state, drafter cache, drafter length, stats): rounds of `strategy`
    (`speculative.spec_decode_chunk`). `on_miss`: `ExecutablePool.get`'s."""
    cfg = self.config
    key = self.spec_key(sampling, strategy, view_len, args[2].batch)
    static, dview = self.static(sampling), key[3]

    def fn(tparams, dparams, state, dcache, dlen, corpus, key, rounds):
      return spec_decode_chunk(
        self.graphdef,
        tparams,
        self.drafter_graphdef,
        dparams,
        state,
        dcache,
        dlen,
        key,
        rounds,
        static=static,
        strategy=strategy,
        view_len=view_len,
        drafter_view_len=dview,
        corpus=corpus,
        group_match=cfg.group_match,
      )

    fn = self.at_precision(fn)
    return self.pool.get(key, fn, args, donate_argnums=(2, 3), on_miss=on_miss)

  def corpus(self, siblings: np.ndarray, reference: np.ndarray) -> GroupCorpus:
    """Device corpus of a chunk: siblings [B, W] and per-row reference lines [B, R]."""
    rows = np.where(siblings[:, 0] >= 0, np.arange(len(siblings)), -1).astype(np.int32)
    return self.rows(
      GroupCorpus(
        *jax.device_put((np.asarray(siblings, np.int32), np.asarray(reference, np.int32), rows))
      )
    )

  def empty_corpus(self, batch: int) -> GroupCorpus:
    """A corpus of no siblings and no reference, `batch` rows."""
    cfg = self.config
    sib = np.full((batch, cfg.group_siblings), -1, np.int32)
    return self.corpus(sib, np.full((batch, cfg.group_reference_len), -1, np.int32))

  def drafter_prefill_key(self, width: int, batch: int) -> tuple:
    """The pool key of the drafter-cache build from `width` positions (`drafter_prefill`)."""
    cfg = self.config
    key = ("drafter_prefill", batch, width, cfg.drafter_slots, self.drafter_graphdef)
    return (*key, *self._shapes(), cfg.matmul_precision)

  def _drafter_prefill_fn(self, width: int) -> Callable[..., Any]:
    cfg = self.config

    def fn(tparams, dparams, state):
      return drafting.prefill_drafter_cache(
        self.drafter_graphdef,
        dparams,
        self.graphdef,
        tparams,
        state.tokens[:, :width],
        state.hidden[:, :width],
        state.length,
        slots=cfg.drafter_slots,
      )

    return self.at_precision(fn)

  def drafter_prefill(self, width: int, args):
    """(params, drafter params, state) -> (drafter cache, drafter length), built from the
    features of the first `width` positions."""
    key = self.drafter_prefill_key(width, args[2].batch)
    return self.pool.get(key, self._drafter_prefill_fn(width), args)

  def drafter_state_shape(self, width: int, args) -> Any:
    """The shapes of what `drafter_prefill(width, args)` returns, without running it."""
    return jax.eval_shape(self._drafter_prefill_fn(width), *args)

  def drafter_take(self, args):
    """((drafter cache, drafter length), rows) -> the drafter state of `rows`."""
    take = lambda tree, rows: jax.tree.map(lambda x: jnp.take(x, rows, axis=0), tree)
    key = ("drafter_take", args[0][1].shape[0], args[1].shape[0], self.config.drafter_slots)
    key += (self.model_config,)
    return self.pool.get(key, take, args)

  def _shapes(self) -> tuple:
    """What fixes the state's shapes besides the batch (engines may share a pool)."""
    cfg = self.config
    return (cfg.slots, cfg.cache_slots, cfg.capture_hidden, self.model_config)

  def take_shape(self, state: RolloutState, batch: int) -> RolloutState:
    """The shapes of what `take` returns for `batch` rows of `state`, without running it."""
    rows = jax.ShapeDtypeStruct((batch,), jnp.int32)
    return jax.eval_shape(programs.take_rows, state, rows, jax.ShapeDtypeStruct((batch,), bool))

  def take(self, args):
    """(state, rows, valid) -> the state of `rows` (compaction; `programs.take_rows`)."""
    key = ("take", args[0].batch, args[1].shape[0], *self._shapes())
    return self.pool.get(key, programs.take_rows, args)

  def harvest(self, args, positions: int):
    """(state, rows, count) -> the arrays of the first `count` of `rows` to copy to the
    host, their hidden states packed into `positions` (`programs.harvest`; one of
    `config.harvest_sizes`, 0 for none) in `config.harvest_dtype`."""
    dtype = self.config.harvest_dtype
    key = ("harvest", args[0].batch, args[1].shape[0], positions, dtype, *self._shapes())
    fn = functools.partial(programs.harvest, positions=positions, dtype=dtype)
    return self.pool.get(key, fn, args)

  def run_prefill(
    self, params, prompts_np, plen_np, num_samples, max_new_rows, seq_ids, sampling, key
  ) -> RolloutState:
    """Prefills `prompts_np` [P, T] (true lengths `plen_np`), each prompt's cache broadcast
    to its `num_samples` rows, padded to the batch and prompt buckets; the state on its
    bucket's devices."""
    cfg = self.config
    p_real, n_rows = prompts_np.shape[0], prompts_np.shape[0] * num_samples
    b = round_up(n_rows, cfg.batch_buckets)
    p_bucket = round_up(p_real, cfg.batch_buckets)
    tp = round_up(prompts_np.shape[1], cfg.prompt_buckets)
    prompts = np.zeros((p_bucket, tp), np.int32)
    prompts[:p_real, : prompts_np.shape[1]] = prompts_np
    plen = np.ones((p_bucket,), np.int32)
    plen[:p_real] = plen_np
    row_prompt = np.zeros((b,), np.int32)
    row_prompt[:n_rows] = np.repeat(np.arange(p_real), num_samples)
    seq = np.full((b,), -1, np.int32)
    seq[:n_rows] = seq_ids
    mx = np.ones((b,), np.int32)
    mx[:n_rows] = max_new_rows
    args = (params, *jax.device_put((prompts, plen, row_prompt, seq, mx)), key)
    if self.placement is not None:
      args = (self.weights(args[0], b), *args[1:6], self.replicate(key, b))
    return self.rows(self.prefill(sampling, args)(*args))

  def assemble(self, outputs, n_rows, num_samples, timeline, wall) -> RolloutResult:
    """The result of a rollout from its harvested rows (`outputs`: request row -> arrays)."""
    missing = [n for n in range(n_rows) if n not in outputs]
    if missing:
      raise RuntimeError(f"rollout lost rows {missing[:8]}: engine bug")
    stack = lambda k: np.stack([outputs[n][k] for n in range(n_rows)])
    hidden = None
    if self.config.harvests_hidden:  # each row's positions up to its length: pad
      width = max(outputs[n]["hidden"].shape[0] for n in range(n_rows))
      first = outputs[0]["hidden"]
      hidden = np.zeros((n_rows, width, first.shape[1]), first.dtype)
      for n in range(n_rows):
        h = outputs[n]["hidden"]
        hidden[n, : h.shape[0]] = h
    return RolloutResult(
      tokens=stack("tokens"),
      logprobs=stack("logprobs"),
      hidden=hidden,
      length=stack("length"),
      prompt_len=stack("prompt_len"),
      prompt_index=np.arange(n_rows) // num_samples,
      timeline=timeline,
      wall_seconds=wall,
    )


class RolloutEngine:
  """Generates G samples per prompt with compaction and cache buckets.

  Params are arguments of every call, never baked into programs, so a policy
  update only needs `engine.generate(new_params, ...)`; likewise a new drafter.

  `bandit` (adaptive speculative decoding only) keeps its statistics across
  rollouts for the engine's own sampling configuration, `history` (group drafts only)
  each prompt's earlier rollouts; save them with `state_dict()` and restore them with
  `load_state_dict`. Calls with another sampling configuration (e.g. greedy evaluation
  beside sampled rollouts) learn in a bandit of their own, not checkpointed: the best
  draft differs by temperature. `programs` (`EnginePrograms`) holds the compiled programs
  and the pool they come from.
  """

  def __init__(
    self,
    graphdef: nnx.GraphDef,
    model_config: ModelConfig,
    config: EngineConfig,
    sampling: SamplingConfig | None = None,
    pool: ExecutablePool | None = None,
    drafter_graphdef: nnx.GraphDef | None = None,
    bandit: StrategyBandit | None = None,
    mesh: Mesh | None = None,
  ):
    self.graphdef = graphdef
    # Rows split over the mesh's "data" axis (weights whole, or split over "tensor"); a
    # compacted bucket moves to fewer devices.
    self.placement = BatchPlacement(mesh) if mesh is not None else None
    self.model_config = model_config
    self.config = config
    self.sampling = sampling if sampling is not None else SamplingConfig()
    self.drafter_graphdef = drafter_graphdef
    self.programs = EnginePrograms(
      graphdef,
      model_config,
      config,
      pool if pool is not None else ExecutablePool(),
      self.placement,
      drafter_graphdef,
    )
    for t in config.stop_tokens:
      if t >= model_config.vocab_size:
        raise ValueError(f"stop token {t} outside the vocabulary (size {model_config.vocab_size})")
    if config.needs_drafter and drafter_graphdef is None:
      raise ValueError(
        "speculative decoding with drafter strategies is on (spec_threshold > 0) but no "
        "drafter_graphdef was given"
      )
    # Group drafts: each prompt's earlier rollouts (checkpointed with the bandit).
    self.history = None
    if config.uses_group:
      self.history = PromptHistory(config.group_history, context=config.group_ngram)
    self.strategies = {s.name: s for s in config.strategies}
    self.bandit = None
    if config.spec_threshold and config.spec_adaptive:
      arms, settings = bandit_settings(config)
      self.bandit = bandit if bandit is not None else StrategyBandit(arms, settings)
      if tuple(self.bandit.arms) != arms:
        raise ValueError(f"bandit arms {tuple(self.bandit.arms)} != engine arms {arms}")
    self._other_bandits: dict[SamplingConfig, StrategyBandit] = {}

  @property
  def pool(self) -> ExecutablePool:
    """The executable pool the engine's programs come from (engines may share one)."""
    return self.programs.pool

  @pool.setter
  def pool(self, pool: ExecutablePool) -> None:
    self.programs.pool = pool

  def state_dict(self) -> dict[str, Any]:
    """What the engine learns across rollouts: "bandit" (JSON, `StrategyBandit.state_dict`)
    and "history" (arrays, `PromptHistory.state_dict`), each where the engine has one."""
    state = {}
    if self.bandit is not None:
      state["bandit"] = self.bandit.state_dict()
    if self.history is not None:
      state["history"] = self.history.state_dict()
    return state

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Restores what `state_dict` saved; a part it lacks is left as it is."""
    if self.bandit is not None and "bandit" in state:
      self.bandit.load_state_dict(state["bandit"])
    if self.history is not None and "history" in state:
      self.history.load_state_dict(dict(state["history"]))

  def bandit_for(self, sampling: SamplingConfig) -> StrategyBandit | None:
    """The bandit learning the draft strategies of `sampling` (None: not adaptive)."""
    if self.bandit is None or sampling == self.sampling:
      return self.bandit
    if sampling not in self._other_bandits:
      # The engine's bandit's settings, statistics of its own.
      self._other_bandits[sampling] = StrategyBandit(self.bandit.arms, self.bandit.settings)
    return self._other_bandits[sampling]

  # -------------------------------------------------------------- validation
  def _validate(
    self, prompts: Sequence[Sequence[int]], num_samples: int, max_new: Sequence[int]
  ) -> None:
    cfg, vocab = self.config, self.model_config.vocab_size
    if len(prompts) == 0:
      raise ValueError("no prompts given")
    if not isinstance(num_samples, int) or num_samples <= 0:
      raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    if len(prompts) * num_samples > cfg.max_batch:
      raise ValueError(
        f"{len(prompts)} prompts x {num_samples} samples = "
        f"{len(prompts) * num_samples} rows exceeds max_batch={cfg.max_batch}"
      )
    for i, p in enumerate(prompts):
      if len(p) == 0:
        raise ValueError(f"prompt {i} is empty: a prompt needs at least one token (e.g. BOS)")
      if len(p) > cfg.max_prompt_len:
        raise ValueError(
          f"prompt {i} has {len(p)} tokens, more than max_prompt_len="
          f"{cfg.max_prompt_len} (the cache holds max_prompt_len + "
          f"max_new_tokens = {cfg.slots} positions)"
        )
      arr = np.asarray(p)
      if arr.dtype.kind not in "iu":
        raise ValueError(f"prompt {i} must hold integer token ids, got dtype {arr.dtype}")
      bad = arr[(arr < 0) | (arr >= vocab)]
      if bad.size:
        raise ValueError(
          f"prompt {i} has token id {int(bad[0])} outside the vocabulary [0, {vocab})"
        )
    for i, m in enumerate(max_new):
      if not 1 <= m <= cfg.max_new_tokens:
        raise ValueError(
          f"max new tokens of row {i} is {m}: must be in [1, max_new_tokens={cfg.max_new_tokens}]"
        )

  # ------------------------------------------------------------------ warmup
  def warmup(
    self,
    params: nnx.State,
    sampling: SamplingConfig | None = None,
    num_prompts: Sequence[int] | None = None,
    num_samples: int = 1,
    drafter_params: nnx.State | None = None,
    compile_workers: int | None = None,
    prompt_lens: Sequence[int] | None = None,
  ) -> float:
    """Compiles every program a rollout can need and runs each once; returns seconds spent.

    `num_prompts`: the prompt counts to prepare prefill for (default: the
    batch buckets divided by num_samples). With `drafter_params` (and
    spec_threshold > 0) the speculative programs are compiled too: one per
    (batch bucket <= threshold) x cache bucket x strategy. `compile_workers`: threads that
    compile them side by side (`ExecutablePool.compiling_ahead`; default one on CPU, up to
    8 on an accelerator); single-device engines only, a mesh engine compiles in turn.
    `prompt_lens`: the prompt lengths the rollouts will see, when known (a benchmark's, a
    fixed-format task's): only their prompt buckets are prepared, and no cache view shorter
    than the shortest prompt (a chunk's view covers every active row, so none is chosen).
    """
    start = time.perf_counter()
    # The weights as `generate` hands them to the programs.
    params = self.programs.read_weights(params)
    if drafter_params is not None:
      drafter_params = self.programs.read_weights(drafter_params)
    cfg = self.config
    prompt_buckets, views = cfg.prompt_buckets, cfg.view_buckets
    if prompt_lens is not None:
      if not len(prompt_lens) or not all(1 <= n <= cfg.max_prompt_len for n in prompt_lens):
        raise ValueError(
          f"prompt_lens must be non-empty, each in [1, max_prompt_len={cfg.max_prompt_len}], "
          f"got {list(prompt_lens)!r}"
        )
      prompt_buckets = sorted({round_up(n, cfg.prompt_buckets) for n in prompt_lens})
      views = tuple(v for v in views if v >= min(prompt_lens))
    walk = functools.partial(
      self._warmup_walk,
      params,
      sampling or self.sampling,
      num_prompts,
      num_samples,
      prompt_buckets,
      views,
    )
    # Every program compiled and run once (first runs carry one-time costs). Compiles that
    # overlap answer with stand-ins that run nothing: then a second walk runs the programs
    # (unless a caller's `compiling_ahead` still defers them: its own walks run them).
    with self.pool.compiling_ahead(compile_workers if self.placement is None else 1):
      deferred = self.pool.deferring
      walk(drafter_params)
    if deferred and not self.pool.deferring:
      walk(drafter_params)
    return time.perf_counter() - start

  def _warmup_walk(
    self, params, sampling, num_prompts, num_samples, prompt_buckets, views, drafter_params
  ) -> None:
    cfg, progs = self.config, self.programs
    key = jax.random.key(0)
    counts = num_prompts or sorted({max(1, b // num_samples) for b in cfg.batch_buckets})
    for p in counts:
      for tp in prompt_buckets:
        progs.run_prefill(
          params,
          np.ones((p, tp), np.int32),
          np.full((p,), tp),
          num_samples,
          np.ones((p * num_samples,), np.int32),
          np.arange(p * num_samples),
          sampling,
          key,
        )
    for b in cfg.batch_buckets:
      state = progs.rows(self._dummy_state(b))
      for view in views:
        # One real step: see `_live`.
        args = (
          progs.weights(params, b),
          self._live(state),
          progs.replicate(key, b),
          jax.device_put(np.int32(1)),
        )
        state, _ = progs.decode(sampling, view, args)(*args)
      for b2 in cfg.batch_buckets:
        if b2 < b:
          rows = jnp.zeros((b2,), jnp.int32)
          progs.take((state, rows, rows > 0))
      for positions in cfg.harvest_sizes(b) or (0,):
        progs.harvest((state, jnp.zeros((b,), jnp.int32), jax.device_put(np.int32(0))), positions)
      spec = drafter_params is not None or not cfg.needs_drafter
      if spec and cfg.spec_threshold and b <= cfg.spec_threshold:
        self._warmup_spec(
          progs.weights(params, b),
          progs.weights(drafter_params, b),
          sampling,
          state,
          views,
        )
    if self.placement is not None:
      self.placement.clear()

  def _warmup_spec(self, params, drafter_params, sampling, state: RolloutState, views) -> None:
    cfg, progs = self.config, self.programs
    key = progs.replicate(jax.random.key(0), state.batch)
    dstate = None
    if cfg.needs_drafter:
      for width in sorted({min(v, cfg.slots) for v in views}):
        args = (params, drafter_params, state)
        dstate = progs.rows(progs.drafter_prefill(width, args)(*args))
    corpus = progs.empty_corpus(state.batch) if cfg.uses_group else None
    for strategy in cfg.strategies:
      for view in views:
        if view >= strategy.nodes:
          # Run each once, one real round where the draft fits the view (see `_live`).
          rounds = int(view > strategy.nodes)
          live = self._live(state) if rounds else state
          if strategy.uses_drafter:
            args = (params, drafter_params, live, *dstate)
          else:
            args = (params, None, live, None, None)
          args += (corpus if strategy.uses_group else None, key, jax.device_put(np.int32(rounds)))
          state, dcache, dlen, _ = progs.spec(sampling, strategy, view, args)(*args)
          if strategy.uses_drafter:
            dstate = (dcache, dlen)  # a tuple, as in generate: the pytree types must match
    if dstate is not None:
      for b2 in cfg.batch_buckets:
        if b2 < state.batch:
          progs.drafter_take((dstate, jnp.zeros((b2,), jnp.int32)))

  def _live(self, state: RolloutState) -> RolloutState:
    """The warm-up's rows made active, one token from their end (length 1 of 2).

    A program's first run must execute its decode loop's body: on XLA:CPU the first
    execution of a loop body that never ran is far slower than the next (each chunk program
    and cache view; experiments/RESULTS.md), so a warm-up of zero steps left that cost to
    the first real chunk of every arm, where it became the bandit's first measurement of
    that arm and kept the arm out of its choices."""
    b = state.batch  # distinct buffers: the state is donated
    live = state.replace(
      length=jnp.ones((b,), jnp.int32),
      prompt_len=jnp.ones((b,), jnp.int32),
      max_len=jnp.full((b,), 2, jnp.int32),
      done=jnp.zeros((b,), bool),
    )
    return self.programs.rows(live)

  def _dummy_state(self, b: int) -> RolloutState:
    cfg, m = self.config, self.model_config
    hid_len = cfg.slots if cfg.capture_hidden else 0
    return RolloutState(
      cache=KVCache.zeros(m, b, cfg.cache_slots),
      tokens=jnp.zeros((b, cfg.slots), jnp.int32),
      logprobs=jnp.zeros((b, cfg.slots), jnp.float32),
      hidden=jnp.zeros((b, hid_len, m.d_model), m.jnp_dtype),
      length=jnp.ones((b,), jnp.int32),
      prompt_len=jnp.ones((b,), jnp.int32),
      max_len=jnp.ones((b,), jnp.int32),
      done=jnp.ones((b,), bool),
      seq_id=jnp.full((b,), -1, jnp.int32),
    )

  # ----------------------------------------------------------------- rollout
  def generate(
    self,
    params: nnx.State,
    prompts: Sequence[Sequence[int]],
    num_samples: int = 1,
    *,
    key: jax.Array | int = 0,
    max_new_tokens: int | Sequence[int] | None = None,
    sampling: SamplingConfig | None = None,
    seq_id_offset: int = 0,
    drafter_params: nnx.State | None = None,
    on_chunk: Callable[[int, float], nnx.State | None] | None = None,
    on_finished: Callable[[int, np.ndarray], None] | None = None,
  ) -> RolloutResult:
    """Samples `num_samples` completions for each prompt.

    Args:
      params: the policy's parameter state.
      prompts: token-id lists (each non-empty, within max_prompt_len).
      num_samples: G, samples per prompt; row n = prompt n // G.
      key: base PRNG key (or int seed); row n's randomness is keyed by
        (key, seq_id_offset + n, position), independent of batch layout.
      max_new_tokens: one limit for all rows, or one per prompt, or one per row.
      sampling: overrides the engine's sampling config for this call.
      seq_id_offset: shifts sequence ids (e.g. by RL step) so calls never reuse keys.
      drafter_params: the EAGLE drafter's params; speculative decoding runs only
        when they are given and the config's spec_threshold > 0. The output
        distribution is the target's either way (greedy: the same tokens).
      on_chunk: called as `on_chunk(batch, rebuild_s)` at every chunk boundary (after
        compaction) with the batch bucket of the next chunk; may return new drafter
        params, used from the next chunk on (a host-side scheduler trains the drafter
        during the long tail). A pushed version invalidates the drafter cache, so the
        next speculative chunk rebuilds it (unless a plain chunk dropped the cache
        first): `rebuild_s` reports the seconds such push-forced rebuilds took since
        the previous call (lazy compiles left out, as in `generation_seconds`), and
        after the last chunk one more call, `on_chunk(0, rebuild_s)`, reports what is
        left (its return is ignored). Each call is timed in the timeline
        ("drafter_hook"), each push-forced rebuild marked (`forced_by_push`). Never
        changes the output: verification is exact whatever the drafter.
      on_finished: called as `on_finished(n, completion_tokens)` once per row n, when the
        row is copied to the host (each such harvest timed in the timeline, "harvest"):
        at the compaction that drops it, or at the end. The
        trainer starts scoring its reward there, so the reward threads work while the
        device decodes the long tail. Never changes the output.
    """
    cfg = self.config
    sampling = sampling or self.sampling
    n_rows = len(prompts) * num_samples if isinstance(num_samples, int) else 0
    if max_new_tokens is None:
      max_new_rows = [cfg.max_new_tokens] * n_rows
    elif isinstance(max_new_tokens, int | np.integer):
      max_new_rows = [int(max_new_tokens)] * n_rows
    else:
      mx = [int(m) for m in max_new_tokens]
      if len(mx) == len(prompts):
        mx = [m for m in mx for _ in range(num_samples)]
      elif len(mx) != n_rows:
        raise ValueError(
          f"max_new_tokens has {len(mx)} entries; expected one per prompt "
          f"({len(prompts)}) or per row ({n_rows})"
        )
      max_new_rows = mx
    self._validate(prompts, num_samples, max_new_rows)
    if drafter_params is not None:
      if self.drafter_graphdef is None:
        raise ValueError("drafter_params given but the engine was built without drafter_graphdef")
      check_drafter_matches(drafter_params, self.model_config)
      drafter_params = self.programs.read_weights(drafter_params)
    # Once per rollout, not per step.
    params = self.programs.read_weights(params)
    if isinstance(key, int):
      key = folded_key(key)
    if self.placement is not None:
      self.placement.clear()  # params are placed once per rollout and bucket
    run = RolloutRun(
      self,
      params,
      prompts,
      num_samples,
      max_new_rows,
      key=key,
      sampling=sampling,
      seq_id_offset=seq_id_offset,
      drafter_params=drafter_params,
      on_chunk=on_chunk,
      on_finished=on_finished,
    )
    while run.active().any():
      run.compact()
      run.drafter_hook()
      arm, learn = run.choose_arm()
      run.run_chunk(arm, learn)
    return run.finish()

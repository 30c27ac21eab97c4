"""One rollout, step by step: the loop of `RolloutEngine.generate` as named steps.

    run = RolloutRun(engine, ...)        # prefill: every row's prompt, first token
    while run.active().any():
      run.compact()                      # harvest finished rows, move to a smaller bucket
      run.drafter_hook()                 # the scheduler may push a new drafter version
      arm, learn = run.choose_arm()      # plain decode or a draft strategy (the bandit)
      run.run_chunk(arm, learn)          # one device call; timeline entry, bandit reward
    result = run.finish()                # harvest the rest, feed the group history

The run holds the device state, host mirrors of its small per-row arrays, the drafter's
cache (when a drafter arm keeps it in step), the group-draft corpus, the timeline and the
harvested rows. The engine owns the bandits and the history, and its `programs`
(`EnginePrograms`) the compiled programs and their placement: the run calls only those.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx

from tlt_jax.decode.group_drafts import GroupCorpus
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.drafter import check_drafter_matches
from tlt_jax.rollout import decisions
from tlt_jax.rollout.bandit import PLAIN
from tlt_jax.rollout.history import reference_line
from tlt_jax.rollout.state import plain_reach, round_up, spec_reach

if TYPE_CHECKING:
  from tlt_jax.rollout.engine import RolloutEngine
  from tlt_jax.rollout.result import RolloutResult


def completion(harvested: dict[str, np.ndarray]) -> np.ndarray:
  """The generated tokens of one harvested row."""
  return harvested["tokens"][harvested["prompt_len"] : harvested["length"]]


class RolloutRun:
  """The mutable state of one `generate` call and its steps (see the module docstring)."""

  def __init__(
    self,
    engine: RolloutEngine,
    params: nnx.State,
    prompts: Sequence[Sequence[int]],
    num_samples: int,
    max_new_rows: Sequence[int],
    *,
    key: jax.Array,
    sampling: SamplingConfig,
    seq_id_offset: int,
    drafter_params: nnx.State | None,
    on_chunk: Callable[[int, float], nnx.State | None] | None,
    on_finished: Callable[[int, np.ndarray], None] | None = None,
  ):
    self.engine, self.cfg = engine, engine.config
    self.params, self.drafter_params = params, drafter_params
    self.prompts, self.num_samples = prompts, num_samples
    self.key, self.sampling, self.seq_id_offset = key, sampling, seq_id_offset
    self.on_chunk, self.on_finished = on_chunk, on_finished
    self.n_rows = len(prompts) * num_samples
    self.start = time.perf_counter()
    lens = np.array([len(p) for p in prompts], np.int32)
    prompts_np = np.zeros((len(prompts), int(lens.max())), np.int32)
    for i, p in enumerate(prompts):
      prompts_np[i, : len(p)] = np.asarray(p, np.int32)
    seq_ids = seq_id_offset + np.arange(self.n_rows, dtype=np.int32)
    compile_s = engine.pool.compile_seconds
    self.state = engine.programs.run_prefill(
      params,
      prompts_np,
      lens,
      num_samples,
      np.asarray(max_new_rows, np.int32),
      seq_ids,
      sampling,
      key,
    )
    # Host mirrors of the small per-row arrays (one read); rows map to request rows.
    st = self.state
    self.row_seq, self.length, self.done, self.prompt_len, self.max_len = jax.device_get(
      (st.seq_id, st.length, st.done, st.prompt_len, st.max_len)
    )
    prefill = {
      "t": 0.0,
      "dt": time.perf_counter() - self.start,
      "phase": "prefill",
      "active": int((~self.done).sum()),
      "batch": self.state.batch,
      # The program's shape: prompts (batch bucket) x prompt tokens (prompt bucket).
      "prompts": round_up(len(prompts), self.cfg.batch_buckets),
      "view": round_up(int(lens.max()), self.cfg.prompt_buckets),
      "tokens": self.n_rows,
    }
    if engine.pool.compile_seconds > compile_s:
      prefill["compile_s"] = engine.pool.compile_seconds - compile_s
    self.timeline: list[dict[str, Any]] = [prefill]
    self.outputs: dict[int, dict[str, np.ndarray]] = {}
    # The last harvest's hidden states on their way to the host: (packed device block,
    # [(row n, its first position in the block, its length)]), read into `outputs` at the
    # next harvest or the end.
    self.hidden_in_flight: tuple[jax.Array, list[tuple[int, int, int]]] | None = None
    # Group drafts: the corpus of the current layout (built on the first group chunk
    # after a change; the siblings' progress is read on the device).
    self.group_corpus: GroupCorpus | None = None
    self.spec_on = bool(self.cfg.spec_threshold) and (
      drafter_params is not None or not self.cfg.needs_drafter
    )
    self.bandit = engine.bandit_for(sampling)
    self.dstate = None  # (drafter cache, drafter_len) in step with `state`, or None
    self.push_forced = False  # the drafter cache was dropped for a pushed drafter version
    # The drafter cache was dropped by an arm that does not advance it (plain or group
    # drafts): rebuilding it is the cost of switching back, charged to the arm that needs
    # it. The first build of a rollout is not: every drafter arm would pay it, and
    # charging it to whichever arm happens to run first makes the incumbent look slow.
    self.switched_away = False
    self.owed_rebuild_s = 0.0  # push-forced rebuild seconds not yet reported to on_chunk

  # ------------------------------------------------------------------ the steps
  def active(self) -> np.ndarray:
    return ~self.done & (self.row_seq >= 0)

  def compact(self) -> None:
    """Finished rows are harvested and the rest gathered into the smallest batch bucket
    that holds them (with the drafter's cache, when it is in step)."""
    if not self.cfg.compact:
      return
    active = self.active()
    target = decisions.bucket_after_compaction(
      int(active.sum()), self.state.batch, self.cfg.batch_buckets
    )
    if target == self.state.batch:
      return
    self.harvest(np.nonzero(self.done & (self.row_seq >= 0))[0])
    keep = np.nonzero(active)[0]
    rows = np.zeros((target,), np.int32)
    rows[: keep.size] = keep
    valid = np.arange(target) < keep.size
    eng = self.engine
    args = (self.state, *jax.device_put((rows, valid)))
    self.state = eng.programs.rows(eng.programs.take(args)(*args))
    if self.dstate is not None:
      args = (self.dstate, jax.device_put(rows))
      self.dstate = eng.programs.rows(eng.programs.drafter_take(args)(*args))
    self.row_seq = np.where(valid, self.row_seq[rows], -1)
    self.length, self.max_len = self.length[rows], self.max_len[rows]
    self.prompt_len = self.prompt_len[rows]
    self.done = np.where(valid, self.done[rows], True)

  def drafter_hook(self) -> None:
    """`on_chunk` at the chunk boundary; a pushed drafter version replaces the drafter
    (its cache, built by the old version, is rebuilt by the next drafter chunk)."""
    if self.on_chunk is None:
      return
    pushed = self._call_hook(self.state.batch, int(self.active().sum()))
    if pushed is not None:
      check_drafter_matches(pushed, self.engine.model_config)
      pushed = self.engine.programs.read_weights(pushed)
      # The cache was built by the old drafter: its rebuild is the push's cost.
      self.push_forced = self.push_forced or self.dstate is not None
      self.drafter_params, self.dstate = pushed, None

  def choose_arm(self) -> tuple[str, bool]:
    """(arm, learn): plain decode above the speculative threshold; below it the bandit's
    choice (learning from the chunk's reward) or the first strategy when not adaptive
    (`decisions.choose_arm`)."""
    cfg, batch = self.cfg, self.state.batch
    return decisions.choose_arm(
      self.bandit,
      batch,
      speculate=self.spec_on and batch <= cfg.spec_threshold,
      default=cfg.strategies[0].name if cfg.strategies else PLAIN,
    )

  def run_chunk(self, arm: str, learn: bool) -> None:
    """One device call of `arm` (or of a compiled arm while its program compiles in the
    background: `_held_arm`); its timeline entry and, when learning, its reward."""
    active = self.active()
    chosen = arm
    arm, teach = self._held_arm(arm, learn, active)
    pool = self.engine.pool
    beside = pool.background_busy  # a compile shares the host with this chunk
    compile_s = pool.compile_seconds
    before = int(self.length[active].sum())
    generated = float((self.length - self.prompt_len)[active].mean())
    if arm == PLAIN:
      t0, entry, view, full, cost = self._decode(active, learn, teach)
    else:
      t0, entry, view, full, cost = self._speculate(arm, active, teach)
    dt = time.perf_counter() - t0
    # Its one step or round (`_first_run`), or a rebuild charged to it whose program ran for
    # the first time: that lesson would price a one-time cost as the arm's.
    teach = teach and not (entry.get("first_run") or entry.get("rebuild_first_run"))
    tokens = int(self.length[active].sum()) - before
    compiled = pool.compile_seconds - compile_s
    if compiled:
      entry["compile_s"] = compiled  # lazy pools: this chunk (or its rebuild) compiled
    if arm != chosen:
      entry["instead_of"] = chosen  # its program was compiling in the background
    if beside:
      entry["beside_compile"] = True  # not the arm's speed alone (`sim.costs` skips it)
    entry["full"] = bool(full)  # ran every step or round it asked for
    if teach:
      ran = entry["steps"] if arm == PLAIN else entry["rounds"]
      measured = decisions.measured(arm, ran, entry["requested"], self.cfg.chunk_steps)
      self._teach(entry, arm, measured, tokens, dt, compiled, cost)
    self.timeline.append(
      {
        "t": t0 - self.start,
        "dt": dt,
        "active": int(active.sum()),
        "batch": self.state.batch,
        "view": view,
        "tokens": tokens,
        "generated": generated,  # tokens generated per active row at the chunk's start
        **entry,
      }
    )
    self._compile_ahead(arm, view)

  def _held_arm(self, arm: str, learn: bool, active: np.ndarray) -> tuple[str, bool]:
    """(the arm to run, whether its chunk teaches the bandit) for the bandit's choice `arm`.

    With `EngineConfig.background_compiles` and the bandit choosing (`learn`), an arm whose
    program is not compiled yet compiles on the pool's background thread while an arm
    whose program is held runs the chunk, the best by the bandit's means: every arm emits
    the same tokens, so the rollout need not wait. With none held it compiles here, as
    without. A chunk run beside a background compile teaches nothing: the compile shares
    the host, and what the chunk measured is not the arm's speed alone (as a chunk that
    compiled is not)."""
    if not (learn and self.cfg.background_compiles):
      return arm, learn
    if not self._held(arm, active, rebuild=False):
      for other in self.bandit.ranked(self.state.batch):
        if other != arm and self._held(other, active) and self._compile_later(arm, active):
          return other, False
    return arm, not self.engine.pool.background_busy

  def finish(self) -> RolloutResult:
    """Harvests the remaining rows, reports the last push-forced rebuild, and feeds the
    engine's own rollouts (not evaluation at another sampling) to the group history."""
    if self.on_chunk is not None and self.owed_rebuild_s:
      self._call_hook(0, 0)  # the last push-forced rebuild's report
    self.harvest(np.nonzero(self.row_seq >= 0)[0])
    if self.hidden_in_flight is not None:
      t0 = time.perf_counter()
      self.receive_hidden()
      self._host_entry("harvest", t0, rows=0, positions=0)  # the last copy's wait
    wall = time.perf_counter() - self.start
    eng = self.engine
    if eng.history is not None and self.sampling == eng.sampling:
      for p, prompt in enumerate(self.prompts):
        group = range(p * self.num_samples, (p + 1) * self.num_samples)
        eng.history.add(prompt, [completion(self.outputs[n]) for n in group])
    return eng.programs.assemble(self.outputs, self.n_rows, self.num_samples, self.timeline, wall)

  def harvest(self, rows: np.ndarray) -> None:
    """Copies finished rows (their tokens, log-probs, features) to the host.

    The hidden states (the bulk) travel packed: each row's positions up to its length, end
    to end, padded to one of `EngineConfig.harvest_sizes` (a bucket's rows times its cache
    width copied up to several times the bytes the rows hold). They are only started on
    their way (`copy_to_host_async`) and read at the next harvest or when the rollout
    finishes (`receive_hidden`): on an accelerator the copy overlaps the chunks that decode
    the rest, where waiting for it here stalled the long tail (experiments/RESULTS.md,
    2026-12-04, the H200's curve), and at most one harvest's copy holds device memory.
    Its host seconds are a "harvest" entry of the timeline (`RolloutResult.phase_seconds`)
    with the rows and the packed positions copied."""
    if rows.size == 0:
      return
    t0 = time.perf_counter()
    self.receive_hidden()
    padded = np.zeros((self.state.batch,), np.int32)
    padded[: rows.size] = rows
    args = (self.state, *jax.device_put((padded, np.int32(rows.size))))
    sizes = self.cfg.harvest_sizes(self.state.batch)
    positions = round_up(int(self.length[rows].sum()), sizes) if sizes else 0
    out = dict(self.engine.programs.harvest(args, positions)(*args))
    hidden = out.pop("hidden", None)
    if hidden is not None:
      hidden.copy_to_host_async()
    got = jax.device_get(out)
    held = [int(x) for x in got["length"][: rows.size]]
    if sum(held) > positions and hidden is not None:
      raise RuntimeError(f"harvested rows hold {sum(held)} positions, packed {positions}")
    pairs, start = [], 0
    for j in range(rows.size):
      n = int(got["seq_id"][j]) - self.seq_id_offset
      self.outputs[n] = {k: v[j] for k, v in got.items()}
      pairs.append((n, start, held[j]))
      start += held[j]
      if self.on_finished is not None:
        self.on_finished(n, completion(self.outputs[n]))
    if hidden is not None:
      self.hidden_in_flight = (hidden, pairs)
    self.group_corpus = None  # finished rows move from the live siblings to the reference
    self._host_entry("harvest", t0, rows=int(rows.size), positions=positions)

  def receive_hidden(self) -> None:
    """The last harvest's hidden states, now on the host, into their rows' `outputs`
    (views of the packed block)."""
    if self.hidden_in_flight is None:
      return
    block, pairs = self.hidden_in_flight
    host = jax.device_get(block)  # its copy started at the harvest (copy_to_host_async)
    for n, start, held in pairs:
      self.outputs[n]["hidden"] = host[start : start + held]
    self.hidden_in_flight = None

  # ------------------------------------------------------------------ chunk kinds
  def _last_bucket(self) -> bool:
    return self.state.batch == self.cfg.batch_buckets[0]

  def _view(self, arm: str, active: np.ndarray) -> int:
    """The cache view a chunk of `arm` reads: the bucket covering its rows' furthest reach
    (every active row may grow by chunk_steps, or by its rounds' deepest emission)."""
    cfg = self.cfg
    if arm == PLAIN:
      reach = plain_reach(self.length, self.max_len, cfg.chunk_steps)
    else:
      s = self.engine.strategies[arm]
      reach = spec_reach(self.length, self.max_len, cfg.spec_rounds, s.max_emit, s.nodes)
    return decisions.chunk_view(reach[active].max(), cfg.view_buckets)

  def _decode_args(self, steps: int, state=None) -> tuple:
    """The arguments of the plain decode program for `state` (default: the rollout's)."""
    eng, state = self.engine, self.state if state is None else state
    b = state.batch
    return (
      eng.programs.weights(self.params, b),
      state,
      eng.programs.replicate(self.key, b),
      jax.device_put(np.int32(steps)),
    )

  def _spec_args(self, strategy, dstate, corpus, rounds: int, state=None) -> tuple:
    """The arguments of `strategy`'s program with the drafter state `dstate`, for `state`
    (default: the rollout's)."""
    eng, state = self.engine, self.state if state is None else state
    b = state.batch
    params = eng.programs.weights(self.params, b)
    if strategy.uses_drafter:
      args = (params, eng.programs.weights(self.drafter_params, b), state, *dstate)
    else:
      args = (params, None, state, None, None)
    rounds = jax.device_put(np.int32(rounds))
    return args + (corpus, eng.programs.replicate(self.key, b), rounds)

  def _held(self, arm: str, active: np.ndarray, rebuild: bool = True) -> bool:
    """Whether the program a chunk of `arm` would run now is compiled, and with `rebuild`
    the drafter-cache build it would run first, if any (a small program, compiled in place
    where the arm itself is held: the background compiles only an arm's own program)."""
    progs, b, view = self.engine.programs, self.state.batch, self._view(arm, active)
    if arm != PLAIN and rebuild and self.engine.strategies[arm].uses_drafter:
      width = min(view, self.cfg.slots)
      if self.dstate is None and progs.drafter_prefill_key(width, b) not in progs.pool:
        return False
    return self._held_at(arm, view, b)

  def _held_at(self, arm: str, view: int, batch: int) -> bool:
    """Whether `arm`'s program over `view` slots for a `batch`-row bucket is compiled."""
    progs = self.engine.programs
    if arm == PLAIN:
      return progs.decode_key(self.sampling, view, batch) in progs.pool
    return progs.spec_key(self.sampling, self.engine.strategies[arm], view, batch) in progs.pool

  def _compile_later(self, arm: str, active: np.ndarray) -> bool:
    """Starts compiling the program of a chunk of `arm` now in the background
    (`_compile_in_background`)."""
    return self._compile_in_background(arm, self._view(arm, active), self.state)

  def _compile_ahead(self, arm: str, view: int) -> None:
    """After a chunk of `arm` over `view` slots, with the bandit choosing, background
    compiles and `EngineConfig.compile_ahead`, and no compile running: starts compiling a
    program the rollout will likely need and does not hold, so that the first chunk of a
    new cell finds it compiled (`_held_arm` otherwise hands that chunk to another arm held
    there or, with none, compiles in place). In order: `arm`'s at the next cache view, if
    a row may grow into it; the next smaller batch bucket's likely arm
    (`StrategyBandit.likely`; plain decode above the speculative threshold) at the view
    the rows need now (single-device engines). The chunk's timeline entry names what it
    started ("ahead": [arm, batch bucket, view])."""
    cfg, progs = self.cfg, self.engine.programs
    if self.bandit is None or not (cfg.background_compiles and cfg.compile_ahead):
      return
    active = self.active()
    if not active.any() or progs.pool.background_busy:
      return
    b = self.state.batch
    later = [v for v in cfg.view_buckets if v > view]
    if later and int(self.max_len[active].max()) > view and not self._held_at(arm, later[0], b):
      if self._compile_in_background(arm, later[0], self.state):
        self.timeline[-1]["ahead"] = [arm, b, later[0]]
      return
    smaller = [bucket for bucket in cfg.batch_buckets if bucket < b]
    if not (cfg.compact and smaller and progs.placement is None):
      return
    batch = smaller[-1]
    speculate = self.spec_on and batch <= cfg.spec_threshold
    arm = self.bandit.likely(batch) if speculate else PLAIN
    view = self._view(arm, active)
    if self._held_at(arm, view, batch):
      return
    if self._compile_in_background(arm, view, progs.take_shape(self.state, batch)):
      self.timeline[-1]["ahead"] = [arm, batch, view]

  def _compile_in_background(self, arm: str, view: int, state) -> bool:
    """Starts compiling `arm`'s program over `view` slots for `state`'s batch bucket in the
    background (unless another compiles there: then nothing is built); `state` is the
    rollout's or its shapes at another bucket (`EnginePrograms.take_shape`). False where
    the program cannot be described without running something first (a drafter arm's
    cache to build under a mesh)."""
    progs, b = self.engine.programs, state.batch
    if progs.pool.background_busy:
      return True
    if arm == PLAIN:
      progs.decode(self.sampling, view, self._decode_args(0, state), on_miss="background")
      return True
    strategy = self.engine.strategies[arm]
    ours = state is self.state
    dstate = self.dstate if ours else None
    if strategy.uses_drafter and dstate is None:
      if progs.placement is not None:
        return False
      built = (progs.weights(self.params, b), progs.weights(self.drafter_params, b), state)
      dstate = progs.drafter_state_shape(min(view, self.cfg.slots), built)
    corpus = None
    if strategy.uses_group:
      corpus = self.group_corpus if ours else None
      corpus = progs.empty_corpus(b) if corpus is None else corpus
    args = self._spec_args(strategy, dstate, corpus, 0, state)
    progs.spec(self.sampling, strategy, view, args, on_miss="background")
    return True

  def _first_run(self, get: Callable[[], Any]) -> tuple[Any, bool]:
    """(`get()`'s program, whether this is its first run).

    A program's first execution carries one-time costs (`rollout.pool`; on XLA:CPU a
    first chunk runs far slower than its cell's later ones: experiments/RESULTS.md). Its
    timeline entry is marked `first_run` (the simulator's cost tables leave it out), and a
    chunk that would teach the bandit runs it for one step or round and teaches nothing,
    so that an arm is judged by its pace, not by its compile's aftermath (the arms the
    bandit rarely pulls were otherwise judged mostly by first runs); the arm's next chunk
    teaches."""
    before = self.engine.pool.first_runs
    program = get()
    return program, self.engine.pool.first_runs > before

  def _decode(self, active: np.ndarray, learn: bool, teach: bool):
    """Plain decode for chunk_steps (to the end of the cache view in the last bucket unless
    the bandit compares arms there, `decisions.runs_to_end`; one step for a teaching
    chunk's first run of its program, `_first_run`). Returns (t0, entry, view, full,
    (charged_s, rebuild_compile))."""
    cfg, eng = self.cfg, self.engine
    t0 = time.perf_counter()
    self.switched_away = self.switched_away or self.dstate is not None
    self.dstate = None  # plain decode does not advance the drafter's cache
    self.push_forced = False  # the switch back rebuilds it anyway
    view = self._view(PLAIN, active)
    run_to_end = decisions.runs_to_end(
      self.bandit, self.state.batch, learn=learn, last_bucket=self._last_bucket()
    )
    steps = decisions.plain_steps(cfg.chunk_steps, view, self.length[active].max(), run_to_end)
    args = self._decode_args(steps)
    program, first = self._first_run(lambda: eng.programs.decode(self.sampling, view, args))
    if first and teach:
      steps, args = 1, self._decode_args(1)
    self.state, ran = program(*args)
    self.length, self.done, ran = jax.device_get((self.state.length, self.state.done, ran))
    entry = {"phase": "decode", "steps": int(ran), "requested": steps}
    if first:
      entry["first_run"] = True  # `_first_run`
    return t0, entry, view, ran == steps, (0.0, 0.0)

  def _speculate(self, arm: str, active: np.ndarray, teach: bool):
    """spec_rounds rounds of draft + verify with strategy `arm` (one for a teaching chunk's
    first run of its program, `_first_run`), rebuilding the drafter's cache first when it
    is not in step. Returns like `_decode`; the rebuild is timed in a timeline entry of its
    own and charged to the arm only after a switch away."""
    cfg, eng = self.cfg, self.engine
    strategy = eng.strategies[arm]
    rounds = cfg.spec_rounds
    view = self._view(arm, active)
    charged_s = rebuild_compile = 0.0
    rebuild_first = False
    t0 = time.perf_counter()
    if strategy.uses_drafter and self.dstate is None:
      charged_s, rebuild_compile, rebuild_first = self._rebuild_drafter_cache(view, active, t0)
      t0 = time.perf_counter()
    corpus, corpus_s = None, 0.0
    if strategy.uses_group:
      if self.group_corpus is None:
        t_corpus = time.perf_counter()
        self.group_corpus = self._build_corpus()
        corpus_s = time.perf_counter() - t_corpus
      corpus = self.group_corpus
    args = self._spec_args(strategy, self.dstate, corpus, rounds)
    program, first = self._first_run(lambda: eng.programs.spec(self.sampling, strategy, view, args))
    if first and teach:
      rounds, args = 1, self._spec_args(strategy, self.dstate, corpus, 1)
    self.state, dcache, dlen, stats = program(*args)
    if strategy.uses_drafter:
      self.dstate = (dcache, dlen)
    else:  # the drafter's cache did not follow: the next drafter chunk rebuilds it
      self.switched_away = self.switched_away or self.dstate is not None
      self.dstate, self.push_forced = None, False
    self.length, self.done, stats = jax.device_get((self.state.length, self.state.done, stats))
    entry = {
      "phase": "spec",
      "strategy": arm,
      "rounds": int(stats.rounds),
      "row_rounds": int(stats.row_rounds.sum()),
      "accepted": int(stats.accepted.sum()),
      "requested": rounds,
    }
    if strategy.uses_group:
      entry["corpus_s"] = corpus_s  # host time building the group corpus (in dt)
    if first:
      entry["first_run"] = True  # `_first_run`
    if rebuild_first and charged_s:
      entry["rebuild_first_run"] = True  # its charged rebuild's program ran for the first time
    return t0, entry, view, stats.rounds == rounds, (charged_s, rebuild_compile)

  def _rebuild_drafter_cache(self, view: int, active: np.ndarray, t0: float):
    """Prefills the drafter's cache from the target's features; returns (seconds charged
    to the chunk's arm, lazy-compile seconds inside the rebuild, whether its program ran for
    the first time)."""
    eng = self.engine
    compile_before = eng.pool.compile_seconds
    width = min(view, self.cfg.slots)
    b = self.state.batch
    args = (
      eng.programs.weights(self.params, b),
      eng.programs.weights(self.drafter_params, b),
      self.state,
    )
    program, first = self._first_run(lambda: eng.programs.drafter_prefill(width, args))
    self.dstate = eng.programs.rows(program(*args))
    jax.block_until_ready(self.dstate)
    switch_s = time.perf_counter() - t0
    rebuild = {
      "t": t0 - self.start,
      "dt": switch_s,
      "phase": "drafter_prefill",
      "active": int(active.sum()),
      "batch": b,
      "view": width,
      "tokens": 0,
      "forced_by_push": self.push_forced,
    }
    rebuild_compile = eng.pool.compile_seconds - compile_before
    if rebuild_compile:  # a lazy pool compiled this width (in the chunk's compile_s too)
      rebuild["rebuild_compile_s"] = rebuild_compile
    if first:
      rebuild["first_run"] = True  # `_first_run`
    self.timeline.append(rebuild)
    charged_s = 0.0
    if self.push_forced:  # reported without lazy compiles (counted apart, one-time)
      self.owed_rebuild_s += switch_s - rebuild_compile
      self.push_forced = False
    elif self.switched_away:
      charged_s = switch_s - rebuild_compile
    self.switched_away = False
    return charged_s, rebuild_compile, first

  # ------------------------------------------------------------------ measurement
  def _teach(self, entry, arm, measured, tokens, dt, compiled, cost) -> None:
    """The bandit's lesson from this chunk (`decisions.teach_bandit`), timed as the chunk's
    seconds plus a drafter-cache rebuild after a switch away (leaving the drafter would
    otherwise look free and the bandit would alternate too often), less any compile the
    chunk triggered. The tokens are divided by the rows active during it (plain: tokens /
    steps; speculative: row-rounds / rounds), so rows that finish do not credit the arm that
    ran then."""
    charged_s, rebuild_compile = cost
    run_s = max(dt + charged_s - (compiled - rebuild_compile), 1e-6)
    if arm == PLAIN:
      mean_rows = tokens / max(entry["steps"], 1)
    else:
      mean_rows = entry["row_rounds"] / max(entry["rounds"], 1)
    reward = decisions.teach_bandit(
      self.bandit,
      self.state.batch,
      arm,
      run_s=run_s,
      measured=measured,
      tokens=tokens,
      mean_rows=mean_rows,
    )
    if reward is not None:
      if charged_s:
        entry["switch_s"] = charged_s
      entry["reward"] = reward
      entry["run_s"] = run_s  # the seconds the reward divides by

  # ------------------------------------------------------------------ helpers
  def _host_entry(self, phase: str, t0: float, **extra: Any) -> None:
    """A timeline entry for host work between device chunks that began at `t0` (`extra`
    adds fields or replaces the defaults: the active rows and batch bucket now)."""
    self.timeline.append(
      {
        "t": t0 - self.start,
        "dt": time.perf_counter() - t0,
        "phase": phase,
        "active": int(self.active().sum()),
        "batch": self.state.batch,
        "view": 0,
        "tokens": 0,
        **extra,
      }
    )

  def _call_hook(self, batch: int, active_rows: int):
    t_hook = time.perf_counter()
    pushed = self.on_chunk(batch, self.owed_rebuild_s)
    self.owed_rebuild_s = 0.0
    # `batch`: the next chunk's bucket (0: the rollout ended, the return is ignored).
    pushed_now = pushed is not None and batch > 0
    self._host_entry("drafter_hook", t_hook, active=active_rows, batch=batch, pushed=pushed_now)
    return pushed

  def _build_corpus(self) -> GroupCorpus:
    """Each row's siblings (live rows of its prompt) and reference line (the prompt's
    earlier rollouts and its finished siblings) for group drafts."""
    eng, cfg = self.engine, self.cfg
    w, r = cfg.group_siblings, cfg.group_reference_len
    g = self.num_samples
    row_prompt = np.where(self.row_seq >= 0, (self.row_seq - self.seq_id_offset) // g, -1)
    siblings = np.full((self.state.batch, w), -1, np.int32)
    reference = np.full((self.state.batch, r), -1, np.int32)
    for p in np.unique(row_prompt[row_prompt >= 0]):
      rows = np.flatnonzero(row_prompt == p)
      pieces = eng.history.pieces(self.prompts[p])
      for n in range(p * g, (p + 1) * g):
        if n in self.outputs:  # finished and harvested: no longer in the batch
          pieces.append(eng.history.with_context(self.prompts[p], completion(self.outputs[n])))
      line = reference_line(pieces, r)
      for i in rows:
        siblings[i, : min(w, rows.size)] = np.concatenate([[i], rows[rows != i]])[:w]
        reference[i] = line
    return eng.programs.corpus(siblings, reference)

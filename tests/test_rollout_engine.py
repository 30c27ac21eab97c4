"""Rollout engine: exact against a reference loop, layout invariant, no recompiles."""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.drafter.buffer import DrafterBuffer
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.rollout.run import RolloutRun
from tlt_jax.rollout.state import round_up

MODEL = ModelConfig(
  vocab_size=40, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64
)
ENGINE = EngineConfig(
  max_prompt_len=8,
  max_new_tokens=40,
  max_batch=16,
  chunk_steps=6,
  min_batch_bucket=2,
  min_cache_bucket=16,
  min_prompt_bucket=8,
)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15, 16, 17]]
LIMITS = [5, 37, 12, 20]  # per-prompt max new tokens: a long tail


@pytest.fixture(scope="module")
def model():
  m = init_model(MODEL, seed=3)
  graphdef, params = nnx.split(m)
  return m, graphdef, params


@pytest.fixture(scope="module")
def pool():
  return ExecutablePool()


def _engine(model, pool, sampling, **changes):
  _, graphdef, _ = model
  return RolloutEngine(graphdef, MODEL, dataclasses.replace(ENGINE, **changes), sampling, pool)


def _reference_greedy(m, prompt, n):
  """Plain full-forward greedy decoding, one fixed padded shape (one compile)."""
  graphdef, params = nnx.split(m)
  width = ENGINE.slots

  @jax.jit
  def next_token(params, toks, length):
    model = nnx.merge(graphdef, params)
    hidden, _, _ = model(toks[None], jnp.arange(width)[None])
    return jnp.argmax(model.logits(hidden[0, length - 1]))

  toks = list(prompt)
  for _ in range(n):
    padded = jnp.zeros((width,), jnp.int32).at[: len(toks)].set(jnp.asarray(toks))
    toks.append(int(next_token(params, padded, len(toks))))
  return toks


def test_greedy_equals_reference_loop_and_records_policy_outputs(model, pool):
  m, _, params = model
  res = _engine(model, pool, SamplingConfig(temperature=0.0)).generate(
    params, PROMPTS, 1, max_new_tokens=LIMITS
  )
  for n, p in enumerate(PROMPTS):
    assert res.num_generated[n] == LIMITS[n]
    want = _reference_greedy(m, p, LIMITS[n])
    assert list(res.tokens[n, : res.length[n]]) == want
    # Log-probs and hidden states are the policy's, from a full forward pass.
    seq = jnp.asarray([want])
    hidden, _, _ = m(seq, jnp.arange(len(want))[None])
    logp = jax.nn.log_softmax(m.logits(hidden)[0, :-1])
    expected = np.asarray(logp[np.arange(len(want) - 1), np.asarray(want[1:])])
    np.testing.assert_allclose(res.completion_logprobs(n), expected[len(p) - 1 :], atol=1e-4)
    np.testing.assert_allclose(res.hidden[n, : len(want) - 1], hidden[0, :-1], atol=1e-4)


def test_sampled_tokens_do_not_depend_on_layout(model, pool):
  """Compaction, chunk size and cache buckets change nothing for the same seeds."""
  _, _, params = model
  sampling = SamplingConfig(temperature=1.0, top_k=20)
  runs = [
    _engine(model, pool, sampling).generate(params, PROMPTS, 3, key=11, max_new_tokens=LIMITS)
    for _ in range(1)
  ]
  runs.append(
    _engine(model, pool, sampling, compact=False, cache_buckets=False).generate(
      params, PROMPTS, 3, key=11, max_new_tokens=LIMITS
    )
  )
  runs.append(
    _engine(model, pool, sampling, chunk_steps=4).generate(
      params, PROMPTS, 3, key=11, max_new_tokens=LIMITS
    )
  )
  base = runs[0]
  # The compacted run really ran its tail at a smaller batch.
  assert min(e["batch"] for e in base.timeline) < max(e["batch"] for e in base.timeline)
  assert all(e["batch"] == 16 for e in runs[1].timeline)
  for other in runs[1:]:
    np.testing.assert_array_equal(other.length, base.length)
    for n in range(len(base.length)):
      np.testing.assert_array_equal(other.completion(n), base.completion(n))
      np.testing.assert_allclose(
        other.completion_logprobs(n), base.completion_logprobs(n), atol=1e-4
      )
  # Generation time by batch bucket: the tail's share is a part of the whole.
  decode = [e for e in base.timeline if e["phase"] == "decode"]
  small = min(e["batch"] for e in decode)
  total = sum(e["dt"] - e.get("compile_s", 0.0) for e in decode)
  assert base.generation_seconds() == pytest.approx(total)
  assert 0 < base.generation_seconds(small) < base.generation_seconds()
  # Different samples of one prompt differ; a different key changes the output.
  assert not np.array_equal(base.completion(3), base.completion(4))
  again = _engine(model, pool, sampling).generate(params, PROMPTS, 3, key=12, max_new_tokens=LIMITS)
  assert any(not np.array_equal(again.completion(n), base.completion(n)) for n in range(12))


def test_stop_tokens_end_sequences(model, pool):
  _, _, params = model
  eng = _engine(model, pool, SamplingConfig(temperature=1.0), stop_tokens=(5, 7))
  res = eng.generate(params, PROMPTS, 4, key=0)
  stopped = 0
  for n in range(len(res.length)):
    comp = res.completion(n)
    assert not np.isin(comp[:-1], [5, 7]).any()
    if comp[-1] in (5, 7):
      stopped += 1
    else:
      assert len(comp) == ENGINE.max_new_tokens
  assert stopped > 0


def test_finished_rows_are_reported_as_they_are_harvested(model, pool):
  """on_finished gets each row once, with its completion, as compaction drops it: the
  short rows before the long tail's last chunks (where the trainer starts their rewards).
  The output is the same as without the callback."""
  _, _, params = model
  sampling = SamplingConfig(temperature=1.0)
  chunks, got = [], {}

  def on_finished(n, tokens):
    assert n not in got
    got[n] = (np.array(tokens), len(chunks))

  def on_chunk(batch, rebuild_s):
    chunks.append(batch)

  res = _engine(model, pool, sampling).generate(
    params, PROMPTS, 2, key=5, max_new_tokens=LIMITS, on_finished=on_finished, on_chunk=on_chunk
  )
  plain = _engine(model, pool, sampling).generate(params, PROMPTS, 2, key=5, max_new_tokens=LIMITS)
  assert sorted(got) == list(range(8))
  for n, (tokens, _) in got.items():
    np.testing.assert_array_equal(tokens, res.completion(n))
    np.testing.assert_array_equal(tokens, plain.completion(n))
  # The rows of the 5-token prompt were reported while the 37-token ones still decoded.
  assert got[0][1] < len(chunks) and got[1][1] < len(chunks)


def test_hidden_states_are_copied_only_as_far_as_the_rows_reach(model, pool):
  """With harvest_hidden the result's hidden states cover every row's positions up to the
  longest row (not all slots), copied packed: each harvest's positions are the smallest
  of `harvest_sizes` that holds its rows' lengths, not its bucket's rows times a width.
  Without, none are copied to the host. Tokens and log-probs are the same either way."""
  _, _, params = model
  sampling = SamplingConfig(temperature=1.0)
  short = [3, 5, 2, 4]  # rows end by position 13, of 48 slots
  kept = _engine(model, pool, sampling).generate(params, PROMPTS, 2, key=5, max_new_tokens=short)
  dropped = _engine(model, pool, sampling, harvest_hidden=False).generate(
    params, PROMPTS, 2, key=5, max_new_tokens=short
  )
  assert dropped.hidden is None
  np.testing.assert_array_equal(kept.tokens, dropped.tokens)
  np.testing.assert_array_equal(kept.logprobs, dropped.logprobs)
  assert kept.hidden.shape == (8, int(kept.length.max()), MODEL.d_model)
  assert ENGINE.slots == 48 and int(kept.length.max()) <= 13
  full = _engine(model, pool, sampling).generate(params, PROMPTS, 2, key=5, max_new_tokens=LIMITS)
  assert full.hidden.shape[1] == int(full.length.max())
  assert ENGINE.harvest_sizes(4) == (192,) and ENGINE.harvest_sizes(8) == (256, 384)
  assert ENGINE.harvest_sizes(64)[:2] == (256, 512) and ENGINE.harvest_sizes(64)[-1] == 64 * 48
  assert dataclasses.replace(ENGINE, harvest_hidden=False).harvest_sizes(8) == ()
  # Each harvest is a timeline entry of its rows: every row harvested once, the packed
  # positions the copies took, and their host seconds inside the rollout's.
  harvests = [e for e in full.timeline if e["phase"] == "harvest"]
  assert sum(e["rows"] for e in harvests) == 8 and len(harvests) >= 2
  for e in harvests:
    if e["rows"]:
      assert e["positions"] in ENGINE.harvest_sizes(e["batch"])
  assert sum(e["positions"] for e in harvests) >= int(full.length.sum())
  assert 0 < full.phase_seconds("harvest") < full.wall_seconds
  assert all(e["positions"] == 0 for e in dropped.timeline if e["phase"] == "harvest")


def test_a_packed_harvest_holds_each_row_up_to_its_length(model, pool):
  """The harvest program packs the first `count` rows' hidden states end to end: each
  row's positions before its length, in order, zeros after; rows past `count` and
  positions past a length are not copied."""
  _, _, params = model
  sampling = SamplingConfig(temperature=1.0)
  engine = _engine(model, pool, sampling)
  run = RolloutRun(
    engine,
    params,
    PROMPTS,
    2,
    [m for m in LIMITS for _ in range(2)],
    key=jax.random.key(5),
    sampling=sampling,
    seq_id_offset=0,
    drafter_params=None,
    on_chunk=None,
  )
  run.run_chunk(*run.choose_arm())  # rows of several lengths past their prompts
  state = run.state
  hidden, length = np.asarray(state.hidden), np.asarray(state.length)
  rows = np.array([3, 0, 6, 1] + [0] * (state.batch - 4), np.int32)
  args = (state, jnp.asarray(rows), np.int32(3))
  size = round_up(int(length[rows[:3]].sum()), ENGINE.harvest_sizes(state.batch))
  out = engine.programs.harvest(args, size)(*args)
  want = np.concatenate([hidden[r, : length[r]] for r in rows[:3]])
  got = np.asarray(out["hidden"])
  assert got.shape == (size, MODEL.d_model)
  np.testing.assert_array_equal(got[: len(want)], want)
  assert not got[len(want) :].any()
  np.testing.assert_array_equal(np.asarray(out["length"])[:3], length[rows[:3]])


def test_hidden_states_arrive_in_the_harvest_dtype_as_the_drafter_buffer_would_store_them(
  model, pool
):
  """harvest_dtype casts the copied hidden states on the device: the rows' tokens are the
  same, the hidden states are float32's rounded to bfloat16 bit for bit, and a drafter
  buffer of that dtype stores the same features from either."""
  _, _, params = model
  sampling = SamplingConfig(temperature=1.0)
  args = (params, PROMPTS, 2)
  kw = {"key": 5, "max_new_tokens": LIMITS}
  f32 = _engine(model, pool, sampling).generate(*args, **kw)
  bf16 = _engine(model, pool, sampling, harvest_dtype="bfloat16").generate(*args, **kw)
  np.testing.assert_array_equal(f32.tokens, bf16.tokens)
  assert f32.hidden.dtype == np.float32 and bf16.hidden.dtype == jnp.bfloat16
  np.testing.assert_array_equal(
    f32.hidden.astype(jnp.bfloat16).view(np.uint16), bf16.hidden.view(np.uint16)
  )
  stored = []
  for result in (f32, bf16):
    buffer = DrafterBuffer(8, ENGINE.slots, MODEL.d_model, keep_steps=1, dtype=jnp.bfloat16)
    buffer.add(result.tokens, result.hidden, result.prompt_len, result.length, step=0)
    stored.append(buffer.features.view(np.uint16))
  np.testing.assert_array_equal(*stored)
  with pytest.raises(ValueError, match="harvest_dtype"):
    dataclasses.replace(ENGINE, harvest_dtype="int8")


def test_no_recompiles_after_warmup(model):
  _, _, params = model
  eng = _engine(
    model, ExecutablePool(), SamplingConfig(temperature=1.0), max_batch=8, max_new_tokens=24
  )
  eng.warmup(params, num_samples=2)
  compiled = eng.pool.compiles
  assert compiled > 0 and all(row["compile_s"] > 0 for row in eng.pool.summary())
  for k, prompts in enumerate([PROMPTS, PROMPTS[:1], PROMPTS[1:3]]):
    eng.generate(params, prompts, 2, key=k, max_new_tokens=[24, 3, 10, 17][: len(prompts)])
  assert eng.pool.compiles == compiled


@pytest.mark.parametrize(
  "prompts,kwargs,match",
  [
    ([[]], {}, "prompt 0 is empty"),
    ([[1] * 9], {}, "more than max_prompt_len"),
    ([[1, 40]], {}, "outside the vocabulary"),
    ([[1, -1]], {}, "outside the vocabulary"),
    ([[1.5, 2]], {}, "integer token ids"),
    ([[1]], {"max_new_tokens": 41}, "max_new_tokens=40"),
    ([[1]], {"max_new_tokens": 0}, "must be in"),
    ([[1], [2]], {"max_new_tokens": [3, 4, 5]}, "one per prompt"),
    ([[1]] * 5, {"num_samples": 4}, "exceeds max_batch"),
    ([], {}, "no prompts"),
  ],
)
def test_bad_requests_fail_clearly(model, pool, prompts, kwargs, match):
  _, _, params = model
  with pytest.raises(ValueError, match=match):
    _engine(model, pool, SamplingConfig()).generate(params, prompts, **kwargs)


def test_a_pad_row_beside_the_last_row_changes_nothing(model, pool):
  """One row alone (min_batch_bucket 1) and beside a pad row (2): the same tokens and
  log-probs (a floor of 2 keeps a GPU's one-row products matrix products,
  experiments/deviceless.py)."""
  _, _, params = model
  sampling = SamplingConfig(temperature=1.0, top_k=20)
  alone, padded = [
    _engine(model, pool, sampling, min_batch_bucket=b).generate(
      params, PROMPTS[1:2], 1, key=5, max_new_tokens=LIMITS[1]
    )
    for b in (1, 2)
  ]
  assert {e["batch"] for e in alone.timeline} == {1} and {e["batch"] for e in padded.timeline} == {
    2
  }
  np.testing.assert_array_equal(alone.completion(0), padded.completion(0))
  assert alone.num_generated[0] == LIMITS[1]
  np.testing.assert_allclose(alone.completion_logprobs(0), padded.completion_logprobs(0), atol=1e-5)


def test_a_one_row_step_as_a_two_token_forward_gives_the_same_output(model, pool):
  """A one-row bucket's plain step with its token in twice (`one_row_step` "paired", a
  GPU's default) or once: the same tokens and log-probs, from a program of its own."""
  _, _, params = model
  sampling = SamplingConfig(temperature=1.0, top_k=20)
  single, paired = [
    _engine(model, pool, sampling, min_batch_bucket=1, one_row_step=step).generate(
      params, PROMPTS, 1, key=5, max_new_tokens=LIMITS
    )
    for step in ("single", "paired")
  ]
  assert min(e["batch"] for e in paired.timeline if e["phase"] == "decode") == 1
  np.testing.assert_array_equal(paired.length, single.length)
  for n in range(len(PROMPTS)):
    np.testing.assert_array_equal(paired.completion(n), single.completion(n))
    np.testing.assert_allclose(
      paired.completion_logprobs(n), single.completion_logprobs(n), atol=1e-5
    )
  decode_keys = [k[0] for k in pool._entries if k[0][0] == "decode" and k[0][1] == 1]
  assert {k[3] for k in decode_keys} == {False, True}


def test_a_one_row_step_is_paired_on_a_gpu_by_default(monkeypatch):
  """`one_row_step` "auto" pairs on a GPU only; "single" and "paired" say it outright;
  a bucket of more rows is never paired."""
  assert not EngineConfig().pairs_step(1)
  assert EngineConfig(one_row_step="paired").pairs_step(1)
  assert not EngineConfig(one_row_step="paired").pairs_step(2)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert EngineConfig().pairs_step(1) and not EngineConfig().pairs_step(4)
  assert not EngineConfig(one_row_step="single").pairs_step(1)
  with pytest.raises(ValueError, match="one_row_step"):
    EngineConfig(one_row_step="twice")


def test_bad_engine_configs_fail_clearly(model):
  _, graphdef, _ = model
  with pytest.raises(ValueError, match="chunk_steps"):
    EngineConfig(chunk_steps=0)
  with pytest.raises(ValueError, match="stop token 99"):
    RolloutEngine(graphdef, MODEL, dataclasses.replace(ENGINE, stop_tokens=(99,)))


def _until_compiled(pool: ExecutablePool, timeout_s: float = 300.0) -> None:
  deadline = time.monotonic() + timeout_s
  while pool.background_busy:
    assert time.monotonic() < deadline, "background compile did not finish"
    time.sleep(0.05)


def test_pool_compiles_a_miss_in_the_background_in_the_callers_context():
  """`on_miss="background"` answers None and compiles on a host thread under the caller's
  trace-time context (here the attention form, a context variable); the program joins the
  pool once ready, counted as a compile but not as seconds a caller waited; a caller that
  needs it meanwhile waits for that compile rather than compiling it again."""
  from tlt_jax.models import attention

  def fn(v):  # what it computes depends on the form it was traced under
    return v + (1.0 if attention.current_attention_form() == "reduce" else 0.0)

  pool, x = ExecutablePool(), jnp.ones((3,))
  with pytest.raises(ValueError, match="on_miss"):
    pool.get("f", fn, (x,), on_miss="later")
  with attention.attention_form("reduce"):
    assert pool.get("f", fn, (x,), on_miss="background") is None
    assert pool.background_busy
    assert pool.get("g", fn, (x,), on_miss="background") is None  # one at a time: not started
    _until_compiled(pool)
    assert "f" in pool and "g" not in pool
    assert pool.compiles == pool.background_compiles == 1 and pool.background_seconds > 0
    assert pool.compile_seconds == 0.0
    assert float(pool.get("f", fn, (x,))(x)[0]) == 2.0 and pool.compiles == 1
    # Needed while it compiles: waited for (its wait is a caller's compile seconds).
    assert pool.get("h", fn, (x * 2,), on_miss="background") is None
    assert float(pool.get("h", fn, (x * 2,))(x)[0]) == 2.0
    assert pool.compiles == pool.background_compiles == 2 and not pool.background_busy
  assert "f" not in pool  # traced under "reduce": not the program of the default form


def test_pool_evicts_least_recently_used_programs():
  """A capped pool (CPU processes run out of JIT memory mappings at a few hundred
  executables) keeps the most recently used programs and counts every compile."""
  from tlt_jax.rollout.pool import ExecutablePool

  pool = ExecutablePool(max_executables=2)
  x = jnp.ones((3,))
  add = lambda k: pool.get(("add", k), lambda v, k=k: v + k, (x,))
  add(1), add(2), add(1), add(3)  # 2 was used least recently: evicted
  assert len(pool) == 2 and pool.evictions == 1 and pool.compiles == 3
  assert ("add", 1) in [k[0] for k in pool._entries] and float(add(1)(x)[0]) == 2.0
  assert pool.compiles == 3
  add(2)
  assert pool.compiles == 4 and len(pool) == 2
  with pytest.raises(ValueError, match="max_executables"):
    ExecutablePool(max_executables=0)
  # The mapping budget: each CPU executable holds JIT code mappings; a budget of 1 keeps one.
  small = ExecutablePool(max_mappings=1)
  for k in range(3):
    small.get(("add", k), lambda v, k=k: v + k, (x,))
  assert len(small) == 1 and small.evictions == 2

"""Mixed precision (float32 masters, bfloat16 compute) and vocabulary-chunked log-probs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import TINY_UNTIED

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.attention import current_attention_form
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.platform import platform_choices
from tlt_jax.models.precision import (
  cast_floating,
  compute_model,
  current_head_precision,
  head_precision,
  platform_head_precision,
)
from tlt_jax.models.products import current_row_products
from tlt_jax.models.transformer import head_product, init_model
from tlt_jax.rl import PolicyLossConfig, UpdateConfig, make_optimizer, make_policy_update
from tlt_jax.rl.update import token_logprobs
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine

FP32 = TINY_UNTIED
MIXED = dataclasses.replace(FP32, dtype="bfloat16")  # param_dtype stays float32
PURE_BF16 = dataclasses.replace(FP32, dtype="bfloat16", param_dtype="bfloat16")


def _params(config, seed=0):
  return nnx.split(init_model(config, seed=seed))


def test_mixed_precision_stores_masters_and_computes_in_bf16():
  graphdef, params = _params(MIXED)
  dtypes = {x.dtype for x in jax.tree.leaves(params)}
  assert dtypes == {jnp.dtype(jnp.float32)}
  model = compute_model(graphdef, params)
  assert {x.dtype for x in jax.tree.leaves(nnx.state(model))} == {jnp.dtype(jnp.bfloat16)}
  tokens = jnp.arange(6, dtype=jnp.int32)[None]
  hidden, _, _ = model(tokens, tokens)
  assert hidden.dtype == jnp.bfloat16
  assert model.logits(hidden).dtype == jnp.float32
  # Integer leaves pass through; leaves already in the dtype are not copied.
  tree = {"a": jnp.ones(2, jnp.int32), "b": jnp.ones(2, jnp.bfloat16)}
  cast = cast_floating(tree, jnp.bfloat16)
  assert cast["a"].dtype == jnp.int32 and cast["b"] is tree["b"]


def test_param_dtype_is_validated():
  with pytest.raises(ValueError, match="param_dtype"):
    dataclasses.replace(FP32, param_dtype="float64")


def _equations(jaxpr):
  """A jaxpr's equations, those of the jaxprs inside them included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      inner = getattr(value, "jaxpr", value)
      if hasattr(inner, "eqns"):
        yield from _equations(inner)


def _head_dot(model, hidden):
  """The dot_general of `model.logits(hidden)`, traced (a new function each call: JAX caches
  a function's trace, and the head precision is read when tracing)."""
  jaxpr = jax.make_jaxpr(lambda h: model.logits(h))(hidden)
  (dot,) = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
  return dot


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_head_multiplies_in_the_compute_dtype_and_sums_in_float32(tied):
  """Under "compute" (what "auto" takes on accelerators) a bfloat16 model's head product
  reads its bfloat16 hidden states and weights as they are (no float32 copy of the head,
  which would put it on a GPU's float32 path) and returns float32 logits: the exact products
  summed in float32, so within float32 rounding of a float64 sum; a float32 model's head is
  the float32 product it was."""
  for config in (MIXED, FP32):
    config = dataclasses.replace(config, tie_embeddings=tied)
    model = compute_model(*_params(config, seed=1))
    hidden = jax.random.normal(jax.random.key(2), (2, 3, config.d_model)).astype(config.dtype)
    with head_precision("compute"):
      dot = _head_dot(model, hidden)
      logits = np.asarray(model.logits(hidden))
    assert [v.aval.dtype for v in dot.invars] == [config.jnp_dtype] * 2
    assert dot.outvars[0].aval.dtype == jnp.float32
    head = model.embed.embedding[...].T if tied else model.lm_head.kernel[...]
    h64, w64 = (np.asarray(x.astype(jnp.float32), np.float64) for x in (hidden, head))
    np.testing.assert_allclose(logits, h64 @ w64, rtol=0, atol=1e-5 * np.abs(h64 @ w64).max())
    if config.dtype == "float32":
      eq, w = ("...d,vd->...v", head.T) if tied else ("...d,dv->...v", head)
      np.testing.assert_array_equal(logits, jnp.einsum(eq, hidden, w))


def test_the_head_precision_takes_float32_on_cpus_and_the_compute_dtype_elsewhere():
  """The default, "auto", keeps a bfloat16 policy's head in float32 on a CPU, whose bfloat16
  matrix-vector product is the slower; accelerators take the compute dtype; a setting is
  scoped and checked."""
  assert platform_head_precision("cpu") == "float32"
  assert platform_head_precision("gpu") == platform_head_precision("tpu") == "compute"
  model = compute_model(*_params(MIXED, seed=1))
  hidden = jnp.ones((1, 2, MIXED.d_model), jnp.bfloat16)
  auto = _head_dot(model, hidden).invars[0].aval.dtype
  assert current_head_precision() == "auto"
  with head_precision("float32"):
    assert _head_dot(model, hidden).invars[0].aval.dtype == jnp.float32
    assert current_head_precision() == "float32"
  expected = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  assert auto == expected and current_head_precision() == "auto"
  with pytest.raises(ValueError, match="head precision"), head_precision("bfloat16"):
    pass


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_bfloat16_heads_gradients_are_the_float32_heads(tied):
  """`head_product`'s backward takes the float32 cotangent with both sides in float32: for
  bfloat16 hidden states and weights the gradients of the float32 product of the same values
  (the hidden state's in float32 when it comes in float32, as `rl.logprobs` passes it)."""
  rng = np.random.default_rng(0)
  weights = jnp.asarray(rng.normal(size=(40, 16) if tied else (16, 40)), jnp.bfloat16)
  cot = jnp.asarray(rng.normal(size=(3, 40)), jnp.float32)
  eq = "...d,vd->...v" if tied else "...d,dv->...v"
  for hidden_dtype in (jnp.bfloat16, jnp.float32):
    hidden = jnp.asarray(rng.normal(size=(3, 16)), jnp.bfloat16).astype(hidden_dtype)
    with head_precision("compute"):
      ours = jax.jit(
        jax.grad(lambda h, w: jnp.sum(cot * head_product(h, w, tied, jnp.bfloat16)), (0, 1))
      ).lower(hidden, weights)
    ours = ours.compile()
    theirs = jax.grad(
      lambda h, w: jnp.sum(cot * jnp.einsum(eq, h.astype(jnp.float32), w.astype(jnp.float32))),
      (0, 1),
    )
    assert "bf16" in ours.as_text() or "bfloat16" in ours.as_text()
    for a, b in zip(ours(hidden, weights), theirs(hidden, weights), strict=True):
      assert a.dtype == b.dtype
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6)


# ----------------------------------------------------------------- vocabulary chunks


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("chunk", [7, 16, 64], ids=["chunk7", "chunk16-overlapping", "whole"])
def test_chunked_logprobs_equal_the_full_pass(tied, chunk):
  """Values, entropy and gradients of the vocabulary-chunked pass equal the one-pass ones
  (40 entries: chunks of 7 leave a short last chunk, 16 an overlapping one)."""
  config = dataclasses.replace(FP32, tie_embeddings=tied)
  graphdef, params = _params(config, seed=1)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (3, 9)), jnp.int32)

  def f(p, vocab_chunk):
    logp, ent = token_logprobs(graphdef, p, tokens, 0.7, with_entropy=True, vocab_chunk=vocab_chunk)
    return jnp.sum(logp) + 0.3 * jnp.sum(ent), (logp, ent)

  (full, (logp, ent)), g_full = jax.jit(jax.value_and_grad(lambda p: f(p, 0), has_aux=True))(params)
  (chunked, (logp_c, ent_c)), g_c = jax.jit(
    jax.value_and_grad(lambda p: f(p, chunk), has_aux=True)
  )(params)
  np.testing.assert_allclose(np.asarray(logp_c), np.asarray(logp), atol=2e-5)
  np.testing.assert_allclose(np.asarray(ent_c), np.asarray(ent), atol=2e-5)
  assert float(full) == pytest.approx(float(chunked), abs=1e-3)
  for a, b in zip(jax.tree.leaves(g_c), jax.tree.leaves(g_full), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


def test_chunked_logprobs_build_no_vocabulary_wide_array():
  """The compiled gradient of the chunked pass saves several [tokens, vocabulary] float32
  arrays of scratch memory over the one-pass gradient (both also hold the model body's
  activations, ~7 MB here, and the gradient accumulators)."""
  config = dataclasses.replace(FP32, vocab_size=4096)
  graphdef, params = _params(config)
  tokens = jnp.zeros((4, 128), jnp.int32)
  vocab_wide = 4 * 127 * 4096 * 4

  def scratch(vocab_chunk):
    loss = lambda p: jnp.sum(token_logprobs(graphdef, p, tokens, 1.0, vocab_chunk=vocab_chunk)[0])
    return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

  full, chunked = scratch(0), scratch(512)
  assert chunked < full / 3
  assert full - chunked >= 2 * vocab_wide


def test_vocab_chunk_refuses_truncated_sampling():
  graphdef, params = _params(FP32)
  tokens = jnp.zeros((1, 4), jnp.int32)
  with pytest.raises(ValueError, match="untruncated"):
    token_logprobs(graphdef, params, tokens, 1.0, top_p=0.9, vocab_chunk=8)
  with pytest.raises(ValueError, match="untruncated"):
    PolicyLossConfig(top_k=5, vocab_chunk=8)
  with pytest.raises(ValueError, match="vocab_chunk"):
    PolicyLossConfig(vocab_chunk=-1)


# ----------------------------------------------------------------- master-weight updates


def _one_update(config, lr, vocab_chunk=0):
  """One AdamW step from the same float32 initial weights (cast to `config.param_dtype`)
  on the same batch; returns (initial, updated) parameters as float32 numpy arrays."""
  graphdef, params = _params(config, seed=2)
  _, init32 = _params(FP32, seed=2)
  params = cast_floating(init32, config.jnp_param_dtype)
  rng = np.random.default_rng(3)
  tokens = jnp.asarray(rng.integers(0, 40, (4, 12)), jnp.int32)
  mask = np.zeros((4, 12), np.float32)
  mask[:, 4:] = 1.0
  old = token_logprobs(graphdef, params, tokens, 1.0)[0]
  batch = dict(
    tokens=tokens,
    mask=jnp.asarray(mask),
    old_logp=old,
    advantages=jnp.asarray(rng.normal(size=(4,)), jnp.float32),
  )
  ucfg = UpdateConfig(learning_rate=lr, total_steps=10, micro_batch=2)
  opt = make_optimizer(ucfg)
  loss_cfg = PolicyLossConfig(vocab_chunk=vocab_chunk)
  update = make_policy_update(graphdef, opt, loss_cfg, ucfg.micro_batch)
  before = [np.asarray(x, np.float32) for x in jax.tree.leaves(params)]
  new, _, metrics = update(jax.tree.map(jnp.copy, params), opt.init(params), batch, None)
  assert int(metrics["skipped"]) == 0
  return before, [np.asarray(x, np.float32) for x in jax.tree.leaves(new)]


def _deltas(pair):
  before, after = pair
  return np.concatenate([(a - b).ravel() for a, b in zip(after, before, strict=True)])


def test_master_weight_update_matches_fp32_and_bf16_weights_lose_it():
  """At lr 1e-6 (Adam's step is ~lr per weight) a float32-master update under bfloat16
  compute matches the all-float32 one: cosine >= 0.98 and norms within 5%; pure bfloat16
  weights keep fewer than 5% of the updates (rounded away: a weight near 0.02 moves by
  1e-6, far below bfloat16's spacing there, ~1e-4)."""
  lr = 1e-6
  full = _deltas(_one_update(FP32, lr))
  mixed = _deltas(_one_update(MIXED, lr))
  pure = _deltas(_one_update(PURE_BF16, lr))
  assert np.mean(full != 0) > 0.9
  cosine = mixed @ full / (np.linalg.norm(mixed) * np.linalg.norm(full))
  assert cosine >= 0.98, cosine
  assert np.linalg.norm(mixed) == pytest.approx(np.linalg.norm(full), rel=0.05)
  assert np.mean(pure != 0) < 0.05


def test_chunked_update_equals_the_full_pass_update():
  full = _deltas(_one_update(MIXED, 1e-3))
  chunked = _deltas(_one_update(MIXED, 1e-3, vocab_chunk=16))
  np.testing.assert_allclose(chunked, full, atol=2e-6)


# ----------------------------------------------------------------- rollouts in bfloat16

ENGINE = EngineConfig(
  max_prompt_len=8,
  max_new_tokens=24,
  max_batch=8,
  chunk_steps=6,
  min_batch_bucket=8,
  min_cache_bucket=32,
  min_prompt_bucket=8,
  spec_threshold=8,
  spec_strategies=("chain3",),
  spec_adaptive=False,
  spec_rounds=2,
)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13]]


def _bf16_rollouts(sampling):
  """Plain and speculative (chain3, random drafter) rollouts of a bfloat16-compute policy
  whose head is scaled up so its logits spread as a trained model's do (a random
  initialisation's are nearly uniform: every position a near-tie)."""
  tg, tp = _params(MIXED, seed=3)
  tp = jax.tree.map(lambda x: x, tp)
  tp["lm_head"]["kernel"][...] = 50.0 * tp["lm_head"]["kernel"][...]
  dg, dp = nnx.split(init_drafter(MIXED, seed=4))
  plain = RolloutEngine(tg, MIXED, dataclasses.replace(ENGINE, spec_threshold=0), sampling)
  spec = RolloutEngine(tg, MIXED, ENGINE, sampling, drafter_graphdef=dg)
  a = plain.generate(tp, PROMPTS, 2, key=5)
  b = spec.generate(tp, PROMPTS, 2, key=5, drafter_params=dp)
  assert b.spec_summary()["accepted_drafts"] > 0
  return tg, tp, a, b


# Greedy paths may part where the two best logits are closer than bfloat16's rounding of a
# one-row and a several-row product moves them (a few hundredths here).
TIE_GAP = 0.1


def _assert_parts_only_at_ties(graphdef, params, plain, other):
  """Each row of `other` equals `plain`'s up to its first difference, where `plain`'s token
  and `other`'s are the prefix's two best under the trainer's forward, TIE_GAP apart."""
  for n in np.nonzero(np.any(plain.tokens != other.tokens, axis=1))[0]:
    first = int(np.argmax(plain.tokens[n] != other.tokens[n]))
    assert first >= int(plain.prompt_len[n]), (n, first)
    swapped = np.array(plain.tokens[n : n + 1])
    swapped[0, first] = other.tokens[n, first]
    pair = jnp.asarray(np.concatenate([plain.tokens[n : n + 1], swapped]))
    logp = np.asarray(token_logprobs(graphdef, params, pair, 1.0)[0])[:, first]
    assert abs(logp[0] - logp[1]) < TIE_GAP, (n, first, logp)


@pytest.mark.parametrize("head", ["auto", "compute"])
def test_bf16_speculative_greedy_equals_bf16_plain(head):
  """bfloat16 compute over float32 masters: greedy speculative tokens are plain's on the
  CPU, its head in float32 ("auto") or in bfloat16 as accelerators run it; on an
  accelerator, whose kernels for one row and for several round bfloat16 products apart,
  they are plain's up to a near tie (an H200 once took one 0.03 apart the other way)."""
  with head_precision(head):
    tg, tp, a, b = _bf16_rollouts(SamplingConfig(temperature=0.0))
  if jax.default_backend() == "cpu":
    np.testing.assert_array_equal(b.tokens, a.tokens)
  else:
    _assert_parts_only_at_ties(tg, tp, a, b)


def test_tie_check_rejects_a_confident_divergence():
  """The accelerator's weaker check fails where greedy paths part at a clear choice."""
  tg, tp, a, _ = _bf16_rollouts(SamplingConfig(temperature=0.0))
  other = dataclasses.replace(a, tokens=np.array(a.tokens))
  n, first = 0, int(a.prompt_len[0]) + 1
  other.tokens[n, first] = (a.tokens[n, first] + 1) % MIXED.vocab_size
  with pytest.raises(AssertionError):
    _assert_parts_only_at_ties(tg, tp, a, other)


def test_bf16_sampled_rollouts_agree_up_to_rounding_ties():
  """Sampled at temperature 1 in bfloat16, token identity holds up to near-ties, and
  bfloat16 makes those far likelier than float32 (where 0 of 125,880 tokens differed at
  scale, experiments/RESULTS.md): the verify pass scores several tokens per forward, plain
  decoding one, and their bfloat16 activations round apart by an ulp (~0.4%), which moves
  logits by a few hundredths here. Measured on this setup: 7 of 8 rows identical, the
  eighth identical up to its first tie. The trainer's log-probs (a full-sequence forward)
  are the rollout's within 0.2 (0.11 measured; the loss's ratios use the trainer's own
  old log-probs, so this is not an off-policy error)."""
  tg, tp, a, b = _bf16_rollouts(SamplingConfig(temperature=1.0))
  same = np.all(a.tokens == b.tokens, axis=1)
  assert same.sum() >= 7, same
  for n in np.nonzero(~same)[0]:  # identical up to the first difference
    first = int(np.argmax(a.tokens[n] != b.tokens[n]))
    assert first > int(a.prompt_len[n])
  logp = np.asarray(token_logprobs(tg, tp, jnp.asarray(a.tokens), 1.0)[0])
  for n in range(a.tokens.shape[0]):
    gen = slice(int(a.prompt_len[n]), int(a.length[n]))
    np.testing.assert_allclose(logp[n, gen], a.logprobs[n, gen], atol=0.2)


def test_bf16_warmup_compiles_what_generate_runs():
  """`warmup` hands the programs the weights in the compute dtype, as `generate` does: a
  bfloat16 engine's rollout after its warm-up compiles nothing (a warm-up over the float32
  masters once left programs whose argument types `generate` then failed)."""
  tg, tp = _params(MIXED, seed=3)
  dg, dp = nnx.split(init_drafter(MIXED, seed=4))
  engine = RolloutEngine(tg, MIXED, ENGINE, SamplingConfig(temperature=1.0), drafter_graphdef=dg)
  engine.warmup(tp, num_prompts=[len(PROMPTS)], num_samples=2, drafter_params=dp)
  compiled = engine.pool.compiles
  engine.generate(tp, PROMPTS, 2, key=5, drafter_params=dp)
  assert engine.pool.compiles == compiled


@pytest.mark.parametrize("precision", ["highest", None])
def test_rollout_programs_trace_under_the_engines_matmul_precision(precision):
  """EngineConfig.matmul_precision is part of every program that multiplies matrices: the
  dots of a traced program carry it (on GPUs "highest" keeps float32 products out of TF32,
  which rounds a one-token step and a k-token verification apart), and engines of different
  precisions never share a program."""
  tg, _ = _params(MIXED, seed=3)
  cfg = dataclasses.replace(ENGINE, spec_threshold=0, matmul_precision=precision)
  engine = RolloutEngine(tg, MIXED, cfg)
  x = jnp.ones((4, 8), jnp.float32)
  text = jax.jit(engine.programs.at_precision(lambda a: a @ a.T)).lower(x).as_text()
  # None: the ambient precision (JAX_DEFAULT_MATMUL_PRECISION, which the accelerator
  # script sets to "highest" for the whole suite).
  ambient = jax.config.jax_default_matmul_precision
  assert ("HIGHEST" in text) == (
    precision == "highest" or (precision is None and ambient == "highest")
  )
  other = RolloutEngine(tg, MIXED, dataclasses.replace(cfg, matmul_precision="default"))
  other.pool = engine.pool
  _, tp = _params(MIXED, seed=3)
  engine.warmup(tp, num_prompts=[2])
  compiled = engine.pool.compiles
  products = [r for r in engine.pool.summary() if r["key"].startswith(("('prefill'", "('decode'"))]
  other.warmup(tp, num_prompts=[2])  # the same shapes at another precision: its own programs
  assert products and engine.pool.compiles == compiled + len(products)  # row moves shared
  with pytest.raises(ValueError, match="matmul_precision"):
    dataclasses.replace(ENGINE, matmul_precision="fast")


def test_platform_choices_scope_each_platforms_attention_form_head_and_products():
  """`models.platform_choices`: one scope for every trace-time choice "auto" makes by
  platform, so a GPU's programs trace on this CPU as on a GPU; all restored after."""
  now = lambda: (current_attention_form(), current_head_precision(), current_row_products())
  seen = {}
  for platform in ("cpu", "gpu", "tpu"):
    with platform_choices(platform):
      seen[platform] = now()
  assert seen == {
    "cpu": ("auto", "float32", "single"),
    "gpu": ("dots", "compute", "paired"),
    "tpu": ("auto", "compute", "single"),
  }
  assert now() == ("auto", "auto", "auto")

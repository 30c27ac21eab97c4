"""Speculative decoding inside the rollout engine: lossless, switching, compaction, errors.

Coupled sampling makes sampled speculative rollouts token-identical to plain ones for the same
key, so every mechanism below (strategies, thresholds, the bandit switching both ways,
compaction, pushed drafter versions) is checked by token identity at temperature 1, not only
greedily.
"""

import dataclasses
import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cudnn_standin import documented_cudnn
from flax import nnx
from tiny_models import TINY_UNTIED

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models import attention
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.platform import platform_choices
from tlt_jax.models.transformer import init_model
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.rollout.speculative import SpecStrategy

# Untied head: `_functional_pair` needs it, and one config lets all tests share programs.
# Programs compile in place (`background_compiles` off): these tests check which arms the
# bandit runs, and a tiny rollout ends before a background compile would.
MODEL = TINY_UNTIED
ENGINE = EngineConfig(
  max_prompt_len=8,
  max_new_tokens=40,
  max_batch=16,
  chunk_steps=6,
  min_batch_bucket=2,
  min_cache_bucket=16,
  min_prompt_bucket=8,
  spec_threshold=16,
  spec_strategies=("chain3", "tree3x2x6"),
  spec_adaptive=False,
  spec_rounds=2,
  background_compiles=False,
)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15, 16, 17]]
LIMITS = [5, 37, 12, 20]  # per-prompt max new tokens: a long tail
GREEDY = SamplingConfig(temperature=0.0)
SAMPLED = SamplingConfig(temperature=1.0)
TRUNCATED = SamplingConfig(temperature=0.7, top_k=12, top_p=0.9)


@pytest.fixture(scope="module")
def models():
  tg, tp = nnx.split(init_model(MODEL, seed=3))
  dg, dp = nnx.split(init_drafter(MODEL, seed=4))
  return tg, tp, dg, dp


@pytest.fixture(scope="module")
def pool():
  return ExecutablePool()


def _engine(models, pool, sampling=GREEDY, model_config=MODEL, **changes):
  tg, _, dg, _ = models
  cfg = dataclasses.replace(ENGINE, **changes)
  return RolloutEngine(tg, model_config, cfg, sampling, pool, drafter_graphdef=dg)


def _run(engine, params, dparams, num_samples=2, key=7, **kw):
  return engine.generate(
    params, PROMPTS, num_samples, key=key, max_new_tokens=LIMITS, drafter_params=dparams, **kw
  )


def _phases(result):
  return [e["phase"] for e in result.timeline]


@pytest.mark.parametrize(
  "strategy,sampling",
  [
    ("chain3", GREEDY),
    ("tree3x2x6", GREEDY),
    ("chain3", SAMPLED),
    ("tree3x2x6", SAMPLED),
    ("tree3x2x6", TRUNCATED),
  ],
  ids=["chain3-greedy", "tree-greedy", "chain3-t1", "tree-t1", "tree-t0.7_k12_p0.9"],
)
def test_spec_equals_plain(models, pool, strategy, sampling):
  """Greedy and sampled (same key): the same tokens as plain decoding, every row."""
  _, tp, _, dp = models
  plain = _run(_engine(models, pool, sampling, spec_threshold=0), tp, None)
  spec = _run(_engine(models, pool, sampling, spec_strategies=(strategy,)), tp, dp)
  assert "spec" in _phases(spec) and "decode" not in _phases(spec)
  # Drafts are accepted and rejected alike (the identity is not that of an always-wrong draft).
  assert 0 < spec.spec_summary()["accepted_drafts"] < SpecStrategy.parse(strategy).depth
  # Its seconds by part (what a simulator is checked against): the generation's, by arm.
  parts = spec.seconds_by_part()
  assert {"prefill", strategy} <= set(parts) <= {"prefill", "plain", strategy, "drafter_prefill"}
  assert min(parts.values()) >= 0
  assert sum(parts.values()) - parts["prefill"] == pytest.approx(spec.generation_seconds())
  np.testing.assert_array_equal(spec.length, plain.length)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  # Recorded log-probs and features are the target's (tree-masked forward vs one token).
  np.testing.assert_allclose(spec.logprobs, plain.logprobs, atol=2e-5)
  want = (len(spec.length), spec.length.max(), MODEL.d_model)
  assert spec.hidden.shape == plain.hidden.shape == want
  valid = np.arange(plain.hidden.shape[1])[None, :] < (plain.length - 1)[:, None]
  np.testing.assert_allclose(spec.hidden[valid], plain.hidden[valid], atol=1e-4)


def test_host_params_run_under_the_loops_transfer_guard(models, pool):
  """Policy and drafter params handed over as host (NumPy) arrays, as a checkpoint or a
  host copy holds them: the engine copies them to the device once, explicitly, so a
  rollout under JAX's "disallow" host-to-device guard (what `GRPOConfig.transfer_guard`
  puts the RL loop and its evaluations under) runs, with the device params' output."""
  _, tp, _, dp = models
  engine = _engine(models, pool, SAMPLED, spec_strategies=("chain3",))
  want = _run(engine, tp, dp)
  assert "spec" in _phases(want)
  host = lambda tree: jax.tree.map(np.array, tree)  # noqa: E731
  assert not any(isinstance(x, jax.Array) for x in jax.tree.leaves(host(dp)))
  with jax.transfer_guard_host_to_device("disallow"):
    got = _run(engine, host(tp), host(dp))
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.length, want.length)


def test_what_a_gpu_runs_equals_plain(models):
  """A GPU's choices (attention as batched products at every batch and one-row products as
  two rows, the drafter's at one row among them: `platform_choices("gpu")`; one-row plain
  steps as two tokens), run on this CPU: sampled speculative output, trees and the one-row
  tail included, identical to plain decoding's under the same choices."""
  _, tp, _, dp = models
  gpu_pool = ExecutablePool()  # every program here traced under the GPU's form
  like_a_gpu = dict(one_row_step="paired", min_batch_bucket=1)
  with platform_choices("gpu"):
    plain = _run(_engine(models, gpu_pool, SAMPLED, spec_threshold=0, **like_a_gpu), tp, None)
    engine = _engine(models, gpu_pool, SAMPLED, spec_strategies=("tree3x2x6",), **like_a_gpu)
    spec = _run(engine, tp, dp)
  assert {r["attention_form"] for r in gpu_pool.summary()} == {"dots"}
  assert "spec" in _phases(spec) and 1 in {e["batch"] for e in spec.timeline}
  np.testing.assert_array_equal(spec.length, plain.length)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_allclose(spec.logprobs, plain.logprobs, atol=2e-5)


def test_fused_attention_equals_plain(monkeypatch):
  """Under cuDNN's fused attention (`attention_form("fused")`, a bfloat16 policy: what a
  GPU would run if "auto" took it; cuDNN stood in for, `cudnn_standin`), the engine's
  programs take the fused path (the kernel traced for CUDA, the dots lowered for this CPU):
  sampled speculative output identical to plain decoding's under the same form. (That form's
  CPU lowering computes the dots' values bit for bit: tests/test_model.py.)"""
  calls = []
  monkeypatch.setattr(attention, "cudnn_module", lambda: documented_cudnn(calls))
  bf16 = dataclasses.replace(MODEL, dtype="bfloat16")
  tg, tp = nnx.split(init_model(bf16, seed=3))
  dg, dp = nnx.split(init_drafter(bf16, seed=4))
  fused_pool, models = ExecutablePool(), (tg, tp, dg, dp)
  with attention.attention_form("fused"):
    plain = _run(_engine(models, fused_pool, SAMPLED, bf16, spec_threshold=0), tp, None)
    engine = _engine(models, fused_pool, SAMPLED, bf16, spec_strategies=("chain3",))
    spec = _run(engine, tp, dp)
  assert calls and {r["attention_form"] for r in fused_pool.summary()} == {"fused"}
  assert "spec" in _phases(spec)
  np.testing.assert_array_equal(spec.length, plain.length)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)


@pytest.mark.parametrize("strategy", ["group4", "hybrid3"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "t1"])
def test_group_drafts_equal_plain(models, pool, strategy, sampling):
  """Drafts from the group's text, alone or beside the drafter's: token-identical to plain
  decoding, on a first rollout (siblings and the row's own text) and on a second of the same
  prompts and key, whose drafts also read the first (the history): there they are right
  most of the time, and still verified."""
  _, tp, _, dp = models
  plain = _run(_engine(models, pool, sampling, spec_threshold=0), tp, None, num_samples=4)
  # group_agree=0: the hybrid takes group drafts wherever they match (this random drafter
  # agrees with nothing, so the default rule would never take them).
  engine = _engine(models, pool, sampling, spec_strategies=(strategy,), group_agree=0)
  first = _run(engine, tp, dp, num_samples=4)
  assert len(engine.history) == len(PROMPTS)
  second = _run(engine, tp, dp, num_samples=4)
  depth = SpecStrategy.parse(strategy).depth
  for spec in (first, second):
    assert "spec" in _phases(spec)
    np.testing.assert_array_equal(spec.length, plain.length)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_allclose(spec.logprobs, plain.logprobs, atol=2e-5)
  assert first.spec_summary()["accepted_drafts"] < 0.9 * depth
  assert second.spec_summary()["accepted_drafts"] > 0.5 * depth
  corpus_entries = [e for e in second.timeline if "corpus_s" in e]
  assert corpus_entries and all(e["corpus_s"] >= 0 for e in corpus_entries)


def test_group_drafts_need_no_drafter(models, pool):
  """An engine whose only strategy is group drafts runs speculative chunks without a drafter."""
  tg, tp, _, _ = models
  cfg = dataclasses.replace(ENGINE, spec_strategies=("group6",))
  engine = RolloutEngine(tg, MODEL, cfg, SAMPLED, pool)
  plain = _run(_engine(models, pool, SAMPLED, spec_threshold=0), tp, None, num_samples=4)
  spec = _run(engine, tp, None, num_samples=4)
  assert "spec" in _phases(spec) and "drafter_prefill" not in _phases(spec)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_bandit_switches_between_group_and_drafter_arms(models, pool):
  """Adaptive over plain, the drafter, group and hybrid drafts: every arm runs, switching from
  a group chunk to a drafter one rebuilds the drafter's cache, and each rollout stays
  token-identical to plain decoding for its key."""
  _, tp, _, dp = models
  strategies = ("chain3", "group4", "hybrid3")
  engine = _engine(models, pool, SAMPLED, spec_strategies=strategies, spec_adaptive=True)
  plain = _engine(models, pool, SAMPLED, spec_threshold=0)
  arms, rebuilt_after_group = set(), 0
  for key in (1, 2, 3):
    want = _run(plain, tp, None, num_samples=4, key=key)
    got = _run(engine, tp, dp, num_samples=4, key=key)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    chunks = [e for e in got.timeline if e["phase"] in ("decode", "spec", "drafter_prefill")]
    arms |= {e.get("strategy", "plain") for e in chunks if e["phase"] != "drafter_prefill"}
    for prev, nxt in zip(chunks, chunks[1:]):
      if prev.get("strategy") == "group4" and nxt["phase"] == "drafter_prefill":
        rebuilt_after_group += 1
  assert arms == {"plain", *strategies}
  assert rebuilt_after_group > 0


def test_threshold_switches_mid_rollout(models, pool):
  """Plain while the batch bucket is above the threshold, speculative below it; sampled
  output identical to plain decoding's."""
  _, tp, _, dp = models
  plain = _run(_engine(models, pool, SAMPLED, spec_threshold=0), tp, None, num_samples=4)
  spec = _run(_engine(models, pool, SAMPLED, spec_threshold=4), tp, dp, num_samples=4)
  phases = [p for p in _phases(spec) if p in ("decode", "spec")]
  assert phases[0] == "decode" and "spec" in phases
  for e in spec.timeline:
    if e["phase"] == "spec":
      assert e["batch"] <= 4
  np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_paired_one_row_steps_between_rounds_keep_outputs_plain(models, pool):
  """A one-row tail whose plain chunks run as two-token forwards (`one_row_step` "paired")
  between speculative rounds: sampled output identical to plain decoding's."""
  _, tp, _, dp = models
  plain = _run(_engine(models, pool, SAMPLED, spec_threshold=0), tp, None, num_samples=1)
  engine = _engine(
    models, pool, SAMPLED, spec_adaptive=True, min_batch_bucket=1, one_row_step="paired"
  )
  spec = _run(engine, tp, dp, num_samples=1)
  one_row = {e["phase"] for e in spec.timeline if e["batch"] == 1}
  assert {"decode", "spec"} <= one_row, one_row
  np.testing.assert_array_equal(spec.length, plain.length)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_adaptive_switches_both_ways(models, pool):
  """The bandit explores plain and speculative arms at one bucket: the drafter cache
  is rebuilt from captured features after plain chunks, and sampled outputs stay identical
  to plain decoding's whatever the bandit chose."""
  _, tp, _, dp = models
  engine = _engine(models, pool, SAMPLED, spec_adaptive=True, spec_threshold=8)
  plain = _run(_engine(models, pool, SAMPLED, spec_threshold=0), tp, None, num_samples=4)
  spec = _run(engine, tp, dp, num_samples=4)
  phases = [p for p in _phases(spec) if p in ("decode", "spec")]
  pairs = set(zip(phases, phases[1:]))
  assert ("spec", "decode") in pairs and ("decode", "spec") in pairs
  assert _phases(spec).count("drafter_prefill") >= 2
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  summary = engine.bandit.summary()
  assert summary and max(summary) <= 8  # buckets at or below the threshold only
  pulls = {a: sum(b[a]["pulls"] for b in summary.values()) for a in ("plain", "chain3")}
  assert pulls["plain"] > 0 and pulls["chain3"] > 0


def test_drafter_cache_follows_compaction(models, pool):
  """Per-row acceptance depends only on the row's own drafter cache: the same with
  and without compaction (which gathers the drafter cache into smaller buckets); sampled
  tokens identical to plain decoding's either way."""
  _, tp, _, dp = models
  a = _run(_engine(models, pool, SAMPLED), tp, dp, num_samples=4)
  b = _run(_engine(models, pool, SAMPLED, compact=False), tp, dp, num_samples=4)
  plain = _run(_engine(models, pool, SAMPLED, spec_threshold=0), tp, None, num_samples=4)
  assert {e["batch"] for e in a.timeline if e["phase"] == "spec"} != {16}
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.tokens, plain.tokens)
  assert a.spec_summary()["accepted_drafts"] > 0
  assert a.spec_summary()["row_rounds"] == b.spec_summary()["row_rounds"]
  assert a.spec_summary()["accepted_drafts"] == b.spec_summary()["accepted_drafts"]


def _functional_pair():
  """A target whose layers add nothing (next token = a function of the current one)
  and a drafter that reproduces it exactly: every greedy draft is accepted."""
  cfg = MODEL
  target = init_model(cfg, seed=5)
  # A sharp head: the drafter's path scores then favour the true path, as a
  # trained drafter's do (flat draft probabilities would let trees go wide instead).
  target.lm_head.kernel[...] = 1000.0 * target.lm_head.kernel[...]
  for layer in target.layers:
    layer.attn.o_proj.kernel[...] = jnp.zeros_like(layer.attn.o_proj.kernel[...])
    layer.mlp.down_proj.kernel[...] = jnp.zeros_like(layer.mlp.down_proj.kernel[...])
  drafter = init_drafter(cfg, seed=6)
  d = cfg.d_model
  # fc picks the next token's embedding; the layer adds nothing. The target's
  # feature is the same embedding RMS-normalised: a positive rescaling, same argmax
  # (x50 undoes the 0.02 init scale so draft probabilities are as sharp as the target's).
  drafter.fc.kernel[...] = jnp.concatenate([50.0 * jnp.eye(d), jnp.zeros((d, d))])
  drafter.layer.attn.o_proj.kernel[...] = jnp.zeros_like(drafter.layer.attn.o_proj.kernel[...])
  drafter.layer.mlp.down_proj.kernel[...] = jnp.zeros_like(drafter.layer.mlp.down_proj.kernel[...])
  return cfg, nnx.split(target), nnx.split(drafter)


@pytest.mark.parametrize("strategy,depth", [("chain3", 3), ("tree3x2x6", 3)])
def test_perfect_drafter_accepts_full_depth(pool, strategy, depth):
  cfg, (tg, tp), (dg, dp) = _functional_pair()
  models = (tg, tp, dg, dp)
  plain = _run(_engine(models, pool, model_config=cfg, spec_threshold=0), tp, None)
  spec = _run(_engine(models, pool, model_config=cfg, spec_strategies=(strategy,)), tp, dp)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  summary = spec.spec_summary()
  # Every round emits depth + 1 tokens except where max_len cuts it short.
  assert summary["accept_length"] > 0.85 * (depth + 1)
  assert summary["accepted_drafts"] > 0.85 * depth


def test_sampling_records_target_logprobs(models, pool):
  """Sampled SD rollouts: recorded log-probs are the target's own for the emitted tokens."""
  tg, tp, _, dp = models
  sampling = SamplingConfig(temperature=1.0)
  spec = _run(_engine(models, pool, sampling=sampling), tp, dp, num_samples=3, key=11)

  @jax.jit
  def logprobs(params, tokens):  # [N, S] -> log p(tokens[:, t] | tokens[:, :t]) at t - 1
    model = nnx.merge(tg, params)
    hidden, _, _ = model(tokens, jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape))
    logp = jax.nn.log_softmax(model.logits(hidden[:, :-1]), axis=-1)
    return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=2)[..., 0]

  ref = np.asarray(logprobs(tp, jnp.asarray(spec.tokens)))  # causal: padding is harmless
  for n in range(spec.tokens.shape[0]):
    start, length = int(spec.prompt_len[n]), int(spec.length[n])
    np.testing.assert_allclose(
      spec.logprobs[n, start:length], ref[n, start - 1 : length - 1], atol=1e-4
    )


def test_strategy_names_round_trip():
  for name in ("chain4", "tree5x4x16", "chain4-argmax", "tree3x2x6-argmax"):
    strategy = SpecStrategy.parse(name)
    assert strategy.name == name and strategy.coupled == (not name.endswith("-argmax"))
  with pytest.raises(ValueError, match="unknown speculative strategy 'chain4-max'"):
    SpecStrategy.parse("chain4-max")


def test_spec_bad_inputs(models):
  tg, tp, dg, _ = models
  with pytest.raises(ValueError, match="unknown speculative strategy 'chian3'"):
    dataclasses.replace(ENGINE, spec_strategies=("chian3",))
  with pytest.raises(ValueError, match="spec_threshold must be an int in"):
    dataclasses.replace(ENGINE, spec_threshold=17)
  with pytest.raises(ValueError, match="spec_threshold must be an int in"):
    dataclasses.replace(ENGINE, spec_threshold=-1)
  with pytest.raises(ValueError, match="non-empty tuple"):
    dataclasses.replace(ENGINE, spec_strategies=())
  with pytest.raises(ValueError, match="non-empty tuple"):
    dataclasses.replace(ENGINE, spec_strategies="chain3")
  with pytest.raises(ValueError, match="duplicates"):
    dataclasses.replace(ENGINE, spec_strategies=("chain3", "chain3"))
  with pytest.raises(ValueError, match="num_nodes must be in"):
    dataclasses.replace(ENGINE, spec_strategies=("tree3x2x40",))
  with pytest.raises(ValueError, match="needs capture_hidden"):
    dataclasses.replace(ENGINE, capture_hidden=False)
  with pytest.raises(ValueError, match="no drafter_graphdef"):
    RolloutEngine(tg, MODEL, ENGINE)
  wide = dataclasses.replace(MODEL, mlp_dim=96)
  _, wrong = nnx.split(init_drafter(wide, seed=0))
  engine = RolloutEngine(tg, MODEL, ENGINE, GREEDY, drafter_graphdef=dg)
  with pytest.raises(ValueError, match="drafter mlp_dim 96 != target mlp_dim 64"):
    _run(engine, tp, wrong)


def test_bandit_state_restores_into_a_new_engine(models):
  """The engine's bandit state survives a JSON checkpoint; mismatched arms are refused."""
  import json

  from tlt_jax.rollout.bandit import StrategyBandit

  tg, _, dg, _ = models
  cfg = dataclasses.replace(ENGINE, spec_adaptive=True)
  engine = RolloutEngine(tg, MODEL, cfg, GREEDY, drafter_graphdef=dg)
  for reward in (10.0, 30.0, 20.0, 25.0, 5.0, 40.0):
    engine.bandit.update(4, engine.bandit.select(4), reward)
  saved = json.loads(json.dumps(engine.bandit.state_dict()))
  restored = RolloutEngine(
    tg, MODEL, cfg, GREEDY, drafter_graphdef=dg, bandit=StrategyBandit.from_state_dict(saved)
  )
  assert restored.bandit.summary() == engine.bandit.summary()
  picks = lambda e: [e.bandit.select(4) for _ in range(3)]
  assert picks(restored) == picks(engine)
  with pytest.raises(ValueError, match="bandit arms"):
    RolloutEngine(
      tg, MODEL, cfg, GREEDY, drafter_graphdef=dg, bandit=StrategyBandit(("plain", "chain3"))
    )
  # EngineConfig.bandit_exploration reaches the engine's bandits, the per-sampling ones too.
  tuned = RolloutEngine(
    tg, MODEL, dataclasses.replace(cfg, bandit_exploration=0.5), GREEDY, drafter_graphdef=dg
  )
  assert engine.bandit.settings.exploration == 0.2
  assert tuned.bandit.settings.exploration == 0.5
  assert tuned.bandit_for(SAMPLED).settings == tuned.bandit.settings
  with pytest.raises(ValueError, match="bandit_exploration"):
    dataclasses.replace(cfg, bandit_exploration=-1.0)


def test_an_arm_still_compiling_gives_its_chunks_to_a_compiled_one(models):
  """`background_compiles`: the bandit picks an arm whose program is not compiled (here the
  tree, the only arm it has not pulled); a compiled arm (chain3, the best by its means) runs
  each chunk instead while the tree compiles on the pool's background thread, teaching the
  bandit nothing, and the rollout's tokens are plain decoding's. The tree's program then
  joins the pool, not counted as seconds the rollout waited."""
  import time

  from tlt_jax.rollout.bandit import StrategyBandit
  from tlt_jax.rollout.config import bandit_settings

  _, tp, _, dp = models
  pool = ExecutablePool()
  cfg = dataclasses.replace(
    ENGINE, spec_strategies=("chain3", "tree3x2x6"), spec_adaptive=True, background_compiles=True
  )
  plain = _run(_engine(models, pool, SAMPLED, spec_threshold=0), tp, None)
  # chain3's programs (the first strategy runs where there is no bandit), none of the tree's.
  chain = _run(_engine(models, pool, SAMPLED), tp, dp)  # the same strategies' shapes
  arms, settings = bandit_settings(cfg)
  bandit = StrategyBandit(arms, settings)
  for batch in cfg.batch_buckets:
    for _ in range(settings.min_pulls):
      bandit.update(batch, "plain", 1.0)
      bandit.update(batch, "chain3", 2.0)
  taught = bandit.summary()
  engine = RolloutEngine(
    models[0], MODEL, cfg, SAMPLED, pool, drafter_graphdef=models[2], bandit=bandit
  )
  waited = pool.compile_seconds
  got = _run(engine, tp, dp)
  np.testing.assert_array_equal(got.tokens, plain.tokens)
  spec = [e for e in got.timeline if e["phase"] == "spec"]
  assert [e["strategy"] for e in spec] == [
    e["strategy"] for e in chain.timeline[1:] if "strategy" in e
  ]
  first = spec[0]
  assert first["instead_of"] == "tree3x2x6" and first["beside_compile"] and "reward" not in first
  assert all(e["strategy"] == "chain3" for e in spec)
  assert "decode" not in _phases(got) and pool.compile_seconds == waited
  assert bandit.summary() == taught  # chunks beside a compile teach nothing
  deadline = time.monotonic() + 300
  while pool.background_busy:
    assert time.monotonic() < deadline
    time.sleep(0.05)
  assert pool.background_compiles == 1 and pool.background_seconds > 0
  tree = SpecStrategy.parse("tree3x2x6")
  key = lambda view: engine.programs.spec_key(SAMPLED, tree, view, first["batch"])
  assert any(key(view) in pool for view in cfg.view_buckets)  # at its own rows' reach
  assert pool.compile_seconds == waited


def test_a_chunk_that_runs_its_program_for_the_first_time_is_marked_and_left_out_of_costs(
  models,
):
  """A program's first execution carries one-time costs (on XLA:CPU a loop body's first run
  is far slower than the next): with programs compiled as chunks need them, the first chunk
  of each arm, batch bucket and cache view (every chunk that compiled among them) is marked
  `first_run`, and the simulator's cost tables (`sim.costs`) leave it out. One the bandit
  chose asks for one step or round and teaches it nothing, nor does a chunk charged with a
  drafter-cache rebuild (after a switch away) whose program ran for the first time; the same
  rollouts stay plain's."""
  from tlt_jax.sim.costs import _timeline_calls

  _, tp, _, dp = models
  engine = _engine(
    models, ExecutablePool(), SAMPLED, spec_strategies=("chain2", "chain3"), spec_adaptive=True
  )
  plain = _engine(models, ExecutablePool(), SAMPLED, spec_threshold=0)
  seen, firsts, short = set(), 0, 0
  for key in (7, 8):
    result = _run(engine, tp, dp, key=key)
    np.testing.assert_array_equal(result.tokens, _run(plain, tp, None, key=key).tokens)
    timeline = result.timeline
    chunks = [e for e in timeline if e["phase"] in ("decode", "spec")]
    for e in chunks:
      cell = (e.get("strategy", "plain"), e["batch"], e["view"])
      assert bool(e.get("first_run")) == (cell not in seen), e
      if e.get("compile_s"):
        assert e.get("first_run"), e
      if e.get("first_run") and e["batch"] <= ENGINE.spec_threshold:  # the bandit chose it
        assert e["requested"] == 1 and "reward" not in e, e
        short += 1
      seen.add(cell)
      firsts += bool(e.get("first_run"))
    for rebuild, e in zip(timeline, timeline[1:]):
      first_rebuild = rebuild["phase"] == "drafter_prefill" and rebuild.get("first_run")
      if e["phase"] == "spec" and first_rebuild:
        assert "switch_s" not in e, e  # no lesson prices a rebuild's first run as the arm's
      if e.get("rebuild_first_run"):
        assert first_rebuild and "reward" not in e, (rebuild, e)
    priced = sum(
      kind not in ("prefill", "drafter_prefill") for kind, *_ in _timeline_calls(timeline)
    )
    assert priced == sum(not (e.get("first_run") or e.get("compile_s")) for e in chunks)
  assert firsts == len(seen) and short > 0
  assert any(cell[0] != "plain" for cell in seen)


def test_programs_compiled_ahead_from_a_smaller_buckets_shapes_are_the_ones_it_runs(models):
  """`compile_ahead` compiles the next smaller bucket's programs before any row is moved
  there, from the shapes compaction will give (`EnginePrograms.take_shape`; a drafting
  arm's cache from its build's shapes): once the rows are gathered into that bucket, its
  plain and drafting chunks run those programs and compile nothing."""
  import time

  from tlt_jax.rollout.run import RolloutRun

  _, tp, _, dp = models
  pool = ExecutablePool()
  engine = _engine(
    models, pool, SAMPLED, spec_strategies=("chain3",), spec_adaptive=True, background_compiles=True
  )
  progs = engine.programs
  run = RolloutRun(
    engine,
    progs.read_weights(tp),
    PROMPTS,
    2,
    [m for m in LIMITS for _ in range(2)],
    key=jax.random.key(7),
    sampling=SAMPLED,
    seq_id_offset=0,
    drafter_params=progs.read_weights(dp),
    on_chunk=None,
  )
  small = ENGINE.batch_buckets[ENGINE.batch_buckets.index(run.state.batch) - 1]
  views = {arm: run._view(arm, run.active()) for arm in ("plain", "chain3")}
  for arm, view in views.items():
    assert run._compile_in_background(arm, view, progs.take_shape(run.state, small))
    deadline = time.monotonic() + 300
    while pool.background_busy:
      assert time.monotonic() < deadline
      time.sleep(0.05)
  assert pool.background_compiles == 2
  # The compaction `RolloutRun.compact` runs, to the first `small` rows.
  rows, valid = np.arange(small, dtype=np.int32), np.ones((small,), bool)
  args = (run.state, *jax.device_put((rows, valid)))
  state = progs.rows(progs.take(args)(*args))
  run.state = state
  width = min(views["chain3"], ENGINE.slots)
  built = (run.params, run.drafter_params, state)
  dstate = progs.drafter_prefill(width, built)(*built)  # the drafting arm's cache build
  compiles = pool.compiles
  progs.decode(SAMPLED, views["plain"], run._decode_args(1, state))
  chain3 = engine.strategies["chain3"]
  progs.spec(SAMPLED, chain3, views["chain3"], run._spec_args(chain3, dstate, None, 1, state))
  assert pool.compiles == compiles


def test_an_adaptive_mixed_pool_matches_plain_and_counts_its_rounds(models, pool):
  """A bandit over coupled and argmax chains and a tree at temperature 1: the rollout stays
  token-identical to plain decoding, and each speculative chunk accepts at most its arm's
  depth of draft tokens per row-round."""
  _, tp, _, dp = models
  strategies = ("chain2", "chain3", "chain3-argmax", "tree3x2x6")
  engine = _engine(models, pool, SAMPLED, spec_strategies=strategies, spec_adaptive=True)
  plain = _engine(models, pool, SAMPLED, spec_threshold=0)
  # Three rollouts: a program's first run teaches nothing (`RolloutRun._first_run`), so the
  # warm-up's pulls come a chunk later in each new cell.
  for key in (1, 2, 3):
    got = _run(engine, tp, dp, num_samples=4, key=key)
    np.testing.assert_array_equal(got.tokens, _run(plain, tp, None, num_samples=4, key=key).tokens)
    for e in got.timeline:
      if e["phase"] == "spec":
        depth = SpecStrategy.parse(e["strategy"]).depth
        assert 0 <= e["accepted"] <= depth * e["row_rounds"]
  # Every arm was pulled in some bucket's warm-up.
  for arm in strategies:
    assert any(arms[arm]["pulls"] > 0 for arms in engine.bandit.summary().values()), arm


def test_each_sampling_configuration_learns_in_its_own_bandit(models, pool):
  """The best draft differs by temperature: a greedy call on an engine whose own sampling
  is temperature 1 learns in a separate bandit and leaves the checkpointed one alone."""
  tg, tp, dg, dp = models
  cfg = dataclasses.replace(ENGINE, spec_adaptive=True)
  engine = RolloutEngine(tg, MODEL, cfg, SAMPLED, pool, drafter_graphdef=dg)
  engine.generate(tp, PROMPTS, 2, key=7, max_new_tokens=LIMITS, drafter_params=dp, sampling=GREEDY)
  assert engine.bandit.buckets == [] and engine.bandit_for(GREEDY).buckets
  assert engine.bandit_for(SAMPLED) is engine.bandit
  _run(engine, tp, dp)
  assert engine.bandit.buckets


def _rl_trainer(models, workdir, steps, engine_changes=None, **kwargs):
  """A GRPO trainer on PROMPTS (reward: a "7" in the completion) over an adaptive engine."""
  from rl_helpers import IdTokenizer, seven_reward, tiny_grpo

  from tlt_jax.rl import PolicyLossConfig, UpdateConfig
  from tlt_jax.rl.trainer import GRPOTrainer

  tg, tp, dg, _ = models
  sampling = SamplingConfig(temperature=1.0)
  examples = [{"question": " ".join(map(str, p)), "answer": ""} for p in PROMPTS]
  engine = RolloutEngine(
    tg,
    MODEL,
    dataclasses.replace(ENGINE, spec_adaptive=True, **(engine_changes or {})),
    sampling,
    drafter_graphdef=dg,
  )
  return GRPOTrainer(
    tg,
    jax.tree.map(jnp.copy, tp),
    engine,
    IdTokenizer(),
    examples,
    examples[:2],
    seven_reward,
    lambda ex: ex["question"],
    tiny_grpo(steps, group_size=4),
    PolicyLossConfig(),
    UpdateConfig(learning_rate=1e-3, total_steps=10, micro_batch=4),
    str(workdir),
    **kwargs,
  )


def test_rl_trainer_rolls_out_with_the_drafter_and_checkpoints_the_bandit(models, tmp_path):
  """GRPO with speculative rollouts (frozen drafter, adaptive engine): the bandit's
  statistics are saved with the RL checkpoint and restored on resume."""
  dp = models[3]
  first = _rl_trainer(models, tmp_path, 1, drafter_params=dp)
  rows = first.run(progress=False)
  assert rows[0]["loss/skipped"] == 0
  # Tokens per active row-round: >= 1 by construction, at most a full chain3/tree3x2x6 path
  # plus the bonus token; and the step's speculative chunks did commit tokens.
  assert 1.0 <= rows[0]["spec/accept_length"] <= 4.0 and rows[0]["spec/tokens"] > 0
  saved = first.engine.bandit.state_dict()
  assert saved["buckets"], "the rollout ran speculative chunks through the bandit"
  resumed = _rl_trainer(models, tmp_path, 2, drafter_params=dp)
  assert resumed.step == 1
  assert resumed.engine.bandit.state_dict() == saved
  # The frozen drafter is an input (the same params on resume), not checkpointed state.
  assert resumed.drafter_params is dp and not (tmp_path / "drafter_checkpoints").exists()


def test_rl_trainer_checkpoints_the_group_history(models, tmp_path):
  """Group drafts read each prompt's earlier rollouts: the history is saved with the RL
  checkpoint and a resumed trainer drafts from the same one."""
  dp = models[3]
  changes = {"spec_strategies": ("chain3", "group4")}
  first = _rl_trainer(models, tmp_path, 1, changes, drafter_params=dp)
  (row,) = first.run(progress=False)
  # The step's arm mix: chunks per arm (the bandit's warm-up runs each), accept per draft arm.
  mix = {k.split("/")[2] for k in row if k.startswith("spec/arm/") and k.endswith("/chunks")}
  assert mix == {"plain", "chain3", "group4"}
  assert row["spec/arm/group4/accept_length"] >= 1.0 and row["spec/arm/group4/row_rounds"] > 0
  # The same per batch bucket: chunks, row-rounds and accepted tokens add up to each arm's.
  for arm in mix:
    buckets = {k.split("/")[2] for k in row if k.startswith("spec/bucket/") and f"/{arm}/" in k}
    per = {
      field: [row.get(f"spec/bucket/{b}/{arm}/{field}", 0) for b in sorted(buckets)]
      for field in ("chunks", "row_rounds", "accept_length")
    }
    assert sum(per["chunks"]) == row[f"spec/arm/{arm}/chunks"]
    if arm != "plain":
      rounds = per["row_rounds"]
      assert sum(rounds) == row[f"spec/arm/{arm}/row_rounds"]
      tokens = sum(a * n for a, n in zip(per["accept_length"], rounds, strict=True))
      assert tokens / sum(rounds) == pytest.approx(row[f"spec/arm/{arm}/accept_length"])
  assert row["data/epoch"] == 0  # the first pass over the training set
  saved = first.engine.history.state_dict()
  assert len(first.engine.history) == 2  # the step's two prompts
  resumed = _rl_trainer(models, tmp_path, 2, changes, drafter_params=dp)
  assert resumed.step == 1
  got = resumed.engine.history.state_dict()
  assert sorted(got) == sorted(saved)
  for k in saved:
    np.testing.assert_array_equal(got[k], saved[k])
  fresh = _rl_trainer(models, tmp_path / "other", 1, changes, drafter_params=dp)
  assert len(fresh.engine.history) == 0


def _online(models, **scheduler):
  from tlt_jax.drafter import DrafterTrainConfig, OnlineDrafter
  from tlt_jax.scheduler import SchedulerConfig, SliceScheduler

  tg, _, dg, dp = models
  drafter = OnlineDrafter(
    dg,
    jax.tree.map(jnp.copy, dp),
    DrafterTrainConfig(learning_rate=1e-2, warmup_steps=0, batch_rows=2),
    slots=ENGINE.slots,
    feature_dim=MODEL.d_model,
  )
  return SliceScheduler(drafter, SchedulerConfig(**scheduler))


def _drafter_overhead(timeline):
  """The drafter's cost to a rollout as the engine timed it: every on_chunk call, and the
  drafter-cache rebuilds that pushed versions forced."""
  hooks = [e["dt"] for e in timeline if e["phase"] == "drafter_hook"]
  rebuilds = [
    e["dt"] - e.get("rebuild_compile_s", 0.0) for e in timeline if e.get("forced_by_push")
  ]
  return sum(hooks) + sum(rebuilds), max(hooks, default=0.0), max(rebuilds, default=0.0)


def _same_drafter_state(a, b):
  """Two `OnlineDrafter.state_dict()`s (params, optimizer, version, buffer) are equal."""
  (ta, arr_a, meta_a), (tb, arr_b, meta_b) = ((d["train"], d["buffer"], d["meta"]) for d in (a, b))
  assert meta_a == meta_b and sorted(arr_a) == sorted(arr_b)
  assert jax.tree.structure(ta) == jax.tree.structure(tb)
  for x, y in zip(jax.tree.leaves((ta, arr_a)), jax.tree.leaves((tb, arr_b))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_rl_trainer_trains_the_drafter_online_and_checkpoints_it(models, tmp_path):
  """TLT mode: rollouts feed the drafter's buffer, updates run in the reward and
  checkpoint windows and the long tail, new versions reach the engine at chunk
  boundaries; what the scheduler charged each rollout is what the engine timed (hook
  calls, push-forced rebuilds), within budget plus one update and one rebuild. The
  drafter (params, optimizer, version, buffer) as it is after the checkpoint window, its
  updates included, and the scheduler's estimates are restored on resume; a kill between
  the policy's and the drafter's writes resumes from the previous complete pair."""
  import shutil

  first_sched = _online(models, rollout_budget=0.5, long_tail_batch=16)
  saved = {}
  fill = first_sched.fill
  begin = first_sched.begin_rollout

  def cheap_updates(target):
    # Whether a measured update fits the long tail's budget depends on this machine's
    # load (a contended CI run once fit none); the budget arithmetic is tested with a
    # fake clock (tests/test_online_drafter.py). Here the estimate starts pinned small, so
    # the long tail runs real updates whatever the timing; they are charged as measured.
    params = begin(target)
    first_sched.update_seconds = 1e-6
    return params

  first_sched.begin_rollout = cheap_updates

  def spy(window, busy, target):
    if window != "checkpoint":
      return fill(window, busy, target)
    # Held open for two updates at least (a tiny policy's write can finish before one).
    before = first_sched.drafter.version
    done = fill(window, lambda: first_sched.drafter.version < before + 2 or busy(), target)
    assert done >= 2 and first_sched.drafter.version == before + done
    saved[first.step] = (first_sched.drafter.state_dict(), first_sched.state_dict())
    return done

  first_sched.fill = spy
  first = _rl_trainer(models, tmp_path, 2, scheduler=first_sched)
  timelines = []
  generate = first.engine.generate

  def timed(*args, **kw):
    out = generate(*args, **kw)
    if kw.get("on_chunk") is not None:
      timelines.append(out)
    return out

  first.engine.generate = timed
  rows = first.run(progress=False)
  assert rows[-1]["drafter/version"] > 0
  assert rows[0]["drafter/buffer_rows"] > 0
  assert sum(r["drafter/updates"] for r in rows) == first_sched.drafter.version
  assert sum(r["drafter/long_tail_updates"] for r in rows) > 0
  assert len(timelines) == len(rows)  # one rollout per step (no dynamic sampling)
  for r, out in zip(rows, timelines):
    overhead, one_update, one_rebuild = _drafter_overhead(out.timeline)
    assert r["drafter/rollout_charged_s"] == pytest.approx(overhead, rel=0.05, abs=2e-3)
    budget = 0.5 * out.wall_seconds + one_update + one_rebuild
    assert r["drafter/rollout_charged_s"] <= budget
  # the drafter moved and is checkpointed beside the policy, window updates included
  moved = jax.tree.map(
    lambda a, b: float(jnp.abs(a - b).max()), first_sched.drafter.params, models[3]
  )
  assert max(jax.tree.leaves(moved)) > 0
  assert sorted(saved) == [1, 2]
  second_sched = _online(models)
  resumed = _rl_trainer(models, tmp_path, 3, scheduler=second_sched)
  assert resumed.step == 2 and second_sched.drafter.version > 0
  _same_drafter_state(second_sched.drafter.state_dict(), saved[2][0])
  assert second_sched.state_dict() == saved[2][1] and saved[2][1]["update_seconds"] > 0
  # Killed after step 2's policy write, before its drafter write: back to step 1's pair,
  # and step 2's orphaned policy checkpoint goes (its rerun writes it afresh).
  shutil.rmtree(tmp_path / "drafter_checkpoints" / "2")
  third_sched = _online(models)
  fallback = _rl_trainer(models, tmp_path, 3, scheduler=third_sched)
  assert fallback.step == 1 and fallback.checkpoints.policy.all_steps() == [1]
  _same_drafter_state(third_sched.drafter.state_dict(), saved[1][0])
  # No drafter checkpoints at all (a workdir from before they existed, or from another
  # mode): the policy resumes, the drafter starts from its warm start, nothing is deleted.
  shutil.rmtree(tmp_path / "drafter_checkpoints")
  fourth_sched = _online(models)
  policy_only = _rl_trainer(models, tmp_path, 3, scheduler=fourth_sched)
  assert policy_only.step == 1 and policy_only.checkpoints.policy.all_steps() == [1]
  assert fourth_sched.drafter.version == 0 and len(fourth_sched.drafter.buffer) == 0
  with pytest.raises(ValueError, match="not both"):
    _rl_trainer(models, tmp_path / "x", 1, scheduler=_online(models), drafter_params=models[3])


def test_long_tail_charges_are_what_the_engine_measured(models, pool):
  """A real OnlineDrafter trained in a real rollout's long tail (budget 0.3, every bucket
  long-tail, speculative throughout): the seconds the scheduler charged equal the drafter's
  overhead as the engine's timeline measured it independently (every on_chunk call, each
  push-forced drafter-cache rebuild), and stay within 0.3 x the rollout's wall time plus
  one update and one rebuild (a lagging estimate overruns by at most that).

  The premise, two updates fitting the budget, holds on the CPU at 0.3; an accelerator runs
  this tiny rollout in milliseconds, so it gets 0.9 there and a skip naming the measured
  costs if even that fits fewer than two (on an H200, 0.3 fitted none)."""
  tg, tp, _, dp = models
  budget = 0.3 if jax.default_backend() == "cpu" else 0.9
  sched = _online(models, rollout_budget=budget, long_tail_batch=16)
  # Argmax drafts: on this random, flat-at-temperature-1 target coupled drafts are accepted
  # so often that the rollout ends in too few chunks for two long-tail updates.
  engine = _engine(models, pool, SAMPLED, spec_strategies=("chain3-argmax",))
  ref = _run(engine, tp, dp, num_samples=4)
  sched.drafter.observe(ref, step=0)
  outs = []
  # A garbage-collection pause between the scheduler's clock and the engine's (a few ms on
  # a loaded host) would be time one side saw and the other did not: none during the runs.
  gc.collect()
  gc.disable()
  try:
    for _ in range(2):  # the first compiles what the rollout needs (drafter rebuild widths)
      params = sched.begin_rollout(tp)
      outs.append(_run(engine, tp, params, num_samples=4, on_chunk=sched.on_chunk))
      sched.end_rollout()
      rec = sched.step_records()
  finally:
    gc.enable()
  out = outs[-1]
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  overhead, one_update, one_rebuild = _drafter_overhead(out.timeline)
  forced = [e for e in out.timeline if e.get("forced_by_push")]
  if rec["drafter/long_tail_updates"] < 2 and jax.default_backend() != "cpu":
    pytest.skip(
      f"{rec['drafter/long_tail_updates']} long-tail updates: one costs "
      f"{1e3 * sched.update_seconds:.1f} ms (+ {1e3 * sched.rebuild_seconds:.1f} ms rebuild), "
      f"the rollout {1e3 * out.wall_seconds:.1f} ms at budget {budget}"
    )
  assert rec["drafter/long_tail_updates"] >= 2 and rec["drafter/pushes"] >= 2 and forced
  charged = rec["drafter/rollout_charged_s"]
  assert charged == pytest.approx(overhead, rel=0.02, abs=1e-3)
  rebuilt = sum(e["dt"] - e.get("rebuild_compile_s", 0.0) for e in forced)
  assert rec["drafter/rollout_charged_rebuild_s"] == pytest.approx(rebuilt)
  assert rec["drafter/rollout_charged_update_s"] > rec["drafter/rollout_charged_host_s"] > 0
  assert charged <= budget * out.wall_seconds + one_update + one_rebuild
  assert rec["drafter/rollout_overrun_s"] <= one_update + one_rebuild


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "t1"])
def test_pushed_drafter_versions_keep_outputs_exact(models, pool, sampling):
  """A hook that swaps the drafter at chunk boundaries (here: alternating between a
  trained-looking and a random drafter) changes speed only, never the tokens."""
  tg, tp, dg, dp = models
  other = nnx.split(init_drafter(MODEL, seed=11))[1]
  calls, reported = [], []

  def hook(batch, rebuild_s):
    reported.append(rebuild_s)
    if batch == 0:  # the last report, after the final chunk
      return None
    calls.append(batch)
    return other if len(calls) % 2 else dp

  plain = _run(_engine(models, pool, sampling, spec_threshold=0), tp, None)
  spec = _run(_engine(models, pool, sampling), tp, dp, on_chunk=hook)
  assert len(calls) >= 2
  pushes = [e for e in spec.timeline if e["phase"] == "drafter_hook" and e["pushed"]]
  assert len(pushes) == len(calls)
  # Every push but the first (no drafter cache yet) forced a rebuild, reported to the hook.
  forced = [
    e["dt"] - e.get("rebuild_compile_s", 0.0) for e in spec.timeline if e.get("forced_by_push")
  ]
  assert len(forced) == len(calls) - 1 and sum(reported) == pytest.approx(sum(forced))
  np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_bandit_reward_charges_the_drafter_rebuild_to_the_spec_chunk(models, pool):
  """Leaving the drafter for plain decode costs a drafter-cache rebuild when coming back; the
  speculative chunk that needed it is rewarded tokens / (rebuild + chunk) seconds, so
  switching never looks free. The rollout's first build is charged to no arm (every drafter
  arm pays it). The tokens: per row active during the chunk (row-rounds / rounds); a plain
  chunk moves every row by one token a step: its steps per second."""
  _, tp, _, dp = models
  switches = plain_checked = 0
  for key in (7, 8, 9):
    # A fresh bandit walks its warm-up, plain before the drafter arms in each bucket, after
    # a rollout of the same key has run its programs once (a first run teaches nothing:
    # `RolloutRun._first_run`).
    _run(_engine(models, pool, spec_adaptive=True, spec_threshold=8), tp, dp, 4, key)
    engine = _engine(models, pool, spec_adaptive=True, spec_threshold=8)
    result = _run(engine, tp, dp, num_samples=4, key=key)
    seen_drafter = False
    for prev, entry in zip(result.timeline, result.timeline[1:]):
      if entry["phase"] == "spec" and "reward" in entry:
        rebuilt = prev["phase"] == "drafter_prefill"
        # Charged iff this rebuild follows an earlier drafter chunk of the rollout.
        assert ("switch_s" in entry) == (rebuilt and seen_drafter)
        if "switch_s" in entry:
          assert entry["switch_s"] == prev["dt"] - prev.get("rebuild_compile_s", 0.0)
          switches += 1
        # Lazy compiles are not charged: the chunk's own, and the rebuild's (timed apart).
        rebuild_compile = prev.get("rebuild_compile_s", 0.0) if rebuilt else 0.0
        chunk_compile = entry.get("compile_s", 0.0) - rebuild_compile
        charged = entry["dt"] + entry.get("switch_s", 0.0) - chunk_compile
        assert charged > 0
        tokens = entry["tokens"] / (entry["row_rounds"] / entry["rounds"])
        assert entry["reward"] == pytest.approx(tokens / charged, rel=1e-6)
      if entry["phase"] == "decode" and "reward" in entry:
        charged = entry["dt"] - entry.get("compile_s", 0.0)
        assert entry["reward"] == pytest.approx(entry["steps"] / charged, rel=1e-6)
        plain_checked += 1
      seen_drafter = seen_drafter or entry["phase"] == "spec"
  assert switches > 0, "no rewarded speculative chunk followed a plain one"
  assert plain_checked > 0, "no rewarded plain chunk"
  # A charged rebuild whose program runs for the first time (its pool entries' calls cleared,
  # as in a lazy pool) carries a one-time cost: its chunk teaches nothing.
  for full_key, entry in pool._entries.items():
    if full_key[0][0] == "drafter_prefill":
      entry.calls = 0
  result = _run(_engine(models, pool, spec_adaptive=True, spec_threshold=8), tp, dp, 4, 7)
  marked = [e for e in result.timeline if e.get("rebuild_first_run")]
  assert marked and all("reward" not in e and "switch_s" not in e for e in marked), marked


def test_settled_plain_runs_the_last_bucket_to_the_end(models, pool):
  """Once the bandit's best arm for the last bucket is plain decode (warm-up done), that
  bucket runs to the end in one call like the plain engine, and each such chunk that ran at
  least a chunk's steps teaches the bandit plain's speed (its mean moves off the seeded
  value); the output stays the plain engine's."""
  _, tp, _, dp = models
  engine = _engine(models, pool, spec_adaptive=True, spec_threshold=8)
  for bucket in (2, 4, 8):
    for arm, reward in (("plain", 1e6), ("chain3", 1.0), ("tree3x2x6", 1.0)):
      engine.bandit.update(bucket, arm, reward)
  assert engine.bandit.warmed_up(2) and not engine.bandit.warmed_up(16)
  before = engine.bandit.summary()[2]["plain"]
  spec = _run(engine, tp, dp)
  plain = _run(_engine(models, pool, spec_threshold=0), tp, None)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  last = [e for e in spec.timeline if e["phase"] == "decode" and e["batch"] == 2]
  assert last and max(e["requested"] for e in last) > ENGINE.chunk_steps
  taught = [e for e in last if "reward" in e]
  assert taught and all(e["steps"] >= ENGINE.chunk_steps for e in taught)
  assert all("reward" in e for e in last if e["steps"] >= ENGINE.chunk_steps)
  after = engine.bandit.summary()[2]["plain"]
  assert after["pulls"] == before["pulls"] + len(taught)
  assert after["last"] == pytest.approx(taught[-1]["reward"]) and after["mean"] < before["mean"]


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "t1"])
def test_round_costs_profile_every_stage_of_the_engines_round(models, pool, sampling):
  """The per-round cost profile runs the engine's own round cut after each stage: every
  stage is timed, the stages add up to the full round, and the profiled rounds accept
  what a round can (1 .. max_emit tokens per row)."""
  from tlt_jax.rollout.profile import round_costs
  from tlt_jax.rollout.speculative import STAGES

  tg, tp, _, dp = models
  engine = _engine(models, pool, sampling)
  prof = round_costs(engine, tp, dp, PROMPTS[:2], sampling, "chain3", rounds=3, reps=1)
  assert list(prof["stage_ms"]) == list(STAGES) and prof["batch"] == 2
  assert sum(prof["stage_ms"].values()) == pytest.approx(prof["round_ms"])
  assert prof["step_ms"] > 0 and prof["round_steps"] == pytest.approx(
    prof["round_ms"] / prof["step_ms"]
  )
  assert 1.0 <= prof["accept_length"] <= SpecStrategy.parse("chain3").max_emit


def test_round_costs_of_the_whole_round_alone(models, pool):
  """Where only a round's cost is wanted (experiments/real_sizes.py at real sizes), the
  round is timed whole, its stages' cut programs never compiled."""
  from tlt_jax.rollout.profile import round_costs

  _, tp, _, dp = models
  # One row, its plain step paired as on a GPU (`one_row_step`): the engine's kind of step.
  engine = _engine(models, pool, GREEDY, one_row_step="paired")
  prof = round_costs(engine, tp, dp, PROMPTS[:1], GREEDY, "chain3", rounds=3, reps=1, stages=())
  assert list(prof["stage_ms"]) == ["extend"] == list(prof["cumulative_ms"])
  assert prof["stage_ms"]["extend"] == prof["round_ms"] > 0
  assert 1.0 <= prof["accept_length"] <= SpecStrategy.parse("chain3").max_emit


def test_round_costs_of_group_drafts(models, pool):
  """Group drafts profile with sibling rows (num_samples per prompt); no drafter runs, so the
  round has no drafter-cache extension to pay for."""
  from tlt_jax.rollout.profile import round_costs

  _, tp, _, dp = models
  engine = _engine(models, pool, SAMPLED, spec_strategies=("group4",))
  prof = round_costs(
    engine, tp, dp, PROMPTS[:2], SAMPLED, "group4", rounds=3, reps=1, num_samples=2
  )
  assert prof["batch"] == 4 and prof["strategy"] == "group4"
  assert 1.0 <= prof["accept_length"] <= 5.0


def test_chunks_record_their_place_and_the_bandit_counts_their_rewards(models, pool):
  """Each chunk records where in the answers it starts (tokens generated per active row:
  it grows by a chunk's tokens per row while no row finishes), and the bandit holds one
  reward per rewarded chunk of each (bucket, arm): their mean, and a pull each."""
  from tlt_jax.rollout.bandit import BanditSettings, StrategyBandit

  _, tp, _, dp = models
  engine = _engine(models, pool, spec_adaptive=True, spec_threshold=16)
  engine.bandit = StrategyBandit(engine.bandit.arms, BanditSettings(discount=1.0, min_pulls=1))
  rewarded: dict[tuple[int, str], list[float]] = {}
  followed = 0
  for key in (3, 4):
    result = _run(engine, tp, dp, num_samples=2, key=key)
    chunks = [e for e in result.timeline if e["phase"] in ("decode", "spec")]
    assert chunks[0]["generated"] == 1.0  # the prefill samples each row's first token
    for prev, entry in zip(chunks, chunks[1:]):
      if entry["active"] == prev["active"] and entry["batch"] == prev["batch"]:
        want = prev["generated"] + prev["tokens"] / prev["active"]
        assert entry["generated"] == pytest.approx(want)
        followed += 1
    for entry in chunks:
      if "reward" in entry:
        cell = (entry["batch"], entry.get("strategy", "plain"))
        rewarded.setdefault(cell, []).append(entry["reward"])
  assert followed > 0 and rewarded
  for bucket, arms in engine.bandit.summary().items():
    for arm, stats in arms.items():
      rewards = rewarded.get((bucket, arm), [])
      assert stats["pulls"] == len(rewards), (bucket, arm)
      if rewards:
        assert stats["mean"] == pytest.approx(np.mean(rewards)), (bucket, arm)


def test_cut_short_chunks_are_not_rewarded(models, pool):
  """A bucket's last chunk ends early when its rows finish: mostly fixed overhead at small
  batch, and an arm that ends the bucket sooner would be rewarded less for it, so the
  bandit learns no reward from it."""
  _, tp, _, dp = models
  # No compaction: the batch stays in one (not the last) bucket, where every chunk learns.
  engine = _engine(
    models, pool, SAMPLED, spec_adaptive=True, spec_strategies=("chain3",), compact=False
  )
  # Which arm runs the last chunk depends on measured times; the longest row's 33 decode
  # steps leave a plain chunk of 6 steps short, a speculative one only sometimes: keys are
  # tried until a rollout ends in a short chunk.
  short = []
  for key in range(11, 19):
    result = engine.generate(
      tp, PROMPTS, 2, key=key, max_new_tokens=[5, 34, 12, 20], drafter_params=dp
    )
    chunks = [e for e in result.timeline if e["phase"] in ("decode", "spec")]
    short += [e for e in chunks if e["phase"] == "spec" and e["rounds"] < ENGINE.spec_rounds]
    short += [e for e in chunks if e["phase"] == "decode" and e["steps"] < ENGINE.chunk_steps]
    full = [e for e in chunks if e not in short]
    if short:
      break
  assert short and not any("reward" in e for e in short)
  assert any("reward" in e for e in full)  # the full chunks did learn


def test_warmup_compiling_ahead_builds_the_same_programs(models):
  """A warm-up whose compiles overlap on worker threads pools the same programs as one
  that compiles them in turn, so no rollout compiles afterwards and the tokens agree."""
  _, tp, _, dp = models
  pools = {workers: ExecutablePool() for workers in (1, 2)}
  results = {}
  for workers, pool in pools.items():
    # 4 rows (4 prompts x 1) and two cache views: few programs (~20), still enough for two
    # compile threads to overlap.
    engine = _engine(
      models,
      pool,
      SAMPLED,
      spec_strategies=("chain3",),
      max_batch=4,
      spec_threshold=4,
      min_cache_bucket=32,
    )
    engine.warmup(tp, num_samples=1, drafter_params=dp, compile_workers=workers)
    compiled = pool.compiles
    results[workers] = _run(engine, tp, dp, num_samples=1)
    assert pool.compiles == compiled  # the warm-up left nothing to compile
  assert pools[2].compiles == pools[1].compiles
  assert {r["key"] for r in pools[2].summary()} == {r["key"] for r in pools[1].summary()}
  np.testing.assert_array_equal(results[2].tokens, results[1].tokens)


def test_warmup_runs_every_chunk_program_through_its_loop(models, pool):
  """The warm-up runs each decode and speculative program for one real step or round (the
  loop's body, not only its entry): on XLA:CPU a body's first execution carries a one-time
  cost that would otherwise land in the bandit's first measurement of each arm."""
  _, tp, _, dp = models
  engine = _engine(models, pool, max_batch=4, spec_threshold=4)
  ran = {"decode": [], "spec": []}

  def spy(name, make):
    def wrapped(*args, **kwargs):
      exe = make(*args, **kwargs)

      def call(*inputs):
        out = exe(*inputs)
        ran[name].append(int(out[1] if name == "decode" else out[3].rounds))
        return out

      return call

    return wrapped

  engine.programs.decode = spy("decode", engine.programs.decode)
  engine.programs.spec = spy("spec", engine.programs.spec)
  engine.warmup(tp, num_samples=2, drafter_params=dp)
  views, buckets = len(engine.config.view_buckets), len(engine.config.batch_buckets)
  assert buckets == 2 and ran["decode"] == [1] * views * buckets
  assert len(ran["spec"]) >= 2 * buckets and set(ran["spec"]) == {1}


def test_warmup_for_known_prompt_lengths_compiles_only_what_they_need(models):
  """Given the prompt lengths, a warm-up skips the other prompt buckets and the cache views
  shorter than the shortest prompt (no chunk can choose them): fewer programs, and still
  none left for the rollout to compile."""
  _, tp, _, dp = models
  prompts, lens = [PROMPTS[1], PROMPTS[3]], [5, 8]
  # 2 prompts x 1 sample: batch bucket 2 is all a rollout of them can use.
  changes = dict(
    min_cache_bucket=4,
    min_prompt_bucket=2,
    spec_strategies=("chain3",),
    max_batch=2,
    spec_threshold=2,
  )
  full, lean = ExecutablePool(), ExecutablePool()
  for pool, known in ((full, None), (lean, lens)):
    engine = _engine(models, pool, SAMPLED, **changes)
    engine.warmup(tp, num_prompts=[2], num_samples=1, drafter_params=dp, prompt_lens=known)
  compiled = lean.compiles
  assert compiled < full.compiles
  out = engine.generate(tp, prompts, 1, key=7, max_new_tokens=[12, 30], drafter_params=dp)
  assert "spec" in _phases(out) and lean.compiles == compiled
  with pytest.raises(ValueError, match="prompt_lens"):
    engine.warmup(tp, prompt_lens=[ENGINE.max_prompt_len + 1])

"""Policy update: log-probs match the sampler, micro-batching is exact, bad steps are skipped."""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tiny_models import ONE_PROGRAM_ENGINE, TINY_ONE_LAYER

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.rl import (
  PolicyLossConfig,
  UpdateConfig,
  make_optimizer,
  make_policy_update,
  token_logprobs,
)
from tlt_jax.rl.update import OUT_OF_SET_LOGP
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.utils.trees import path_name

MODEL = TINY_ONE_LAYER
# No stop token: every row runs to its budget.
ENGINE = dataclasses.replace(ONE_PROGRAM_ENGINE, stop_tokens=())
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15]]
B, T = 8, ENGINE.slots  # rollout and training batches share one log-prob program


@pytest.fixture(scope="module")
def model():
  graphdef, params = nnx.split(init_model(MODEL, seed=5))
  return graphdef, params


def _copy(tree):
  # The update donates its inputs: every call gets fresh buffers.
  return jax.tree.map(jnp.copy, tree)


def _host(tree):
  return [np.array(x) for x in jax.tree.leaves(tree)]


@functools.cache
def _jit_logprobs(graphdef):
  # Temperature traced: one compiled program serves every temperature.
  return jax.jit(lambda p, t, temp: token_logprobs(graphdef, p, t, temp)[0])


def _logprobs_fn(graphdef, temperature):
  return lambda p, t: _jit_logprobs(graphdef)(p, t, jnp.float32(temperature))


def _batch(graphdef, params, seed=0, noise=0.1, temperature=1.0):
  """Random rows: a prompt of 2-4 tokens, then a response of varying length."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, MODEL.vocab_size, (B, T)).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  for b in range(B):
    start = int(rng.integers(2, 5))
    mask[b, start : start + int(rng.integers(1, T - start + 1))] = 1.0
  logp = np.asarray(_logprobs_fn(graphdef, temperature)(params, tokens))
  old = (logp + noise * rng.normal(size=(B, T))) * mask
  adv = rng.normal(size=(B,)).astype(np.float32)
  return dict(tokens=tokens, mask=mask, old_logp=old.astype(np.float32), advantages=adv)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_rollout_engine(model, temperature):
  graphdef, params = model
  engine = RolloutEngine(graphdef, MODEL, ENGINE, SamplingConfig(temperature=temperature))
  res = engine.generate(params, PROMPTS, num_samples=2, key=7)
  assert res.tokens.shape == (B, T)
  logp = np.asarray(_logprobs_fn(graphdef, temperature)(params, jnp.asarray(res.tokens)))
  checked = 0
  for n in range(res.tokens.shape[0]):
    gen = slice(int(res.prompt_len[n]), int(res.length[n]))
    np.testing.assert_allclose(logp[n, gen], res.logprobs[n, gen], atol=1e-4)
    checked += gen.stop - gen.start
  assert checked >= 16
  assert np.all(logp[:, 0] == 0.0)


def test_token_logprobs_temperature_changes_values_and_entropy(model):
  graphdef, params = model
  tokens = jnp.asarray(np.arange(2 * T).reshape(2, T) % MODEL.vocab_size, jnp.int32)
  both = jax.jit(
    lambda p, t: [token_logprobs(graphdef, p, t, temp, with_entropy=True) for temp in (1.0, 0.5)]
  )
  (lp1, ent1), (lp2, ent2) = jax.device_get(both(params, tokens))
  assert np.max(np.abs(lp1 - lp2)) > 1e-3
  # Sharper at lower temperature; bounded by log V; nothing at t = 0.
  assert np.all(ent2[:, 1:] < ent1[:, 1:])
  assert np.all(ent1 <= np.log(MODEL.vocab_size) + 1e-5)
  assert np.all(ent1[:, 0] == 0.0)
  with pytest.raises(ValueError, match="temperature"):
    token_logprobs(graphdef, params, tokens, 0.0)


@functools.cache
def _jit_logits(graphdef):
  """The full next-token logits [B, T, V] (position t predicts token t + 1)."""

  def logits(p, tokens):
    model = nnx.merge(graphdef, p)
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    return model.logits(model(tokens, pos)[0])

  return jax.jit(logits)


@functools.cache
def _jit_truncated(graphdef, top_k, top_p):
  """token_logprobs of the truncated distribution, temperature traced: (logp, entropy)."""
  return jax.jit(
    lambda p, t, temp: token_logprobs(
      graphdef, p, t, temp, top_k=top_k, top_p=top_p, with_entropy=True
    )
  )


def _reference_logp(logits, temperature, top_k, top_p):
  """float64: temper; keep the top k (every token tied with the k-th too); then keep the
  smallest prefix, by probability, whose mass reaches top_p; renormalise. -inf elsewhere."""
  z = logits.astype(np.float64) / temperature
  if 0 < top_k < z.shape[-1]:
    z = np.where(z >= np.sort(z, axis=-1)[..., -top_k, None], z, -np.inf)
  if top_p < 1.0:
    probs = np.exp(z - z.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    keep = np.empty_like(sorted_p, bool)
    np.put_along_axis(keep, order, np.cumsum(sorted_p, axis=-1) - sorted_p < top_p, axis=-1)
    z = np.where(keep, z, -np.inf)
  top = z.max(-1, keepdims=True)
  return z - top - np.log(np.sum(np.exp(z - top), axis=-1, keepdims=True))


def _scaled_params(params, scale, tie_pairs=False):
  """params with the (tied) embedding scaled, so next-token distributions are peaked;
  tie_pairs: token 2i + 1's embedding := token 2i's, so every logit comes in an exactly
  equal pair (the same dot product) and every top-k threshold with odd k is a tie."""
  emb = np.asarray(params["embed"]["embedding"][...]) * scale
  if tie_pairs:
    emb[1::2] = emb[0::2]
  new = jax.tree.map(jnp.copy, params)
  new["embed"]["embedding"].value = jnp.asarray(emb)
  return new


TRUNCATIONS = {  # (top_k, top_p, tie_pairs)
  "top_k_tie": (3, 1.0, True),
  "top_p": (0, 0.8, False),
  "top_k_top_p": (5, 0.8, False),
}


@pytest.mark.parametrize("name", list(TRUNCATIONS))
def test_token_logprobs_score_the_truncated_distribution(model, name):
  """Log-probs and entropy of the tempered, truncated, renormalised distribution the rollout
  samples, against a float64 reference; tokens outside the kept set score OUT_OF_SET_LOGP.
  The tokens are chosen position by position from the reference at their prefix: the least
  probable kept token (a k-th-value tie, or the token whose mass crosses top_p), the most
  probable dropped one, or a random one."""
  graphdef, params = model
  top_k, top_p, tie_pairs = TRUNCATIONS[name]
  temp = 0.7
  params = _scaled_params(params, 10.0, tie_pairs)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, MODEL.vocab_size, (B, T)).astype(np.int32)
  for t in range(1, T):  # causal: the logits at t - 1 do not depend on tokens[:, t:]
    logits = np.asarray(_jit_logits(graphdef)(params, tokens))[:, t - 1]
    ref = _reference_logp(logits, temp, top_k, top_p)
    for b in range(B):
      kept, dropped = np.flatnonzero(ref[b] > -np.inf), np.flatnonzero(ref[b] == -np.inf)
      if t % 3 == 0:
        tokens[b, t] = kept[np.argmin(logits[b, kept])]
      elif t % 3 == 1 and dropped.size:
        tokens[b, t] = dropped[np.argmax(logits[b, dropped])]
      else:
        tokens[b, t] = rng.integers(MODEL.vocab_size)
  logits = np.asarray(_jit_logits(graphdef)(params, tokens))
  ref = _reference_logp(logits, temp, top_k, top_p)[:, :-1]  # position t - 1 predicts t
  got, ent = jax.device_get(_jit_truncated(graphdef, top_k, top_p)(params, tokens, temp))
  want = np.take_along_axis(ref, tokens[:, 1:, None], axis=-1)[..., 0]
  inside = want > -np.inf
  assert 0.2 < inside.mean() < 0.9  # both kinds are checked
  np.testing.assert_allclose(got[:, 1:][inside], want[inside], rtol=0, atol=2e-5)
  np.testing.assert_array_equal(got[:, 1:][~inside], OUT_OF_SET_LOGP)
  kept = ref > -np.inf
  want_ent = -np.sum(np.exp(ref) * np.where(kept, ref, 0.0), axis=-1)
  np.testing.assert_allclose(ent[:, 1:], want_ent, rtol=0, atol=2e-5)
  assert np.all(got[:, 0] == 0.0) and np.all(ent[:, 0] == 0.0)
  if tie_pairs:  # the k-th value's twin is kept too: k + 1 tokens everywhere
    assert np.all(np.sum(kept, axis=-1) == top_k + 1)


MICRO_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")


@pytest.fixture(scope="module")
def micro_runs(model):
  """{aggregation: {micro-batches: (new params, metrics)}} for one update on one batch."""
  graphdef, params = model
  batch = _batch(graphdef, params, seed=1)
  # Plain SGD at lr 1: the parameter change IS the gradient, so any weighting
  # error shows at full size (Adam's first step would hide it behind sign(g)).
  sgd = optax.sgd(1.0)
  runs = {}
  for aggregation in MICRO_AGGREGATIONS:
    cfg = PolicyLossConfig(aggregation=aggregation, clip_high=0.28)
    runs[aggregation] = {}
    for n_mb in (1, 4):
      fn = make_policy_update(graphdef, sgd, cfg, B // n_mb)
      new, _, metrics = fn(_copy(params), sgd.init(params), batch, None)
      runs[aggregation][n_mb] = (_host(new), jax.device_get(metrics))
  return runs


@pytest.mark.parametrize("aggregation", MICRO_AGGREGATIONS)
def test_micro_batches_equal_full_batch(model, micro_runs, aggregation):
  _, params = model
  (full, m_full), (micro, m_micro) = micro_runs[aggregation][1], micro_runs[aggregation][4]
  assert int(m_full["skipped"]) == 0 and int(m_micro["skipped"]) == 0
  change = max(np.max(np.abs(a - b)) for a, b in zip(full, _host(params), strict=True))
  assert change > 1e-3
  for a, b in zip(full, micro, strict=True):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
  for k in ("loss", "grad_norm", "ratio_mean", "clip_fraction_low", "clip_fraction_high"):
    np.testing.assert_allclose(m_full[k], m_micro[k], rtol=1e-5, err_msg=k)


def test_aggregations_give_different_updates(micro_runs):
  # Guards the test above: rows have unequal token counts, so the token and row
  # weightings must disagree; equal results would mean the weighting is untested.
  a, b = (micro_runs[agg][4][0] for agg in MICRO_AGGREGATIONS)
  assert max(np.max(np.abs(x - y)) for x, y in zip(a, b, strict=True)) > 1e-3


TEMP = 0.7


@pytest.fixture(scope="module")
def adam_update(model):
  """The full-featured step (AdamW, KL to a reference, entropy bonus, 4 micro-batches),
  compiled once and shared by the tests below. Call it with the initial params as reference."""
  graphdef, _ = model
  ucfg = UpdateConfig(learning_rate=1e-2, warmup_steps=0, total_steps=100, micro_batch=2)
  opt = make_optimizer(ucfg)
  cfg = PolicyLossConfig(temperature=TEMP, kl_coef=0.01, entropy_coef=0.001, clip_high=0.28)
  fn = make_policy_update(graphdef, opt, cfg, ucfg.micro_batch)
  return opt, fn


def test_non_finite_batch_is_skipped_bit_for_bit(model, adam_update):
  graphdef, params = model
  opt, fn = adam_update
  batch = _batch(graphdef, params, seed=2, temperature=TEMP)
  ref = _copy(params)
  # One good step first so the optimizer state is not all zeros.
  p, s, m = fn(_copy(params), opt.init(params), batch, ref)
  assert int(m["skipped"]) == 0
  before_p, before_s = _host(p), _host(s)
  bad = dict(batch, advantages=batch["advantages"].copy())
  bad["advantages"][3] = np.nan
  p2, s2, m2 = fn(p, s, bad, ref)
  assert int(m2["skipped"]) == 1
  assert not np.isfinite(float(m2["loss"]))
  for a, b in zip(before_p + before_s, _host(p2) + _host(s2), strict=True):
    np.testing.assert_array_equal(a, b)
  # And the same state still trains on a good batch.
  p3, _, m3 = fn(p2, s2, batch, ref)
  assert int(m3["skipped"]) == 0
  assert any(np.any(a != b) for a, b in zip(before_p, _host(p3), strict=True))


def test_first_update_has_unit_ratio_and_no_clipping(model, adam_update):
  graphdef, params = model
  opt, fn = adam_update
  batch = _batch(graphdef, params, seed=3, noise=0.0, temperature=TEMP)
  new, _, m = fn(_copy(params), opt.init(params), batch, _copy(params))
  m = jax.device_get(m)
  assert int(m["skipped"]) == 0
  assert abs(float(m["ratio_mean"]) - 1.0) < 1e-5
  assert abs(float(m["ratio_max"]) - 1.0) < 1e-5
  assert float(m["clip_fraction_low"]) == 0.0 and float(m["clip_fraction_high"]) == 0.0
  assert abs(float(m["approx_kl"])) < 1e-6 and abs(float(m["kl"])) < 1e-6
  assert float(m["entropy"]) > 0.0 and float(m["grad_norm"]) > 0.0
  # Old log-probs at another temperature do not give unit ratios: the check can fail.
  wrong = _batch(graphdef, params, seed=3, noise=0.0, temperature=1.0)
  _, _, m_wrong = fn(new, opt.init(params), wrong, _copy(params))
  assert abs(float(m_wrong["ratio_mean"]) - 1.0) > 1e-3


@pytest.mark.parametrize("name", ["top_k_tie", "top_p"])
def test_truncated_update_is_on_policy_and_finite_off_it(model, name):
  """With the loss's truncation, old log-probs from token_logprobs at the same truncation
  give ratio 1 up to float error (another program) and no clipping (random tokens: many
  outside the kept set, scored -30 both times, so their ratio is exactly 1).
  Off-policy, with tokens leaving the kept set (old log-probs of the untruncated policy:
  new / old ~ e^-27) and entering it (old -30: new / old ~ e^+29), loss, gradients and
  metrics stay finite and the step is taken."""
  graphdef, params = model
  top_k, top_p, tie_pairs = TRUNCATIONS[name]
  params = _scaled_params(params, 10.0, tie_pairs)
  ucfg = UpdateConfig(learning_rate=1e-2, total_steps=100, micro_batch=4)
  opt = make_optimizer(ucfg)
  cfg = PolicyLossConfig(
    temperature=TEMP, top_k=top_k, top_p=top_p, kl_coef=0.01, entropy_coef=0.001
  )
  fn = make_policy_update(graphdef, opt, cfg, ucfg.micro_batch)
  batch = _batch(graphdef, params, seed=8, noise=0.0, temperature=TEMP)
  logp = np.asarray(_jit_truncated(graphdef, top_k, top_p)(params, batch["tokens"], TEMP)[0])
  mask = batch["mask"] > 0
  out = mask & (logp == OUT_OF_SET_LOGP)
  assert 0 < out.sum() < mask.sum()  # both kinds of token count
  on_policy = dict(batch, old_logp=logp * batch["mask"])
  _, _, m = fn(_copy(params), opt.init(params), on_policy, _copy(params))
  m = jax.device_get(m)
  assert int(m["skipped"]) == 0
  assert abs(float(m["ratio_max"]) - 1.0) < 1e-5 and abs(float(m["ratio_mean"]) - 1.0) < 1e-6
  assert abs(float(m["approx_kl"])) < 1e-10
  assert float(m["clip_fraction_low"]) == 0.0 and float(m["clip_fraction_high"]) == 0.0
  assert float(m["grad_norm"]) > 0.0 and float(m["entropy"]) > 0.0
  # Off-policy both ways; batch["old_logp"] is the untruncated policy's.
  old = batch["old_logp"].copy()
  entering = mask & ~out & (np.arange(T)[None] % 2 == 0)
  old[entering] = OUT_OF_SET_LOGP
  new, _, m = fn(_copy(params), opt.init(params), dict(batch, old_logp=old), _copy(params))
  m = jax.device_get(m)
  assert int(m["skipped"]) == 0, m
  assert all(np.isfinite(float(v)) for v in m.values()), m
  assert float(m["ratio_max"]) > 1e10 and float(m["clip_fraction_low"]) > 0.0
  assert all(np.all(np.isfinite(x)) for x in _host(new))


def test_kl_without_reference_raises(model):
  graphdef, params = model
  opt = optax.sgd(0.1)
  fn = make_policy_update(graphdef, opt, PolicyLossConfig(kl_coef=0.1), B)
  batch = _batch(graphdef, params, seed=4)
  with pytest.raises(ValueError, match="ref_params"):
    fn(_copy(params), opt.init(params), batch, None)


def test_positive_advantage_raises_sequence_logprob(model, adam_update):
  graphdef, params = model
  opt, fn = adam_update
  batch = _batch(graphdef, params, seed=5, noise=0.0, temperature=TEMP)
  batch["advantages"] = np.zeros((B,), np.float32)
  batch["advantages"][2] = 1.0
  logp_fn = _logprobs_fn(graphdef, TEMP)
  row_logp = lambda p: float(np.sum(np.asarray(logp_fn(p, batch["tokens"]))[2] * batch["mask"][2]))
  start = row_logp(params)
  p, s, ref = _copy(params), opt.init(params), _copy(params)
  for _ in range(4):
    p, s, m = fn(p, s, batch, ref)
    assert int(m["skipped"]) == 0
  assert row_logp(p) > start + 0.1


def test_trainable_pattern_freezes_the_rest(model):
  graphdef, params = model
  ucfg = UpdateConfig(
    learning_rate=1e-2, total_steps=10, micro_batch=B, trainable="final_norm|layers/0/mlp"
  )
  opt = make_optimizer(ucfg)
  fn = make_policy_update(graphdef, opt, PolicyLossConfig(), ucfg.micro_batch)
  batch = _batch(graphdef, params, seed=6)
  new, _, m = fn(_copy(params), opt.init(params), batch, None)
  assert int(m["skipped"]) == 0
  moved = {
    path_name(path)
    for (path, a), b in zip(
      jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(new), strict=True
    )
    if np.any(np.asarray(a) != np.asarray(b))
  }
  assert "final_norm/scale" in moved and "layers/0/mlp/up_proj/kernel" in moved
  assert all(p == "final_norm/scale" or p.startswith("layers/0/mlp/") for p in moved)
  with pytest.raises(ValueError, match="matches no parameter"):
    make_optimizer(dataclasses.replace(ucfg, trainable="no_such_layer")).init(params)


@pytest.mark.parametrize("pattern", ["final_norm", "final_norm|layers/0/mlp"])
def test_differentiating_only_the_trained_parameters_changes_nothing(model, pattern):
  """The update told the trainable pattern (frozen leaves held constant in the loss, so
  the backward pass can stop early) moves the parameters as the plain update does, whose
  optimizer zeroes the frozen leaves' full gradients afterwards."""
  graphdef, params = model
  ucfg = UpdateConfig(learning_rate=1e-2, total_steps=10, micro_batch=2, trainable=pattern)
  opt = make_optimizer(ucfg)
  batch = _batch(graphdef, params, seed=7)
  outs = {}
  for told in ("", pattern):
    fn = make_policy_update(graphdef, opt, PolicyLossConfig(), ucfg.micro_batch, told)
    outs[told] = fn(_copy(params), opt.init(params), batch, None)
  (p_full, s_full, m_full), (p_cut, s_cut, m_cut) = outs[""], outs[pattern]
  chex.assert_trees_all_close(p_cut, p_full, rtol=1e-5, atol=1e-7)
  chex.assert_trees_all_close(s_cut, s_full, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(m_cut["loss"], m_full["loss"], rtol=1e-6)
  # grad_norm covers the trained parameters only, so it is below the full one.
  assert 0 < float(m_cut["grad_norm"]) < float(m_full["grad_norm"])
  with pytest.raises(ValueError, match="matches no parameter"):
    make_policy_update(graphdef, opt, PolicyLossConfig(), 2, "no_such_layer")(
      _copy(params), opt.init(params), batch, None
    )


@pytest.mark.parametrize("remat, scan_layers", [(True, False), (False, True), (True, True)])
def test_remat_and_scanned_layers_compute_the_same_update(model, remat, scan_layers):
  """Rematerialised layers (UpdateConfig.remat: one more forward, less memory, see
  tests/test_memory.py) and layers as one scan (UpdateConfig.scan_layers: one layer's
  program to compile) give the update of the plain unrolled backward pass."""
  graphdef, params = model
  sgd = optax.sgd(1.0)  # the change is the gradient itself
  batch = _batch(graphdef, params, seed=9)
  outs = [
    make_policy_update(graphdef, sgd, PolicyLossConfig(), 2, remat=r, scan_layers=s)(
      _copy(params), sgd.init(params), batch, None
    )
    for r, s in ((False, False), (remat, scan_layers))
  ]
  (p_plain, _, m_plain), (p_other, _, m_other) = outs
  chex.assert_trees_all_close(p_other, p_plain, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m_other["grad_norm"], m_plain["grad_norm"], rtol=1e-5)
  assert float(m_plain["grad_norm"]) > 1e-3


def test_update_config_validation():
  assert UpdateConfig().mini_batch_samples(16) == 16
  assert UpdateConfig(mini_batches=4).mini_batch_samples(16) == 4
  with pytest.raises(ValueError, match="mini_batches \\(3\\) must divide"):
    UpdateConfig(mini_batches=3).mini_batch_samples(16)
  bad = [
    dict(learning_rate=0.0),
    dict(warmup_steps=10, total_steps=10),
    dict(total_steps=0),
    dict(weight_decay=-0.1),
    dict(grad_clip=0.0),
    dict(micro_batch=0),
    dict(mini_batches=0),
    dict(epochs=0),
    dict(b1=1.0),
    dict(b2=-0.5),
    dict(trainable="layers/(3"),
  ]
  for kwargs in bad:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
      dataclasses.replace(UpdateConfig(), **kwargs)
  with pytest.raises(ValueError, match="micro_batch must be"):
    make_policy_update(None, optax.sgd(1.0), PolicyLossConfig(), 0)
  with pytest.raises(ValueError, match="trainable is not a regular expression"):
    make_policy_update(None, optax.sgd(1.0), PolicyLossConfig(), 1, "layers/(3")


def _masked_max(x, mask):
  return float(np.max(np.where(mask > 0, np.abs(x), 0.0)))


def test_on_policy_update_equals_the_old_logprob_pass(model):
  """One optimizer step per rollout batch: the update that takes stop_gradient of its own
  log-probs as old_logp (no old-log-prob pass, no old_logp in the batch) moves the params
  as the update fed a separate pass's log-probs, KL reference and entropy included (plain
  SGD: the change is the gradient). Its ratio is exactly 1, and the rollout log-probs in
  the batch give the rollout-vs-trainer gap from the update's own forward."""
  graphdef, params = model
  sgd = optax.sgd(1.0)
  cfg = PolicyLossConfig(temperature=TEMP, kl_coef=0.01, entropy_coef=0.001, clip_high=0.28)
  batch = _batch(graphdef, params, seed=10, noise=0.0, temperature=TEMP)
  # The pass's log-probs (another program), and the engine's, off by 0.01 at one token.
  rollout = batch["old_logp"].copy()
  b, t = np.argwhere(batch["mask"] > 0)[3]
  rollout[b, t] += 0.01
  passed = make_policy_update(graphdef, sgd, cfg, 2)
  own = make_policy_update(graphdef, sgd, cfg, 2, on_policy=True)
  p_pass, _, m_pass = passed(_copy(params), sgd.init(params), batch, _copy(params))
  on_batch = {k: v for k, v in batch.items() if k != "old_logp"}
  p_own, _, m_own = own(
    _copy(params), sgd.init(params), dict(on_batch, rollout_logp=rollout), _copy(params)
  )
  m_pass, m_own = jax.device_get((m_pass, m_own))
  assert int(m_own["skipped"]) == 0 and float(m_own["grad_norm"]) > 1e-3
  chex.assert_trees_all_close(p_own, p_pass, rtol=1e-4, atol=1e-6)
  for k in ("loss", "grad_norm", "kl", "entropy"):
    np.testing.assert_allclose(m_own[k], m_pass[k], rtol=1e-4, atol=1e-7, err_msg=k)
  assert float(m_own["ratio_max"]) == 1.0 and float(m_own["approx_kl"]) == 0.0
  assert "rollout_logp_gap" not in m_pass
  assert float(m_own["rollout_logp_gap"]) == pytest.approx(0.01, abs=1e-4)
  with pytest.raises(ValueError, match="old_logp"):
    passed(_copy(params), sgd.init(params), on_batch, _copy(params))


def test_on_policy_gradient_is_the_plain_policy_gradient(model):
  """At ratio exactly 1 the clip cannot bind, whatever its bounds: clip 0 / 0 (bounds at 1,
  where jnp.clip and jnp.maximum tie) gives the gradient of clips 0.2 / 0.28, and both are
  the gradient of -sum(weights x advantage x logp) (SGD at lr 1: the change is it)."""
  graphdef, params = model
  sgd = optax.sgd(1.0)
  batch = _batch(graphdef, params, seed=11)
  del batch["old_logp"]
  outs = [
    make_policy_update(graphdef, sgd, cfg, 4, on_policy=True)(
      _copy(params), sgd.init(params), batch, None
    )[0]
    for cfg in (PolicyLossConfig(clip_low=0.0, clip_high=0.0), PolicyLossConfig(clip_high=0.28))
  ]
  mask, adv = jnp.asarray(batch["mask"]), jnp.asarray(batch["advantages"])

  def pg_loss(p):
    logp, _ = token_logprobs(graphdef, p, jnp.asarray(batch["tokens"]), 1.0)
    return -jnp.sum(adv[:, None] * logp * mask) / jnp.sum(mask)

  grads = jax.grad(pg_loss)(params)
  want = jax.tree.map(lambda p, g: p - g, params, grads)
  chex.assert_trees_all_close(outs[0], outs[1], rtol=1e-5, atol=1e-7)
  chex.assert_trees_all_close(outs[0], want, rtol=1e-4, atol=1e-6)


def _moves(before, after):
  """{path: parameter change} of one update."""
  return {
    path_name(path): np.asarray(b) - np.asarray(a)
    for (path, a), b in zip(
      jax.tree_util.tree_leaves_with_path(before), jax.tree.leaves(after), strict=True
    )
  }


def test_lr_multipliers_scale_each_groups_step(model):
  """Adam's first step is the same for every learning rate up to the rate itself, so with
  lr_multipliers each group moves by its multiple of the single-rate step: final_norm x30,
  embed x3, the rest x1; with trainable, frozen parameters stay put and a group's multiple
  holds among the trained ones."""
  graphdef, params = model
  batch = _batch(graphdef, params, seed=12)
  want = {"final_norm": 30.0, "embed": 3.0}
  for trainable in ("", "final_norm|embed|layers/0/mlp"):
    base = UpdateConfig(learning_rate=1e-3, total_steps=10, micro_batch=B, trainable=trainable)
    grouped = dataclasses.replace(base, lr_multipliers="final_norm=30,embed=3")
    moves = {}
    for ucfg in (base, grouped):
      opt = make_optimizer(ucfg)
      fn = make_policy_update(graphdef, opt, PolicyLossConfig(), B, trainable)
      new, _, m = fn(_copy(params), opt.init(params), batch, None)
      assert int(m["skipped"]) == 0
      moves[ucfg.lr_multipliers] = _moves(params, new)
    for path, step in moves[""].items():
      scaled = moves[grouped.lr_multipliers][path]
      if trainable and not path.startswith(("final_norm", "embed", "layers/0/mlp")):
        assert not np.any(step) and not np.any(scaled), path  # frozen stays frozen
        continue
      assert np.max(np.abs(step)) > 1e-4, path
      factor = next((v for k, v in want.items() if path.startswith(k)), 1.0)
      np.testing.assert_allclose(scaled, factor * step, rtol=2e-3, atol=1e-8, err_msg=path)


def _adam_first_moments(state):
  """Every trained leaf's Adam first moment in an optimizer state (all groups)."""
  adams = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
  return [
    np.asarray(x)
    for s in adams
    if isinstance(s, optax.ScaleByAdamState)
    for x in jax.tree.leaves(s.mu)
  ]


def test_lr_multipliers_clip_by_the_global_norm_of_the_trained_parameters(model):
  """Clipping with groups is one global norm over every trained parameter, as without:
  with a tiny grad_clip the first moments (1 - b1) x clipped gradient have norm
  (1 - b1) x grad_clip over all groups together (clipped per group it would be sqrt(3)
  times that; counting the frozen gradients, which this update computes in full, less)."""
  graphdef, params = model
  batch = _batch(graphdef, params, seed=13)
  ucfg = UpdateConfig(
    learning_rate=1e-3,
    total_steps=10,
    micro_batch=B,
    grad_clip=1e-4,
    trainable="final_norm|embed|layers/0/mlp",
    lr_multipliers="final_norm=30,embed=3",
  )
  norms = {}
  for multipliers in ("", ucfg.lr_multipliers):
    opt = make_optimizer(dataclasses.replace(ucfg, lr_multipliers=multipliers))
    fn = make_policy_update(graphdef, opt, PolicyLossConfig(), B)  # frozen gradients too
    _, state, m = fn(_copy(params), opt.init(params), batch, None)
    assert float(m["grad_norm"]) > 100 * ucfg.grad_clip
    mu = _adam_first_moments(state)
    assert len(mu) == 5  # final_norm, embed and the three MLP kernels
    norms[multipliers] = float(np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in mu)))
  assert norms[ucfg.lr_multipliers] == pytest.approx((1 - ucfg.b1) * ucfg.grad_clip, rel=1e-4)
  assert norms[""] == pytest.approx(norms[ucfg.lr_multipliers], rel=1e-4)


def test_lr_multipliers_validation(model):
  _, params = model
  bad = {
    "final_norm": "not 'regex=multiplier'",
    "=3": "not 'regex=multiplier'",
    "final_norm=0": "finite number > 0",
    "final_norm=-2": "finite number > 0",
    "final_norm=nan": "finite number > 0",
    "final_norm=x": "finite number > 0",
    "layers/(3=2": "not a regular expression",
  }
  for spec, match in bad.items():
    with pytest.raises(ValueError, match=f"lr_multipliers: .*{match}"):
      UpdateConfig(lr_multipliers=spec)
  unmatched = {
    ("no_such_layer=2", ""): "'no_such_layer' matches no trained",
    ("attn=2", "final_norm"): "'attn' matches no trained",  # only frozen ones
    ("norm=2,final_norm=3", ""): "'final_norm' matches no trained",  # taken by 'norm'
  }
  for (spec, trainable), match in unmatched.items():
    opt = make_optimizer(UpdateConfig(lr_multipliers=spec, trainable=trainable))
    with pytest.raises(ValueError, match=match):
      opt.init(params)
  # A regex may hold '=' (the multiplier follows the last one); spaces around pairs go.
  opt = make_optimizer(UpdateConfig(lr_multipliers=" final_norm=2 , (?=embed)=3"))
  assert jax.tree.leaves(opt.init(params))


def test_padding_micro_batches_change_nothing(model):
  """Rows padded to micro_batch x 2^k leave micro-batches with no counted token; the
  update skips their forward and backward (lax.cond), and the step is the unpadded one's:
  the same params (SGD: the change is the gradient) and metrics, KL and entropy included."""
  graphdef, params = model
  sgd = optax.sgd(1.0)
  batch = _batch(graphdef, params, seed=14, temperature=TEMP)
  cfg = PolicyLossConfig(temperature=TEMP, kl_coef=0.01, entropy_coef=0.001, clip_high=0.28)
  fn = make_policy_update(graphdef, sgd, cfg, 2)
  # Four padding rows: two micro-batches of nothing (zero mask, old log-probs, advantage).
  padded = {k: np.concatenate([v, np.zeros((4, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}
  (p, _, m), (p_pad, _, m_pad) = (
    fn(_copy(params), sgd.init(params), b, _copy(params)) for b in (batch, padded)
  )
  assert int(m_pad["skipped"]) == 0 and float(m["grad_norm"]) > 1e-3
  chex.assert_trees_all_close(p_pad, p, rtol=1e-6, atol=1e-7)
  for k, v in jax.device_get(m).items():
    np.testing.assert_allclose(m_pad[k], v, rtol=1e-6, atol=1e-8, err_msg=k)


def test_cpu_library_fusions_compute_the_same_update(model):
  """The update program compiled with YNNPACK for its dots only (UpdateConfig.cpu_fusions
  "dots", the default) computes the gradient XLA's default fusions do, up to float
  rounding; an unknown setting is refused."""
  graphdef, params = model
  sgd = optax.sgd(1.0)  # the change is the gradient itself
  batch = _batch(graphdef, params, seed=11)
  outs = {
    setting: make_policy_update(graphdef, sgd, PolicyLossConfig(), 4, cpu_fusions=setting)(
      _copy(params), sgd.init(params), batch, None
    )
    for setting in ("xla", "dots")
  }
  grads = {k: jax.tree.map(jnp.subtract, out[0], params) for k, out in outs.items()}
  chex.assert_trees_all_close(grads["dots"], grads["xla"], rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(outs["dots"][2]["loss"], outs["xla"][2]["loss"], rtol=1e-5)
  assert float(outs["dots"][2]["grad_norm"]) > 1e-3  # a gradient worth comparing
  with pytest.raises(ValueError, match="cpu_fusions"):
    UpdateConfig(cpu_fusions="all")

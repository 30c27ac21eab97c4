"""Policy loss: a numpy reference, clipping gradients, KL and entropy terms, and the loss
options (dual clip, k2, log-ratio clamp, GSPO, CISPO, TIS), each against its formula."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.rl import AGGREGATIONS, PolicyLossConfig, kl_penalty, policy_loss
from tlt_jax.rl.loss import sequence_mean
from tlt_jax.rl.update import OUT_OF_SET_LOGP


def _random_inputs(seed=0, b=5, t=7):
  rng = np.random.default_rng(seed)
  logp = -rng.uniform(0.1, 3.0, (b, t)).astype(np.float32)
  old = (logp + rng.normal(0, 0.3, (b, t))).astype(np.float32)  # ratios well outside [0.8, 1.2]
  ref = (logp + rng.normal(0, 0.5, (b, t))).astype(np.float32)
  adv = rng.normal(0, 1, (b,)).astype(np.float32)
  mask = (rng.uniform(size=(b, t)) < 0.7).astype(np.float32)
  mask[0] = 0.0  # an empty row
  mask[1, :] = 1.0
  ent = rng.uniform(0, 2, (b, t)).astype(np.float32)
  return logp, old, ref, adv, mask, ent


def _numpy_loss(logp, old, ref, adv, mask, ent, cfg):
  lp, old, ref, ent = (x.astype(np.float64) for x in (logp, old, ref, ent))
  ratio = np.exp(lp - old)
  a = adv.astype(np.float64)[:, None]
  tok = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high))
  if cfg.kl_type == "k1":
    kl = lp - ref
  else:
    kl = np.exp(ref - lp) - (ref - lp) - 1
  tok = tok + cfg.kl_coef * kl - cfg.entropy_coef * ent
  if cfg.aggregation == "token-mean":
    return (tok * mask).sum() / mask.sum()
  row = (tok * mask).sum(axis=1)
  if cfg.aggregation == "seq-mean-token-mean":
    row = row / np.maximum(mask.sum(axis=1), 1)
  return row.mean()


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl_type", ["k1", "k3"])
def test_matches_numpy_reference(aggregation, kl_type):
  logp, old, ref, adv, mask, ent = _random_inputs()
  cfg = PolicyLossConfig(
    clip_low=0.2,
    clip_high=0.28,
    aggregation=aggregation,
    kl_coef=0.1,
    kl_type=kl_type,
    entropy_coef=0.01,
  )
  loss, metrics = policy_loss(logp, old, adv, mask, cfg, ref_logp=ref, entropy=ent)
  want = _numpy_loss(logp, old, ref, adv, mask, ent, cfg)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)

  on = mask > 0
  ratio = np.exp(logp.astype(np.float64) - old)
  a = np.broadcast_to(adv[:, None], ratio.shape)
  np.testing.assert_allclose(metrics["ratio_mean"], ratio[on].mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics["ratio_max"], ratio[on].max(), rtol=1e-5)
  np.testing.assert_allclose(metrics["clip_fraction_low"], ((ratio < 0.8) & (a < 0))[on].mean())
  np.testing.assert_allclose(metrics["clip_fraction_high"], ((ratio > 1.28) & (a > 0))[on].mean())
  assert 0 < metrics["clip_fraction_low"] + metrics["clip_fraction_high"] < 1
  d = np.log(ratio)
  np.testing.assert_allclose(metrics["approx_kl"], (np.exp(d) - 1 - d)[on].mean(), rtol=1e-4)
  np.testing.assert_allclose(metrics["entropy"], ent[on].mean(), rtol=1e-5)


def test_aggregations_differ():
  logp, old, _, adv, mask, _ = _random_inputs(1)
  losses = [
    float(policy_loss(logp, old, adv, mask, PolicyLossConfig(aggregation=a))[0])
    for a in AGGREGATIONS
  ]
  assert len({round(x, 6) for x in losses}) == 3


def test_garbage_off_the_mask_is_ignored():
  logp, old, _, adv, mask, _ = _random_inputs(2)
  cfg = PolicyLossConfig()
  dirty = np.where(mask > 0, old, np.float32(-np.inf))
  dirty_logp = np.where(mask > 0, logp, np.float32(np.nan))
  grad = lambda lp, o: jax.grad(lambda x: policy_loss(x, o, adv, mask, cfg)[0])(lp)
  np.testing.assert_allclose(
    policy_loss(dirty_logp, dirty, adv, mask, cfg)[0], policy_loss(logp, old, adv, mask, cfg)[0]
  )
  g = grad(jnp.asarray(dirty_logp), dirty)
  assert np.all(np.isfinite(g))
  np.testing.assert_allclose(g, grad(jnp.asarray(logp), old), rtol=1e-6)


def _clip_case(cfg):
  """One row per case: (log-ratio, advantage)."""
  cases = {
    "high_pos": (np.log(1.25), 1.0),  # above 1 + clip_high only when clip_high < 0.25
    "far_high_pos": (np.log(1.5), 1.0),  # clipped: no gradient
    "far_high_neg": (np.log(1.5), -1.0),  # pessimistic branch is unclipped: gradient
    "far_low_neg": (np.log(0.5), -1.0),  # clipped: no gradient
    "far_low_pos": (np.log(0.5), 1.0),  # unclipped: gradient
    "low_neg": (np.log(0.75), -1.0),  # below 1 - clip_low (0.8): no gradient
    "inside": (0.0, 1.0),
  }
  names = list(cases)
  log_ratio = np.array([[cases[n][0], 0.0] for n in names], np.float32)
  adv = np.array([cases[n][1] for n in names], np.float32)
  mask = np.array([[1.0, 0.0]] * len(names), np.float32)
  old = np.full_like(log_ratio, -1.0)
  logp = jnp.asarray(old + log_ratio)
  g = jax.grad(lambda x: policy_loss(x, old, adv, mask, cfg)[0])(logp)
  _, metrics = policy_loss(logp, old, adv, mask, cfg)
  assert np.all(np.asarray(g)[:, 1] == 0.0)  # masked-out tokens
  return {n: float(g[i, 0]) for i, n in enumerate(names)}, metrics


def test_clipped_tokens_get_zero_gradient():
  g, m = _clip_case(PolicyLossConfig(clip_low=0.2, clip_high=0.2))
  for name in ("high_pos", "far_high_pos", "far_low_neg", "low_neg"):
    assert g[name] == 0.0, name
  for name in ("far_high_neg", "far_low_pos", "inside"):
    assert g[name] != 0.0, name
  # Gradient of the surrogate -A * ratio / n_tokens w.r.t. logp is -A * ratio / n.
  np.testing.assert_allclose(g["inside"], -1.0 / 7, rtol=1e-6)
  np.testing.assert_allclose(g["far_high_neg"], 1.5 / 7, rtol=1e-5)
  np.testing.assert_allclose(m["clip_fraction_high"], 2 / 7, rtol=1e-6)
  np.testing.assert_allclose(m["clip_fraction_low"], 2 / 7, rtol=1e-6)


def test_clip_higher_is_asymmetric():
  g, m = _clip_case(PolicyLossConfig(clip_low=0.2, clip_high=0.28))
  assert g["high_pos"] != 0.0  # 1.25 < 1.28: still learning upwards
  assert g["low_neg"] == 0.0  # 0.75 < 0.8: the low side is unchanged
  assert g["far_high_pos"] == 0.0
  np.testing.assert_allclose(m["clip_fraction_high"], 1 / 7, rtol=1e-6)
  np.testing.assert_allclose(m["clip_fraction_low"], 2 / 7, rtol=1e-6)


def test_kl_estimators():
  rng = np.random.default_rng(3)
  logp = jnp.asarray(-rng.uniform(0, 4, (64,)))
  ref = jnp.asarray(-rng.uniform(0, 4, (64,)))
  k3 = kl_penalty(logp, ref, "k3")
  assert np.all(np.asarray(k3) >= 0) and np.any(np.asarray(k3) > 0.1)
  np.testing.assert_array_equal(kl_penalty(logp, logp, "k3"), 0.0)
  k1 = np.asarray(kl_penalty(logp, ref, "k1"))
  np.testing.assert_array_equal(np.sign(k1), np.sign(np.asarray(logp - ref)))


def test_kl_penalty_in_loss_and_metric():
  logp, old, ref, adv, mask, _ = _random_inputs(4)
  base = PolicyLossConfig()
  with_kl = dataclasses.replace(base, kl_coef=0.5, kl_type="k1")
  loss0, _ = policy_loss(logp, old, adv, mask, base)
  loss1, m1 = policy_loss(logp, old, adv, mask, with_kl, ref_logp=ref)
  kl = ((logp - ref) * mask).sum() / mask.sum()
  np.testing.assert_allclose(m1["kl"], kl, rtol=1e-5)
  np.testing.assert_allclose(loss1 - loss0, 0.5 * kl, rtol=1e-4, atol=1e-6)
  _, m_same = policy_loss(logp, old, adv, mask, base, ref_logp=logp)
  assert float(m_same["kl"]) == 0.0
  with pytest.raises(ValueError, match="ref_logp"):
    policy_loss(logp, old, adv, mask, with_kl)


def test_entropy_bonus_lowers_loss():
  logp, old, _, adv, mask, ent = _random_inputs(5)
  cfg = PolicyLossConfig(entropy_coef=0.1)
  loss0, m0 = policy_loss(logp, old, adv, mask, PolicyLossConfig(), entropy=ent)
  loss1, _ = policy_loss(logp, old, adv, mask, cfg, entropy=ent)
  assert float(loss1) < float(loss0)
  np.testing.assert_allclose(loss0 - loss1, 0.1 * m0["entropy"], rtol=1e-5)
  # The bonus pushes entropy up: d loss / d entropy = -coef / n on counted tokens.
  g = jax.grad(lambda e: policy_loss(logp, old, adv, mask, cfg, entropy=e)[0])(jnp.asarray(ent))
  np.testing.assert_allclose(np.asarray(g)[mask > 0], -0.1 / mask.sum(), rtol=1e-5)
  with pytest.raises(ValueError, match="entropy"):
    policy_loss(logp, old, adv, mask, cfg)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(aggregation="sum"), "token-mean"),
    (dict(kl_type="k4"), "k1"),
    (dict(kind="grpo"), "kind"),
    (dict(ratio_level="seq"), "ratio_level"),
    (dict(kind="cispo", ratio_level="sequence"), "GSPO"),
    (dict(clip_ratio_c=1.0), "clip_ratio_c"),
    (dict(clip_ratio_c=-3.0), "clip_ratio_c"),
    (dict(clip_ratio_c=3.0, kind="cispo"), "kind='ppo'"),
    (dict(log_ratio_clamp=-1.0), "log_ratio_clamp"),
    (dict(tis_cap=0.5), "tis_cap"),
    (dict(tis_cap=float("inf")), "tis_cap"),
    (dict(clip_low=1.0), "clip_low"),
    (dict(clip_high=-0.1), "clip_high"),
    (dict(kl_coef=-1.0), "kl_coef"),
    (dict(entropy_coef=float("nan")), "entropy_coef"),
    (dict(temperature=0.0), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.0), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
  ],
)
def test_config_rejects_bad_values(kwargs, match):
  with pytest.raises(ValueError, match=match):
    PolicyLossConfig(**kwargs)


def test_bad_aggregation_error_lists_valid_names():
  with pytest.raises(ValueError) as e:
    PolicyLossConfig(aggregation="token_mean")
  for name in AGGREGATIONS:
    assert name in str(e.value)


def test_sampling_is_the_rollout_distribution():
  cfg = PolicyLossConfig(temperature=0.7, top_k=20, top_p=0.9)
  assert cfg.sampling == SamplingConfig(temperature=0.7, top_k=20, top_p=0.9)
  assert PolicyLossConfig().sampling == SamplingConfig(temperature=1.0)


def test_tokens_outside_the_kept_set_keep_everything_finite():
  """Truncated sampling: a token leaving the kept set (new log-prob OUT_OF_SET_LOGP) or
  entering it (old log-prob OUT_OF_SET_LOGP), each with either advantage sign, under the
  clip, a k3 KL to an untruncated reference and an entropy bonus: finite loss, gradient
  and metrics. The unclamped value (about -1e30) overflows them."""
  cfg = PolicyLossConfig(kl_coef=0.1, entropy_coef=0.01)
  adv = np.array([1.0, -1.0, 1.0, -1.0], np.float32)
  mask = np.ones((4, 2), np.float32)
  ent = np.full((4, 2), 0.5, np.float32)

  def run(floor):
    logp = np.array([[floor, -1.0]] * 2 + [[-0.5, -1.0]] * 2, np.float32)
    old = np.array([[-1.0, -1.0]] * 2 + [[floor, -1.0]] * 2, np.float32)
    ref = np.full((4, 2), -1.5, np.float32)
    f = lambda x: policy_loss(x, old, adv, mask, cfg, ref_logp=ref, entropy=ent)
    (loss, metrics), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp))
    return jax.device_get((loss, metrics, g))

  loss, metrics, g = run(OUT_OF_SET_LOGP)
  assert np.isfinite(loss) and np.all(np.isfinite(g))
  assert all(np.isfinite(v) for v in metrics.values()), metrics
  assert metrics["ratio_max"] > 1e10 and metrics["clip_fraction_low"] > 0
  loss, metrics, g = run(-1e30)
  assert not (np.isfinite(loss) and np.all(np.isfinite(g)))


# ------------------------------------------------------------------ loss options, by formula


def _options_inputs(seed=7, b=6, t=9):
  """Log-probs and old log-probs that differ (ratios from about 0.3 to 3), advantages of
  both signs, ragged masks, rollout log-probs off the trainer's."""
  rng = np.random.default_rng(seed)
  logp = -rng.uniform(0.1, 3.0, (b, t))
  old = logp + rng.normal(0, 0.5, (b, t))
  rollout = old + rng.normal(0, 0.4, (b, t))
  adv = rng.normal(0, 1, (b,))
  adv[:2] = [1.3, -1.1]
  mask = (rng.uniform(size=(b, t)) < 0.75).astype(np.float64)
  mask[:, 1] = 1.0  # every row counts at least one token
  f32 = lambda x: np.asarray(x, np.float32)
  return f32(logp), f32(old), f32(rollout), f32(adv), f32(mask)


def _token_mean(tok, mask):
  return (tok * mask).sum() / mask.sum()


def _loss_and_grad(cfg, logp, old, adv, mask, **kw):
  f = lambda x: policy_loss(x, old, adv, mask, cfg, **kw)
  (loss, metrics), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp))
  return float(loss), jax.device_get(metrics), np.asarray(g)


def test_k2_is_half_the_squared_log_ratio():
  logp, old, ref, adv, mask = _options_inputs()
  np.testing.assert_allclose(kl_penalty(logp, ref, "k2"), 0.5 * (logp - ref) ** 2, rtol=1e-6)
  base = PolicyLossConfig()
  loss0, _, _ = _loss_and_grad(base, logp, old, adv, mask)
  cfg = dataclasses.replace(base, kl_coef=0.3, kl_type="k2")
  loss, m, g = _loss_and_grad(cfg, logp, old, adv, mask, ref_logp=ref)
  k2 = _token_mean(0.5 * (logp.astype(np.float64) - ref) ** 2, mask)
  np.testing.assert_allclose(m["kl"], k2, rtol=1e-5)
  np.testing.assert_allclose(loss - loss0, 0.3 * k2, rtol=1e-4)
  # Its gradient is 0.3 (logp - ref) / n per token on top of the surrogate's.
  _, _, g0 = _loss_and_grad(base, logp, old, adv, mask)
  np.testing.assert_allclose(g - g0, 0.3 * (logp - ref) * mask / mask.sum(), atol=1e-6)


def test_dual_clip_bounds_negative_advantages_at_c_times_abs_a():
  logp, old, _, adv, mask = _options_inputs()
  c = 1.5
  cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28, clip_ratio_c=c)
  loss, m, g = _loss_and_grad(cfg, logp, old, adv, mask)
  r = np.exp(logp.astype(np.float64) - old)
  a = np.broadcast_to(adv[:, None], r.shape).astype(np.float64)
  ppo = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.28))
  want = np.where(a < 0, np.minimum(ppo, c * np.abs(a)), ppo)
  np.testing.assert_allclose(loss, _token_mean(want, mask), rtol=1e-5)
  bound = (a < 0) & (r > c) & (mask > 0)
  assert bound.sum() >= 2  # the case is exercised
  np.testing.assert_allclose(m["clip_fraction_dual"], bound.sum() / mask.sum(), rtol=1e-6)
  assert np.all(g[bound] == 0.0)  # capped tokens: a constant c |A|
  # Everything else has PPO's gradient: the dual clip changes nothing below r = c.
  _, _, g_ppo = _loss_and_grad(PolicyLossConfig(clip_high=0.28), logp, old, adv, mask)
  np.testing.assert_allclose(g[~bound], g_ppo[~bound], rtol=1e-6)
  assert np.any(g_ppo[bound] != 0.0)


def test_log_ratio_clamp_clamps_before_exp():
  logp, old, _, adv, mask = _options_inputs()
  cfg = PolicyLossConfig(log_ratio_clamp=0.3)
  loss, m, g = _loss_and_grad(cfg, logp, old, adv, mask)
  lr = np.clip(logp.astype(np.float64) - old, -0.3, 0.3)
  r = np.exp(lr)
  a = adv[:, None].astype(np.float64)
  want = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.2))
  np.testing.assert_allclose(loss, _token_mean(want, mask), rtol=1e-5)
  np.testing.assert_allclose(m["ratio_max"], r[mask > 0].max(), rtol=1e-5)
  outside = (np.abs(logp - old) > 0.3) & (mask > 0)
  assert outside.sum() >= 2 and np.all(g[outside] == 0.0)
  # A bound wider than every log-ratio changes nothing.
  wide = _loss_and_grad(PolicyLossConfig(log_ratio_clamp=20.0), logp, old, adv, mask)
  np.testing.assert_allclose(wide[0], _loss_and_grad(PolicyLossConfig(), logp, old, adv, mask)[0])


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_sequence_level_ratio_is_gspo(aggregation):
  """GSPO: s_i = exp(mean_t log r_t) over sample i's counted tokens, clipped per sample;
  the loss aggregates max(-A s, -A clip(s)) over the tokens, and its gradient with respect
  to a token's log-prob is -A s_i times that token's aggregation weight (0 when the clip
  binds)."""
  logp, old, _, adv, mask = _options_inputs(seed=8)
  cfg = PolicyLossConfig(
    clip_low=0.2, clip_high=0.28, ratio_level="sequence", aggregation=aggregation
  )
  loss, m, g = _loss_and_grad(cfg, logp, old, adv, mask)
  d = (logp.astype(np.float64) - old) * mask
  s = np.exp(d.sum(1) / mask.sum(1))
  a = adv.astype(np.float64)
  per_seq = np.maximum(-a * s, -a * np.clip(s, 0.8, 1.28))
  tok = np.broadcast_to(per_seq[:, None], mask.shape)
  weights = {
    "token-mean": mask / mask.sum(),
    "seq-mean-token-mean": mask / (mask.sum(1, keepdims=True) * len(a)),
    "seq-mean-token-sum": mask / len(a),
  }[aggregation]
  np.testing.assert_allclose(loss, (tok * weights).sum(), rtol=1e-5)
  clipped = ((s > 1.28) & (a > 0)) | ((s < 0.8) & (a < 0))
  assert clipped.any() and not clipped.all()
  want_g = np.where(clipped[:, None], 0.0, -a[:, None] * s[:, None]) * weights
  np.testing.assert_allclose(g, want_g, rtol=1e-5, atol=1e-8)
  on = mask > 0
  np.testing.assert_allclose(m["ratio_max"], s.max(), rtol=1e-5)
  np.testing.assert_allclose(m["ratio_mean"], np.broadcast_to(s[:, None], on.shape)[on].mean())


def test_sequence_means_follow_packed_segments():
  """Packed rows (several samples a row, rl/packing.py): each token's sample mean is over
  its own segment only, as the same samples one a row."""
  rng = np.random.default_rng(9)
  x = rng.normal(size=(2, 8)).astype(np.float32)
  mask = np.array([[0, 1, 1, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0, 0]], np.float32)
  seg = np.array([[1, 1, 1, 2, 2, 2, 2, 0], [3, 3, 3, 3, 0, 0, 0, 0]], np.int32)
  got = np.asarray(sequence_mean(jnp.asarray(x), jnp.asarray(mask), jnp.asarray(seg)))
  np.testing.assert_allclose(got[0, :3], x[0, 1:3].mean(), rtol=1e-6)
  np.testing.assert_allclose(got[0, 3:7], x[0, 4:7].mean(), rtol=1e-6)
  np.testing.assert_allclose(got[1, :4], x[1, 1:4].mean(), rtol=1e-6)
  assert got[0, 7] == 0.0 and np.all(got[1, 4:] == 0.0)  # padding: no counted token
  unpacked = np.asarray(sequence_mean(jnp.asarray(x), jnp.asarray(mask)))
  np.testing.assert_allclose(unpacked[1], x[1, 1:4].mean(), rtol=1e-6)


def test_cispo_weighs_every_token_by_its_clipped_ratio():
  """CISPO: -sg(clip(r)) A log p: the gradient is -clip(r) A / n on every counted token,
  clipped ones included (PPO gives those 0)."""
  logp, old, _, adv, mask = _options_inputs()
  cfg = PolicyLossConfig(kind="cispo", clip_low=0.2, clip_high=0.28)
  loss, m, g = _loss_and_grad(cfg, logp, old, adv, mask)
  r = np.exp(logp.astype(np.float64) - old)
  w = np.clip(r, 0.8, 1.28)
  a = adv[:, None].astype(np.float64)
  np.testing.assert_allclose(loss, _token_mean(-a * w * logp, mask), rtol=1e-5)
  np.testing.assert_allclose(g, -a * w * mask / mask.sum(), rtol=1e-5, atol=1e-8)
  on = mask > 0
  np.testing.assert_allclose(m["clip_fraction_high"], (r > 1.28)[on].mean(), rtol=1e-6)
  np.testing.assert_allclose(m["clip_fraction_low"], (r < 0.8)[on].mean(), rtol=1e-6)
  _, _, g_ppo = _loss_and_grad(PolicyLossConfig(clip_high=0.28), logp, old, adv, mask)
  ppo_clipped = on & (g_ppo == 0.0)
  assert ppo_clipped.sum() >= 2 and np.all(g[ppo_clipped] != 0.0)


@pytest.mark.parametrize("kind", ["ppo", "cispo"])
def test_tis_weights_tokens_by_the_capped_trainer_rollout_ratio(kind):
  """TIS: every token's surrogate times min(exp(old_logp - rollout_logp), C), a constant;
  the KL term is not weighted."""
  logp, old, rollout, adv, mask = _options_inputs(seed=10)
  ref = (logp - 0.2).astype(np.float32)
  base = PolicyLossConfig(kind=kind, clip_high=0.28, kl_coef=0.1, kl_type="k1")
  cfg = dataclasses.replace(base, tis_cap=1.5)
  loss, m, g = _loss_and_grad(cfg, logp, old, adv, mask, ref_logp=ref, rollout_logp=rollout)
  w = np.minimum(np.exp(old.astype(np.float64) - rollout), 1.5)
  r = np.exp(logp.astype(np.float64) - old)
  a = adv[:, None].astype(np.float64)
  if kind == "ppo":
    surrogate = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.28))
  else:
    surrogate = -a * np.clip(r, 0.8, 1.28) * logp
  want = _token_mean(surrogate * w + 0.1 * (logp - ref), mask)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  on = mask > 0
  capped = (w == 1.5) & on
  assert capped.any() and (on & (w < 1.0)).any()
  np.testing.assert_allclose(m["tis_weight_mean"], w[on].mean(), rtol=1e-5)
  np.testing.assert_allclose(m["tis_capped_fraction"], capped.sum() / on.sum(), rtol=1e-6)
  # The surrogate's gradient is scaled token by token; the KL's is not.
  _, _, g0 = _loss_and_grad(base, logp, old, adv, mask, ref_logp=ref)
  kl_g = 0.1 * mask / mask.sum()
  np.testing.assert_allclose(g - kl_g, (g0 - kl_g) * w, rtol=1e-4, atol=1e-7)
  with pytest.raises(ValueError, match="rollout_logp"):
    policy_loss(logp, old, adv, mask, cfg, ref_logp=ref)


def test_option_defaults_keep_the_plain_loss():
  """Every option at its default is the loss as it was: PPO, token ratios, no dual clip,
  no clamp, no TIS (bit for bit, rollout log-probs given or not)."""
  logp, old, rollout, adv, mask = _options_inputs()
  cfg = PolicyLossConfig()
  assert (cfg.kind, cfg.ratio_level, cfg.clip_ratio_c, cfg.log_ratio_clamp, cfg.tis_cap) == (
    "ppo",
    "token",
    0.0,
    0.0,
    0.0,
  )
  a = _loss_and_grad(cfg, logp, old, adv, mask)
  b = _loss_and_grad(cfg, logp, old, adv, mask, rollout_logp=rollout)
  assert a[0] == b[0] and np.array_equal(a[2], b[2]) and set(a[1]) == set(b[1])
  assert "clip_fraction_dual" not in a[1] and "tis_weight_mean" not in a[1]

"""Clipped policy loss: a numpy reference, clipping gradients, KL and entropy terms."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.rl import AGGREGATIONS, PolicyLossConfig, kl_penalty, policy_loss
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
    (dict(kl_type="k2"), "k1"),
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

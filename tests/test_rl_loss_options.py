"""The loss options through the jitted update and the trainer, off ratio 1: a second PPO
mini-batch (the policy moved since its samples were drawn, old log-probs perturbed too) on
packed rows, each option's update against its formula written here; TIS on the one-step
on-policy path; the trainer with two mini-batches and the options on."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from rl_helpers import IdTokenizer, seven_reward, tiny_grpo
from tiny_models import ONE_PROGRAM_ENGINE, TINY_ONE_LAYER

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.rl import PolicyLossConfig, UpdateConfig, make_policy_update, token_logprobs
from tlt_jax.rl.packing import pack_policy_batch
from tlt_jax.rl.trainer import GRPOTrainer
from tlt_jax.rollout.engine import RolloutEngine

MODEL = TINY_ONE_LAYER
N, T, WIDTH = 8, 24, 48  # samples of up to T tokens, packed two or more to a row of WIDTH
sg = jax.lax.stop_gradient


@pytest.fixture(scope="module")
def model():
  return nnx.split(init_model(MODEL, seed=3))


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def _samples(graphdef, params, seed):
  """N samples: a 2-4 token prompt then a response; old log-probs of `params` (the
  sampling policy) off by noise, the engine's off again, advantages of both signs."""
  rng = np.random.default_rng(seed)
  length = rng.integers(8, T + 1, N).astype(np.int32)
  tokens = rng.integers(1, MODEL.vocab_size, (N, T)).astype(np.int32)
  mask = np.zeros((N, T), np.float32)
  for n in range(N):
    mask[n, int(rng.integers(2, 5)) : length[n]] = 1.0
  tokens = np.where(np.arange(T)[None] < length[:, None], tokens, 0)
  logp = np.asarray(token_logprobs(graphdef, params, jnp.asarray(tokens), 1.0)[0])
  old = ((logp + rng.normal(0, 0.3, (N, T))) * mask).astype(np.float32)
  rollout = ((old + rng.normal(0, 0.3, (N, T))) * mask).astype(np.float32)
  adv = rng.normal(0, 1, N).astype(np.float32)
  return dict(tokens=tokens, length=length, mask=mask, old=old, rollout=rollout, adv=adv)


# Each option, with the clips the formula below assumes.
OPTIONS = {
  "dual_clip": dict(clip_ratio_c=1.2),
  "k2": dict(kl_coef=0.1, kl_type="k2"),
  "clamp": dict(log_ratio_clamp=0.15),
  "gspo": dict(ratio_level="sequence", clip_low=0.03, clip_high=0.04),
  "gspo_seq_mean": dict(
    ratio_level="sequence", clip_low=0.03, clip_high=0.04, aggregation="seq-mean-token-mean"
  ),
  "cispo": dict(kind="cispo"),
  "tis": dict(tis_cap=1.3),
}


def _formula(option, cfg, logp, s, ref_logp):
  """The option's loss on unpacked rows, as the papers write it."""
  a, m, old = jnp.asarray(s["adv"])[:, None], jnp.asarray(s["mask"]), jnp.asarray(s["old"])
  lo, hi = 1 - cfg.clip_low, 1 + cfg.clip_high
  log_r = logp - old
  if option == "clamp":
    log_r = jnp.clip(log_r, -0.15, 0.15)
  if option.startswith("gspo"):
    # s_i = exp(mean_t log r_t), differentiated as s_i * grad log p_t per token.
    seq = jnp.sum(sg(log_r) * m, 1, keepdims=True) / jnp.sum(m, 1, keepdims=True)
    r = jnp.exp(seq) * jnp.exp(logp - sg(logp))
  else:
    r = jnp.exp(log_r)
  if option == "cispo":
    tok = -a * sg(jnp.clip(r, lo, hi)) * logp
  else:
    tok = jnp.maximum(-a * r, -a * jnp.clip(r, lo, hi))
  if option == "dual_clip":
    tok = jnp.where(a < 0, jnp.minimum(tok, -a * 1.2), tok)
  if option == "tis":
    tok = tok * jnp.minimum(jnp.exp(old - jnp.asarray(s["rollout"])), 1.3)
  if option == "k2":
    tok = tok + 0.1 * 0.5 * (logp - ref_logp) ** 2
  if cfg.aggregation == "seq-mean-token-mean":
    return jnp.mean(jnp.sum(tok * m, 1) / jnp.sum(m, 1))
  return jnp.sum(tok * m) / jnp.sum(m)


def _packed(s, aggregation, with_rollout):
  batch, _ = pack_policy_batch(
    s["tokens"],
    s["length"],
    s["mask"],
    s["old"],
    s["adv"],
    aggregation,
    WIDTH,
    row_multiple=2,
    rollout_logp=s["rollout"] if with_rollout else None,
  )
  assert batch["tokens"].shape[0] < N  # several samples share a row: segments matter
  return batch


@pytest.mark.parametrize("option", list(OPTIONS))
def test_second_mini_batch_update_matches_the_formula(model, option):
  """Mini-batch 1 moves the policy; mini-batch 2 is then updated against the old
  log-probs of the policy that sampled it (ratios away from 1): with SGD at lr 1 the
  params move by minus the gradient of the option's formula (on unpacked rows) at the
  moved params, while the update runs on packed rows in micro-batches."""
  graphdef, params0 = model
  cfg = PolicyLossConfig(**{"clip_low": 0.2, "clip_high": 0.28, **OPTIONS[option]})
  sgd = optax.sgd(1.0)
  update = make_policy_update(graphdef, sgd, cfg, 2)
  first, second = _samples(graphdef, params0, 1), _samples(graphdef, params0, 2)
  ref = _copy(params0) if cfg.kl_coef else None
  batch1 = _packed(first, cfg.aggregation, True)
  params1, _, m1 = update(_copy(params0), sgd.init(params0), batch1, ref)
  assert int(m1["skipped"]) == 0
  params1_host = jax.device_get(params1)
  batch2 = _packed(second, cfg.aggregation, True)
  params2, _, m2 = update(params1, sgd.init(params0), batch2, _copy(params0) if ref else None)
  m2 = jax.device_get(m2)
  assert int(m2["skipped"]) == 0

  tokens = jnp.asarray(second["tokens"])
  ref_logp = token_logprobs(graphdef, params0, tokens, 1.0)[0] if ref else None

  def loss(p):
    logp = token_logprobs(graphdef, p, tokens, 1.0)[0]
    return _formula(option, cfg, logp, second, ref_logp), logp

  (value, logp), grads = jax.value_and_grad(loss, has_aux=True)(params1_host)
  want = jax.tree.map(lambda p, g: p - g, params1_host, grads)
  np.testing.assert_allclose(float(m2["loss"]), float(value), rtol=2e-4, atol=1e-6)
  chex.assert_trees_all_close(params2, want, rtol=2e-4, atol=2e-6)
  # The option binds on this batch (else the test could not tell it from plain PPO).
  on = second["mask"] > 0
  log_r = np.asarray(logp) - second["old"]
  neg = (second["adv"] < 0)[:, None]
  binds = {
    "dual_clip": lambda: np.any(on & neg & (np.exp(log_r) > 1.2)) and m2["clip_fraction_dual"] > 0,
    "k2": lambda: m2["kl"] > 1e-6,
    "clamp": lambda: np.any(on & (np.abs(log_r) > 0.15)),
    "cispo": lambda: np.any(on & ((np.exp(log_r) < 0.8) | (np.exp(log_r) > 1.28))),
    "tis": lambda: 0 < m2["tis_capped_fraction"] < 1,
  }.get(option, lambda: 0 < m2["clip_fraction_low"] + m2["clip_fraction_high"] < 1)
  assert binds()


def test_tis_on_the_on_policy_path(model):
  """One optimizer step per batch (no old-log-prob pass): the TIS weight compares the
  update forward's own log-probs with the engine's, min(exp(logp - rollout_logp), C), and
  the gradient is that of -sum(w A log p) / n; without the engine's log-probs in the batch
  the update refuses."""
  graphdef, params = model
  cfg = PolicyLossConfig(tis_cap=1.3)
  sgd = optax.sgd(1.0)
  update = make_policy_update(graphdef, sgd, cfg, 2, on_policy=True)
  s = _samples(graphdef, params, 4)
  batch = {k: v for k, v in _packed(s, cfg.aggregation, True).items() if k != "old_logp"}
  got, _, m = update(_copy(params), sgd.init(params), batch, None)
  m = jax.device_get(m)
  tokens = jnp.asarray(s["tokens"])
  a, mask = jnp.asarray(s["adv"])[:, None], jnp.asarray(s["mask"])
  own = token_logprobs(graphdef, params, tokens, 1.0)[0]
  w = jnp.minimum(jnp.exp(own - jnp.asarray(s["rollout"])), 1.3)

  def loss(p):
    logp = token_logprobs(graphdef, p, tokens, 1.0)[0]
    return -jnp.sum(w * a * logp * mask) / jnp.sum(mask)

  grads = jax.grad(loss)(params)
  chex.assert_trees_all_close(
    got, jax.tree.map(lambda p, g: p - g, params, grads), rtol=2e-4, atol=2e-6
  )
  on = s["mask"] > 0
  np.testing.assert_allclose(m["tis_weight_mean"], np.asarray(w)[on].mean(), rtol=1e-4)
  assert m["ratio_max"] == 1.0
  del batch["rollout_logp"]
  with pytest.raises(ValueError, match="rollout_logp"):
    update(_copy(params), sgd.init(params), batch, None)


ENGINE = ONE_PROGRAM_ENGINE


@pytest.mark.parametrize(
  "loss",
  [
    PolicyLossConfig(ratio_level="sequence", clip_ratio_c=3.0, tis_cap=2.0, clip_high=0.28),
    PolicyLossConfig(kind="cispo", log_ratio_clamp=5.0, kl_coef=0.05, kl_type="k2"),
  ],
  ids=["gspo_dual_tis", "cispo_clamp_k2"],
)
def test_trainer_with_two_mini_batches(tmp_path, loss):
  """The trainer with two mini-batches (the second off ratio 1) and the options on: the
  engine's log-probs reach the update on the old-log-prob pass path (TIS), the dual clip's
  fraction is averaged over the optimizer steps, and the group std takes Bessel's
  correction: a finite update of every mini-batch."""
  graphdef, params = nnx.split(init_model(MODEL, seed=0))
  engine = RolloutEngine(graphdef, MODEL, ENGINE, SamplingConfig(temperature=1.0))
  cfg = dataclasses.replace(tiny_grpo(1, 4), std_ddof=1)
  update = UpdateConfig(learning_rate=0.1, total_steps=4, micro_batch=2, mini_batches=2)
  prompts = [
    {"question": " ".join(map(str, range(1 + i % 5, 4 + i % 5))), "answer": ""} for i in range(8)
  ]
  trainer = GRPOTrainer(
    graphdef, params, engine, IdTokenizer(), prompts, prompts[:2], seven_reward,
    lambda ex: ex["question"], cfg, loss, update, str(tmp_path),
  )  # fmt: skip
  assert not trainer.skip_old_logp
  (row,) = trainer.run(progress=False)
  assert row["loss/optimizer_steps"] == 2 and row["loss/skipped"] == 0
  assert np.isfinite(row["loss/loss"]) and row["loss/ratio_max"] != 1.0
  if loss.tis_cap:
    # The engine and the trainer agree in float32: weights of 1, none capped.
    assert row["loss/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert row["loss/tis_capped_fraction"] == 0.0
    assert 0.0 <= row["loss/clip_fraction_dual"] <= 1.0
  else:
    assert row["loss/kl"] == pytest.approx(0.0, abs=1e-9)  # mini-batch 1: the reference


def test_trainer_one_step_per_batch_with_tis_and_gspo(tmp_path):
  """One optimizer step per batch (no old-log-prob pass): the engine's log-probs are in the
  update's batch, so TIS weighs against the update forward's own log-probs."""
  graphdef, params = nnx.split(init_model(MODEL, seed=0))
  engine = RolloutEngine(graphdef, MODEL, ENGINE, SamplingConfig(temperature=1.0))
  loss = PolicyLossConfig(ratio_level="sequence", clip_low=3e-4, clip_high=4e-4, tis_cap=2.0)
  update = UpdateConfig(learning_rate=0.1, total_steps=4, micro_batch=2)
  prompts = [{"question": f"{i} {i + 1}", "answer": ""} for i in range(1, 9)]
  trainer = GRPOTrainer(
    graphdef, params, engine, IdTokenizer(), prompts, prompts[:2], seven_reward,
    lambda ex: ex["question"], tiny_grpo(1, 4), loss, update, str(tmp_path),
  )  # fmt: skip
  assert trainer.skip_old_logp
  (row,) = trainer.run(progress=False)
  assert row["loss/skipped"] == 0 and row["loss/ratio_max"] == 1.0
  assert row["loss/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)

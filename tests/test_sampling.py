"""Samplers draw from exactly the intended distribution (statistical tests)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tlt_jax.decode.sampling import SamplingConfig, sample_tokens, sampling_logits

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], np.float32)


def _reference_probs(logits, temperature, top_k, top_p):
  """The target distribution written independently of the implementation."""
  z = logits / temperature
  order = np.argsort(-z, kind="stable")
  keep = np.zeros_like(z, bool)
  if top_k:
    keep[order[:top_k]] = True
  else:
    keep[:] = True
  p = np.exp(z - z.max()) * keep
  p /= p.sum()
  if top_p < 1.0:
    kept = np.zeros_like(keep)
    mass = 0.0
    for i in order:
      if mass < top_p and keep[i]:
        kept[i] = True
        mass += p[i]
    p = p * kept
    p /= p.sum()
  return p


def _chi2_critical(dof, z=4.0):
  # Wilson-Hilferty: the chi-square quantile at a normal z-score (~3e-5 tail for z=4).
  return dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3


@pytest.mark.parametrize(
  "temperature,top_k,top_p",
  [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8), (1.3, 5, 0.9)],
)
def test_sampler_matches_target_distribution(temperature, top_k, top_p):
  n = 100_000
  cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
  logits = jnp.broadcast_to(jnp.asarray(LOGITS), (n, LOGITS.size))
  draw = jax.jit(lambda x, s: sample_tokens(x, cfg, jax.random.key(7), s, jnp.zeros_like(s)))
  tokens, logp = draw(logits, jnp.arange(n, dtype=jnp.int32))
  counts = np.bincount(np.asarray(tokens), minlength=LOGITS.size)
  expected = _reference_probs(LOGITS, temperature, top_k, top_p)
  assert np.all(counts[expected == 0] == 0), "sampled a truncated token"
  support = expected > 0
  e = expected[support] * n
  chi2 = float(((counts[support] - e) ** 2 / e).sum())
  assert chi2 < _chi2_critical(support.sum() - 1), (chi2, counts, expected)
  tv = 0.5 * np.abs(counts / n - expected).sum()
  assert tv < 0.01
  # The recorded log-prob is that of the distribution sampled from (tempered AND truncated):
  # an on-policy trainer's ratio refers to the policy that generated the data.
  ref_lp = np.log(expected[np.asarray(tokens[:50])])
  np.testing.assert_allclose(logp[:50], ref_lp, atol=1e-5)


def test_wrong_distribution_is_detected():
  """The test above has power: a sampler at the wrong temperature fails it."""
  n = 100_000
  cfg = SamplingConfig(temperature=1.1)
  logits = jnp.broadcast_to(jnp.asarray(LOGITS), (n, LOGITS.size))
  tokens, _ = sample_tokens(logits, cfg, jax.random.key(7), jnp.arange(n), jnp.zeros(n, int))
  counts = np.bincount(np.asarray(tokens), minlength=LOGITS.size)
  e = _reference_probs(LOGITS, 1.0, 0, 1.0) * n
  assert ((counts - e) ** 2 / e).sum() > _chi2_critical(LOGITS.size - 1)


def test_greedy_and_keys_are_layout_invariant():
  logits = jax.random.normal(jax.random.key(0), (6, 11))
  tok, _ = sample_tokens(
    logits, SamplingConfig(temperature=0.0), jax.random.key(0), jnp.arange(6), jnp.zeros(6, int)
  )
  np.testing.assert_array_equal(tok, np.argmax(logits, -1))
  cfg = SamplingConfig(temperature=1.0)
  seq, pos = jnp.arange(6), jnp.arange(6) * 3
  a, _ = sample_tokens(logits, cfg, jax.random.key(1), seq, pos)
  perm = jnp.array([3, 0, 5, 1, 4, 2])
  b, _ = sample_tokens(logits[perm], cfg, jax.random.key(1), seq[perm], pos[perm])
  np.testing.assert_array_equal(np.asarray(a)[perm], b)


def test_truncation_masks_and_invalid_params():
  x = sampling_logits(jnp.asarray(LOGITS), SamplingConfig(top_k=2))
  assert int((x > -1e29).sum()) == 2
  for bad in (
    dict(temperature=-1.0),
    dict(top_k=-2),
    dict(top_p=0.0),
    dict(top_p=1.5),
    dict(top_k=1.5),
  ):
    with pytest.raises(ValueError):
      SamplingConfig(**bad)

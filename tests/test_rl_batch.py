"""Batch assembly (tlt_jax.rl.batch) on hand-made rollouts: no model, no engine."""

from types import SimpleNamespace

import numpy as np
import pytest

from tlt_jax.data.tokenizer import CharTokenizer
from tlt_jax.rl.batch import (
  ProcessAdvantages,
  ProcessCredit,
  ScoredRollout,
  assemble,
  chosen_groups,
  packed_width,
)

G = 2


def _rollout(rewards, lengths, prompt_len=2, slots=8, seed=0, process=None):
  """A scored rollout of len(rewards) rows: tokens 1..slots, log-probs and old log-probs
  drawn from `seed`."""
  n = len(rewards)
  rng = np.random.default_rng(seed)
  result = SimpleNamespace(
    tokens=np.tile(np.arange(1, slots + 1, dtype=np.int32), (n, 1)),
    length=np.asarray(lengths, np.int32),
    prompt_len=np.full((n,), prompt_len, np.int32),
    logprobs=rng.normal(size=(n, slots)).astype(np.float32),
  )
  r = np.asarray(rewards, np.float32)
  old = result.logprobs + rng.normal(scale=0.01, size=(n, slots)).astype(np.float32)
  return ScoredRollout(result, r, r, old_logp=old, process=process)


def test_chosen_groups_takes_the_first_informative_groups_in_rollout_order():
  first = _rollout([1, 1, 0, 1, 0, 0], [5] * 6)  # groups: equal, differ, equal
  refill = _rollout([0, 1, 1, 0, 1, 1], [5] * 6)  # differ, differ, equal
  rollouts = [first, refill]
  assert chosen_groups(rollouts, G, 3, dynamic_sampling=True) == [(0, 1), (1, 0), (1, 1)]
  assert chosen_groups(rollouts, G, 2, dynamic_sampling=True) == [(0, 1), (1, 0)]
  assert chosen_groups(rollouts, G, 3, dynamic_sampling=False) == [(0, 0), (0, 1), (0, 2)]


def test_process_rewards_make_an_equal_outcome_group_informative():
  tokens = np.zeros((4, 8), np.float32)
  process = ProcessAdvantages(tokens, np.array([True, False]), 0.5)
  r = _rollout([1, 1, 1, 1], [5] * 4, process=process)
  assert r.informative(G).tolist() == [True, False]


def test_assemble_lays_out_tokens_mask_advantages_and_old_logprobs():
  process_tokens = np.zeros((4, 8), np.float32)
  process_tokens[2, 3] = 0.5
  a = _rollout([0, 1, 1, 1], [4, 6, 5, 7], seed=1)
  b = _rollout([1, 0, 2, 2], [3, 8, 6, 6], seed=2)
  b.process = ProcessAdvantages(process_tokens, np.array([True, True]), 0.0)
  samples, gap = assemble([a, b], [(1, 1), (0, 0)], G, width=8, process_coef=2.0)
  assert samples["tokens"].shape == (4, 8)
  np.testing.assert_array_equal(samples["length"], [6, 6, 4, 6])
  # The response mask: columns [prompt_len, length).
  np.testing.assert_array_equal(samples["mask"][2], [0, 0, 1, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(samples["mask"][0], [0, 0, 1, 1, 1, 1, 0, 0])
  # Group (1, 1) has equal rewards: outcome advantage 0, plus 2 x its process advantage.
  expected = np.zeros(8, np.float32)
  expected[3] = 1.0
  np.testing.assert_allclose(samples["advantages"][0], expected)
  np.testing.assert_allclose(samples["advantages"][1], 0.0)
  # Group (0, 0): rewards 0 and 1 -> -1 and +1 (std-normalised), on every column.
  np.testing.assert_allclose(samples["advantages"][2], -1.0, atol=1e-5)
  np.testing.assert_allclose(samples["advantages"][3], 1.0, atol=1e-5)
  np.testing.assert_array_equal(samples["old_logp"][2], a.old_logp[0])
  np.testing.assert_array_equal(samples["old_logp"][0], b.old_logp[2])
  # The gap is over response tokens only.
  pairs = [(b, 2), (b, 3), (a, 0), (a, 1)]
  want = max(
    np.abs(r.old_logp[i] - r.result.logprobs[i])[samples["mask"][k] > 0].max()
    for k, (r, i) in enumerate(pairs)
  )
  assert gap == pytest.approx(float(want))


def test_assemble_needs_the_old_logprobs():
  r = _rollout([0, 1], [4, 4])
  r.old_logp = None
  with pytest.raises(ValueError, match="old log-probs"):
    assemble([r], [(0, 0)], G, width=8)


def test_an_empty_batch_has_no_gap():
  samples, gap = assemble([_rollout([1, 1], [4, 4])], [], G, width=8)
  assert samples["tokens"].shape == (0, 8) and gap == 0.0


def test_packed_width_rounds_to_128_within_the_cache():
  short = SimpleNamespace(length=np.array([5, 130]))
  assert packed_width([short], slots=1024) == 256
  assert packed_width([short], slots=200) == 200


def test_process_credit_counts_checkers_that_fail_and_gives_them_no_credit():
  def steps(example, text):
    if text.startswith("x"):
      raise RuntimeError("a broken checker")
    if text.startswith("y"):
      return [(3, 1.0), (2, 0.0)]  # ends not increasing
    return [(1, 1.0), (len(text), float(text.count("a")))]

  texts = ["xa", "ya", "aa", "ab"]
  tokenizer = CharTokenizer()
  ids = [tokenizer.encode(t) for t in texts]
  result = SimpleNamespace(
    tokens=np.zeros((4, 6), np.int32),
    prompt_len=np.full((4,), 1, np.int32),
    completion=lambda n: ids[n],
  )
  credit = ProcessCredit(steps, tokenizer, "step", G, normalize_std=False)
  out = credit(result, texts, [{}, {}])
  assert credit.errors == 2
  np.testing.assert_array_equal(out.tokens[:2], 0.0)  # no credit for broken checkers
  # "aa": steps end at 1 and 2 with rewards 1 and 2, centred on the group's 1.25.
  np.testing.assert_allclose(out.tokens[2], [0, -0.25, 0.75, 0, 0, 0])
  assert out.informative.tolist() == [False, True]  # group 2: step rewards 2 vs 1 differ
  assert out.mean_step_reward == pytest.approx(np.mean([1.0, 2.0, 1.0, 1.0]))
  credit.reset_errors()
  assert credit.errors == 0

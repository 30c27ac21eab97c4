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
  pooled_step_reward,
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


def test_without_old_logprobs_the_update_measures_the_gap():
  """Rollouts with no old-log-prob pass (one on-policy optimizer step): the samples carry
  the engine's log-probs for the update to compare with, no old_logp and no gap of their
  own; a batch with old log-probs for some rollouts only is an error."""
  a, b = _rollout([0, 1, 1, 0], [4, 6, 5, 7], seed=1), _rollout([1, 0], [3, 8], seed=2)
  with_old, gap = assemble([a, b], [(0, 1), (1, 0)], G, width=8)
  a.old_logp = b.old_logp = None
  samples, none = assemble([a, b], [(0, 1), (1, 0)], G, width=8)
  assert none is None and gap > 0 and "old_logp" not in samples
  assert set(with_old) == set(samples) | {"old_logp"}
  for k, v in samples.items():
    np.testing.assert_array_equal(v, with_old[k], err_msg=k)
  np.testing.assert_array_equal(samples["rollout_logp"][0], a.result.logprobs[2])
  np.testing.assert_array_equal(samples["rollout_logp"][3], b.result.logprobs[1])
  b.old_logp = b.result.logprobs
  with pytest.raises(ValueError, match="old log-probs"):
    assemble([a, b], [(0, 0), (1, 0)], G, width=8)


def test_pooled_step_reward_weighs_each_call_by_its_steps():
  tokens = np.zeros((2, 8), np.float32)
  calls = [
    ProcessAdvantages(tokens, np.array([True]), 1.0, num_steps=3),
    ProcessAdvantages(tokens, np.array([True]), 0.0, num_steps=1),
    ProcessAdvantages(tokens, np.array([False]), 0.0, num_steps=0),
  ]
  assert pooled_step_reward(calls) == pytest.approx(0.75)
  assert pooled_step_reward(calls[2:]) == 0.0


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
  assert out.num_steps == 4
  credit.reset_errors()
  assert credit.errors == 0


def test_packed_width_fixed_gives_at_most_two_widths():
  class R:
    def __init__(self, n):
      self.length = np.array([n, 3])

  assert packed_width([R(100)], 1024) == 128
  assert packed_width([R(300), R(90)], 1024) == 384
  assert packed_width([R(300)], 1024, fixed=512) == 512
  assert packed_width([R(600)], 1024, fixed=512) == 1024
  assert packed_width([R(600)], 256, fixed=512) == 256

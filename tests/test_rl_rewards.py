"""Several reward functions with weights: the weighted sum, the "name=weight" spec a job's
rl.rewards holds, and the job's reward function from its config section."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from tlt_jax.configuration import ConfigError
from tlt_jax.data.checkers import check_arithmetic, check_gsm8k, extract_gsm8k_answer
from tlt_jax.rl.rewards import (
  RewardPool,
  format_reward,
  job_reward,
  parse_reward_spec,
  rewards_from_spec,
  weighted_rewards,
)


def short(completion: str, answer: str) -> float:
  return float(len(completion) < 10)


def test_weighted_rewards_sum_their_terms():
  reward = weighted_rewards([(check_gsm8k, 1.0), (format_reward(extract_gsm8k_answer), 0.2)])
  assert reward("so #### 42", "42") == pytest.approx(1.2)
  assert reward("so #### 41", "42") == pytest.approx(0.2)
  assert reward("42", "42") == 0.0
  with_penalty = weighted_rewards([(check_gsm8k, 1.0), (short, -0.5)])
  assert with_penalty("#### 42", "42") == pytest.approx(0.5)
  assert weighted_rewards([(check_gsm8k, 1.0)]) is check_gsm8k  # one term at weight 1
  with pytest.raises(ValueError, match="at least one"):
    weighted_rewards([])
  with pytest.raises(ValueError, match="finite"):
    weighted_rewards([(short, float("nan"))])
  with pytest.raises(ValueError, match="not callable"):
    weighted_rewards([("short", 1.0)])


def test_a_failing_term_fails_the_sample_not_the_run():
  def broken(completion, answer):
    raise RuntimeError("checker bug")

  pool = RewardPool(weighted_rewards([(short, 1.0), (broken, 0.1)]), workers=1)
  try:
    got = pool.submit(["a", "b"], ["", ""])()
  finally:
    pool.close()
  assert got.errors == 2 and list(got.rewards) == [0.0, 0.0]


def test_parse_reward_spec():
  assert parse_reward_spec("task=1, format=0.1,") == (("task", 1.0), ("format", 0.1))
  assert parse_reward_spec([("task", 1), ("pkg.mod:fn", "0.5")]) == (
    ("task", 1.0),
    ("pkg.mod:fn", 0.5),
  )
  assert parse_reward_spec("") == ()
  for bad, match in [
    ("task", "not 'name=weight'"),
    ("=1", "not 'name=weight'"),
    ("task=x", "finite number"),
    ("task=inf", "finite number"),
    ("task=1,task=2", "given twice"),
    ([("task",)], "pair"),
  ]:
    with pytest.raises(ValueError, match=match):
      parse_reward_spec(bad)


def test_rewards_from_spec_names():
  reward = rewards_from_spec(
    "task=1,format=0.1,format:gsm8k=0.01,format:math=0.001,exact=0.5,test_rl_rewards:short=-1",
    check_arithmetic,
  )
  # A marked answer (#7, the task's format) that is right and short.
  assert reward("3+4=7 #7", "7") == pytest.approx(1 + 0.1 - 1)
  # "#### 7" ends in a marked "7" too: right, both formats, short.
  assert reward("#### 7", "7") == pytest.approx(1 + 0.1 + 0.01 - 1)
  assert reward("#### 8\nmore text", "7") == pytest.approx(0.01)  # GSM8K's format only
  assert reward("the answer is \\boxed{8} ok", "7") == pytest.approx(0.001)
  assert reward("7", "7") == pytest.approx(0.5 - 1)  # exact match, short
  for bad, match in [
    ("format:xml=1", "answer formats"),
    ("nochecker=1", "Unknown checker"),
    ("", "no reward terms"),
  ]:
    with pytest.raises(ValueError, match=match):
      rewards_from_spec(bad, check_arithmetic)


def test_job_reward_from_the_rl_section():
  rl = ml_collections.ConfigDict({"rewards": "", "format_reward": 0.0})
  assert job_reward(rl, check_arithmetic) is check_arithmetic  # as before: the checker
  rl.format_reward = 0.2
  assert job_reward(rl, check_arithmetic)("#8", "7") == pytest.approx(0.2)
  rl.rewards = "task=1,format=0.2"
  with pytest.raises(ConfigError, match="config.rl.rewards: rl.format_reward is set too"):
    job_reward(rl, check_arithmetic)
  rl.format_reward = 0.0
  assert job_reward(rl, check_arithmetic)("#7", "7") == pytest.approx(1.2)
  rl.rewards = "task=one"
  with pytest.raises(ConfigError, match="config.rl.rewards: the weight of 'task'"):
    job_reward(rl, check_arithmetic)
  bad_bonus = ml_collections.ConfigDict({"rewards": "", "format_reward": 0.7})
  with pytest.raises(ConfigError, match="config.rl.format_reward"):
    job_reward(bad_bonus, check_arithmetic)


def test_a_reward_batch_scores_samples_as_they_are_added():
  """Samples added one by one (a rollout's rows as they are harvested) score as a whole
  batch does; a sample added twice or never is an error, not a silent zero."""
  pool = RewardPool(lambda c, a: float(c == a), workers=2)
  try:
    whole = pool.submit(["1", "2", "3"], ["1", "0", "3"])()
    batch = pool.batch(["1", "0", "3"])
    batch.add(2, "3")
    assert not batch.done() and batch.missing() == [0, 1]
    with pytest.raises(ValueError, match="never added"):
      batch()
    batch.add(0, "1")
    with pytest.raises(ValueError, match="already added"):
      batch.add(0, "1")
    batch.add(1, "2")
    got = batch()
    assert batch.done()
    np.testing.assert_array_equal(got.rewards, whole.rewards)
    np.testing.assert_array_equal(got.rewards, [1.0, 0.0, 1.0])
  finally:
    pool.close()

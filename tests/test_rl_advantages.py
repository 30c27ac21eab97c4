"""Group advantages, dynamic-sampling filter and DAPO overlong penalty."""

from __future__ import annotations

import numpy as np
import pytest

from tlt_jax.rl import group_advantages, informative_groups, overlong_penalty
from tlt_jax.rl.advantages import process_advantages, token_process_advantages


def test_group_advantages_hand_computed():
  # Group [1, 0, 1, 0]: mean 0.5, population std 0.5.
  # Group [0, 2, 4, 2]: mean 2, deviations [-2, 0, 2, 0], population std sqrt(2).
  adv = group_advantages([1.0, 0.0, 1.0, 0.0, 0.0, 2.0, 4.0, 2.0], 4, eps=1e-12)
  s2 = np.sqrt(2.0)
  want = [1.0, -1.0, 1.0, -1.0, -2 / s2, 0.0, 2 / s2, 0.0]
  np.testing.assert_allclose(adv, want, rtol=1e-6, atol=1e-6)
  assert adv.dtype == np.float32


def test_group_advantages_without_std_is_centred_reward():
  adv = group_advantages([3.0, 1.0, 0.0, 10.0], 2, normalize_std=False)
  np.testing.assert_allclose(adv, [1.0, -1.0, -5.0, 5.0])


def test_negative_weight_scales_only_below_mean_samples():
  rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 2.0, 4.0, 2.0]
  full = group_advantages(rewards, 4)
  for w in (0.0, 0.25):
    adv = group_advantages(rewards, 4, negative_weight=w)
    np.testing.assert_allclose(adv, np.where(full < 0, w * full, full))
  assert np.all(group_advantages(rewards, 4, negative_weight=0.0) >= 0.0)
  for bad in (-0.1, 1.5, np.nan):
    with pytest.raises(ValueError, match="negative_weight"):
      group_advantages(rewards, 4, negative_weight=bad)


def test_all_equal_group_gives_zero_and_is_not_informative():
  rewards = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
  adv = group_advantages(rewards, 3)
  np.testing.assert_array_equal(adv[:3], 0.0)
  np.testing.assert_array_equal(adv[6:], 0.0)
  assert np.all(adv[3:6] != 0.0)
  np.testing.assert_array_equal(informative_groups(rewards, 3), [False, True, False])


def test_group_of_one_is_zero():
  np.testing.assert_array_equal(group_advantages([0.3, 5.0], 1), [0.0, 0.0])
  np.testing.assert_array_equal(informative_groups([0.3, 5.0], 1), [False, False])


@pytest.mark.parametrize(
  "rewards, group_size",
  [
    ([1.0, 2.0, 3.0], 2),  # not a multiple
    ([], 2),  # empty
    ([[1.0, 2.0]], 2),  # not 1-D
    ([1.0, 2.0], 0),  # bad group size
    ([1.0, 2.0], 1.5),
    ([1.0, np.nan], 2),  # non-finite
  ],
)
def test_group_functions_reject_bad_args(rewards, group_size):
  with pytest.raises(ValueError):
    group_advantages(rewards, group_size)
  with pytest.raises(ValueError):
    informative_groups(rewards, group_size)


def test_group_advantages_rejects_bad_eps():
  with pytest.raises(ValueError, match="eps"):
    group_advantages([1.0, 2.0], 2, eps=0.0)


def test_overlong_penalty_boundaries():
  # max_len 20, buffer 4: free up to 16, ramp over (16, 20], -1 beyond.
  lengths = np.array([0, 15, 16, 17, 18, 19, 20, 21, 100])
  want = [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
  got = overlong_penalty(lengths, max_len=20, buffer=4)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
  assert got.dtype == np.float32
  # buffer == max_len: the ramp starts at 0.
  np.testing.assert_allclose(overlong_penalty([0, 5, 10], 10, 10), [0.0, -0.5, -1.0])


@pytest.mark.parametrize(
  "lengths, max_len, buffer, match",
  [
    ([1], 0, 1, "max_len"),
    ([1], 10, 0, "buffer"),
    ([1], 10, 11, "buffer"),
    ([1], 10.0, 2, "max_len"),
    ([-1], 10, 2, "lengths"),
    ([1.5], 10, 2, "lengths"),
  ],
)
def test_overlong_penalty_rejects_bad_args(lengths, max_len, buffer, match):
  with pytest.raises(ValueError, match=match):
    overlong_penalty(lengths, max_len, buffer)


def test_process_advantages_normalise_over_all_steps_of_a_group():
  # Group 0: steps [1, 1, 0] and [1]: mean 0.75, std sqrt(3) / 4. Group 1: all equal.
  got = process_advantages([[1, 1, 0], [1], [0, 0], []], 2)
  std = np.sqrt(3) / 4
  np.testing.assert_allclose(got[0], [0.25 / std, 0.25 / std, -0.75 / std], rtol=1e-5)
  np.testing.assert_allclose(got[1], [0.25 / std], rtol=1e-5)
  np.testing.assert_array_equal(got[2], [0.0, 0.0])
  assert got[3].shape == (0,)
  centred = process_advantages([[1, 1, 0], [1]], 2, normalize_std=False)
  np.testing.assert_allclose(centred[0], [0.25, 0.25, -0.75])
  with pytest.raises(ValueError, match="multiple of 2"):
    process_advantages([[1], [0], [1]], 2)
  with pytest.raises(ValueError, match="finite"):
    process_advantages([[np.nan], [0.0]], 2)


def test_token_process_advantages_step_and_return_credit():
  # Steps end at characters 2, 5, 7; tokens end at 1, 2, 4, 5, 5 (a special token), 7, 9.
  ends, adv, tokens = [2, 5, 7], np.array([1.0, -2.0, 0.5]), [1, 2, 4, 5, 5, 7, 9]
  step = token_process_advantages(ends, adv, tokens, "step")
  np.testing.assert_allclose(step, [1, 1, -2, -2, -2, 0.5, 0])
  ret = token_process_advantages(ends, adv, tokens, "return")
  np.testing.assert_allclose(ret, [-0.5, -0.5, -1.5, -1.5, -1.5, 0.5, 0])
  with pytest.raises(ValueError, match="credit"):
    token_process_advantages(ends, adv, tokens, "token")
  with pytest.raises(ValueError, match="increasing"):
    token_process_advantages([5, 2, 7], adv, tokens, "step")


def test_std_ddof_one_is_bessels_sample_std():
  # Group [1, 0, 1, 0]: deviations +-0.5; squared sum 1, so the sample std is sqrt(1/3).
  # Group [0, 2, 4, 2]: squared deviations sum to 8, sample std sqrt(8/3).
  rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 2.0, 4.0, 2.0]
  adv = group_advantages(rewards, 4, eps=1e-12, std_ddof=1)
  s1, s2 = np.sqrt(1 / 3), np.sqrt(8 / 3)
  want = [0.5 / s1, -0.5 / s1, 0.5 / s1, -0.5 / s1, -2 / s2, 0.0, 2 / s2, 0.0]
  np.testing.assert_allclose(adv, want, rtol=1e-6, atol=1e-6)
  # sqrt(G / (G - 1)) smaller than the population-std default, which stays as it was.
  population = group_advantages(rewards, 4, eps=1e-12)
  np.testing.assert_allclose(adv, population * np.sqrt(3 / 4), rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(population, group_advantages(rewards, 4, eps=1e-12, std_ddof=0))
  np.testing.assert_array_equal(group_advantages([1.0, 1.0], 2, std_ddof=1), [0.0, 0.0])
  for bad in (2, -1, 0.5, True):
    with pytest.raises(ValueError, match="std_ddof"):
      group_advantages(rewards, 4, std_ddof=bad)
  with pytest.raises(ValueError, match="group_size >= 2"):
    group_advantages([0.3, 5.0], 1, std_ddof=1)


def test_process_advantages_std_ddof():
  # Group 0's four step rewards [1, 1, 0, 1]: mean 0.75, sample std sqrt(0.75 / 3) = 0.5.
  got = process_advantages([[1, 1, 0], [1], [1], []], 2, std_ddof=1, eps=1e-12)
  np.testing.assert_allclose(got[0], [0.5, 0.5, -1.5], rtol=1e-5)
  # A group with one step reward: centred to 0 whatever the ddof (no division by zero).
  np.testing.assert_array_equal(got[2], [0.0])
  with pytest.raises(ValueError, match="std_ddof"):
    process_advantages([[1], [0]], 2, std_ddof=3)

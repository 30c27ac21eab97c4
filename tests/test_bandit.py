"""StrategyBandit: per-bucket discounted UCB over draft strategies (pure Python, no JAX)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from tlt_jax.rollout.bandit import BanditSettings, StrategyBandit

ARMS = ("plain", "chain2", "chain4", "tree4x2x8")

# Synthetic tokens/s per (batch bucket, arm). The best arm differs per bucket, as on hardware:
# deep chains win at batch 1 (verification nearly free), a short chain at 8, plain decoding at 64
# (verification of extra nodes is compute bound). Best-to-second gaps are 12-14%.
TRUE_RATE = {
  1: {"plain": 40.0, "chain2": 60.0, "chain4": 75.0, "tree4x2x8": 66.0},
  8: {"plain": 250.0, "chain2": 330.0, "chain4": 290.0, "tree4x2x8": 260.0},
  64: {"plain": 1500.0, "chain2": 1300.0, "chain4": 1100.0, "tree4x2x8": 1000.0},
}
NOISE_SIGMA = 0.15

# The defaults (BanditSettings: exploration 0.2 of the best mean, discount 0.99, the
# engine's) track a drifting drafter with a ~100-chunk window. For a check on a stationary
# cost model with 12% gaps and 15% noise, a smaller bonus is appropriate.
TUNED = {"exploration": 0.15, "discount": 0.99}


def _noisy(rng: np.random.Generator, rate: float) -> float:
  return float(rate * rng.lognormal(0.0, NOISE_SIGMA))


def _true_best(bucket: int) -> str:
  rates = TRUE_RATE[bucket]
  return max(rates, key=rates.get)


def test_cost_model_has_a_different_best_arm_per_bucket():
  # Guards the premise of the next test: one global arm would not do.
  assert len({_true_best(b) for b in TRUE_RATE}) == len(TRUE_RATE)


def test_learns_best_arm_per_bucket():
  bandit = StrategyBandit(ARMS, BanditSettings(seed=0, **TUNED))
  rng = np.random.default_rng(1234)
  chosen: dict[int, list[str]] = {b: [] for b in TRUE_RATE}
  # Interleave buckets as an engine would: statistics must not leak across buckets.
  for _ in range(300):
    for bucket, rates in TRUE_RATE.items():
      arm = bandit.select(bucket)
      chosen[bucket].append(arm)
      bandit.update(bucket, arm, _noisy(rng, rates[arm]))

  for bucket, rates in TRUE_RATE.items():
    best = _true_best(bucket)
    assert bandit.best(bucket) == best, (bucket, bandit.summary()[bucket])
    late_share = chosen[bucket][-100:].count(best) / 100
    assert late_share >= 0.7, (bucket, late_share)
    achieved = np.mean([rates[a] for a in chosen[bucket]])
    assert achieved >= 0.95 * rates[best], (bucket, achieved / rates[best])
    assert sum(s["pulls"] for s in bandit.summary()[bucket].values()) == 300


def _late_share_after_jump(**kwargs) -> tuple[StrategyBandit, float, float]:
  """chain4 goes from worst to best half-way; returns its share of the final 100 pulls and
  of the first 50 after the jump."""
  rates = {"plain": 100.0, "chain2": 120.0, "chain4": 90.0}
  bandit = StrategyBandit(tuple(rates), BanditSettings(seed=0, **kwargs))
  rng = np.random.default_rng(7)
  chosen = []
  for step in range(300):
    if step == 150:
      assert bandit.best(8) == "chain2"
      rates["chain4"] = 150.0
    arm = bandit.select(8)
    chosen.append(arm)
    bandit.update(8, arm, _noisy(rng, rates[arm]))
  return bandit, chosen[-100:].count("chain4") / 100, chosen[150:200].count("chain4") / 50


def test_adapts_when_an_arm_improves():
  # The drafter improves during training, so a deeper draft can become best mid-run. This is
  # what the defaults are for.
  # (With 15% noise, the default bonus re-tries the stale arm within the first 50 chunks and
  # holds it by the end.)
  bandit, share, soon = _late_share_after_jump()
  assert share >= 0.7 and soon >= 0.3, (share, soon)
  assert bandit.best(8) == "chain4"
  # Without discounting, the 150 stale observations hold chain4 back for dozens of chunks:
  # the decay does the work.
  _, _, stationary_soon = _late_share_after_jump(discount=1.0)
  assert stationary_soon < soon - 0.3, (stationary_soon, soon)


def _drive(bandit: StrategyBandit, rng: np.random.Generator, steps: int) -> list[str]:
  """Runs `steps` rounds over buckets 1 and 8; returns the selections."""
  chosen = []
  for _ in range(steps):
    for bucket in (1, 8):
      arm = bandit.select(bucket)
      chosen.append(arm)
      bandit.update(bucket, arm, _noisy(rng, TRUE_RATE[bucket][arm]))
  return chosen


def test_state_dict_json_round_trip_continues_identically():
  original = StrategyBandit(ARMS, BanditSettings(seed=3))
  _drive(original, np.random.default_rng(0), 40)
  state = json.loads(json.dumps(original.state_dict()))
  restored = StrategyBandit.from_state_dict(state)
  assert restored.state_dict() == original.state_dict()
  assert repr(restored) == repr(original)

  # A bandit that has seen nothing chooses differently: the comparison below can fail.
  fresh = StrategyBandit(ARMS, BanditSettings(seed=3))
  rng_a, rng_b, rng_c = (np.random.default_rng(5) for _ in range(3))
  a, b, c = _drive(original, rng_a, 25), _drive(restored, rng_b, 25), _drive(fresh, rng_c, 25)
  assert len(a) == 50
  assert a == b
  assert a != c
  assert restored.summary() == original.summary()


def test_state_dict_restores_tie_breaking_generator():
  # Equal rewards and no discount make every post-warm-up selection an exact tie, decided by the
  # generator: the restored bandit only agrees if the generator state came back.
  def run(bandit: StrategyBandit, steps: int) -> list[str]:
    out = []
    for _ in range(steps):
      arm = bandit.select(2)
      out.append(arm)
      bandit.update(2, arm, 10.0)
    return out

  original = StrategyBandit(ARMS, BanditSettings(discount=1.0, min_pulls=1, seed=11))
  run(original, 13)
  restored = StrategyBandit.from_state_dict(json.loads(json.dumps(original.state_dict())))
  # Same statistics, another generator state.
  other_rng = StrategyBandit(ARMS, BanditSettings(seed=12)).state_dict()["rng"]
  other_seed = StrategyBandit.from_state_dict({**original.state_dict(), "rng": other_rng})
  a, b, c = run(original, 50), run(restored, 50), run(other_seed, 50)
  assert a == b
  assert a != c


def test_load_state_dict_rejects_different_arms():
  source = StrategyBandit(ARMS)
  source.update(1, "plain", 1.0)
  state = source.state_dict()
  with pytest.raises(ValueError, match="arms"):
    StrategyBandit(ARMS[:3]).load_state_dict(state)
  with pytest.raises(ValueError, match="arms"):
    StrategyBandit(tuple(reversed(ARMS))).load_state_dict(state)
  target = StrategyBandit(ARMS)
  target.load_state_dict(state)  # Same arms: accepted.
  assert target.summary() == source.summary()


@pytest.mark.parametrize(
  ("args", "kwargs", "match"),
  [
    ((), {}, "empty"),
    ((("plain", "chain2", "plain"),), {}, "duplicate"),
    ((("plain", 4),), {}, "strings"),
    ((ARMS,), {"discount": 0.0}, "discount"),
    ((ARMS,), {"discount": 1.5}, "discount"),
    ((ARMS,), {"exploration": -0.1}, "exploration"),
    ((ARMS,), {"min_pulls": 0}, "min_pulls"),
    ((ARMS,), {"min_pulls": 1.5}, "min_pulls"),
  ],
)
def test_constructor_rejects_bad_arguments(args, kwargs, match):
  arms = args[0] if args else ()
  with pytest.raises(ValueError, match=match):
    StrategyBandit(arms, BanditSettings(**kwargs))


def test_constructor_accepts_boundary_values():
  bandit = StrategyBandit(["plain"], BanditSettings(exploration=0.0, discount=1.0, min_pulls=1))
  assert bandit.arms == ("plain",)


def test_settings_are_one_checked_normalised_value():
  """BanditSettings holds every setting once: its defaults are the engine's, a bad value is
  refused naming the field, and equal settings (numpy or Python numbers) compare equal and
  are what the state records and restores."""
  default = BanditSettings()
  assert (default.exploration, default.discount, default.min_pulls) == (0.2, 0.99, 1)
  assert StrategyBandit(ARMS).settings == default
  for field, bad in (("exploration", -1.0), ("seed", "x"), ("discount", 0.0)):
    with pytest.raises(ValueError, match=rf"^BanditSettings\.{field} must be"):
      BanditSettings(**{field: bad})
  a = BanditSettings(exploration=np.float32(1.5), min_pulls=np.int64(2))
  b = BanditSettings(exploration=1.5, min_pulls=2)
  assert a == b and hash(a) == hash(b) and type(a.min_pulls) is int
  assert BanditSettings.from_state(json.loads(json.dumps(a.to_state()))) == a
  with pytest.raises(dataclasses.FrozenInstanceError):
    a.discount = 0.5  # type: ignore[misc]


def test_update_rejects_bad_input():
  bandit = StrategyBandit(ARMS)
  with pytest.raises(ValueError, match="chain2"):  # The message lists the known arms.
    bandit.update(1, "chain9", 10.0)
  for bad in (math.nan, math.inf, -1.0):
    with pytest.raises(ValueError, match="reward"):
      bandit.update(1, "plain", bad)
  # The failed calls recorded nothing, not even the bucket; a zero reward is allowed.
  assert bandit.summary() == {}
  bandit.update(1, "plain", 0.0)
  assert bandit.summary()[1]["plain"] == {"pulls": 1, "mean": 0.0, "last": 0.0}


@pytest.mark.parametrize("min_pulls", [1, 2, 3])
def test_fresh_bucket_warms_up_round_robin(min_pulls):
  bandit = StrategyBandit(ARMS, BanditSettings(min_pulls=min_pulls))
  # Rewards favour the last arm heavily, so UCB alone would not produce this order.
  rewards = {"plain": 1.0, "chain2": 2.0, "chain4": 3.0, "tree4x2x8": 100.0}
  chosen = []
  for _ in range(len(ARMS) * min_pulls):
    arm = bandit.select(16)
    chosen.append(arm)
    assert not bandit.warmed_up(16)
    bandit.update(16, arm, rewards[arm])
  assert chosen == list(ARMS) * min_pulls
  assert bandit.warmed_up(16) and not bandit.warmed_up(32)
  # Buckets are independent: a new one starts its own warm-up.
  assert bandit.select(32) == ARMS[0]
  assert bandit.buckets == [16, 32]
  # After warm-up, the clearly best arm is exploited.
  assert bandit.select(16) == "tree4x2x8"


def test_best_and_summary():
  bandit = StrategyBandit(ARMS, BanditSettings(discount=0.5))
  assert bandit.best(4) == "plain"  # No data: the first arm.
  bandit.update(4, "chain4", 10.0)
  assert bandit.best(4) == "chain4"  # Arms without data are excluded, not treated as 0.
  bandit.update(4, "chain4", 20.0)
  bandit.update(4, "plain", 12.0)
  summary = bandit.summary()[4]
  # Discounted mean of chain4: (10 * 0.5 + 20) / (0.5 + 1), then both decayed alike.
  assert summary["chain4"]["pulls"] == 2
  assert summary["chain4"]["mean"] == pytest.approx(25.0 / 1.5)
  assert summary["chain4"]["last"] == 20.0
  assert summary["plain"] == {"pulls": 1, "mean": 12.0, "last": 12.0}
  assert bandit.best(4) == "chain4"
  assert "chain4" in repr(bandit) and "buckets=[4]" in repr(bandit)


def test_exploration_weight_sets_how_often_close_seconds_are_tried():
  """The bonus is a plain UCB's on rewards normalised by the best mean: with 5% timing
  noise and 10% gaps, the default weight spends most chunks on the best arm, a 10x larger
  one keeps comparing, a 4x smaller one compares less."""
  rates = {"plain": 100.0, "chain2": 110.0, "chain4": 121.0}

  def best_share(exploration):
    bandit = StrategyBandit(tuple(rates), BanditSettings(exploration=exploration, seed=0))
    rng = np.random.default_rng(3)
    chosen = []
    for _ in range(200):
      arm = bandit.select(1)
      chosen.append(arm)
      bandit.update(1, arm, float(rates[arm] * rng.lognormal(0.0, 0.05)))
    return chosen[-150:].count("chain4") / 150

  default, wide, narrow = (
    best_share(BanditSettings().exploration),
    best_share(2.0),
    best_share(0.05),
  )
  assert default >= 0.8, default
  assert wide < default - 0.2 and narrow > default, (wide, default, narrow)


@pytest.mark.parametrize("version", [1, 4, 5, 7, None])
def test_refuses_a_state_of_another_version_in_one_line(version):
  """Only the current layout is read: an older checkpoint's bandit state fails at once,
  naming its version, not deep inside the reader."""
  bandit = StrategyBandit(ARMS, BanditSettings(seed=2))
  bandit.update(1, "plain", 10.0)
  state = {**json.loads(json.dumps(bandit.state_dict())), "version": version}
  for load in (StrategyBandit.from_state_dict, StrategyBandit(ARMS).load_state_dict):
    with pytest.raises(ValueError, match=rf"^bandit state version {version!r} is not supported"):
      load(state)


def test_bandit_settings_are_the_engines_for_each_pool():
  from tlt_jax.rollout.config import EngineConfig, bandit_settings

  pool = ("chain4", "chain8", "tree5x4x16")
  arms, settings = bandit_settings(EngineConfig(spec_threshold=8, spec_strategies=pool))
  assert arms == ("plain", *pool)
  # One set of defaults, whatever the pool.
  assert (settings.discount, settings.min_pulls, settings.seed) == (0.99, 1, 0)
  _, tree = bandit_settings(EngineConfig(spec_threshold=8, spec_strategies=("tree5x4x16",)))
  assert tree == settings
  StrategyBandit(arms, settings)
  # The UCB bonus's weight comes from the config.
  assert settings.exploration == 0.2
  tuned = EngineConfig(spec_threshold=8, spec_strategies=pool, bandit_exploration=1)
  _, tuned = bandit_settings(tuned)
  assert tuned.exploration == 1.0
  for bad in (-0.5, float("inf"), True):
    with pytest.raises(ValueError, match="bandit_exploration"):
      EngineConfig(spec_threshold=8, spec_strategies=pool, bandit_exploration=bad)


def test_likely_is_the_next_pick_without_drawing_anything():
  """`likely`: the warm-up's next arm while a bucket warms up (the first arm for a bucket
  never seen), then the best by mean; it creates no bucket and leaves the generator alone
  (exact ties draw from it), so the picks that follow are the same as without it."""
  settings = BanditSettings(min_pulls=2, discount=1.0, seed=3)  # undiscounted: exact ties
  peeked, plain = StrategyBandit(ARMS, settings), StrategyBandit(ARMS, settings)
  assert peeked.likely(8) == ARMS[0] and peeked.buckets == []
  for bandit in (peeked, plain):
    bandit.update(8, "plain", 1.0)
  assert peeked.likely(8) == "chain2" == peeked.select(8)  # the warm-up's next
  for bandit in (peeked, plain):
    for arm in ARMS:
      for _ in range(2):
        bandit.update(8, arm, 1.0)  # all tied: UCB's picks draw from the generator
        bandit.update(1, arm, 5.0 if arm == "chain4" else 1.0)
  assert peeked.likely(1) == "chain4" == peeked.best(1)
  picks = []
  for _ in range(20):
    peeked.likely(8)
    picks.append(peeked.select(8))
  assert picks == [plain.select(8) for _ in range(20)] and len(set(picks)) > 1

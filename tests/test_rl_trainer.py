"""The GRPO loop on a tiny model: end to end, exact resume, reward failures, config errors."""

import json
import time

import numpy as np
import pytest
from flax import nnx

from tlt_jax.data.tasks import format_prompt, generate_arithmetic
from tlt_jax.data.tokenizer import CharTokenizer
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.rl import PolicyLossConfig, UpdateConfig
from tlt_jax.rl.rewards import RewardPool
from tlt_jax.rl.trainer import GRPOConfig, GRPOTrainer
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.pool import ExecutablePool

TOK = CharTokenizer()
MODEL = ModelConfig(
  vocab_size=100, num_layers=1, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64
)
ENGINE = EngineConfig(
  max_prompt_len=48,
  max_new_tokens=24,
  max_batch=8,
  min_batch_bucket=8,
  min_cache_bucket=72,
  min_prompt_bucket=48,
  compact=False,
  stop_tokens=(TOK.eos_id,),
)
DATA = generate_arithmetic(0, 64, max_steps=2, max_operand=9, max_value=99, style="labelled")
POOL = ExecutablePool()


def seven(completion: str, answer: str) -> float:
  """A reward a random policy earns sometimes, so groups carry signal."""
  return float("7" in completion)


def _trainer(workdir, steps, reward_fn=seven, **changes):
  graphdef, params = nnx.split(init_model(MODEL, seed=0))
  engine = RolloutEngine(graphdef, MODEL, ENGINE, SamplingConfig(temperature=1.0), POOL)
  cfg = GRPOConfig(
    steps=steps,
    prompts_per_step=2,
    group_size=4,
    eval_every=0,
    eval_examples=2,
    checkpoint_every=1,
    reward_workers=2,
    **changes,
  )
  return GRPOTrainer(
    graphdef,
    params,
    engine,
    TOK,
    DATA[:48],
    DATA[48:],
    reward_fn,
    format_prompt,
    cfg,
    PolicyLossConfig(clip_high=0.28),
    UpdateConfig(learning_rate=3e-3, total_steps=10, micro_batch=4),
    str(workdir),
  )


def _comparable(row):
  return {k: v for k, v in row.items() if not k.startswith("time/") and k != "eval"}


def test_runs_and_resumes_exactly(tmp_path):
  full = _trainer(tmp_path / "a", 4).run(progress=False)
  assert [r["step"] for r in full] == [0, 1, 2, 3]
  assert all(r["loss/skipped"] == 0 for r in full)
  assert all(r["logp_rollout_vs_trainer_max_abs"] < 1e-3 for r in full)
  assert full[-1]["eval"]["accuracy"] >= 0.0
  # Interrupted after two steps, resumed by a new trainer on the same workdir.
  first = _trainer(tmp_path / "b", 2).run(progress=False)
  resumed = _trainer(tmp_path / "b", 4)
  assert resumed.step == 2
  rest = resumed.run(progress=False)
  assert [r["step"] for r in rest] == [2, 3]
  for a, b in zip(full, first + rest):
    assert _comparable(a) == pytest.approx(_comparable(b), rel=1e-5, abs=1e-6)
  with open(tmp_path / "b" / "metrics.jsonl") as f:
    assert [json.loads(line)["step"] for line in f] == [0, 1, 2, 3]


def test_dynamic_sampling_drops_uninformative_groups(tmp_path):
  def first_prompt_only(completion, answer):  # constant within a group except by chance
    return 1.0 if answer == DATA[0]["answer"] else 0.0

  rows = _trainer(tmp_path, 1, reward_fn=first_prompt_only, max_refills=1).run(progress=False)
  assert rows[0]["groups_used"] == 0 and rows[0]["refills"] == 1
  assert rows[0]["update_tokens"] == 0


def test_reward_failures_are_zero_and_counted():
  def flaky(completion, answer):
    if answer == "boom":
      raise RuntimeError("checker bug")
    if answer == "slow":
      time.sleep(2.0)
    if answer == "nan":
      return float("nan")
    return 1.0

  pool = RewardPool(flaky, workers=2, timeout_s=0.5)
  got = pool.submit(["a"] * 5, ["ok", "boom", "slow", "nan", "ok"])()
  pool.close()
  np.testing.assert_array_equal(got.rewards, [1.0, 0.0, 0.0, 0.0, 1.0])
  assert (got.errors, got.timeouts) == (2, 1)


def test_bad_configs():
  with pytest.raises(ValueError, match="group_size must be >= 2"):
    GRPOConfig(group_size=1)
  with pytest.raises(ValueError, match="prompts_per_step must be a positive int"):
    GRPOConfig(prompts_per_step=0)
  with pytest.raises(ValueError, match="workers"):
    RewardPool(seven, workers=0)

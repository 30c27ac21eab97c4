"""TLT's per-step drafter minimum and the drafter evaluation, in tiny GRPO runs.

The scheduler's idle slices are shut (no long-tail budget, no window update), so every
drafter update comes from the per-step minimum: the drafter state is a function of the
steps alone, and a resumed run must reproduce it, drafter evaluations included.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_helpers import IdTokenizer, seven_reward, tiny_grpo
from tiny_models import TINY_UNTIED

from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.drafter import DrafterTrainConfig, OnlineDrafter
from tlt_jax.drafter.acceptance import DrafterEvalConfig, default_strategy
from tlt_jax.models.drafter import init_drafter
from tlt_jax.models.transformer import init_model
from tlt_jax.rl import PolicyLossConfig, UpdateConfig
from tlt_jax.rl.trainer import PHASES, GRPOTrainer
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.scheduler import SchedulerConfig, SliceScheduler

MODEL = TINY_UNTIED
# One batch, cache and prompt bucket; every chunk speculative with one chain (few programs).
ENGINE = EngineConfig(
  max_prompt_len=8,
  max_new_tokens=16,
  max_batch=8,
  chunk_steps=4,
  min_batch_bucket=8,
  min_cache_bucket=24,
  min_prompt_bucket=8,
  compact=False,
  spec_threshold=8,
  spec_strategies=("chain2",),
  spec_adaptive=False,
  spec_rounds=2,
)
EXAMPLES = [
  {"question": " ".join(map(str, p)), "answer": ""}
  for p in ([1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13])
]
# Every update from the minimum: no long-tail budget, no update in an idle window.
SHUT = {"rollout_budget": 0.0, "max_window_updates": 0}
# What a resumed run repeats: the policy's figures and the drafter's (not their timings).
_REPEATED = (
  "reward_mean",
  "length_mean",
  "update_tokens",
  "spec/accept_length",
  "drafter/version",
  "drafter/updates",
  "drafter/step_min_updates",
  "drafter/buffer_rows",
  "drafter/loss",
  "drafter/top1_agreement",
)


@pytest.fixture(scope="module")
def models():
  tg, tp = nnx.split(init_model(MODEL, seed=3))
  dg, dp = nnx.split(init_drafter(MODEL, seed=4))
  return tg, tp, dg, dp


@pytest.fixture(scope="module")
def pool():
  return ExecutablePool()


def _trainer(models, pool, workdir, steps, scheduler=None, frozen=False, every=2):
  tg, tp, dg, dp = models
  engine = RolloutEngine(tg, MODEL, ENGINE, SamplingConfig(temperature=1.0), pool, dg)
  online = None
  if scheduler is not None:
    drafter = OnlineDrafter(
      dg,
      jax.tree.map(jnp.copy, dp),
      DrafterTrainConfig(learning_rate=1e-2, warmup_steps=0, batch_rows=2),
      slots=ENGINE.slots,
      feature_dim=MODEL.d_model,
    )
    online = SliceScheduler(drafter, SchedulerConfig(**scheduler))
  trainer = GRPOTrainer(
    tg,
    jax.tree.map(jnp.copy, tp),
    engine,
    IdTokenizer(),
    EXAMPLES,
    EXAMPLES[:2],
    seven_reward,
    lambda ex: ex["question"],
    tiny_grpo(steps, group_size=4),
    PolicyLossConfig(),
    UpdateConfig(learning_rate=1e-3, total_steps=10, micro_batch=4),
    str(workdir),
    drafter_params=dp if frozen else None,
    scheduler=online,
    drafter_eval=DrafterEvalConfig(every=every, prompts=2),
  )
  # The held-out pass@1 after the last step is not what is tested (its greedy programs
  # would only add compiles).
  trainer.evaluate = lambda: {"accuracy": 0.0}
  return trainer


def _reproducible(row):
  keep = lambda k: k in _REPEATED or k.startswith(("loss/", "drafter_eval/"))  # noqa: E731
  return {k: v for k, v in row.items() if keep(k)}


def test_every_tlt_step_trains_the_drafter_and_resumes_exactly(models, pool, tmp_path):
  """min_step_updates=1 with the slices shut: the drafter version advances by one every
  step, each update run by the step's minimum and timed as time/drafter (inside the
  step); the drafters' accept lengths are recorded after steps 2 and 4 (both finite,
  within a chain2 round's 1-3 tokens). Killed after step 2 and resumed, the run repeats
  every figure but the timings: policy, drafter versions, accept lengths."""
  full = _trainer(models, pool, tmp_path / "full", 4, {**SHUT, "min_step_updates": 1})
  rows = full.run(progress=False)
  assert [r["drafter/version"] for r in rows] == [1, 2, 3, 4]
  for r in rows:
    assert r["drafter/updates"] == r["drafter/step_min_updates"] == 1
    assert r["drafter/long_tail_updates"] == 0 and r["drafter/reclaimed_s"] == 0
    assert 0 < r["drafter/step_min_s"] <= r["time/drafter"] < r["time/step"]
    assert "drafter" in PHASES and r["time/other"] == pytest.approx(
      r["time/step"] - sum(r[f"time/{p}"] for p in PHASES)
    )
  evaluated = [r["step"] for r in rows if "drafter_eval/accept_online" in r]
  assert evaluated == [1, 3]  # after steps 2 and 4 of every=2
  # The drafter update's compiles count as compiles (left out of the modes' step times).
  compiled = sum(r["time/rollout_compile"] + r["time/train_compile"] for r in rows)
  assert full.scheduler.drafter.compile_seconds > 0
  assert compiled >= full.scheduler.drafter.compile_seconds
  assert rows[0]["time/train_compile"] >= rows[0]["drafter/step_min_s"] * 0.5
  # Step 0's update is the step's minimum, after train_step: its compile counts too.
  train_compiled = sum(r["time/train_compile"] for r in rows)
  drafter_compiled = full.scheduler.drafter.compile_seconds
  assert train_compiled >= full.programs.compile_seconds + drafter_compiled - 1e-6
  assert all("drafter_eval/accept_frozen" not in r for r in rows if r["step"] not in evaluated)
  for r in rows:
    if r["step"] in evaluated:
      assert r["drafter_eval/online_version"] == r["drafter/version"]
      for k in ("drafter_eval/accept_online", "drafter_eval/accept_frozen"):
        assert np.isfinite(r[k]) and 1.0 <= r[k] <= 3.0
      assert r["time/eval"] > 0
  # The drafter moved away from the frozen warm start, which the scheduler kept as it was.
  moved = jax.tree.map(
    lambda a, b: float(jnp.abs(a - b).max()), full.scheduler.drafter.params, models[3]
  )
  assert max(jax.tree.leaves(moved)) > 0
  kept = jax.tree.map(
    lambda a, b: float(jnp.abs(a - b).max()), full.scheduler.initial_params, models[3]
  )
  assert max(jax.tree.leaves(kept)) == 0
  # Killed after step 2, resumed by a fresh trainer and scheduler from the checkpoints.
  _trainer(models, pool, tmp_path / "cut", 2, {**SHUT, "min_step_updates": 1}).run(progress=False)
  resumed = _trainer(models, pool, tmp_path / "cut", 4, {**SHUT, "min_step_updates": 1})
  assert resumed.step == 2 and resumed.scheduler.drafter.version == 2
  rest = resumed.run(progress=False)
  assert [r["step"] for r in rest] == [2, 3]
  assert "drafter_eval/accept_online" in _reproducible(rest[1])
  for want, got in zip(rows[2:], rest):
    assert _reproducible(got) == pytest.approx(_reproducible(want), rel=1e-6, abs=1e-7)


def test_without_a_minimum_shut_slices_never_train_and_both_drafters_measure_alike(
  models, pool, tmp_path
):
  """min_step_updates=0 (the slices alone) with the slices shut: no update in any step,
  and the online drafter, still the warm start, measures exactly the frozen one's accept
  length on the same prompts, key and strategy. Mode sd (a frozen drafter): only the
  frozen one is measured, and no drafter phase is spent."""
  rows = _trainer(models, pool, tmp_path / "tlt", 2, {**SHUT, "min_step_updates": 0}, every=1).run(
    progress=False
  )
  assert [r["drafter/version"] for r in rows] == [0, 0]
  assert all(r["drafter/updates"] == r["drafter/step_min_updates"] == 0 for r in rows)
  for r in rows:
    assert r["drafter_eval/accept_online"] == r["drafter_eval/accept_frozen"] >= 1.0
  (sd,) = _trainer(models, pool, tmp_path / "sd", 1, frozen=True, every=1).run(progress=False)
  assert sd["drafter_eval/accept_frozen"] == rows[0]["drafter_eval/accept_frozen"]
  assert "drafter_eval/accept_online" not in sd and sd["time/drafter"] == 0.0
  assert default_strategy(ENGINE) == "chain2"
  with pytest.raises(ValueError, match="strategy"):
    DrafterEvalConfig(every=1, strategy="group4")


def test_the_drafter_evaluation_spans_several_engine_calls(models, pool):
  """More prompts than the engine's max_batch: one call per max_batch of them, each with its
  own sequence ids, and the accept length is all calls' tokens over all their row-rounds
  (not a mean of the calls' means); within one call it is that call's figure."""
  from tlt_jax.drafter.acceptance import DrafterAcceptance

  tg, tp, dg, dp = models
  engine = RolloutEngine(tg, MODEL, ENGINE, SamplingConfig(temperature=1.0), pool, dg)
  prompts = [[1 + (i % 5), 2 + i] for i in range(ENGINE.max_batch + 3)]
  many = DrafterAcceptance(engine, prompts, DrafterEvalConfig(every=1, prompts=len(prompts)))
  calls = []
  generate = many.engine.generate

  def counted(params, batch, *args, **kwargs):
    result = generate(params, batch, *args, **kwargs)
    calls.append((len(batch), kwargs["seq_id_offset"], result.spec_summary()))
    return result

  many.engine.generate = counted
  got = many.accept_length(tp, dp)
  (n0, off0, s0), (n1, off1, s1) = calls
  assert (n0, n1) == (ENGINE.max_batch, 3) and off1 - off0 == ENGINE.max_batch
  rounds = s0["row_rounds"] + s1["row_rounds"]
  assert got == pytest.approx((s0["tokens"] + s1["tokens"]) / rounds)
  one = DrafterAcceptance(engine, prompts, DrafterEvalConfig(every=1, prompts=ENGINE.max_batch))
  assert one.accept_length(tp, dp) == pytest.approx(s0["accept_length"])

"""The GRPO loop on a tiny model: end to end, exact resume, reward failures, config errors."""

import json
import time

import jax
import numpy as np
import pytest
from flax import nnx

from tlt_jax.data.tasks import format_prompt, generate_arithmetic
from tlt_jax.data.tokenizer import CharTokenizer
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.evaluation import evaluate_pass_at_1
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.rl import PolicyLossConfig, UpdateConfig
from tlt_jax.rl.rewards import RewardPool
from tlt_jax.rl.trainer import GRPOConfig, GRPOTrainer
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine
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


def _trainer(
  workdir,
  steps,
  reward_fn=seven,
  loss=None,
  update=None,
  step_reward_fn=None,
  sampling=None,
  **changes,
):
  graphdef, params = nnx.split(init_model(MODEL, seed=0))
  sampling = sampling or SamplingConfig(temperature=1.0)
  engine = RolloutEngine(graphdef, MODEL, ENGINE, sampling, POOL)
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
    loss or PolicyLossConfig(clip_high=0.28),
    update or UpdateConfig(learning_rate=3e-3, total_steps=10, micro_batch=4),
    str(workdir),
    step_reward_fn=step_reward_fn,
  )


def _comparable(row):
  return {k: v for k, v in row.items() if not k.startswith("time/") and k != "eval"}


def test_runs_and_resumes_exactly(tmp_path):
  trainer = _trainer(tmp_path / "a", 4)
  full = trainer.run(progress=False)
  assert [r["step"] for r in full] == [0, 1, 2, 3]
  assert all(r["loss/skipped"] == 0 for r in full)
  assert all(r["logp_rollout_vs_trainer_max_abs"] < 1e-3 for r in full)
  # eval_every=0: one evaluation, after the last step, of the final params: it equals an
  # independent greedy pass@1 of trainer.params on the held-out problems.
  assert [("eval" in r) for r in full] == [False, False, False, True]
  engine = RolloutEngine(trainer.graphdef, MODEL, ENGINE, SamplingConfig(temperature=0.0), POOL)
  want = evaluate_pass_at_1(engine, trainer.params, TOK, DATA[48:50], seven, format_prompt)
  assert want["num_examples"] == 2 and want["mean_length"] > 0
  assert want["accuracy"] == np.mean([seven(x["completion"], x["answer"]) for x in want["samples"]])
  assert full[-1]["eval"] == {"accuracy": want["accuracy"], "mean_length": want["mean_length"]}
  # Interrupted after two steps, resumed by a new trainer on the same workdir.
  first = _trainer(tmp_path / "b", 2).run(progress=False)
  resumed = _trainer(tmp_path / "b", 4)
  assert resumed.step == 2
  rest = resumed.run(progress=False)
  assert [r["step"] for r in rest] == [2, 3]
  for a, b in zip(full, first + rest):
    assert _comparable(a) == pytest.approx(_comparable(b), rel=1e-5, abs=1e-6)
  assert rest[-1]["eval"] == full[-1]["eval"]  # the resumed run ends with the same params
  with open(tmp_path / "b" / "metrics.jsonl") as f:
    assert [json.loads(line)["step"] for line in f] == [0, 1, 2, 3]
  # Each step's response lengths (the simulator's trace), kept beside the metrics.
  with open(tmp_path / "b" / "rollout_lengths.jsonl") as f:
    lengths = [json.loads(line) for line in f]
  assert [r["step"] for r in lengths] == [0, 1, 2, 3]
  assert [sum(map(sum, r["rollouts"])) for r in lengths] == [r["rollout_tokens"] for r in full]
  # And each row's prompt length (the cache views the simulator charges depend on them).
  for r in lengths:
    assert [len(p) for p in r["prompts"]] == [len(x) for x in r["rollouts"]]
    assert all(n >= 2 for p in r["prompts"] for n in p)  # BOS and some question


def _events(logdir):
  """(tag, step, value) of every scalar in a TensorBoard log folder (TFRecord framing)."""
  from tensorboardX.proto import event_pb2

  out = []
  for path in sorted(logdir.iterdir()):
    data = path.read_bytes()
    i = 0
    while i < len(data):
      n = int.from_bytes(data[i : i + 8], "little")
      event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
      i += 12 + n + 4
      out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
  return out


def test_learns_a_controlled_reward(tmp_path):
  """The whole loop climbs a reward it can reach: "7" in the completion goes from a
  random policy's rate to nearly always (the end-to-end sign check of the gradient)."""
  update = UpdateConfig(learning_rate=3e-2, total_steps=100, micro_batch=4)
  rows = _trainer(tmp_path, 16, update=update, max_refills=0).run(progress=False)
  first = np.mean([r["reward_mean"] for r in rows[:4]])
  last = np.mean([r["reward_mean"] for r in rows[-4:]])
  assert first < 0.5 and last > 0.85, (first, last)


def test_process_credit_learns_a_per_token_reward(tmp_path):
  """Process supervision end to end: every character is a step rewarded for being "7",
  the outcome reward is constant (so only the process advantages carry signal, and dynamic
  sampling must keep groups on their step rewards alone); the share of 7s climbs."""

  def sevens(example, completion):
    return [(i + 1, float(c == "7")) for i, c in enumerate(completion)]

  update = UpdateConfig(learning_rate=3e-2, total_steps=100, micro_batch=4)
  rows = _trainer(
    tmp_path,
    12,
    reward_fn=lambda completion, answer: 0.0,
    update=update,
    step_reward_fn=sevens,
    process_credit="step",
    max_refills=0,
  ).run(progress=False)
  # Outcome rewards are all equal: every kept group was kept for its step rewards.
  assert rows[0]["groups_used"] > 0 and rows[0]["step_reward_errors"] == 0
  first = np.mean([r["step_reward_mean"] for r in rows[:3]])
  last = np.mean([r["step_reward_mean"] for r in rows[-3:]])
  assert first < 0.1 and last > 0.5, (first, last)


def test_a_failing_step_checker_costs_its_sample_the_step_credit_only(tmp_path):
  calls = []

  def flaky(example, completion):
    calls.append(completion)
    if len(calls) % 3 == 0:
      raise RuntimeError("checker bug")
    if len(calls) % 3 == 1:
      return [(len(completion) + 5, 1.0)]  # past the end of the text: malformed
    return [(i + 1, float(c == "7")) for i, c in enumerate(completion)]

  rows = _trainer(tmp_path, 1, step_reward_fn=flaky, process_credit="step").run(progress=False)
  # Every third sample raises, every third returns a malformed step: 2/3 of the 8 samples
  # of the first rollout (refills count too).
  assert rows[0]["step_reward_errors"] >= 5
  assert rows[0]["loss/skipped"] == 0


def test_process_credit_needs_a_step_checker(tmp_path):
  with pytest.raises(ValueError, match="needs a step_reward_fn"):
    _trainer(tmp_path, 1, process_credit="step")
  with pytest.raises(ValueError, match="process_credit must be"):
    GRPOConfig(process_credit="token")
  with pytest.raises(ValueError, match="process_coef"):
    GRPOConfig(process_credit="step", process_coef=-1.0)


def test_ppo_mini_batches_and_tensorboard(tmp_path):
  update = UpdateConfig(
    learning_rate=3e-2, total_steps=100, micro_batch=2, mini_batches=2, epochs=2
  )
  rows = _trainer(tmp_path, 2, update=update, max_refills=0).run(progress=False)
  for r in rows:
    assert r["loss/optimizer_steps"] == 4
    # Later mini-batches see a moved policy: the ratio leaves 1 and the clip can bind.
    assert r["loss/approx_kl"] > 0 and r["loss/ratio_max"] > 1.0
    assert r["time/other"] >= 0
  events = _events(tmp_path / "tensorboard")
  rewards = [(step, v) for tag, step, v in events if tag == "reward_mean"]
  assert rewards == [(r["step"], pytest.approx(r["reward_mean"])) for r in rows]
  assert {"loss/approx_kl", "time/rollout", "eval/accuracy"} <= {tag for tag, _, _ in events}


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (0, 0.7)])
def test_truncated_rollouts_are_scored_as_sampled(tmp_path, top_k, top_p):
  """Rollouts at top-k / top-p: the trainer's old log-probs (recomputed on packed rows)
  equal the log-probs the rollout recorded, both of the truncated distribution sampled
  from. Either side untruncated is off by -log(kept mass) (3.5 at top-k 3, 0.36 at top-p
  0.7 for this near-uniform policy), so the ratio would refer to another policy."""
  sampling = SamplingConfig(temperature=1.0, top_k=top_k, top_p=top_p)
  loss = PolicyLossConfig(clip_high=0.28, top_k=top_k, top_p=top_p)
  # Every group used (no dynamic sampling): the comparison covers all sampled tokens.
  trainer = _trainer(tmp_path, 1, loss=loss, sampling=sampling, dynamic_sampling=False)
  rows = trainer.run(progress=False)
  assert rows[0]["loss/skipped"] == 0 and rows[0]["update_tokens"] > 0
  assert rows[0]["logp_rollout_vs_trainer_max_abs"] < 1e-4
  assert abs(rows[0]["loss/ratio_max"] - 1.0) < 1e-4


def test_loss_must_score_the_engines_sampling(tmp_path):
  cases = [
    (SamplingConfig(temperature=1.0, top_k=3), PolicyLossConfig(), "top_k=3 .* top_k=0"),
    (
      SamplingConfig(temperature=1.0, top_p=0.7),
      PolicyLossConfig(top_p=0.9),
      "top_p=0.7 .* top_p=0.9",
    ),
    (SamplingConfig(temperature=0.7), PolicyLossConfig(), "temperature=0.7 .* temperature=1.0"),
  ]
  for sampling, loss, match in cases:
    with pytest.raises(ValueError, match=match):
      _trainer(tmp_path, 1, loss=loss, sampling=sampling)


def test_kl_reference_is_frozen_and_checkpointed(tmp_path):
  loss = PolicyLossConfig(clip_high=0.28, kl_coef=0.5)
  trainer = _trainer(tmp_path, 2, loss=loss)
  start = jax.tree.map(np.array, nnx.to_pure_dict(trainer.params))  # params are donated
  rows = trainer.run(progress=False)
  assert rows[0]["loss/kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference at first
  assert rows[1]["loss/kl"] > 0
  resumed = _trainer(tmp_path, 3, loss=loss)
  assert resumed.step == 2
  same = lambda a, b: all(
    np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )
  assert same(nnx.to_pure_dict(resumed.ref_params), start)
  assert not same(nnx.to_pure_dict(resumed.params), start)


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


def test_format_reward():
  from tlt_jax.data.checkers import check_arithmetic, extract_marked_answer
  from tlt_jax.rl.rewards import with_format_reward

  fn = with_format_reward(check_arithmetic, extract_marked_answer, 0.1)
  assert fn("1;a+2=3;#3", "3") == pytest.approx(1.1)
  assert fn("1;a+2=4;#4", "3") == pytest.approx(0.1)
  assert fn("1;a+2=3;", "3") == 0.0
  assert with_format_reward(check_arithmetic, extract_marked_answer, 0.0) is check_arithmetic
  with pytest.raises(ValueError, match="format reward"):
    with_format_reward(check_arithmetic, extract_marked_answer, 0.5)


def test_sampled_evaluation_is_keyed_and_counts_every_sample(tmp_path):
  from tlt_jax.evaluation import evaluate_pass_at_1

  trainer = _trainer(tmp_path, 1, eval_samples=3)
  row = trainer.evaluate()
  assert 0.0 <= row["sampled_accuracy"] <= 1.0
  assert trainer.evaluate() == row  # a fixed key: the same samples again
  calls = []

  def counting(completion, answer):
    calls.append(completion)
    return seven(completion, answer)

  args = (trainer.engine, trainer.params, TOK, trainer.evals, counting, format_prompt)
  out = evaluate_pass_at_1(*args, sampling=trainer.engine.sampling, num_samples=3)
  assert out["num_samples"] == 3 and len(calls) == 3 * len(trainer.evals)
  assert out["accuracy"] == pytest.approx(np.mean([seven(c, "") for c in calls]))
  with pytest.raises(ValueError, match="num_samples"):
    evaluate_pass_at_1(*args, num_samples=2)  # greedy samples are all the same


def test_the_last_step_is_checkpointed_even_when_its_update_was_skipped(tmp_path):
  """checkpoint_every=3 and 2 steps: only the last step is due, and its update is skipped
  (as the non-finite guard does): it is saved all the same (the params are unchanged)."""
  import dataclasses

  trainer = _trainer(tmp_path, 2)
  trainer.cfg = dataclasses.replace(trainer.cfg, checkpoint_every=3)
  optimize = trainer._optimize

  def skipped_last(samples, width):
    m = optimize(samples, width)
    return {**m, "skipped": 1.0} if trainer.step == 1 else m

  trainer._optimize = skipped_last
  rows = trainer.run(progress=False)
  assert [r["loss/skipped"] for r in rows] == [0.0, 1.0]
  assert trainer.checkpoints.policy.all_steps() == [2]
  assert _trainer(tmp_path, 2).step == 2

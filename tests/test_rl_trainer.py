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
from tlt_jax.sim import run_costs

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
  scheduler=None,
  **changes,
):
  graphdef, params = nnx.split(init_model(MODEL, seed=0))
  sampling = sampling or SamplingConfig(temperature=1.0)
  engine = RolloutEngine(graphdef, MODEL, ENGINE, sampling, POOL)
  defaults = dict(prompts_per_step=2, group_size=4, eval_every=0, eval_examples=2)
  cfg = GRPOConfig(steps=steps, checkpoint_every=1, reward_workers=2, **{**defaults, **changes})
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
    scheduler=scheduler,
  )


# Metrics measured in seconds (or per second): they differ from run to run.
TIMED = ("time/", "update/model_tflops")


def _comparable(row):
  return {
    k: v
    for k, v in row.items()
    if not k.startswith(TIMED) and k not in ("eval", "first_token_share")
  }


def _assert_same_step(a, b):
  """Two runs' rows of one step agree: numbers to float tolerance, text (the responses'
  opening-token shares, JSON) exactly."""
  assert a["first_token_share"] == b["first_token_share"]
  assert _comparable(a) == pytest.approx(_comparable(b), rel=1e-5, abs=1e-6)


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
  # Written as checkpoints were before the data cursor had a state of its own: the bare
  # position under "cursor". It resumes the same.
  meta_path = tmp_path / "b" / "checkpoints" / "2" / "meta" / "metadata"
  meta = json.loads(meta_path.read_text())
  assert set(meta["data"]) == {"position"}  # prompts read, refills included
  meta_path.write_text(json.dumps({"step": meta["step"], "cursor": meta["data"]["position"]}))
  resumed = _trainer(tmp_path / "b", 4)
  assert resumed.step == 2
  rest = resumed.run(progress=False)
  assert [r["step"] for r in rest] == [2, 3]
  for a, b in zip(full, first + rest):
    _assert_same_step(a, b)
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
    # And each row's completion as a CRC-32 (runs and replays compared token for token).
    assert [len(d) for d in r["digests"]] == [len(x) for x in r["rollouts"]]
    assert len(set(sum(r["digests"], []))) > 1
  # And each call's timeline and wall seconds: the run's own engine costs (`sim.run_costs`).
  with open(tmp_path / "b" / "rollout_timelines.jsonl") as f:
    timelines = [json.loads(line) for line in f]
  assert [r["step"] for r in timelines] == [0, 1, 2, 3]
  for r, lens in zip(timelines, lengths):
    assert len(r["rollouts"]) == len(lens["rollouts"])
    for call in r["rollouts"]:
      last = max(e["t"] + e["dt"] for e in call["timeline"])
      assert 0 < last <= call["wall"]
      assert {"prefill", "decode"} <= {e["phase"] for e in call["timeline"]}
  pooled, drift = run_costs(timelines, {1, 2, 3})
  assert pooled.cells["plain"] and sorted(drift) == [1, 2, 3]
  assert all(0 < d < 10 for d in drift.values())


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
  with pytest.raises(ValueError, match="transfer_guard must be one of"):
    GRPOConfig(transfer_guard="warn")


@pytest.mark.parametrize("guard", ["disallow", "allow"])
def test_the_loop_refuses_a_hidden_host_to_device_copy(tmp_path, guard):
  """The loop's steps run under JAX's host-to-device transfer guard: the library's own
  transfers are explicit (this step runs under "disallow"), and a NumPy array handed to a
  jitted function inside a step, as a change to the rollout might, fails there."""
  trainer = _trainer(tmp_path, 1, transfer_guard=guard)
  generate, double = trainer.engine.generate, jax.jit(lambda x: 2 * x)

  def generate_and_copy(*args, **kwargs):
    double(np.ones(3, np.float32))  # an implicit copy: no jax.device_put
    return generate(*args, **kwargs)

  trainer.engine.generate = generate_and_copy
  if guard == "allow":
    assert len(trainer.run(progress=False)) == 1
  else:
    with pytest.raises(jax.errors.JaxRuntimeError, match="Disallowed host-to-device transfer"):
      trainer.run(progress=False)


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


def _recording(trainer, scored=None):
  """Wraps the trainer's engine.generate: returns the list of (tokens, seq_id_offset) of its
  rollout calls; with `scored` (the completions the reward function has seen), also whether, when
  a call started, every earlier call's completions had been scored meanwhile (waits 5 s)."""
  calls, generate = [], trainer.engine.generate

  def record(*args, **kwargs):
    if "sampling" in kwargs:  # a held-out evaluation's
      return generate(*args, **kwargs)
    overlapped = None
    if scored is not None and calls:
      rows = sum(len(c[0]) for c in calls)
      deadline = time.perf_counter() + 5.0
      while len(scored) < rows and time.perf_counter() < deadline:
        time.sleep(0.01)
      overlapped = len(scored) >= rows
    result = generate(*args, **kwargs)
    calls.append((np.array(result.tokens), kwargs["seq_id_offset"], overlapped))
    return result

  trainer.engine.generate = record
  return calls


def _leaves(params):
  return [np.asarray(x) for x in jax.tree.leaves(params)]


def _lengths(workdir):
  """Per step, (response lengths, prompt lengths, completion digests) per engine call:
  rollout_lengths.jsonl."""
  with open(workdir / "rollout_lengths.jsonl") as f:
    return [(r["rollouts"], r["prompts"], r["digests"]) for r in map(json.loads, f)]


def test_rows_per_call_rolls_out_the_same_step_in_several_calls(tmp_path):
  """rows_per_call=G: each batch of P x G rows is P engine calls of one group, each with
  its own sequence-id offset and the batch's key, so the step's tokens, rewards, refills
  and update are those of one call per batch, bit for bit; each call's rewards are scored
  while the next call decodes; rollout_lengths has one entry per call."""
  scored = []

  def seven_seen(completion, answer):
    scored.append(completion)
    return seven(completion, answer)

  runs = {}
  for rows_per_call in (0, 4):
    scored.clear()
    trainer = _trainer(
      tmp_path / str(rows_per_call), 3, reward_fn=seven_seen, rows_per_call=rows_per_call
    )
    calls = _recording(trainer, scored if rows_per_call else None)
    rows = trainer.run(progress=False)
    runs[rows_per_call] = (rows, calls, _leaves(trainer.params))
  (one, one_calls, one_params), (split, split_calls, split_params) = runs[0], runs[4]
  one_lengths, split_lengths = _lengths(tmp_path / "0"), _lengths(tmp_path / "4")
  assert sum(r["refills"] for r in one) > 0  # refills are split into calls too
  assert [r["rollout_calls"] for r in one] == [1 + r["refills"] for r in one]
  assert [r["rollout_calls"] for r in split] == [2 * (1 + r["refills"]) for r in one]
  assert len(split_calls) == 2 * len(one_calls)
  for (tokens, offset, _), halves in zip(one_calls, zip(split_calls[::2], split_calls[1::2])):
    np.testing.assert_array_equal(np.concatenate([h[0] for h in halves]), tokens)
    assert [h[1] for h in halves] == [offset, offset + 4]
  assert all(c[2] for c in split_calls[1:])  # the reward pool kept up with the calls
  strip = lambda r: {k: v for k, v in _comparable(r).items() if k != "rollout_calls"}
  for a, b, la, lb in zip(one, split, one_lengths, split_lengths, strict=True):
    for x, y in zip(la, lb):  # responses, prompts, tokens: the same rows, a list per call
      assert sum(x, []) == sum(y, []) and len(y) == b["rollout_calls"]
    assert strip(a) == strip(b)
  for x, y in zip(one_params, split_params, strict=True):
    np.testing.assert_array_equal(x, y)


def test_rows_per_call_validation(tmp_path):
  with pytest.raises(ValueError, match="rows_per_call .* multiple of group_size"):
    GRPOConfig(group_size=4, rows_per_call=6)
  with pytest.raises(ValueError, match="rows_per_call must be an int >= 0"):
    GRPOConfig(group_size=4, rows_per_call=-4)
  with pytest.raises(ValueError, match="rows_per_call \\(16\\) exceeds the engine's max_batch 8"):
    _trainer(tmp_path, 1, rows_per_call=16)
  # 4 prompts x 4 samples > max_batch 8: one call cannot, calls of 8 rows can.
  with pytest.raises(ValueError, match="exceeds the engine's max_batch 8; set .*rows_per_call"):
    _trainer(tmp_path, 1, prompts_per_step=4)
  assert _trainer(tmp_path, 1, prompts_per_step=4, rows_per_call=8).cfg.rows_per_call == 8


def _trainer_with_pass(workdir, steps, **changes):
  """A trainer that runs the old-log-prob pass even for one optimizer step per batch."""
  trainer = _trainer(workdir, steps, **changes)
  trainer.skip_old_logp = False
  trainer.update = trainer._make_update()
  return trainer


def test_one_optimizer_step_skips_the_old_logprob_pass(tmp_path):
  """mini_batches = epochs = 1: no old-log-prob pass runs (time/old_logp 0), the update
  takes its own forward's log-probs as the old ones and gives the same params as the
  update fed the pass's (float tolerance: another program); the rollout-vs-trainer check
  comes from the update's forward, small either way. And the update's throughput figures:
  every token of the samples (prompts and responses, here all groups) and its padding."""
  skipped = _trainer(tmp_path / "skip", 1, dynamic_sampling=False)
  assert skipped.skip_old_logp

  def no_pass(results):
    raise AssertionError("the old-log-prob pass ran")

  skipped._old_logp = no_pass
  passed = _trainer_with_pass(tmp_path / "pass", 1, dynamic_sampling=False)
  (a,), (b,) = skipped.run(progress=False), passed.run(progress=False)
  assert a["time/old_logp"] == 0.0 and b["time/old_logp"] > 0.0
  (lengths,) = _lengths(tmp_path / "skip")
  assert a["reward_mean"] == b["reward_mean"] and [lengths] == _lengths(tmp_path / "pass")
  assert a["loss/ratio_max"] == 1.0 and abs(b["loss/ratio_max"] - 1.0) < 1e-4
  for row in (a, b):
    assert row["loss/skipped"] == 0
    assert 0 <= row["logp_rollout_vs_trainer_max_abs"] < 1e-4
  for x, y in zip(_leaves(skipped.params), _leaves(passed.params), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
  assert a["loss/grad_norm"] == pytest.approx(b["loss/grad_norm"], rel=1e-4)
  tokens = sum(sum(sum(x, [])) for x in lengths[:2])  # responses and prompts
  assert a["update/real_tokens"] == tokens
  assert a["update/padding_fraction"] == pytest.approx(1 - a["loss/update_fill"])
  assert 0 < a["update/padding_fraction"] < 1 and a["update/model_tflops"] > 0
  assert 0 <= a["update/computed_padding"] <= a["update/padding_fraction"]
  assert a["update/computed_padding"] == pytest.approx(1 - a["loss/update_computed_fill"])
  # Several optimizer steps per batch keep the pass (its log-probs are the old policy's).
  ppo = UpdateConfig(learning_rate=3e-3, total_steps=10, micro_batch=2, mini_batches=2)
  assert not _trainer(tmp_path / "ppo", 1, update=ppo).skip_old_logp


def test_lr_multipliers_train_and_resume_exactly(tmp_path):
  """Per-group learning rates in the trainer: the optimizer state (one AdamW per group)
  is checkpointed and restored, so an interrupted run resumes exactly."""
  update = UpdateConfig(
    learning_rate=3e-3, total_steps=10, micro_batch=4, lr_multipliers="final_norm=30,embed=3"
  )
  full = _trainer(tmp_path / "a", 2, update=update)
  rows = full.run(progress=False)
  assert all(r["loss/skipped"] == 0 for r in rows)
  _trainer(tmp_path / "b", 1, update=update).run(progress=False)
  resumed = _trainer(tmp_path / "b", 2, update=update)
  assert resumed.step == 1
  rest = resumed.run(progress=False)
  _assert_same_step(rest[0], rows[1])
  for x, y in zip(_leaves(full.params), _leaves(resumed.params), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


class _FakeScheduler:
  """Records the trainer's scheduler calls (TLT mode's call sites); trains nothing."""

  def __init__(self):
    self.log = []
    self.drafter = self
    self.compile_seconds = 0.0  # the drafter's update compiles

  def begin_rollout(self, params):
    self.log.append("begin")

  def on_chunk(self, batch, rebuild_s=0.0):
    return None

  def end_rollout(self):
    self.log.append("end")

  def observe(self, result, step):
    self.log.append(("observe", len(result.length), step))

  def fill(self, window, busy, params):
    self.log.append(("fill", window, isinstance(busy(), bool)))
    return 0

  def between_calls(self, params):
    self.log.append("between")
    return 0.0


def test_rows_per_call_brackets_each_call_for_the_scheduler(tmp_path):
  """TLT's call sites with several engine calls: each call is its own rollout for the
  slice scheduler (begin_rollout / end_rollout, and the online drafter observes its rows),
  and the reward window opens once, after the batch's last call; between two calls the
  drafter gets its turn (`between_calls`), timed as the drafter's phase."""
  trainer = _trainer(tmp_path, 1, rows_per_call=4, max_refills=0, scheduler=_FakeScheduler())
  rewards = RewardPool(seven, workers=2)
  try:
    row = trainer.train_step(rewards)
  finally:
    rewards.close()
  call = ["begin", "end", ("observe", 4, 0)]
  assert trainer.scheduler.log == [*call, "between", *call, ("fill", "reward", True)]
  assert "time/drafter" in row
  assert row["rollout_calls"] == 2 and row["loss/skipped"] == 0
  # The commonest opening tokens of the step's responses, as JSON text any sink can hold.
  shares = json.loads(row["first_token_share"])
  assert shares and all(0 < v <= 1 for v in shares.values()) and sum(shares.values()) <= 1

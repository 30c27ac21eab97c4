"""A trained policy taken away (tlt_jax.export): the end-of-run export of a job on a tiny
random Hugging Face checkpoint, `python -m tlt_jax.export` on that workdir and on a run of
the built-in model with the char tokenizer, each loaded by transformers with logits within
1e-4 of the trained policy's; the warning when a dtype rounds the training away."""

from __future__ import annotations

import json
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bpe_helpers import write_qwen3_checkpoint
from flax import nnx

from tlt_jax import configuration
from tlt_jax.data.tasks import format_prompt, generate_arithmetic
from tlt_jax.data.tokenizer import CharTokenizer
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.export import (
  PrecisionWarning,
  export_policy,
  export_workdir,
  main,
  policy_steps,
  restore_policy,
  rounded_away,
)
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.hf_io import load_hf_checkpoint
from tlt_jax.models.transformer import Transformer, init_model
from tlt_jax.rl import PolicyLossConfig, UpdateConfig
from tlt_jax.rl.trainer import GRPOTrainer
from tlt_jax.rollout.config import EngineConfig
from tlt_jax.rollout.engine import RolloutEngine
from tlt_jax.train import train_and_evaluate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from configs import default, hf_grpo  # noqa: E402


def parity_reward(completion: str, answer: str) -> float:
  """A reward a random policy's samples differ in (so the update moves the weights)."""
  return float(len(completion) % 2)


def _logits_ours(graphdef, params, tokens):
  model = nnx.merge(graphdef, params)
  b, t = tokens.shape
  hidden, _, _ = model(jnp.asarray(tokens), jnp.broadcast_to(jnp.arange(t), (b, t)))
  return np.asarray(model.logits(hidden), np.float32)


def _logits_hf(path, tokens, dtype=torch.float32):
  model, info = transformers.AutoModelForCausalLM.from_pretrained(
    path, attn_implementation="eager", dtype=dtype, output_loading_info=True
  )
  assert not any(info.values()), info  # every weight from the files
  with torch.no_grad():
    out = model.eval()(torch.from_numpy(tokens.astype(np.int64))).logits
  return out.float().numpy()


def _restored(model_cfg, pure):
  """Our graph and the given nested dict of arrays as its params."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(model_cfg, rngs=nnx.Rngs(0))))
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, pure))
  return graphdef, state


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
  """A Qwen3-layout random model with a ChatML BPE tokenizer (eos <|im_end|>, no BOS)."""
  return write_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3_tiny"))


def _hf_job(checkpoint_dir, data_file):
  config = hf_grpo.get_config()
  config.model.checkpoint = str(checkpoint_dir)
  config.task.path = str(data_file)
  config.task.test_fraction = 0.25
  config.engine.max_prompt_len = 48
  config.engine.max_new_tokens = 16
  config.engine.max_batch = 8
  config.engine.spec_threshold = 8
  config.engine.min_batch_bucket = 4
  config.engine.min_cache_bucket = 64
  config.engine.min_prompt_bucket = 48
  config.engine.chunk_steps = 8
  config.rollout.num_prompts = 0
  config.eval.num_examples = 2
  config.rl.steps = 1
  config.rl.prompts_per_step = 2
  config.rl.group_size = 4
  config.rl.dynamic_sampling = False
  config.rl.eval_every = 0
  config.rl.eval_examples = 2
  config.rl_update.micro_batch = 2
  config.rl_update.warmup_steps = 0
  # Weighted reward terms (rl.rewards) by name, one of them a function of this module.
  config.rl.rewards = "task=1,format:gsm8k=0.1,test_export:parity_reward=0.5"
  config.export.dir = "hf"
  return config


def test_a_job_exports_its_trained_policy_for_transformers(tmp_path, checkpoint_dir, capsys):
  """export.dir: at the end of the run the trained policy is a directory transformers
  loads, with the logits of the trained float32 params (the newest RL checkpoint), the
  tokenizer's files, eos in config.json and the rollout's sampling in
  generation_config.json. The CLI writes the same files; in bfloat16 it warns that lr-1e-6
  updates round away."""
  rows = [
    {"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}={a + b}. #### {a + b}"}
    for a in range(1, 7)
    for b in range(1, 5)
  ]
  data = tmp_path / "sums.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in rows))
  config = _hf_job(checkpoint_dir, data)
  workdir = tmp_path / "run"
  summary = train_and_evaluate(config, str(workdir), progress=False)
  out = workdir / "hf"
  assert summary["export"]["dir"] == str(out) and summary["export"]["dtype"] == "float32"
  assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= set(
    os.listdir(out)
  )
  assert policy_steps(workdir) == [1]

  tok = configuration.tokenizer(config)
  model_cfg, start = load_hf_checkpoint(checkpoint_dir)
  trained, _ = restore_policy(workdir)
  initial = nnx.to_pure_dict(nnx.state(start, nnx.Param))
  assert any(  # RL moved the weights: the export is not the starting checkpoint
    not np.array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(initial), strict=True)
  )
  tokens = np.asarray([tok.encode("What is 2 plus 3? 2+3=5. #### 5")[:14]] * 2, np.int32)
  ours = _logits_ours(*_restored(model_cfg, trained), tokens)
  assert np.max(np.abs(_logits_hf(out, tokens) - ours)) < 1e-4

  hf_config = json.loads((out / "config.json").read_text())
  assert hf_config["model_type"] == "qwen3" and hf_config["eos_token_id"] == tok.eos_id
  assert "bos_token_id" not in hf_config  # this tokenizer starts no sequence with one
  gen = transformers.GenerationConfig.from_pretrained(out)
  assert gen.eos_token_id == tok.eos_id and gen.do_sample and gen.temperature == 1.0
  assert gen.top_k == 0 and gen.top_p == 1.0 and gen.max_new_tokens == 16
  for name in ("tokenizer.json", "tokenizer_config.json"):  # the run's own, as they were
    assert (out / name).read_bytes() == (checkpoint_dir / name).read_bytes()

  # The CLI on the workdir: the same weights; bfloat16 warns and still loads.
  assert main([f"--workdir={workdir}", f"--out={tmp_path / 'cli'}"]) == 0
  assert (tmp_path / "cli" / "model.safetensors").read_bytes() == (
    out / "model.safetensors"
  ).read_bytes()
  capsys.readouterr()
  assert main([f"--workdir={workdir}", f"--out={tmp_path / 'bf16'}", "--dtype=bfloat16"]) == 0
  assert "warning: exporting in bfloat16 rounds away" in capsys.readouterr().err
  assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
  half = _logits_hf(tmp_path / "bf16", tokens, torch.bfloat16)
  assert np.max(np.abs(half - ours)) < 0.1
  assert main([f"--workdir={tmp_path / 'nowhere'}", f"--out={tmp_path / 'x'}"]) == 2


def test_cli_exports_a_char_tokenizer_run(tmp_path, capsys):
  """The built-in model and the char tokenizer (no tokenizer files to copy): the newest
  RL checkpoint as a Llama with tied embeddings, eos / bos / pad ids in config.json."""
  config = default.get_config("tiny")
  model_cfg = configuration.model_config(config, CharTokenizer())
  graphdef, params = nnx.split(init_model(model_cfg, seed=0))
  engine_cfg = EngineConfig(
    max_prompt_len=48,
    max_new_tokens=16,
    max_batch=8,
    min_batch_bucket=8,
    min_cache_bucket=64,
    min_prompt_bucket=48,
    compact=False,
    capture_hidden=False,
    stop_tokens=(CharTokenizer().eos_id,),
  )
  engine = RolloutEngine(graphdef, model_cfg, engine_cfg, SamplingConfig(temperature=1.0))
  data = generate_arithmetic(0, 16, max_steps=2, max_operand=9, max_value=99, style="labelled")
  workdir = tmp_path / "run"
  trainer = GRPOTrainer(
    graphdef, params, engine, CharTokenizer(), data, data[:2], parity_reward, format_prompt,
    configuration.GRPOConfig(
      steps=2, prompts_per_step=2, group_size=4, eval_every=0, eval_examples=2,
      checkpoint_every=1, dynamic_sampling=False, reward_workers=1,
    ),
    PolicyLossConfig(kl_coef=0.01, kl_type="k2"),
    UpdateConfig(learning_rate=1e-2, total_steps=2, micro_batch=4), str(workdir),
  )  # fmt: skip
  trainer.run(progress=False)
  (workdir / "config.json").write_text(config.to_json_best_effort())
  assert main([f"--workdir={workdir}", f"--out={tmp_path / 'hf'}"]) == 0
  assert "from " in capsys.readouterr().out
  out = tmp_path / "hf"
  assert "tokenizer.json" not in os.listdir(out)
  hf_config = json.loads((out / "config.json").read_text())
  assert hf_config["model_type"] == "llama" and hf_config["tie_word_embeddings"]
  assert (hf_config["eos_token_id"], hf_config["bos_token_id"], hf_config["pad_token_id"]) == (
    2,
    1,
    0,
  )
  tok = CharTokenizer()
  tokens = np.asarray([tok.encode("3+4=7;7*2=14", add_bos=True)] * 2, np.int32)
  ours = _logits_ours(graphdef, trainer.params, tokens)
  assert np.max(np.abs(_logits_hf(out, tokens) - ours)) < 1e-4
  # An older step, and the KL reference as the training's start for the rounding check.
  summary = export_workdir(workdir, tmp_path / "step1", dtype="float16", step=1)
  assert summary["source"].endswith("step 1") and summary["rounding"]["changed"] > 0


def test_the_rounding_warning(tmp_path):
  """rounded_away counts the weights training changed whose change a cast undoes; the
  export warns when that is most of them, never in float32."""
  cfg = ModelConfig(
    vocab_size=16, num_layers=1, d_model=8, num_heads=2, num_kv_heads=1, head_dim=4, mlp_dim=16
  )
  initial = nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1])
  tiny = jax.tree.map(lambda x: np.asarray(x) * (1 + 1e-6), initial)  # lr-1e-6-sized steps
  big = jax.tree.map(lambda x: np.asarray(x) * 1.5 + 0.25, initial)
  r = rounded_away(tiny, initial, "bfloat16")
  assert r["changed"] > 0 and r["fraction"] > 0.99
  assert rounded_away(big, initial, "bfloat16")["fraction"] < 0.01
  assert rounded_away(tiny, initial, "float32")["fraction"] == 0.0
  assert rounded_away(initial, initial, "float16") == {
    "changed": 0.0,
    "rounded_away": 0.0,
    "fraction": 0.0,
  }
  common = dict(eos_token_id=2, initial=initial)
  with pytest.warns(PrecisionWarning, match="float16 rounds away"):
    export_policy(tiny, cfg, tmp_path / "a", dtype="float16", **common)
  with warnings.catch_warnings():
    warnings.simplefilter("error", PrecisionWarning)
    export_policy(big, cfg, tmp_path / "b", dtype="bfloat16", **common)
    summary = export_policy(tiny, cfg, tmp_path / "c", **common)
  assert summary["rounding"] is None and summary["dtype"] == "float32"
  with pytest.raises(ValueError, match="dtype"):
    export_policy(tiny, cfg, tmp_path / "d", dtype="int8", eos_token_id=2)

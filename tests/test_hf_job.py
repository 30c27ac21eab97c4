"""configs/hf_grpo.py end to end on a tiny random checkpoint written here: the job imports the
checkpoint and its tokenizer, renders prompts with the chat template, trains on a local .jsonl
file with the GSM8K checker, and refuses the toy task's RL settings on a checkpoint."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from bpe_helpers import write_qwen3_checkpoint

from tlt_jax import configuration
from tlt_jax.train import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from configs import default, hf_grpo  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
  """A Qwen3-layout random model (q/k norms) with a ChatML BPE tokenizer and no BOS."""
  return write_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3_tiny"))


@pytest.fixture
def data_file(tmp_path):
  rows = [
    {"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}={a + b}. #### {a + b}"}
    for a in range(1, 7)
    for b in range(1, 5)
  ]
  path = tmp_path / "sums.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _small(config, checkpoint_dir, data_file):
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
  config.rollout.num_prompts = 2
  config.rollout.num_samples = 2
  config.eval.num_examples = 2
  config.rl.steps = 1
  config.rl.prompts_per_step = 2
  config.rl.group_size = 2
  config.rl.dynamic_sampling = False  # a random policy's groups all score 0: keep them
  config.rl.eval_every = 1
  config.rl.eval_examples = 2
  config.rl_update.micro_batch = 2
  config.rl_update.warmup_steps = 0
  return config


def test_hf_grpo_job_runs_on_a_checkpoint_and_a_jsonl_file(tmp_path, checkpoint_dir, data_file):
  config = _small(hf_grpo.get_config(), checkpoint_dir, data_file)
  tok = configuration.tokenizer(config)  # the checkpoint's own
  prompt = configuration.prompt_format(config, tok)({"question": "What is 1 plus 2?"})
  assert prompt == "<|im_start|>user\nWhat is 1 plus 2?<|im_end|>\n<|im_start|>assistant\n"
  assert not tok.uses_bos
  summary = train_and_evaluate(config, str(tmp_path / "run"), progress=False)
  assert summary["warm_start"]["source"] == str(checkpoint_dir)
  assert summary["rl"]["steps"] == 1 and summary["rollout"]["sequences"] == 4


def test_toy_rl_settings_are_refused_on_a_checkpoint(tmp_path, checkpoint_dir, data_file):
  config = _small(default.get_config("tiny"), checkpoint_dir, data_file)
  config.task.name = "local"
  config.task.tokenizer = str(checkpoint_dir)
  with pytest.raises(ValueError, match="RL settings are the toy task's"):
    train_and_evaluate(config, str(tmp_path / "run"), progress=False)
  config.model.checkpoint = str(tmp_path / "nowhere")
  with pytest.raises(
    configuration.ConfigError, match="config.model.checkpoint=.*no such directory"
  ):
    train_and_evaluate(config, str(tmp_path / "run"), progress=False)
  assert not (tmp_path / "run" / "tfds").exists()  # refused before the dataset was built


def _readme_section(title: str) -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  start = text.index(f"\n## {title}")
  return text[start : text.index("\n## ", start + 1)]


def test_the_readmes_own_model_commands_run_as_written(tmp_path, checkpoint_dir, data_file):
  """The README's "Your own model and data" job and its export line, run as a user would
  from the repository root: only the files (a tiny Qwen3 checkpoint, GSM8K-format jsonl)
  and the shapes are this test's (tiny sizes, one RL step)."""
  section = _readme_section("Your own model and data")
  block = section.split("```bash\n", 1)[1].split("```", 1)[0]
  argv = shlex.split(block.replace("\\\n", " "))
  assert argv[:3] == ["python", "-m", "tlt_jax.main"], argv
  test_file = tmp_path / "test.jsonl"
  test_file.write_text(
    "".join(
      json.dumps({"question": f"What is {a} plus 5?", "answer": f"{a}+5={a + 5}. #### {a + 5}"})
      + "\n"
      for a in range(1, 4)
    )
  )
  ours = {
    "--workdir": str(tmp_path / "run"),
    "--config.model.checkpoint": str(checkpoint_dir),
    "--config.task.path": str(data_file),
    "--config.task.test_path": str(test_file),
  }
  args = []
  for arg in argv[3:]:
    name = arg.split("=", 1)[0]
    assert name == "--config" or name in ours, f"the README's command has a new flag: {arg}"
    args.append(f"{name}={ours[name]}" if name in ours else arg)
  small = _small(hf_grpo.get_config(), checkpoint_dir, data_file)
  shapes = [
    f"--config.{section}.{field}={getattr(small[section], field)}"
    for section, fields in {
      "engine": (
        "max_prompt_len",
        "max_new_tokens",
        "max_batch",
        "spec_threshold",
        "min_batch_bucket",
        "min_cache_bucket",
        "min_prompt_bucket",
        "chunk_steps",
      ),
      "rollout": ("num_prompts", "num_samples"),
      "eval": ("num_examples",),
      "rl": ("steps", "prompts_per_step", "group_size", "dynamic_sampling", "eval_examples"),
      "rl_update": ("micro_batch", "warmup_steps"),
    }.items()
    for field in fields
  ]
  run = subprocess.run(
    [sys.executable, "-m", "tlt_jax.main", *args, *shapes],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  with open(tmp_path / "run" / "summary.json") as f:
    assert json.load(f)["rl"]["steps"] == 1
  # "Take the trained policy away": the export line as the README writes it.
  (line,) = re.findall(r"`(python -m tlt_jax\.export [^`]*)`", section)
  placeholders = {
    "--workdir=W": f"--workdir={tmp_path / 'run'}",
    "--out=D": f"--out={tmp_path / 'out'}",
  }
  export = [placeholders.get(arg, arg) for arg in shlex.split(line)]
  assert export[:3] == ["python", "-m", "tlt_jax.export"] and len(export) == 5, export
  out = subprocess.run(
    [sys.executable, *export[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stderr[-3000:]
  for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
    assert (tmp_path / "out" / name).exists(), name

"""What a user gets wrong, reported in one line before anything is built: a missing
or incomplete checkpoint, a config.json the loader does not understand, malformed data rows,
rows without the configured keys, reference answers the checker cannot read, rl.steps < 0;
and a run whose steps took no optimizer step says so in its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tlt_jax import configuration
from tlt_jax.data import checkers
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.hf_io import save_hf_checkpoint
from tlt_jax.models.transformer import init_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from configs import default  # noqa: E402


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A one-layer Llama-layout checkpoint (weights only: the tests give the tokenizer)."""
  path = tmp_path_factory.mktemp("llama_tiny")
  config = ModelConfig(
    vocab_size=100, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
  )
  save_hf_checkpoint(init_model(config, seed=0), config, path, model_type="llama")
  return path


def _copy(src, dst):
  import shutil

  return shutil.copytree(src, dst)


def _on_checkpoint(path):
  config = default.get_config("tiny")
  config.model.checkpoint = str(path)
  config.rl.steps = 0  # the toy task's lr on a checkpoint is refused: not what is tested here
  return config


def _edit_config_json(path, **updates):
  hf = json.loads((path / "config.json").read_text())
  hf.update(updates)
  (path / "config.json").write_text(json.dumps(hf))


def test_a_good_checkpoint_passes_with_its_config(hf_dir):
  model = configuration.checkpoint(_on_checkpoint(hf_dir))
  assert model.num_layers == 1 and model.d_model == 16


@pytest.mark.parametrize(
  "damage,message",
  [
    ("missing", r"config.model.checkpoint='.*nowhere': no such directory"),
    ("no_config", r"no config.json \(a Hugging Face checkpoint directory holds"),
    ("bad_json", r"config.json is not readable JSON"),
    ("model_type", r"unsupported model_type 'mistral'"),
    ("rope_type", r"rope_type 'yarn' is not supported"),
    ("no_weights", r"no safetensors weights in"),
    ("bad_weights", r"Error while deserializing header"),
    ("extra_tensor", r"tensors its config.json does not describe .*: model.layers.1.mlp.w"),
    (
      "missing_tensor",
      r"incomplete, 1 of its config's 11 tensors missing from its weights: "
      r"model.norm.weight \(shape \(16,\)\)",
    ),
    ("wrong_shape", r"tensors of the wrong shape: model.norm.weight \(8,\) \(expected \(16,\)\)"),
  ],
)
def test_checkpoint_problems_are_config_errors_before_any_weight_is_read(
  hf_dir, tmp_path, damage, message
):
  path = _copy(hf_dir, tmp_path / "ckpt")
  weights = path / "model.safetensors"
  if damage == "missing":
    path = tmp_path / "nowhere"
  elif damage == "no_config":
    (path / "config.json").unlink()
  elif damage == "bad_json":
    (path / "config.json").write_text('{"model_type": "llama",')
  elif damage == "model_type":
    _edit_config_json(path, model_type="mistral")
  elif damage == "rope_type":
    _edit_config_json(path, rope_scaling={"rope_type": "yarn", "factor": 2.0})
  elif damage == "no_weights":
    weights.unlink()
  elif damage == "bad_weights":
    weights.write_bytes(b"not a safetensors file")
  else:
    tensors = load_file(str(weights))
    if damage == "missing_tensor":
      tensors.pop("model.norm.weight")
    elif damage == "extra_tensor":
      tensors["model.layers.1.mlp.w"] = np.ones(3, np.float32)
    else:
      tensors["model.norm.weight"] = np.ones(8, np.float32)
    save_file(tensors, str(weights), metadata={"format": "pt"})
  with pytest.raises(configuration.ConfigError, match=message) as info:
    configuration.checkpoint(_on_checkpoint(path))
  assert "\n" not in str(info.value)
  # The job's own check (the CLI's) reports it before the data or anything else.
  with pytest.raises(configuration.ConfigError, match=message):
    configuration.job_inputs(_on_checkpoint(path))


def _local(path, **task):
  config = default.get_config("tiny")
  config.task.name = "local"
  config.task.path = str(path)
  config.task.checker = task.pop("checker", "gsm8k")
  for k, v in task.items():
    config.task[k] = v
  return config


def _write(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


GOOD = [
  {"question": f"What is {a} plus 1?", "answer": f"{a}+1={a + 1}. #### {a + 1}"} for a in range(8)
]


def test_good_local_data_passes(tmp_path):
  configuration.task_data(_local(_write(tmp_path / "d.jsonl", GOOD)))
  bare = [{"question": r["question"], "answer": r["answer"].split("#### ")[1]} for r in GOOD]
  configuration.task_data(_local(_write(tmp_path / "bare.jsonl", bare)))  # bare numbers


def test_a_malformed_row_names_the_file_and_row(tmp_path):
  path = _write(tmp_path / "d.jsonl", [*GOOD[:2], '{"question": "x", "answer":', *GOOD[2:]])
  with pytest.raises(configuration.ConfigError, match=r"config.task.path: d.jsonl: row 3: invalid"):
    configuration.task_data(_local(path))


def test_a_row_without_the_configured_keys_names_them(tmp_path):
  rows = [{"problem": r["question"], "answer": r["answer"]} for r in GOOD]
  path = _write(tmp_path / "math.jsonl", rows)
  with pytest.raises(
    configuration.ConfigError,
    match=r"math.jsonl: row 1: missing key 'question' \(row has keys \['answer', 'problem'\]; "
    r"the key is set by question_key\)",
  ):
    configuration.task_data(_local(path))
  configuration.task_data(_local(path, question_key="problem"))  # the fix the message names


def test_references_the_gsm8k_checker_cannot_read_are_counted_and_shown(tmp_path):
  """GSM8K answers without their '#### <number>' line: the checker compares the whole text,
  so no completion is ever rewarded. Every such row is counted, the first five shown."""
  rows = [{"question": f"q{i}", "answer": f"She has {i} apples, so {i}."} for i in range(9)]
  rows.insert(3, {"question": "fine", "answer": "#### 12"})
  path = _write(tmp_path / "gsm.jsonl", rows)
  with pytest.raises(configuration.ConfigError) as info:
    configuration.task_data(_local(path))
  text = str(info.value)
  assert text.startswith("config.task.path: gsm.jsonl: 9 of 10 rows have a reference answer")
  assert "the gsm8k checker cannot read (a number, or a solution ending in '#### <number>')" in text
  assert "row 1 'She has 0 apples, so 0.', row 2 " in text and "row 6 " in text
  assert "row 7 " not in text and " and 4 more." in text and "\n" not in text
  # The math checker reads the same answers (any non-empty text is a MATH answer).
  configuration.task_data(_local(path, checker="math"))


@pytest.mark.parametrize(
  "reader,answer,want",
  [
    (checkers.gsm8k_reference, "so 72 clips.\n#### 72", "72"),
    (checkers.gsm8k_reference, "1,000", "1000"),
    (checkers.gsm8k_reference, "$18", "18"),
    (checkers.gsm8k_reference, "Natalia sold 48/2 = 24 clips in May.", None),
    (checkers.gsm8k_reference, "#### ", None),
    (checkers.math_reference, "so \\boxed{\\frac{1}{2}}.", "0.5"),
    (checkers.math_reference, "\\boxed{x", None),
    (checkers.math_reference, "x^2", "x^2"),
  ],
)
def test_reference_readers_read_what_the_checkers_compare(reader, answer, want):
  assert reader(answer) == want
  check = checkers.check_gsm8k if reader is checkers.gsm8k_reference else checkers.check_math
  if want is not None:  # a completion stating the reference is rewarded
    said = f"#### {want}" if check is checkers.check_gsm8k else f"\\boxed{{{want}}}"
    assert check(said, answer) == 1.0


def test_other_data_and_config_errors(tmp_path):
  config = default.get_config("tiny")
  config.rl.steps = -1
  with pytest.raises(configuration.ConfigError, match=r"config.rl.steps must be an int >= 0"):
    configuration.job_inputs(config)
  config = default.get_config("tiny")
  config.task.params.max_stepz = 3
  with pytest.raises(configuration.ConfigError, match=r"config.task.params: Unknown parameters"):
    configuration.job_inputs(config)
  one = _write(tmp_path / "one.jsonl", GOOD[:1])
  with pytest.raises(configuration.ConfigError, match="two distinct questions"):
    configuration.task_data(_local(one))
  with pytest.raises(configuration.ConfigError, match="config.task.test_fraction must be in"):
    configuration.task_data(_local(_write(tmp_path / "d.jsonl", GOOD), test_fraction=1.0))


def test_the_cli_reports_a_data_error_in_one_line_and_builds_nothing(tmp_path):
  path = _write(tmp_path / "gsm.jsonl", [{"question": "q", "answer": "no number here"}] * 3)
  workdir = tmp_path / "wd"
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "tlt_jax.main",
      "--config=configs/default.py:tiny",
      f"--workdir={workdir}",
      "--config.task.name=local",
      f"--config.task.path={path}",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 2, out.stderr[-3000:]
  assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
  assert out.stderr.startswith("error: config.task.path: gsm.jsonl: 3 of 3 rows have a reference")
  assert not workdir.exists()


def _rows(changes=None):
  """Metrics rows as the trainer writes them (the fields rl_summary reads)."""
  base = {
    "reward_mean": 0.0,
    "update_tokens": 10,
    "time/update": 1.0,
    "time/rollout": 1.0,
    "time/step": 2.0,
    "loss/skipped": 0.0,
    "loss/optimizer_steps": 1.0,
  }
  return [{**base, "step": i, **(changes or {}).get(i, {})} for i in range(4)]


def test_steps_without_an_optimizer_step_are_counted_and_said(tmp_path):
  """Dynamic sampling drops every group whose rewards are equal; a step left with none takes
  no optimizer step. The summary counts such steps apart and says so."""
  from tlt_jax.reporting import format_summary
  from tlt_jax.train import rl_summary

  def summary(rows):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rl = rl_summary(str(path))
    text = format_summary(
      {
        "model_params": 1e4,
        "warm_start": {"source": "sft"},
        "eval": {"accuracy": 0.0, "num_examples": 4},
        "rl": rl,
      }
    )
    return rl, text

  none = {"loss/optimizer_steps": 0.0}
  rl, text = summary(_rows({0: none, 2: none}))
  assert rl["steps"] == 4 and rl["steps_without_update"] == 2 and rl["optimizer_steps"] == 2
  assert "after 4 GRPO steps (2 of them updated the policy)" in text
  assert "2 of the 4 steps took no optimizer step: every group's rewards were equal" in text
  rl, text = summary(_rows(dict.fromkeys(range(4), none)))
  assert rl["steps_without_update"] == 4
  assert "after 4 GRPO steps, none of which updated the policy" in text
  rl, text = summary(_rows())
  assert rl["steps_without_update"] == 0 and "after 4 GRPO steps: held-out" in text
  assert "no optimizer step" not in text

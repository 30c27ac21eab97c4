"""Prompt formats: chat templates rendered as transformers renders them, BOS as the tokenizer
defines it, checkers by name or import path, and the local-file task's config checks."""

from __future__ import annotations

import json
import os
import sys

import pytest
from bpe_helpers import train_bpe

from tlt_jax import configuration
from tlt_jax.data.checkers import check_exact, check_gsm8k
from tlt_jax.data.prompts import PromptFormat, render_chat
from tlt_jax.data.tasks import resolve_checker
from tlt_jax.data.tokenizer import HFTokenizer

# A ChatML template (the Qwen family's layout) and a Llama-3-style one that prints bos_token.
CHATML = (
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
  "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HEADERS = (
  "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
  "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
  "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
SPECIALS = [
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<|begin_of_text|>",
  "<|start_header_id|>",
  "<|end_header_id|>",
  "<|eot_id|>",
]
EXAMPLE = {"question": "What is 6 times 7?", "solution": "", "answer": "42"}


def _tokenizer_dir(tmp_path, tok_cfg: dict):
  tok = train_bpe(["What is 6 times 7? You are a careful solver. 42"] * 4, SPECIALS, 300)
  tok.save(str(tmp_path / "tokenizer.json"))
  # tokenizer_class: what transformers' AutoTokenizer needs (this project ignores it).
  tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **tok_cfg}
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
  return tmp_path


def _hf_ids(path, messages):
  transformers = pytest.importorskip("transformers")
  hf = transformers.AutoTokenizer.from_pretrained(path)
  text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  return text, hf(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
  ("template", "tok_cfg", "first"),
  [
    # Qwen: no bos token (null), so no BOS in front of the template's text.
    (CHATML, {"bos_token": None, "eos_token": "<|im_end|>"}, "<|im_start|>"),
    # Llama 3: the template prints bos_token; the prompt holds it once.
    (HEADERS, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "<|begin_of_text|>"),
  ],
  ids=["chatml", "llama3"],
)
def test_chat_prompt_ids_equal_transformers(tmp_path, template, tok_cfg, first):
  """The prompt ids (formatter text, then encode(add_bos=True)) are the ids transformers'
  apply_chat_template gives, system turn included."""
  path = _tokenizer_dir(tmp_path, {**tok_cfg, "chat_template": template})
  tok = HFTokenizer.from_dir(path)
  fmt = PromptFormat.for_tokenizer("chat", tok, system_prompt="You are a careful solver.")
  ids = tok.encode(fmt(EXAMPLE), add_bos=True)
  messages = [
    {"role": "system", "content": "You are a careful solver."},
    {"role": "user", "content": EXAMPLE["question"]},
  ]
  hf_text, hf_ids = _hf_ids(path, messages)
  assert ids == hf_ids, (fmt(EXAMPLE), hf_text)
  assert ids[0] == tok.hf_tokenizer.token_to_id(first)
  assert ids.count(tok.hf_tokenizer.token_to_id("<|begin_of_text|>")) <= 1


def test_bos_follows_the_tokenizer_config(tmp_path):
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  qwen = HFTokenizer.from_dir(_tokenizer_dir(tmp_path / "a", {"bos_token": None}))
  assert not qwen.uses_bos and qwen.encode("42", add_bos=True) == qwen.encode("42")
  off = HFTokenizer.from_dir(
    _tokenizer_dir(tmp_path / "b", {"bos_token": "<|begin_of_text|>", "add_bos_token": False})
  )
  assert not off.uses_bos and off.encode("42", add_bos=True) == off.encode("42")


def test_template_file_and_named_templates(tmp_path):
  cfg = {"bos_token": None, "chat_template": [{"name": "default", "template": CHATML}]}
  assert HFTokenizer.from_dir(_tokenizer_dir(tmp_path, cfg)).chat_template == CHATML
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": None}))
  (tmp_path / "chat_template.jinja").write_text(HEADERS)
  assert HFTokenizer.from_dir(tmp_path).chat_template == HEADERS


def test_prompt_format_errors(tmp_path):
  tok = HFTokenizer.from_dir(_tokenizer_dir(tmp_path, {"bos_token": None}))
  with pytest.raises(ValueError, match="needs a chat template"):
    PromptFormat.for_tokenizer("chat", tok)
  with pytest.raises(ValueError, match="system prompt needs the 'chat'"):
    PromptFormat.for_tokenizer("plain", tok, system_prompt="hi")
  with pytest.raises(ValueError, match="must be one of"):
    PromptFormat.for_tokenizer("markdown", tok)
  with pytest.raises(ValueError, match="chat template: no system turns"):
    render_chat(
      "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}",
      [{"role": "system", "content": "x"}],
    )
  assert PromptFormat()(EXAMPLE) == EXAMPLE["question"]


def check_by_length(completion: str, answer: str) -> float:
  """A module-level checker, for the import-path test."""
  return float(len(completion) == len(answer))


def test_checkers_by_name_and_import_path():
  assert resolve_checker("gsm8k") is check_gsm8k and resolve_checker("exact") is check_exact
  assert resolve_checker("test_data_prompts:check_by_length")("ab", "cd") == 1.0
  with pytest.raises(ValueError, match="Unknown checker 'nope'"):
    resolve_checker("nope")
  with pytest.raises(ValueError, match="cannot import"):
    resolve_checker("no_such_module_xyz:f")
  with pytest.raises(ValueError, match="no function 'missing'"):
    resolve_checker("test_data_prompts:missing")
  assert check_exact(" 42 ", "42") == 1.0 and check_exact("the answer is 42", "42") == 0.0


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_config():
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  from configs.default import get_config

  return get_config("tiny")


def test_local_task_config_is_checked_before_anything_is_built(tmp_path):
  config = _tiny_config()
  config.task.name = "local"
  with pytest.raises(ValueError, match="needs config.task.path"):
    configuration.task_spec(config)
  config.task.path = str(tmp_path / "missing.jsonl")
  with pytest.raises(configuration.ConfigError, match="no such file"):
    configuration.task_spec(config)
  data = tmp_path / "gsm8k.jsonl"
  data.write_text(json.dumps({"question": "1+1?", "answer": "so #### 2"}) + "\n")
  config.task.path = str(data)
  assert configuration.task_spec(config).check("... #### 2", "2") == 1.0
  config.task.checker = "math"
  assert configuration.task_spec(config).check("\\boxed{2}", "2") == 1.0
  config.task.checker = "bogus"
  with pytest.raises(ValueError, match="config.task.checker: Unknown checker"):
    configuration.task_spec(config)
  config.task.name = "arithmetic2"
  with pytest.raises(ValueError, match="config.task.name: Unknown task"):
    configuration.task_spec(config)


def test_tiny_job_trains_on_a_local_jsonl_file(tmp_path):
  """The default job from the CLI's settings on a GSM8K-style .jsonl file: the rows are
  imported, split, warm-started on, rolled out and scored by the GSM8K checker."""
  from tlt_jax.train import train_and_evaluate

  rows = []
  for a in range(1, 9):
    for b in range(1, 6):
      q = f"What is {a} plus {b}?"
      rows.append({"question": q, "answer": f"{a}+{b}={a + b}. #### {a + b}"})
  data = tmp_path / "sums.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in rows))
  config = _tiny_config()
  config.task.name = "local"
  config.task.path = str(data)
  config.task.test_fraction = 0.2
  config.rl.steps = 1
  config.rl.dynamic_sampling = False  # a 3-step warm start may score every group alike
  summary = train_and_evaluate(config, str(tmp_path / "run"), progress=False)
  assert summary["eval"]["num_examples"] == 4  # eval.num_examples of the tiny config
  assert 0.0 <= summary["eval"]["accuracy"] <= 1.0 and summary["rl"]["steps"] == 1
  assert summary["rollout"]["sequences"] == 2 * 4

"""Prompt text of an example: the question as it is, or rendered with a chat template.

A chat model is trained on its own template (roles, turn markers, the assistant's opening), and
prompting it with bare text puts it off its training distribution. `PromptFormat("chat", ...)`
renders the question as one user turn (after an optional system turn) with the tokenizer's
template and the assistant's turn opened, as Hugging Face's `apply_chat_template(...,
add_generation_prompt=True)` does: the template runs in a sandboxed Jinja environment with the
same settings (trim_blocks, lstrip_blocks, loop controls) and receives `messages`,
`add_generation_prompt`, the bos / eos token strings and `raise_exception`.

BOS: a template that prints `bos_token` starts the text with it; the formatter drops that
prefix, and the caller's `tokenizer.encode(text, add_bos=True)` puts the id back exactly when
the tokenizer starts sequences with one (so a prompt never holds two, and a Qwen prompt none).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from tlt_jax.data.tasks import format_prompt

__all__ = ["PROMPT_FORMATS", "PromptFormat", "render_chat"]

PROMPT_FORMATS = ("plain", "chat")


@functools.lru_cache(maxsize=8)
def _compile(template: str):
  from jinja2.ext import loopcontrols
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
  )

  def raise_exception(message: str):
    raise ValueError(f"chat template: {message}")

  env.globals["raise_exception"] = raise_exception
  return env.from_string(template)


def render_chat(
  template: str,
  messages: list[Mapping[str, str]],
  *,
  add_generation_prompt: bool = True,
  **special: Any,
) -> str:
  """`template` rendered on `messages` ([{"role", "content"}, ...]); `special` holds the
  template's other variables (bos_token, eos_token)."""
  return _compile(template).render(
    messages=list(messages), add_generation_prompt=add_generation_prompt, **special
  )


@dataclasses.dataclass(frozen=True)
class PromptFormat:
  """example -> prompt text.

  Attributes:
    kind: "plain" (the question itself) or "chat" (the chat template).
    template: the chat template (kind "chat").
    system_prompt: a system turn before the question ("" none; kind "chat").
    bos_token, eos_token: the strings the template may print for them.
  """

  kind: str = "plain"
  template: str | None = None
  system_prompt: str = ""
  bos_token: str = ""
  eos_token: str = ""

  def __post_init__(self):
    if self.kind not in PROMPT_FORMATS:
      raise ValueError(f"prompt format must be one of {PROMPT_FORMATS}, got {self.kind!r}")
    if self.kind == "chat" and not self.template:
      raise ValueError(
        "prompt format 'chat' needs a chat template: the tokenizer directory has none "
        "(tokenizer_config.json 'chat_template' or chat_template.jinja)"
      )
    if self.kind == "plain" and self.system_prompt:
      raise ValueError("a system prompt needs the 'chat' prompt format")

  @classmethod
  def for_tokenizer(cls, kind: str, tokenizer: Any, system_prompt: str = "") -> PromptFormat:
    """The format `kind` with the tokenizer's template and special strings (HFTokenizer's
    `chat_template` / `special_text`; other tokenizers have none)."""
    special = getattr(tokenizer, "special_text", {})
    return cls(
      kind=kind,
      template=getattr(tokenizer, "chat_template", None) if kind == "chat" else None,
      system_prompt=system_prompt,
      bos_token=special.get("bos_token", ""),
      eos_token=special.get("eos_token", ""),
    )

  def __call__(self, example: Mapping[str, str]) -> str:
    if self.kind == "plain":
      return format_prompt(example)
    messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
    messages.append({"role": "user", "content": example["question"]})
    text = render_chat(self.template, messages, bos_token=self.bos_token, eos_token=self.eos_token)
    if self.bos_token and text.startswith(self.bos_token):
      text = text[len(self.bos_token) :]  # encode(add_bos=True) adds the id back
    return text

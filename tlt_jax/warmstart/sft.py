"""Supervised warm start: next-token training on a task's worked solutions.

Examples are packed into fixed-length rows (segment ids keep packed samples
from attending to each other, positions restart per sample) so the long tail
of solution lengths costs no padding. The loss covers solution tokens and the
closing EOS only: the policy learns to answer, not to write questions. Openings (the first
part of a target, no EOS) pack the same way: a row holds how many long answers begin.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from tlt_jax.data.tokenizer import Tokenizer
from tlt_jax.models.attention import checked_key_windows, key_windows
from tlt_jax.models.precision import compute_model
from tlt_jax.utils.cpu_fusions import checked_cpu_fusions, compiler_options
from tlt_jax.utils.optim import clipped_adamw


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  steps: int = 300
  batch_rows: int = 16
  row_len: int = 512
  learning_rate: float = 3e-3
  warmup_steps: int = 30
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  seed: int = 0
  # Attention key windows of the packed rows' forward (`models.attention.key_windows`;
  # tokens): a query block reads only the keys its samples hold. (): all keys up to it.
  key_windows: tuple[int, ...] = ()
  # XLA:CPU's library fusions in the step's program (`utils.cpu_fusions`): "dots" (YNNPACK
  # for its dots only) or "xla" (XLA's default); ignored off a CPU.
  cpu_fusions: str = "dots"

  def __post_init__(self):
    object.__setattr__(self, "key_windows", checked_key_windows(self.key_windows))
    checked_cpu_fusions(self.cpu_fusions)
    for name in ("steps", "batch_rows", "row_len"):
      if getattr(self, name) <= 0:
        raise ValueError(f"SFTConfig.{name} must be positive, got {getattr(self, name)}")
    if not 0 < self.learning_rate < 1:
      raise ValueError(f"SFTConfig.learning_rate must be in (0, 1), got {self.learning_rate}")
    if self.warmup_steps < 0 or self.warmup_steps >= self.steps:
      raise ValueError(f"SFTConfig.warmup_steps must be in [0, steps), got {self.warmup_steps}")


def encode_example(tokenizer: Tokenizer, prompt: str, target: str) -> tuple[list[int], int]:
  """BOS + prompt + target + EOS, and the index where the loss starts (first target token)."""
  tokens, start = encode_opening(tokenizer, prompt, target)
  return tokens + [tokenizer.eos_id], start


def encode_opening(tokenizer: Tokenizer, prompt: str, opening: str) -> tuple[list[int], int]:
  """BOS + prompt + the opening of a target, with no EOS, and the index where the loss starts.

  Packed like a whole example, its loss covers the opening's tokens and predicts no end, so
  SFT can show a policy the openings of many demonstrations too long to fit a row whole (or
  too rare for a row to hold many) without teaching it to stop where they were cut."""
  p = tokenizer.encode(prompt, add_bos=True)
  return p + tokenizer.encode(opening), len(p)


def pack_batches(
  sequences: Sequence[tuple[list[int], int]], rows: int, row_len: int, seed: int
) -> Iterator[dict[str, np.ndarray]]:
  """Endless batches of packed rows, reshuffled every epoch.

  Each batch: tokens, positions, segment_ids (0 = padding) [rows, row_len] and
  loss_mask, which marks positions whose NEXT token is a target token (from the last prompt
  token to the one before the sequence's last: its EOS, or an opening's last token).
  Sequences longer than a row are skipped (counted once in `skipped`).
  """
  fit = [s for s in sequences if len(s[0]) <= row_len]
  if not fit:
    raise ValueError(f"no training sequence fits in row_len={row_len}")
  rng = np.random.default_rng(seed)
  order: list[int] = []
  while True:
    batch = {
      k: np.zeros((rows, row_len), np.int32)
      for k in ("tokens", "positions", "segment_ids", "loss_mask")
    }
    for r in range(rows):
      col, seg = 0, 0
      while True:
        if not order:
          order = list(rng.permutation(len(fit)))
        toks, start = fit[order[-1]]
        if col + len(toks) > row_len:
          break
        order.pop()
        seg += 1
        n = len(toks)
        batch["tokens"][r, col : col + n] = toks
        batch["positions"][r, col : col + n] = np.arange(n)
        batch["segment_ids"][r, col : col + n] = seg
        # Position t predicts token t + 1: the loss runs from the last prompt
        # token to the one before the last (which predicts nothing here).
        batch["loss_mask"][r, col + start - 1 : col + n - 1] = 1
        col += n
    yield batch


def sft_loss(model, batch):
  hidden, _, _ = model(batch["tokens"], batch["positions"], segment_ids=batch["segment_ids"])
  logits = model.logits(hidden[:, :-1])
  targets = batch["tokens"][:, 1:]
  mask = batch["loss_mask"][:, :-1].astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  denom = jnp.maximum(mask.sum(), 1.0)
  return (nll * mask).sum() / denom, {"token_accuracy": (correct * mask).sum() / denom}


def sft_optimizer(cfg: SFTConfig) -> optax.GradientTransformation:
  """Clipped AdamW (b2 0.98) on a warm-up cosine to 5% of the peak rate."""
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, cfg.learning_rate, cfg.warmup_steps, cfg.steps, end_value=cfg.learning_rate * 0.05
  )
  return clipped_adamw(schedule, grad_clip=cfg.grad_clip, b2=0.98, weight_decay=cfg.weight_decay)


def make_train_step(
  graphdef: nnx.GraphDef,
  optimizer: optax.GradientTransformation,
  windows: Sequence[int] = (),
  cpu_fusions: str = "dots",
):
  """A jitted `(params, opt_state, batch) -> (params, opt_state, metrics)`, state donated;
  attention under `key_windows(windows)`; compiled under `cpu_fusions`
  (`utils.cpu_fusions`: XLA:CPU's library fusions)."""

  def step(params, opt_state, batch):
    with key_windows(windows):  # read while the step is traced
      return windowed_step(params, opt_state, batch)

  def windowed_step(params, opt_state, batch):
    def loss_fn(p):
      return sft_loss(compute_model(graphdef, p), batch)

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads), **aux}

  return jax.jit(step, donate_argnums=(0, 1), compiler_options=compiler_options(cpu_fusions))


def train_sft(
  graphdef: nnx.GraphDef,
  params: nnx.State,
  tokenizer: Tokenizer,
  examples: Sequence[tuple[str, str]],
  cfg: SFTConfig,
  progress: bool = True,
  openings: Sequence[tuple[str, str]] = (),
) -> tuple[nnx.State, list[dict[str, Any]]]:
  """Trains on (prompt, target) text pairs and (prompt, opening) pairs (`encode_opening`),
  shuffled together; returns new params and per-step metrics."""
  seqs = [encode_example(tokenizer, p, t) for p, t in examples]
  seqs += [encode_opening(tokenizer, p, o) for p, o in openings]
  batches = pack_batches(seqs, cfg.batch_rows, cfg.row_len, cfg.seed)
  optimizer = sft_optimizer(cfg)
  opt_state = optimizer.init(params)
  step_fn = make_train_step(graphdef, optimizer, cfg.key_windows, cfg.cpu_fusions)
  history: list[dict[str, Any]] = []
  pending = None  # Metrics are read one step late so the host never stalls the device.
  bar = tqdm(range(cfg.steps), desc="sft", disable=not progress, dynamic_ncols=True)
  start = time.perf_counter()
  for i in bar:
    batch = next(batches)
    params, opt_state, metrics = step_fn(params, opt_state, batch)
    if pending is not None:
      row = {k: float(v) for k, v in jax.device_get(pending[1]).items()}
      row.update(step=pending[0], seconds=time.perf_counter() - start)
      history.append(row)
      bar.set_postfix(loss=f"{row['loss']:.3f}", acc=f"{row['token_accuracy']:.3f}")
    pending = (i, metrics)
  row = {k: float(v) for k, v in jax.device_get(pending[1]).items()}
  row.update(step=pending[0], seconds=time.perf_counter() - start)
  history.append(row)
  return params, history

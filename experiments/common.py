"""What the experiment scripts share: the warm-started policy of a workdir (or one of its RL
checkpoints); row comparison; where a rollout call's time goes; the FLOPs of a policy
update's products and attention; how far parameters moved; the fields of a worked line; a
comparison's warm starts packed to travel to an accelerator; published model shapes; rows
packed with samples of the curve's lengths; an engine chunk's kind of device loop."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlt_jax import checkpoint, configuration, train  # noqa: E402
from tlt_jax.data import get_tokenizer  # noqa: E402
from tlt_jax.data.checkers import CAREFUL, HASTY  # noqa: E402
from tlt_jax.models.attention import current_causal_block, full_mask, key_window  # noqa: E402
from tlt_jax.models.config import ModelConfig  # noqa: E402
from tlt_jax.models.transformer import Transformer, init_model  # noqa: E402
from tlt_jax.parallel.memory import qwen25  # noqa: E402


def load_policy(config, workdir: str) -> dict[str, Any]:
  """The job's tokenizer, data splits and warm-started policy (restored from
  <workdir>/warm_start, else trained there as the default job does)."""
  tok = get_tokenizer(config.task.tokenizer)
  train_split, test_split = train.load_data(config, workdir)
  model_cfg, graphdef, params, info = train.build_policy(config, workdir, tok, train_split)
  return {
    "tokenizer": tok,
    "train_split": train_split,
    "test_split": test_split,
    "model_config": model_cfg,
    "graphdef": graphdef,
    "params": params,
    "info": info,
  }


def policy_at(config, workdir: str, rl_step: int = -1):
  """(model config, graphdef, params) of a workdir's warm start (rl_step < 0) or of its RL
  checkpoint at `rl_step` (<workdir>/checkpoints/<step>/state)."""
  from tlt_jax import configuration
  from tlt_jax.models.transformer import init_model

  model_cfg = configuration.model_config(config, get_tokenizer(config.task.tokenizer))
  graphdef, params = nnx.split(init_model(model_cfg, seed=0))
  if rl_step < 0:
    return (
      model_cfg,
      graphdef,
      checkpoint.restore_params(os.path.join(workdir, "warm_start"), params),
    )
  path = os.path.join(os.path.abspath(workdir), "checkpoints", str(rl_step), "state")
  nnx.replace_by_pure_dict(params, ocp.StandardCheckpointer().restore(path)["params"])
  return model_cfg, graphdef, params


def relative_change(before: Any, after: Any, depth: int = 1) -> dict[str, float]:
  """||after - before|| / ||before|| per parameter group: the leaves grouped by the first
  `depth` keys of their path (e.g. "embed", "final_norm", "layers")."""
  sums: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
  for (path, a), b in zip(
    jax.tree_util.tree_leaves_with_path(before), jax.tree_util.tree_leaves(after), strict=True
  ):
    keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    group = "/".join(keys[:depth])
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    sums[group][0] += float(np.sum((b - a) ** 2))
    sums[group][1] += float(np.sum(a**2))
  return {g: float(np.sqrt(d / n)) if n else float("nan") for g, (d, n) in sums.items()}


def print_report(report: dict, out: str = "") -> None:
  """A diagnostic's figures as JSON on stdout and, with `out`, in that file."""
  print(json.dumps(report, indent=1))
  if out:
    with open(out, "w") as f:
      json.dump(report, f, indent=1)


def rows_differing(a, b) -> np.ndarray:
  """Per row, whether two rollouts of the same prompts and keys differ in tokens or length
  (coupled sampling makes speculative and plain rows equal)."""
  return np.any(a.tokens != b.tokens, axis=1) | (a.length != b.length)


def call_phases_ms(results) -> dict[str, float]:
  """Mean ms per rollout call (`RolloutResult`s) by timeline phase (prefill,
  drafter_prefill, decode, spec, ...) and "outside": host time outside every timed phase.
  Modes that make the same tokens with the same keys compare phase by phase."""
  if not results:
    raise ValueError("call_phases_ms needs at least one rollout result")
  total: dict[str, float] = {}
  for r in results:
    for e in r.timeline:
      total[e["phase"]] = total.get(e["phase"], 0.0) + e["dt"]
    outside = r.wall_seconds - sum(e["dt"] for e in r.timeline)
    total["outside"] = total.get("outside", 0.0) + outside
  return {k: round(1e3 * v / len(results), 3) for k, v in total.items()}


def dense_shapes(params: Any) -> list[tuple[int, int]]:
  """(inputs, outputs) of every product the policy runs per token: each 2-D weight (the
  tied embedding as the output head's [d, vocab] product; its lookup is a gather)."""
  shapes = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    if leaf.ndim == 2:
      name = jax.tree_util.keystr(path)
      i, o = leaf.shape
      shapes.append((o, i) if "embed" in name else (i, o))
  return shapes


def attention_flops(
  model_cfg, rows: int, width: int, segment_ids: np.ndarray | None = None, windows=()
) -> float:
  """Forward + backward FLOPs of attention's two products (scores q k^T and the weighted
  values) over `rows` packed rows, as `attend_causal` computes them: each query block
  against the keys up to its end; with `segment_ids` [rows, width] (one micro-batch row
  each, the update's micro-batch of 1) and key `windows` (`models.attention.key_windows`),
  a block reads the window `models.attention.key_window` picks from its row's mask."""
  block = current_causal_block()
  masks = None
  if segment_ids is not None and windows:
    masks = full_mask(jnp.ones(segment_ids.shape, bool), jnp.asarray(segment_ids))
  pairs = 0
  for s in range(0, width, block):
    e = min(s + block, width)
    spans = [e] * rows
    fits = [w for w in sorted(windows) if e - s <= w < e]
    if masks is not None and fits:
      picked = [int(key_window(masks[r : r + 1, s:e, :e], fits)) for r in range(rows)]
      spans = [fits[i] if i < len(fits) else e for i in picked]
    pairs += (e - s) * sum(spans)
  per_layer = 2 * 2 * pairs * model_cfg.num_heads * model_cfg.head_dim
  return 3.0 * per_layer * model_cfg.num_layers


def packed_rows(rng, rows: int, width: int, vocab: int, median: int = 123) -> dict[str, np.ndarray]:
  """Rows packed with samples of log-normal lengths (`median`, sigma 1, >= 30 tokens,
  12-token prompts), the last sample of a row cut at its end: the fields both the policy
  update and SFT read."""
  out = {k: np.zeros((rows, width), np.int32) for k in ("tokens", "segment_ids", "positions")}
  mask = np.zeros((rows, width), np.float32)
  for r in range(rows):
    col, seg = 0, 1
    while col < width - 30:
      n = int(min(width - col, max(30, rng.lognormal(np.log(median), 1.0))))
      out["tokens"][r, col : col + n] = rng.integers(3, vocab, n)
      out["segment_ids"][r, col : col + n] = seg
      out["positions"][r, col : col + n] = np.arange(n)
      mask[r, col + 12 : col + n] = 1.0
      col, seg = col + n, seg + 1
  advantages = rng.normal(size=(rows, width)).astype(np.float32) * mask
  return dict(out, mask=mask, loss_mask=mask, advantages=advantages, weights=mask / mask.sum())


def split_calls(traces, prompts, rows: int):
  """Each recorded rollout's rows (and their prompt lengths) in consecutive engine calls of
  `rows` rows, as `rl.rows_per_call` runs a step (experiments/simulate.py
  --rows_per_call); returns (calls, their prompts or None, calls per rollout)."""
  counts = {len(t) for t in traces}
  if len(counts) != 1 or next(iter(counts)) % rows:
    raise ValueError(f"{rows} rows a call do not divide the rollouts' rows {sorted(counts)}")
  per = next(iter(counts)) // rows
  cut = lambda xs: [x[i * rows : (i + 1) * rows] for x in xs for i in range(per)]
  return cut(traces), (None if prompts is None else cut(prompts)), per


# Effort-mix tasks (experiments/effort_mix.py): which effort an answer opened with, and why
# a wrong one is wrong.


def effort_of(text: str) -> str:
  return {CAREFUL: "careful", HASTY: "hasty"}.get(text[:1], "other")


def why_wrong(question: str, text: str, steps_of) -> str:
  """A wrong answer's first fault: "line" (a line that does not follow from the one before:
  a slip in the arithmetic or the copying) or "count" (every line right, the wrong number
  of them: stopping early or late, or a hasty jump past an odd count)."""
  lines = (steps_of(question, text) or [])[:-1] if steps_of else []
  return "count" if lines and all(r == 1.0 for _, r in lines) else "line"


def summarise(texts, answers, sizes, check, questions=None, steps_of=None) -> dict:
  """Per effort: share, pass@1, mean length and (with the task's line checker) what its
  wrong answers got wrong; pass@1 by problem size (a quartile bin)."""
  by = collections.defaultdict(list)
  questions = questions or [""] * len(texts)
  for text, answer, question in zip(texts, answers, questions):
    right = check(text, answer)
    fault = "" if right else why_wrong(question, text, steps_of)
    by[effort_of(text)].append((right, len(text), fault))
  n = len(texts)
  out = {
    "pass@1": float(np.mean([r for v in by.values() for r, _, _ in v])),
    "mean_length": float(np.mean([len(t) for t in texts])),
  }
  for effort, v in sorted(by.items()):
    out[effort] = {
      "share": len(v) / n,
      "pass@1": float(np.mean([r for r, _, _ in v])),
      "mean_length": float(np.mean([length for _, length, _ in v])),
    }
    if steps_of:
      faults = collections.Counter(f for _, _, f in v if f)
      out[effort]["wrong_by"] = {k: faults[k] / len(v) for k in ("line", "count")}
  edges = np.quantile(sizes, [0.25, 0.5, 0.75])
  bins = collections.defaultdict(list)
  for text, answer, size in zip(texts, answers, sizes):
    bins[int(np.searchsorted(edges, size, side="right"))].append(check(text, answer))
  out["pass@1_by_size_quartile"] = [float(np.mean(bins[b])) if bins[b] else None for b in range(4)]
  return out


# A worked line of the stride task ("12:23+7=30;"): each character's line and field.
LINE_FIELDS = ("marker", "label", "prev", "stride", "result", "answer")


def opening(solution: str, lines: int) -> str | None:
  """The first `lines` lines of a worked solution (through their ';'); None when it has no
  more lines than that (then it is kept whole)."""
  ends = [i + 1 for i, ch in enumerate(solution) if ch == ";"]
  return solution[: ends[lines - 1]] if lines < len(ends) else None


def line_fields(solution: str) -> list[tuple[int, str]]:
  """(line index, field) of each character of a stride solution: the effort marker opens
  line 0; then per line its counter ("label", up to ":"), the value it starts from ("prev",
  up to "+"), the stride (up to "="), the new value (up to and with ";"); after the answer
  marker "#", the answer. A separator belongs to the field it closes."""
  out, line, field = [], 0, "label"
  for i, ch in enumerate(solution):
    if i == 0 and ch in (CAREFUL, HASTY):
      out.append((0, "marker"))
      continue
    if ch == "#":
      field = "answer"
    out.append((line, field))
    if field == "answer":
      continue
    nxt = {":": "prev", "+": "stride", "=": "result", ";": "label"}.get(ch)
    if nxt:
      field = nxt
      line += ch == ";"
  return out


def pack_warm_starts(shared: str, out: str, dtype: str = "bfloat16") -> dict:
  """A comparison's warm starts, packed to travel to a remote accelerator
  (experiments/pack_warm_start.py says why): writes <out>/{warm_start, drafter_warm_start,
  config.json, summary.json}, the policy's weights cast to `dtype`, and returns the summary
  it wrote (its "packed": the cast and the unrounded policy's evaluation, taken out)."""
  for piece in ("warm_start", "drafter_warm_start", "config.json", "summary.json"):
    if not os.path.exists(os.path.join(shared, piece)):
      raise FileNotFoundError(f"{shared} has no {piece}: not a finished comparison's shared folder")
  if os.path.exists(out):
    shutil.rmtree(out)
  os.makedirs(out)
  # The saved tree itself (no model needed): restored as saved, cast, saved again.
  src = os.path.abspath(os.path.join(shared, "warm_start"))
  with ocp.StandardCheckpointer() as ckpt:
    params = ckpt.restore(src)
  cast = jax.tree.map(lambda x: jax.numpy.asarray(x, dtype), params)
  checkpoint.save_params(os.path.join(out, "warm_start"), nnx.State(cast))
  shutil.copytree(
    os.path.join(shared, "drafter_warm_start"), os.path.join(out, "drafter_warm_start")
  )
  shutil.copy(os.path.join(shared, "config.json"), os.path.join(out, "config.json"))
  with open(os.path.join(shared, "summary.json")) as f:
    summary = json.load(f)
  summary["packed"] = {
    "from": shared,
    "dtype": dtype,
    "unpacked_eval": summary.pop("eval", None),
  }
  with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  return summary


def json_child(argv: list[str], xla_flags: str) -> dict[str, Any]:
  """Runs `python *argv` with XLA_FLAGS = `xla_flags` (XLA reads its flags once a process, so
  each setting of an A/B needs a process of its own) and returns the JSON object on its last
  line of output, or {"error": the end of its stderr} where it failed (an XLA that does not
  know a flag refuses to start)."""
  env = dict(os.environ, XLA_FLAGS=xla_flags)
  done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True)
  if done.returncode:
    return {"error": done.stderr.strip()[-600:]}
  return json.loads(done.stdout.strip().splitlines()[-1])


def published_shape(name: str) -> ModelConfig:
  """Published layer shapes (the models' config.json), bfloat16 weights and products:
  experiments/real_sizes.py measures them, experiments/simulate.py projects from that."""
  bf16 = dict(dtype="bfloat16", param_dtype="bfloat16")
  if name == "qwen3-8b":
    return ModelConfig(
      vocab_size=151936,
      num_layers=36,
      d_model=4096,
      num_heads=32,
      num_kv_heads=8,
      head_dim=128,
      mlp_dim=12288,
      qk_norm=True,
      tie_embeddings=False,
      rope_theta=1e6,
      max_position=40960,
      **bf16,
    )
  if name == "qwen2.5-1.5b":
    return dataclasses.replace(qwen25("1.5B"), **bf16)
  if name == "tiny":
    return ModelConfig(
      vocab_size=512,
      num_layers=2,
      d_model=64,
      num_heads=2,
      num_kv_heads=1,
      head_dim=32,
      mlp_dim=128,
      **bf16,
    )
  raise ValueError(f"unknown shape {name!r}: qwen3-8b, qwen2.5-1.5b or tiny")


@functools.partial(jax.jit, static_argnums=(2, 3))
def _normal_leaf(key, std, shape, dtype):
  return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def config_policy(config) -> tuple[ModelConfig, nnx.GraphDef, nnx.State]:
  """A job config's policy, randomly initialised (seed 0): its model config, graphdef and
  params (what the benchmarks time, where weights do not matter)."""
  cfg = configuration.model_config(config, get_tokenizer(config.task.tokenizer))
  graphdef, params = nnx.split(init_model(cfg, seed=0))
  return cfg, graphdef, params


def random_params(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
  """Random weights made on the default device (no host round trip for gigabytes):
  kernels and embeddings normal with std 1 / sqrt(fan-in), norm scales one, biases zero.

  One small program per distinct leaf shape, called for every layer: the model's own
  initialisers traced together are one program whose compile grows with the layer count
  (experiments/RESULTS.md), paid again by every process of a sitting."""
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  key, made = jax.random.key(0), []
  for i, (path, leaf) in enumerate(leaves):
    names = {getattr(k, "key", None) for k in path}
    if "scale" in names:
      made.append(jnp.ones(leaf.shape, leaf.dtype))
    elif "bias" in names:
      made.append(jnp.zeros(leaf.shape, leaf.dtype))
    else:
      fan_in = leaf.shape[0] if "kernel" in names else leaf.shape[-1]
      made.append(_normal_leaf(jax.random.fold_in(key, i), fan_in**-0.5, leaf.shape, leaf.dtype))
  return graphdef, jax.block_until_ready(jax.tree_util.tree_unflatten(treedef, made))

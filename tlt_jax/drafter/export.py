"""The trained drafter as a standalone artifact: `model.safetensors` + `drafter_config.json`.

The drafter is a deployable by-product of TLT training (the paper's point): the
directory holds only the drafter's own weights (fc + one decoder layer; the
embedding and LM head stay the target's) and the target's ModelConfig it was
built for, so a loader can check it against a target before use.
Tensor names are the flattened nnx paths ("layer.attn.q_proj.kernel"), kept in
the layout this project stores (kernels [in, out]).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from tlt_jax.models.config import ModelConfig
from tlt_jax.models.drafter import check_drafter_matches, init_drafter

FORMAT = "tlt_jax.eagle_drafter.v1"


def _flat(params: nnx.State) -> dict[str, np.ndarray]:
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(params)):
    out[".".join(str(getattr(p, "key", p)) for p in path)] = np.asarray(leaf)
  return out


def save_drafter(
  directory: str | os.PathLike, params: nnx.State, target_config: ModelConfig, **info
) -> Path:
  """Writes the drafter's weights and config; `info` (e.g. version, acceptance) goes
  into the config's "info" field. Returns the directory."""
  d = Path(directory)
  d.mkdir(parents=True, exist_ok=True)
  check_drafter_matches(params, target_config)
  save_file(_flat(params), str(d / "model.safetensors"), metadata={"format": FORMAT})
  meta = {"format": FORMAT, "target_config": dataclasses.asdict(target_config), "info": info}
  (d / "drafter_config.json").write_text(json.dumps(meta, indent=2, default=str))
  return d


def load_drafter(
  directory: str | os.PathLike, target_config: ModelConfig | None = None
) -> tuple[nnx.GraphDef, nnx.State, ModelConfig, dict]:
  """Reads a drafter saved by `save_drafter`: (graphdef, params, target config, info).

  With `target_config`, refuses a drafter built for a different target shape.
  """
  d = Path(directory)
  cfg_path, weights = d / "drafter_config.json", d / "model.safetensors"
  if not cfg_path.exists() or not weights.exists():
    raise FileNotFoundError(f"{d} has no drafter_config.json + model.safetensors")
  meta = json.loads(cfg_path.read_text())
  if meta.get("format") != FORMAT:
    raise ValueError(f"{cfg_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
  saved_cfg = ModelConfig(**meta["target_config"])
  if target_config is not None:
    for f in ("d_model", "num_heads", "num_kv_heads", "head_dim", "mlp_dim", "vocab_size"):
      if getattr(saved_cfg, f) != getattr(target_config, f):
        raise ValueError(
          f"drafter at {d} was built for {f}={getattr(saved_cfg, f)}, the target has "
          f"{getattr(target_config, f)}"
        )
  graphdef, params = nnx.split(init_drafter(saved_cfg, seed=0))
  tensors = load_file(str(weights))
  flat = _flat(params)
  if set(tensors) != set(flat):
    missing, extra = sorted(set(flat) - set(tensors)), sorted(set(tensors) - set(flat))
    raise ValueError(f"{weights}: missing tensors {missing[:5]}, unexpected {extra[:5]}")
  for name, like in flat.items():
    if tensors[name].shape != like.shape:
      raise ValueError(f"{weights}: {name} has shape {tensors[name].shape}, expected {like.shape}")
  pure = nnx.to_pure_dict(params)
  leaves_with_path = jax.tree_util.tree_leaves_with_path(pure)
  treedef = jax.tree_util.tree_structure(pure)
  values = [
    jax.numpy.asarray(tensors[".".join(str(getattr(p, "key", p)) for p in path)], leaf.dtype)
    for path, leaf in leaves_with_path
  ]
  nnx.replace_by_pure_dict(params, jax.tree_util.tree_unflatten(treedef, values))
  check_drafter_matches(params, saved_cfg)
  return graphdef, params, saved_cfg, meta.get("info", {})

"""SFT warm start: packing is exact and training learns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tlt_jax.data import CharTokenizer
from tlt_jax.models.attention import causal_block
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import init_model
from tlt_jax.warmstart.sft import (
  SFTConfig,
  encode_example,
  encode_opening,
  make_train_step,
  pack_batches,
  sft_loss,
  sft_optimizer,
  train_sft,
)


def _tiny_policy(tok):
  """A one-layer policy over `tok`'s vocabulary: (graphdef, params)."""
  cfg = ModelConfig(
    vocab_size=tok.vocab_size,
    num_layers=1,
    d_model=32,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    mlp_dim=64,
  )
  return nnx.split(init_model(cfg))


def test_packing_keeps_samples_apart_and_masks_only_targets():
  tok = CharTokenizer()
  seqs = [
    encode_example(tok, "1+2=", "3;#3"),
    encode_example(tok, "4+4=", "8;#8"),
    encode_example(tok, "9-1=", "8;#8"),
  ]
  batch = next(pack_batches(seqs, rows=2, row_len=24, seed=0))
  assert batch["tokens"].shape == (2, 24)
  for r in range(2):
    segs = batch["segment_ids"][r]
    for s in set(segs[segs > 0].tolist()):
      idx = np.nonzero(segs == s)[0]
      toks = batch["tokens"][r, idx]
      assert toks[0] == tok.bos_id and toks[-1] == tok.eos_id
      np.testing.assert_array_equal(batch["positions"][r, idx], np.arange(idx.size))
      # Loss positions predict exactly the target and EOS: "3;#3" + EOS.
      predicted = batch["tokens"][r, idx[1:]][batch["loss_mask"][r, idx[:-1]] == 1]
      assert predicted[-1] == tok.eos_id
      assert tok.decode(predicted[:-1]) in ("3;#3", "8;#8")
  with pytest.raises(ValueError, match="fits"):
    next(pack_batches(seqs, rows=1, row_len=4, seed=0))


def test_an_opening_is_trained_on_its_tokens_and_never_on_an_end():
  tok = CharTokenizer()
  seqs = [encode_opening(tok, "7+3x40=", "~40:7+3=10;39:"), encode_example(tok, "1+2=", "3;#3")]
  assert seqs[0][0][-1] != tok.eos_id
  batch = next(pack_batches(seqs, rows=1, row_len=40, seed=0))
  targets = {}
  for s in (1, 2):
    idx = np.nonzero(batch["segment_ids"][0] == s)[0]
    predicted = batch["tokens"][0, idx[1:]][batch["loss_mask"][0, idx[:-1]] == 1]
    # An opening's last token predicts nothing: no end is taught where it was cut.
    assert batch["loss_mask"][0, idx[-1]] == 0
    targets[tok.decode(predicted[predicted != tok.eos_id])] = int(predicted[-1] == tok.eos_id)
  assert targets == {"~40:7+3=10;39:": 0, "3;#3": 1}


def test_sft_learns_openings_beside_whole_examples():
  tok = CharTokenizer()
  graphdef, params = _tiny_policy(tok)
  sft = SFTConfig(steps=60, batch_rows=2, row_len=32, learning_rate=1e-2, warmup_steps=5)
  openings = [("3x9=", "~9:1+3=4;8:"), ("2x7=", "~7:1+2=3;6:")]
  trained, history = train_sft(
    graphdef, params, tok, [("1+2=", "3;#3")], sft, progress=False, openings=openings
  )
  assert history[-1]["loss"] < 0.5 * history[0]["loss"]
  # Teacher-forced on the openings alone, the trained policy has learnt them.
  batch = next(pack_batches([encode_opening(tok, *o) for o in openings], 1, 32, seed=0))
  _, aux = sft_loss(nnx.merge(graphdef, trained), batch)
  assert aux["token_accuracy"] > 0.9


def test_sft_overfits_a_few_examples():
  tok = CharTokenizer()
  graphdef, params = _tiny_policy(tok)
  pairs = [("1+2=", "1+2=3;#3"), ("5+4=", "5+4=9;#9")]
  sft = SFTConfig(steps=60, batch_rows=2, row_len=32, learning_rate=1e-2, warmup_steps=5)
  _, history = train_sft(graphdef, params, tok, pairs, sft, progress=False)
  assert len(history) == 60
  assert history[-1]["loss"] < 0.5 * history[0]["loss"]
  assert history[-1]["token_accuracy"] > 0.8


def test_invalid_sft_config():
  with pytest.raises(ValueError, match="warmup_steps"):
    SFTConfig(steps=5, warmup_steps=5)


def test_key_windows_leave_an_sft_step_unchanged():
  tok = CharTokenizer()
  graphdef, params = _tiny_policy(tok)
  pairs = [(f"{a}+{b}=", f"{a}+{b}={a + b};#{a + b}") for a in range(9) for b in range(1, 9, 3)]
  seqs = [encode_example(tok, p, t) for p, t in pairs]
  batch = next(pack_batches(seqs, rows=2, row_len=64, seed=0))
  optimizer = sft_optimizer(SFTConfig(steps=10, warmup_steps=0))
  out = []
  for windows in ((), (16, 32)):
    step = make_train_step(graphdef, optimizer, windows)
    with causal_block(8):  # blocks of 8 in rows of 64: samples of ~13 tokens fit 16 keys
      p = jax.tree.map(jnp.copy, params)
      out.append(step(p, optimizer.init(p), batch)[2])
  for key in ("loss", "grad_norm"):
    np.testing.assert_allclose(out[1][key], out[0][key], rtol=1e-5)
  with pytest.raises(ValueError, match="key_windows"):
    SFTConfig(key_windows=(-1,))

"""A stand-in for JAX's cuDNN attention module (`models.attention.cudnn_module`), for tests
on hosts without a GPU: its `dot_product_attention` computes what JAX's documents for the
arguments `attention.attend_cudnn` passes, with JAX's own XLA attention."""

import types

import jax


def documented_cudnn(record=None):
  """The stand-in: q [B, N, T, H], k and v [B, N_kv, S, H] under qkv_layout "BNTH", a
  boolean mask broadcast over heads, a padding mask's query and key lengths a row; a CPU
  then checks the layouts, grouping and lengths `attend_cudnn` assumes. `record` collects
  the calls' query shapes."""
  padding = object()

  def dot_product_attention(query, key, value, *, mask, q_seqlen, kv_seqlen, mask_type, **kw):
    assert kw.pop("qkv_layout") == "BNTH" and mask_type is padding
    assert mask.dtype == bool and mask.shape[1] == 1
    if record is not None:
      record.append(query.shape)
    btnh = lambda x: x.transpose(0, 2, 1, 3)
    lengths = dict(query_seq_lengths=q_seqlen, key_value_seq_lengths=kv_seqlen)
    out = jax.nn.dot_product_attention(
      btnh(query), btnh(key), btnh(value), mask=mask, **lengths, **kw, implementation="xla"
    )
    return btnh(out)

  return types.SimpleNamespace(
    dot_product_attention=dot_product_attention, MaskType=types.SimpleNamespace(PADDING=padding)
  )

"""The host record every benchmark writes (experiments/host.py)."""

import pathlib
import sys

import jax
from flax import nnx

from tlt_jax.models.config import ModelConfig
from tlt_jax.models.transformer import init_model

# experiments/ is not an installed package: import it from the repository root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from experiments.host import FORWARD_TOKENS, format_host, host_info  # noqa: E402

TINY = ModelConfig(
  vocab_size=40, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64
)


def test_host_record_has_the_verification_cost_curve_of_the_policy():
  graphdef, params = nnx.split(init_model(TINY, seed=0))
  info = host_info((graphdef, params), bandwidth_bytes=1 << 20)
  assert info["cores"] >= 1 and info["cpu"] and info["read_bandwidth_gbs"] > 0
  assert info["policy_params"] == sum(x.size for x in jax.tree.leaves(params))
  assert list(info["forward_ms"]) == [str(n) for n in FORWARD_TOKENS]
  assert all(v > 0 for v in info["forward_ms"].values())
  assert info["forward_in_steps"]["1"] == 1.0
  line = format_host(info)
  assert info["cpu"] in line and "1/5/17-token forward" in line


def test_the_default_policys_forwards_can_be_left_out(monkeypatch):
  """TLT_HOST_FORWARDS=0 (the suite's setting, tests/conftest.py): the default policy's
  forwards are not timed and the record says so; a policy passed in is timed still."""
  monkeypatch.setenv("TLT_HOST_FORWARDS", "0")
  info = host_info(bandwidth_bytes=1 << 20)
  assert info["forward_ms"] == info["forward_in_steps"] == {} and info["policy_params"] == 0
  assert format_host(info).endswith("forwards not timed (TLT_HOST_FORWARDS=0)")
  graphdef, params = nnx.split(init_model(TINY, seed=0))
  assert list(host_info((graphdef, params), bandwidth_bytes=1 << 20)["forward_ms"]) == [
    str(n) for n in FORWARD_TOKENS
  ]

"""PRNG keys from host integers inside the RL loop, which runs under JAX's host-to-device
transfer guard (`GRPOConfig.transfer_guard`): building a key from a Python int copies the
int to the device, a copy meant here, so it is allowed where it is made."""

import jax


def folded_key(seed: int, *data: int) -> jax.Array:
  """`jax.random.key(seed)` folded in with each of `data` in turn (`jax.random.fold_in`)."""
  with jax.transfer_guard_host_to_device("allow"):
    key = jax.random.key(seed)
    for x in data:
      key = jax.random.fold_in(key, x)
  return key

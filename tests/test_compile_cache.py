"""The persistent compile cache: a second process loads what the first compiled, from a
folder of this host's own."""

import json
import os
import subprocess
import sys

from tlt_jax.utils import compile_cache

# Enables the cache in argv[1], compiles one program, prints its cache hits and the folder.
_CHILD = """
import json, sys
import jax, jax.numpy as jnp
from tlt_jax.utils import compile_cache
hits = []
jax.monitoring.register_event_listener(
  lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None
)
path = compile_cache.enable(sys.argv[1])
out = jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((8, 8)))
print(json.dumps({"path": path, "hits": len(hits), "out": float(out.sum())}))
"""


def _child(directory: str) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  # The program compiles in milliseconds, under JAX's one-second threshold for caching.
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  done = subprocess.run(
    [sys.executable, "-c", _CHILD, directory],
    capture_output=True,
    text=True,
    check=True,
    env=env,
  )
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_first_ones_programs(tmp_path):
  first = _child(str(tmp_path))
  assert first["path"] == os.path.join(str(tmp_path), compile_cache.host_tag())
  assert first["hits"] == 0 and os.listdir(first["path"])
  second = _child(str(tmp_path))
  assert second["hits"] >= 1 and second["out"] == first["out"]


def test_host_tag_names_the_processor_and_an_empty_folder_changes_nothing():
  tag = compile_cache.host_tag()
  assert tag == compile_cache.host_tag() and len(tag.rsplit("-", 1)[1]) == 12
  before = compile_cache.jax.config.jax_compilation_cache_dir
  assert compile_cache.enable("") == (before or "")
  assert compile_cache.jax.config.jax_compilation_cache_dir == before

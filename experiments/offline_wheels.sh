#!/usr/bin/env bash
# Wheels for a GPU machine that has Python 3.12, JAX (CUDA) and flax but no network: the
# rest of this project's runtime needs, downloaded here and installed there with
#   python3 -m pip install --no-index --no-deps --target /tmp/site <dir>/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
# Seen working on an H200 with jax 0.11.2 and flax 0.12.10 (experiments/RESULTS.md,
# 2026-11-28). flax is left out on purpose: the 0.12.8 wheel pinned in pyproject.toml does
# not import under jax 0.11.2; the machine's own flax does. tensorstore (22 MB) too: the H200
# machine's image has it (orbax needs >= 0.1.84), and without it a call's 64 MiB (the
# repository, the wheels, what it carries) holds the packed regime warm start
# (experiments/pack_warm_start.py, 23 MB).
#
#   bash experiments/offline_wheels.sh .whl
set -euo pipefail
DIR=${1:-.whl}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
platforms=(manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64
  manylinux_2_28_x86_64 manylinux_2_31_x86_64)
args=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d "$DIR")
for p in "${platforms[@]}"; do args+=(--platform "$p"); done
for pkg in ml_collections==1.1.0 tensorflow-datasets==4.9.10 array_record==0.8.6 dm-tree==0.1.10 \
  immutabledict==4.3.1 simple-parsing==0.1.9 docstring-parser==0.18.0 tensorflow-metadata==1.21.0 \
  googleapis-common-protos==1.76.0 termcolor==3.3.0 toml==0.10.2 tensorboardX==2.6.5 \
  importlib_resources==7.1.0 orbax-checkpoint==0.12.8 nest-asyncio==1.6.0 \
  chex==0.1.92 optax==0.2.8 etils==1.15.0; do
  $PY -m pip download -q "${args[@]}" "$pkg"
done
# promise (a tfds need) publishes no wheel: build its pure-Python one here.
$PY -m pip wheel -q --no-deps -w "$DIR" promise==2.3
ls "$DIR"

#!/usr/bin/env bash
# Correctness checks and the speculative-decoding benchmark on whatever accelerator JAX finds
# (GPU or TPU; CPU works too, slowly). Nothing is downloaded: every model is built here.
#
#   pip install -U "jax[cuda12]"   # or "jax[tpu]"; then: pip install -e '.[test]'
#   bash experiments/accelerator.sh runs/accelerator
#
# Writes logs under the output folder; the host line of every benchmark names the device.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/accelerator}
PY=${PYTHON:-python}
PLATFORM=$($PY -c "import jax; print(jax.default_backend())")
mkdir -p "$OUT"
echo "backend: $PLATFORM"
$PY -c "import jax; print(jax.devices())" | tee "$OUT/devices.txt"
$PY experiments/host.py | tee "$OUT/host.txt"

# 1. Exactness on the device: coupled sampling, verification, mixed precision, the engine.
JAX_PLATFORMS=$PLATFORM $PY -m pytest -q -p no:cacheprovider tests/test_verify.py \
  tests/test_engine_spec.py tests/test_precision.py tests/test_rollout_engine.py \
  2>&1 | tee "$OUT/tests.log"

# 2. Token identity at scale: the default job's warm start, float32 and bfloat16 compute.
$PY -m tlt_jax.main --config=configs/default.py --workdir="$OUT/default" --config.rl.steps=0 \
  2>&1 | tail -5 | tee "$OUT/default.log"
$PY experiments/check_coupled.py --workdir="$OUT/default" --prompts=32 --samples=8 --keys=1 \
  2>&1 | tee "$OUT/check_coupled_fp32.log"
$PY experiments/check_coupled.py --workdir="$OUT/default" --prompts=32 --samples=8 --keys=1 \
  --config.model.dtype=bfloat16 2>&1 | tee "$OUT/check_coupled_bf16.log"

# 3. Speculative decoding by batch size: the 50M policy and its drafter, then the benchmark.
$PY experiments/train_drafter.py --config=configs/sd_bench.py --workdir="$OUT/sd_policy" \
  --steps=900 --logit_weight=1.0 --out_name=drafter_kd900 2>&1 | tail -20 | tee "$OUT/train_drafter.log"
$PY experiments/bench_sd.py --workdir="$OUT/sd_policy" --drafter=drafter_kd900 \
  --out="$OUT/bench_sd" --control=chain4 2>&1 | grep -v "^[IW][0-9]" | tee "$OUT/bench_sd.log"
$PY experiments/cost_surface.py --out="$OUT/cost_surface" 2>&1 | tail -20 | tee "$OUT/cost_surface.log"
echo "done: $OUT"

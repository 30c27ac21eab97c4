#!/usr/bin/env bash
# Exactness and speed on whatever accelerator JAX finds (GPU or TPU; CPU works too, slowly).
# Nothing is downloaded: every model is built here. Stages run cheapest-to-compile first,
# each under its own time budget (seconds); a stage that fails or runs out does not stop the
# next, so one call on a borrowed machine returns whatever it could measure. On an H200 the
# 50M policy's programs took 15-45 s each to compile (experiments/RESULTS.md, stop 31), so
# the speculative-decoding stages come last and measure one batch size by default.
#
#   pip install -U "jax[cuda12]"   # or "jax[tpu]"; then: pip install -e '.[test]'
#   bash experiments/accelerator.sh runs/accelerator
#
# Everything printed goes to <out>/accelerator.log (less absl's INFO lines); the benchmarks'
# JSON and plots land beside it. Budgets: T_TESTS, T_COUPLED, T_COST, T_SD_TRAIN, T_BENCH;
# TEST_ARGS, COUPLED_ARGS, COST_ARGS, SD_TRAIN_ARGS and BENCH_ARGS add flags; SKIP names
# stages to leave out (e.g. SKIP="sd_train bench_sd" where 15 minutes is all there is).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/accelerator}
PY=${PYTHON:-python}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/accelerator.log"
: >"$LOG"
# Several processes (the test workers) share one device: allocate as needed.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# Stages that build the same programs (a warm start's engines) load them from disk.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$OUT/xla_cache}

stage() {  # stage NAME BUDGET COMMAND...: run it, keep its log, say how it ended
  local name=$1 budget=$2 start=$SECONDS rc
  shift 2
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    echo "== $name: skipped" | tee -a "$LOG"
    return
  fi
  echo "== $name: budget ${budget}s: $*" | tee -a "$LOG"
  timeout --signal=INT --kill-after=15 "$budget" "$@" 2>&1 | grep --line-buffered -v '^[IW][0-9]' >>"$LOG"
  rc=${PIPESTATUS[0]}
  echo "== $name: rc $rc after $((SECONDS - start)) s" | tee -a "$LOG"
}

stage devices 60 $PY -c "import jax; print(jax.__version__, jax.devices())"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm \
  --format=csv >>"$LOG" 2>&1

# 1. The exactness tests on the device (tiny models: quick to compile).
JAX_PLATFORMS=$($PY -c "import jax; print(jax.default_backend())") stage tests \
  "${T_TESTS:-150}" $PY -m pytest -q -p no:cacheprovider tests/test_verify.py \
  tests/test_precision.py tests/test_engine_spec.py ${TEST_ARGS:-}

# 2. Token identity at scale: coupled sampling on the default job's warm start (trained here),
#    float32 at the platform's default matmul precision (TF32 on recent NVIDIA GPUs), float32
#    throughout, then bfloat16 compute.
COUPLED="experiments/check_coupled.py --workdir=$OUT/default --prompts=32 --samples=8 --keys=1"
stage coupled_f32_default "${T_COUPLED:-120}" $PY $COUPLED --strategies=chain4 ${COUPLED_ARGS:-}
JAX_DEFAULT_MATMUL_PRECISION=highest stage coupled_f32_highest "${T_COUPLED:-120}" \
  $PY $COUPLED --strategies=chain4 ${COUPLED_ARGS:-}
stage coupled_bf16 "${T_COUPLED:-120}" $PY $COUPLED --strategies=chain4 \
  --config.model.dtype=bfloat16 ${COUPLED_ARGS:-}

# 3. The decode cost surface (ms per step by batch and tokens per row): where is b* here?
stage cost_surface "${T_COST:-200}" $PY experiments/cost_surface.py --out="$OUT/cost_surface" \
  --batches=1,8,32,128,512 --tokens=1,5,17 --contexts=1024 ${COST_ARGS:-}

# 4. Speculative decoding: the 50M policy and its drafter, then the benchmark.
stage sd_train "${T_SD_TRAIN:-300}" $PY experiments/train_drafter.py --config=configs/sd_bench.py \
  --workdir="$OUT/sd_policy" --steps=900 --logit_weight=1.0 --out_name=drafter_kd900 \
  ${SD_TRAIN_ARGS:-}
stage bench_sd "${T_BENCH:-600}" $PY experiments/bench_sd.py --workdir="$OUT/sd_policy" \
  --drafter=drafter_kd900 --out="$OUT/bench_sd" --batches=1 --control=chain4 ${BENCH_ARGS:-}
echo "done: $OUT" | tee -a "$LOG"

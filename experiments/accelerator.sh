#!/usr/bin/env bash
# Exactness and speed on whatever accelerator JAX finds (GPU or TPU; CPU works too, slowly).
# Nothing is downloaded: every model is built here. Each stage runs under its own time budget
# (seconds) and logs to <out>/<stage>.log; a stage that fails or runs out does not stop the
# others, so one call on a borrowed machine returns whatever it could measure.
#
# Compiles, not runs, are what a 15-minute lease runs out of (an H200 took 15-45 s per program
# of the 50M policy: experiments/RESULTS.md, 2026-11-26, the first H200 sitting). So the
# stages that time nothing (the exactness tests, the token-identity checks, the 50M policy's
# warm start and drafter) run side by side, each compiling on its own host cores; warm-ups
# compile their programs on several threads (ExecutablePool.compiling_ahead); on NVIDIA GPUs
# XLA's GEMM autotuning is off unless XLA_FLAGS says otherwise (cuBLAS's heuristics pick the
# kernels). The timed stages (the speculative benchmark, then the cost surface) run alone
# afterwards.
#
#   pip install -U "jax[cuda12]"   # or "jax[tpu]"; then: pip install -e '.[test]'
#   bash experiments/accelerator.sh runs/accelerator
#
# Budgets: T_TESTS, T_COUPLED, T_SD_TRAIN, T_BENCH, T_COST, or DEADLINE (seconds for the
# whole script: the benchmark then gets what is left); TESTS picks the tests (paths or node
# ids); TEST_ARGS, COUPLED_ARGS, SD_TRAIN_ARGS, BENCH_ARGS and COST_ARGS add flags (a flag
# given again wins); SKIP names stages to leave out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/accelerator}
PY=${PYTHON:-python}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/accelerator.log"
: >"$LOG"
# Several processes share one device: allocate as needed.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# Stages that build the same programs load them from disk.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$OUT/xla_cache}

say() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }

stage() {  # stage NAME BUDGET COMMAND...: run it into <out>/NAME.log, say how it ended
  local name=$1 budget=$2 start=$SECONDS rc
  shift 2
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    say "== $name: skipped"
    return
  fi
  say "== $name: budget ${budget}s: $*"
  timeout --signal=INT --kill-after=15 "$budget" "$@" 2>&1 |
    grep --line-buffered -v '^[IW][0-9]' >"$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  say "== $name: rc $rc after $((SECONDS - start)) s"
}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >>"$LOG" 2>&1
  if [[ -z "${XLA_FLAGS:-}" ]]; then
    export XLA_FLAGS=--xla_gpu_autotune_level=0
    # An XLA that no longer knows the flag refuses to start: then run without it.
    $PY -c "import jax; jax.jit(lambda x: x + 1)(1)" >/dev/null 2>&1 || unset XLA_FLAGS
  fi
fi
stage devices 120 $PY -c "import jax, flax, optax, orbax.checkpoint as ocp, tlt_jax
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
say "XLA_FLAGS=${XLA_FLAGS:-}"

# 1. Untimed stages, side by side. The drafter's stage feeds the benchmark: the others yield
# the host cores to it (nice).
# The exactness tests on the device (tiny models), with every platform visible (the suite
# defaults to CPU), float32 products at "highest" as their tolerances assume (the rollout's
# are by default; at TF32 the trainer's chunked and full log-probs differ by up to 5e-3).
JAX_PLATFORMS="" JAX_DEFAULT_MATMUL_PRECISION=highest stage tests "${T_TESTS:-240}" nice $PY -m pytest -q -p no:cacheprovider \
  -n "${TEST_WORKERS:-4}" ${TESTS:-tests/test_verify.py tests/test_precision.py \
  tests/test_engine_spec.py tests/test_pool.py} ${TEST_ARGS:-} &
# Token identity at scale: coupled sampling on the default job's warm start (trained here,
# one per check so they can run at once): float32 products at "highest" (the engine's
# default), at the platform's default (TF32 on recent NVIDIA GPUs), then bfloat16 compute.
COUPLED="experiments/check_coupled.py --prompts=16 --samples=8 --keys=1 --strategies=chain4"
stage coupled_f32 "${T_COUPLED:-240}" nice $PY $COUPLED --workdir="$OUT/coupled_f32" \
  ${COUPLED_ARGS:-} &
stage coupled_f32_platform "${T_COUPLED:-240}" nice $PY $COUPLED \
  --workdir="$OUT/coupled_f32_platform" --config.engine.matmul_precision=default \
  ${COUPLED_ARGS:-} &
stage coupled_bf16 "${T_COUPLED:-240}" nice $PY $COUPLED --workdir="$OUT/coupled_bf16" \
  --config.model.dtype=bfloat16 ${COUPLED_ARGS:-} &
# The 50M policy's warm start and its drafter, for the benchmark (which measures acceptance
# itself: the held-out check's programs would delay it).
stage sd_train "${T_SD_TRAIN:-300}" $PY experiments/train_drafter.py --config=configs/sd_bench.py \
  --workdir="$OUT/sd_policy" --steps=900 --logit_weight=1.0 --out_name=drafter_kd900 \
  --eval_prompts=0 ${SD_TRAIN_ARGS:-} &
wait

# 2. Timed stages, alone. Speculative decoding on the 50M policy: whatever batch sizes finish
#    within the budget are in bench_sd.log (one JSON row per configuration as it ends).
LEFT=$(( ${DEADLINE:-$((SECONDS + 600))} - SECONDS - 10 ))
stage bench_sd "${T_BENCH:-$LEFT}" $PY experiments/bench_sd.py --workdir="$OUT/sd_policy" \
  --drafter=drafter_kd900 --out="$OUT/bench_sd" --batches=1,4,16,64 --strategies=chain4,chain8 \
  --profile_batches= ${BENCH_ARGS:-}
# The decode cost surface (ms per step by batch and tokens per row): where is b* here?
stage cost_surface "${T_COST:-200}" $PY experiments/cost_surface.py --out="$OUT/cost_surface" \
  --batches=1,8,32,128,512 --tokens=1,5,17 --contexts=1024 ${COST_ARGS:-}
say "done: $OUT"

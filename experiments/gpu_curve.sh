#!/usr/bin/env bash
# TLT's figure on a GPU in one sitting: baseline, sd and tlt interleaved
# (experiments/learning_curve.py), reward and held-out accuracy against wall-clock time,
# with the program count and compile seconds printed.
#
# Variant gpu (configs/regime.py:gpu) is the CPU regime's own curve (the 13M policy, 16
# prompts x 8 samples, 40 RL steps) with a step's 128 rows in one engine call, from the
# CPU's warm start carried over: WARM_START names a folder experiments/pack_warm_start.py
# wrote (by default the committed experiments/warm_starts/regime_stage11_hostJ_2026-12-04,
# the eleventh SFT stage's policy and its drafter), copied into <out>/shared (its SFT took
# hours). Sized for ~9 minutes of device time with its compiles: programs capped by few
# batch and cache buckets, three chains, one packed update width and a plain held-out
# evaluation. Float32 products at "highest" and XLA's deterministic GPU ops, so the three
# modes' curves coincide step by step. Programs are cached on disk
# (JAX_COMPILATION_CACHE_DIR), so a second process in the sitting (a rerun after a failure,
# e.g. with --resume) compiles nothing it already compiled. Nothing is downloaded. Variant
# tiny rehearses the script on a CPU with tiny shapes, its warm starts built in the run.
#
#   pip install -U "jax[cuda12]"; pip install -e .                  # on the GPU machine
#   bash experiments/gpu_curve.sh runs/gpu_curve                    # the sitting
#   bash experiments/gpu_curve.sh /tmp/gpu_rehearsal tiny        # the CPU rehearsal, ~2 minutes
#
# Extra flags after the variant go to learning_curve.py (e.g. --config.rl.steps=30).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu_curve}
VARIANT=${2:-gpu}
shift $(($# < 2 ? $# : 2))
PY=${PYTHON:-python}
mkdir -p "$OUT"
if [ "$VARIANT" = gpu ]; then
  WARM_START=${WARM_START:-experiments/warm_starts/regime_stage11_hostJ_2026-12-04}
fi
if [ -n "${WARM_START:-}" ]; then
  if [ ! -d "$WARM_START/warm_start" ]; then
    echo "WARM_START=$WARM_START holds no warm_start (experiments/pack_warm_start.py)" >&2
    exit 2
  fi
  mkdir -p "$OUT/shared"
  for piece in warm_start drafter_warm_start config.json summary.json; do
    [ -e "$OUT/shared/$piece" ] || cp -r "$WARM_START/$piece" "$OUT/shared/"
  done
fi
export PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$OUT/xla_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_DEFAULT_MATMUL_PRECISION=highest
# Deterministic GPU reductions (the modes' parameters stay bit-equal) and no GEMM autotuning
# (cuBLAS's heuristics pick the kernels: compiles, not runs, fill a sitting). An XLA that
# does not know a flag refuses to start, so each is kept only if a jitted add still runs.
start=$SECONDS
if command -v nvidia-smi >/dev/null; then
  for flag in --xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0; do
    if XLA_FLAGS="${XLA_FLAGS:-} $flag" $PY -c "import jax; jax.jit(lambda x: x + 1)(1)" \
      >/dev/null 2>&1; then
      export XLA_FLAGS="${XLA_FLAGS:-} $flag"
    else
      echo "XLA does not take $flag: left out"
    fi
  done
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
fi
echo "XLA_FLAGS=${XLA_FLAGS:-}"
echo "$(date -u +%H:%M:%S) devices: $($PY -c 'import jax; print(jax.devices())')"
$PY experiments/learning_curve.py --config="configs/regime.py:$VARIANT" --out="$OUT" \
  --eval_batch=256 --eval_speculative=false --block=10 "$@" 2>&1 | tee "$OUT/gpu_curve.log"
echo "$(date -u +%H:%M:%S) done in $((SECONDS - start)) s; programs and compile seconds:"
$PY - "$OUT" <<'EOF'
import json, sys
report = json.load(open(f"{sys.argv[1]}/learning_curve.json"))
total = sum(p["rollout"] + p.get("update", 0) for p in report["programs"].values())
seconds = sum(p["rollout_s"] + p.get("update_s", 0) for p in report["programs"].values())
for name, p in report["programs"].items():
  print(f"  {name}: {p}")
print(f"  all: {total} programs, {seconds:.0f} s compiling")
EOF

#!/usr/bin/env bash
# One time-boxed device sitting in one call, its parts in the order ORDER names (default: real
# sizes first, the measurements still missing, then the rest in the time left):
#   sizes    the real-sizes stages (experiments/real_sizes.py), batch-1 decode and the
#            update first. Measured afresh: the H200's results of 2026-12-04
#            (experiments/results/regime_curve_stage9_h200_2026-12-04) predate the one-row
#            step as two tokens, the one-row cache write in place and the dots as a GPU's
#            attention, which change its programs; within a sitting every figure is one
#            code's;
#   fused    experiments/bench_step_variants.py --compare=fused: the 8B shape's attention as
#            cuDNN's fused kernel (one kernel a layer, the scores kept on chip) against the
#            dots "auto" takes on GPUs, at one row and at 16 and 64 rows of 5 new tokens
#            (verifying chain-4 rounds mid-batch, where the dots' scores are most of what a
#            forward writes), each cell's outputs compared between the two;
#   head     experiments/bench_step_variants.py --compare=head on the device, under the
#            rollout's "highest": a bfloat16 policy's head as the float32 product it was until
#            2026-12-06 against the bfloat16 one, the 8B shape at 1, 32 and 64 rows;
#   forms    the same script's --compare=form: the 8B shape's
#            attention as multiply-reduce against the dots, which "auto" now takes on GPUs;
#   writes   the same script's --compare=write: the one-row cache write in place against
#            the scatter it replaced, the 50M policy and the 8B shape;
#   harvest  about a minute of experiments/bench_harvest.py (what mode tlt's copy of hidden
#            states to the host costs its rollout);
#   curve    TLT's learning curve on the GPU (experiments/gpu_curve.sh);
#   drafter  experiments/bench_drafter_update.py at Qwen3-8B's width: the online drafter's
#            update seconds, whole batch against logit chunks (their recomputation's cost).
# What is worth keeping is copied into KEEP (the folder a device call brings back) as each
# part ends, so a sitting cut short returns what it reached; called again while the machine
# is warm, it goes on where the last call stopped (real sizes from its results file, the
# curve from its checkpoints).
#
#   bash experiments/device_sitting.sh "$OUT"              # on the device, ~9.5 minutes
#   bash experiments/device_sitting.sh /tmp/sitting tiny   # the CPU rehearsal, ~3 minutes
#
# DEADLINE: seconds for the whole call (default 570). Each part takes at most its cap and
# the time left: SIZES_S (default 400), FUSED_S (150), HEAD_S (120), FORMS_S (150), WRITES_S (120),
# HARVEST_S (150), CURVE_S (480; the stage-9 curve took 453 s on the H200 on 2026-12-04),
# DRAFTER_S (120);
# PROFILE_STEP: the curve's step traced in every mode (default 25; 1 in the rehearsal).
# ORDER: e.g. "curve harvest sizes" (default "sizes fused head forms writes harvest curve
# drafter").
# RUNS: where the runs live on the machine (default runs/sitting_<variant>).
set -uo pipefail
cd "$(dirname "$0")/.."
KEEP=${1:?usage: experiments/device_sitting.sh KEEP [gpu|tiny]}
VARIANT=${2:-gpu}
PY=${PYTHON:-python}
DEADLINE=${DEADLINE:-570}
SIZES_S=${SIZES_S:-400}
FUSED_S=${FUSED_S:-150}
HEAD_S=${HEAD_S:-120}
FORMS_S=${FORMS_S:-150}
WRITES_S=${WRITES_S:-120}
HARVEST_S=${HARVEST_S:-150}
CURVE_S=${CURVE_S:-480}
DRAFTER_S=${DRAFTER_S:-120}
ORDER=${ORDER:-sizes fused head forms writes harvest curve drafter}
RUNS=${RUNS:-runs/sitting_$VARIANT}
PROFILE_STEP=${PROFILE_STEP:-$([ "$VARIANT" = tiny ] && echo 1 || echo 25)}
# The benchmarks' host records leave out the 50M reference policy's forwards (compiled and
# timed anew by each process: device seconds the real-size stages spend on the same policy).
export TLT_HOST_FORWARDS=${TLT_HOST_FORWARDS:-0}
mkdir -p "$KEEP" "$RUNS"
KEEP=$(cd "$KEEP" && pwd)
start=$SECONDS
say() { echo "$(date -u +%H:%M:%S) +$((SECONDS - start))s $*" | tee -a "$KEEP/sitting.log"; }
# A part's seconds: its cap or the time left less a margin, whichever is smaller.
budget() {
  local left=$((DEADLINE - (SECONDS - start) - 10))
  echo $(($1 < left ? $1 : left))
}

curve=$RUNS/gc
sizes=$RUNS/rs

part_curve() {
  if [ -f "$curve/learning_curve.json" ]; then
    say "curve: finished in an earlier call"
  else
    local s resume=()
    s=$(budget "$CURVE_S")
    [ -d "$curve/baseline_s0" ] && resume=(--resume)
    if [ "$s" -lt 60 ]; then
      say "curve: ${s}s left, not started"
    else
      say "curve: up to ${s}s ${resume[*]:-}"
      # One step of each mode traced (GRPOConfig.profile_steps; learning_curve.json's
      # "profiles"): where tlt's rollout and update spent the seconds the H200's curve of
      # 2026-12-04 could not place. The transfer guard that fails a CPU test on a hidden copy
      # (GRPOConfig.transfer_guard) only logs here: a copy only a GPU makes is a line of
      # curve.log, not the end of the curve.
      timeout -k 5 "$s" env PYTHON="$PY" bash experiments/gpu_curve.sh "$curve" "$VARIANT" \
        "${resume[@]}" "--config.rl.profile_steps=($PROFILE_STEP,)" \
        --config.rl.transfer_guard=log >>"$KEEP/curve.log" 2>&1
      say "curve: rc $?"
    fi
  fi
  # The report and its plot (here also when an earlier call made them).
  cp "$curve"/learning_curve.json "$curve"/learning_curve.md "$curve"/learning_curve.png \
    "$KEEP/" 2>/dev/null
}

# A benchmark part: `bench PART CAP SCRIPT PATTERN ARGS...` runs experiments/SCRIPT.py
# with ARGS into $RUNS/PART.json (skipped when an earlier call wrote it) and copies its
# log's lines matching PATTERN into the sitting's log; a run cut short leaves PART.json.part
# (the archive takes it), which a later call starts over.
bench() {
  local part=$1 cap=$2 script=$3 pattern=$4 s
  shift 4
  local out=$RUNS/$part.json
  if [ -f "$out" ]; then
    say "$part: finished in an earlier call"
    return
  fi
  s=$(budget "$cap")
  if [ "$s" -lt 30 ]; then
    say "$part: ${s}s left, not started"
    return
  fi
  say "$part: up to ${s}s"
  timeout -k 5 "$s" "$PY" "experiments/$script.py" "$@" --out="$out.part" \
    >"$RUNS/$part.log" 2>&1 && mv "$out.part" "$out"
  say "$part: rc $?"
  grep -- "$pattern" "$RUNS/$part.log" | tee -a "$KEEP/sitting.log"
}

part_harvest() {
  # Off, float32 and bfloat16 cast on the device, copied asynchronously.
  case $VARIANT in
    tiny) set -- --config=configs/regime.py:tiny --prompts=2 --rounds=1 ;;
    *) set -- --config=configs/regime.py:gpu --rounds=5 ;;
  esac
  bench harvest "$HARVEST_S" bench_harvest "^|" "$@"
}

part_drafter() {
  case $VARIANT in
    tiny) set -- --shape=tiny --vocab=0 --batch=2x64 --settings=0,16,16/remat --reps=2 ;;
    *) set -- --shape=qwen3-8b --vocab=0 --batch=4x2048 --settings=0,1024,1024/remat --reps=5 ;;
  esac
  bench drafter "$DRAFTER_S" bench_drafter_update "^|" "$@"
}

part_head() {
  # Two variants' loops are held at once: 64 rows of the 8B's cache at a view of 2,048 slots
  # are 19.3 GB each, beside 16.4 GB of weights.
  case $VARIANT in
    tiny) set -- --shapes=tiny --cells=1x1,2x1 --context=16 --reps=2 ;;
    *) set -- --shapes=qwen3-8b --cells=1x1,32x1,64x1 --context=1024 --reps=10 ;;
  esac
  bench head "$HEAD_S" bench_step_variants "x[0-9]*:" --compare=head --matmul_precision=highest "$@"
}

part_fused() {
  # Two variants' loops are held at once: 64 rows of the 8B's cache at 2,048 slots are
  # 19.3 GB each, beside 16.4 GB of weights. The tiny shape is a bfloat16 policy.
  case $VARIANT in
    tiny) set -- --shapes=tiny --cells=1x1,2x5 --context=16 --reps=2 ;;
    *) set -- --shapes=qwen3-8b --cells=1x1,1x2,16x5,64x5 --context=1024 --reps=10 ;;
  esac
  bench fused "$FUSED_S" bench_step_variants "x[0-9]*:" --compare=fused "$@"
}

part_forms() {
  # The 8B's one-row step, two-row verifications and a 16-row decode, where a CPU takes the
  # multiply-reduce: the 2026-12-04 grid's two rows cost 1.46x / 1.73x one row's.
  case $VARIANT in
    tiny) set -- --shapes=configs/sd_bench.py:tiny --cells=1x2,2x5 --context=16 --reps=2 ;;
    *) set -- --shapes=qwen3-8b --cells=2x5,1x2,16x1,2x9 --context=1024 --reps=10 ;;
  esac
  bench forms "$FORMS_S" bench_step_variants "x[0-9]*:" --compare=form "$@"
}

part_writes() {
  case $VARIANT in
    tiny) set -- --shapes=configs/sd_bench.py:tiny --cells=1x1,1x2 --context=16 --reps=2 ;;
    *) set -- --shapes=configs/sd_bench.py,qwen3-8b --cells=1x1,1x2 --context=1024 --reps=10 ;;
  esac
  bench writes "$WRITES_S" bench_step_variants "x[0-9]*:" --compare=write "$@"
}

part_sizes() {
  local s args stages
  mkdir -p "$sizes"
  if [ "$VARIANT" = tiny ]; then # the flags of tests/test_real_sizes.py
    args=(--shapes=tiny --contexts=16 --tokens=1,2,5 --overhead_tokens=5 --accept=chain4=3.0
      --max_batch=2 --copy_gb=0.01 --update_rows=4 --update_width=16 --reps=2 --steps=2
      --policies=configs/sd_bench.py:tiny)
  else
    # The update before the grid: two sittings' grids left it no time. The 8B's XLA flag
    # settings (overhead) were measured on 2026-12-04 (autotuning off 3x slower, command
    # buffers nothing), so they wait for the grid this time; the 50M policy's are not yet.
    stages=decode_b1,bandwidth,verify_b1,policy_overhead,update,decode_b1_profile
    args=(--stages=$stages,decode_grid,rounds,engine_rounds,overhead,update_unrolled)
  fi
  s=$(budget "$SIZES_S")
  if [ "$s" -lt 60 ]; then
    say "real sizes: ${s}s left, not started"
  else
    # A stage's cell is not cut: each stage stops adding cells 30 s before the timeout.
    say "real sizes: up to ${s}s"
    timeout -k 5 "$s" "$PY" experiments/real_sizes.py --out="$sizes" --stage_s=$((s - 30)) \
      "${args[@]}" >>"$KEEP/real_sizes.log" 2>&1
    say "real sizes: rc $?"
  fi
  [ -f "$sizes/real_sizes.json" ] && cp "$sizes/real_sizes.json" "$KEEP/"
}

for part in $ORDER; do
  case $part in
    sizes | fused | head | forms | writes | harvest | curve | drafter) "part_$part" ;;
    *) say "unknown part $part (sizes, fused, head, forms, writes, harvest, curve, drafter)" ;;
  esac
done
# In one archive (a device call brings back 8 files at most): the curve's per-step tables,
# its warm start's summary, its script's log and, when it was cut short, each run's own
# per-step metrics; tlt's rollout timelines (experiments/beside_compile_pace.py reads how
# its chunks ran beside background compiles); the copy's benchmark and its log.
(cd "$RUNS" && tar czf "$KEEP/sitting_files.tgz" --ignore-failed-read gc/steps_*.csv \
  gc/shared/summary.json gc/gpu_curve.log gc/*_s0/metrics.jsonl \
  gc/tlt_s0/rollout_timelines.jsonl harvest.json harvest.log \
  fused.json fused.json.part fused.log head.json head.json.part head.log forms.json \
  forms.json.part forms.log writes.json writes.json.part writes.log drafter.json drafter.log \
  2>/dev/null)
say "sitting: done"

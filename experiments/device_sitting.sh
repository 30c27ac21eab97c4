#!/usr/bin/env bash
# One lent device sitting, in the order the issues ask: TLT's learning curve on the GPU first
# (experiments/gpu_curve.sh), a minute of experiments/bench_harvest.py (what mode tlt's copy
# of hidden states to the host costs its rollout), then the real-sizes stages
# (experiments/real_sizes.py) in the time left. What is worth keeping is copied into KEEP
# (the folder a device call brings back) as each part ends, so a sitting cut short returns
# what it reached; called again while the machine is warm, it goes on where the last call
# stopped (the curve from its checkpoints, real sizes from its results file).
#
#   bash experiments/device_sitting.sh "$OUT"              # on the device, ~9.5 minutes
#   bash experiments/device_sitting.sh /tmp/sitting tiny   # the CPU rehearsal, ~5 minutes
#
# DEADLINE: seconds for the whole call (default 570); CURVE_S: the curve's part (default
# 480; the stage-9 curve took 453 s on the H200 on 2026-12-04); RUNS: where the runs live on
# the machine (default runs/sitting_<variant>). Real sizes start from the H200's recorded
# results (experiments/results/regime_curve_stage9_h200_2026-12-04), whose finished stages
# are skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
KEEP=${1:?usage: experiments/device_sitting.sh KEEP [gpu|tiny]}
VARIANT=${2:-gpu}
PY=${PYTHON:-python}
DEADLINE=${DEADLINE:-570}
CURVE_S=${CURVE_S:-480}
RUNS=${RUNS:-runs/sitting_$VARIANT}
mkdir -p "$KEEP" "$RUNS"
KEEP=$(cd "$KEEP" && pwd)
start=$SECONDS
say() { echo "$(date -u +%H:%M:%S) +$((SECONDS - start))s $*" | tee -a "$KEEP/sitting.log"; }

# 1. The learning curve.
curve=$RUNS/gc
if [ -f "$curve/learning_curve.json" ]; then
  say "curve: finished in an earlier call"
else
  resume=()
  [ -d "$curve/baseline_s0" ] && resume=(--resume)
  say "curve: up to ${CURVE_S}s ${resume[*]:-}"
  timeout -k 5 "$CURVE_S" env PYTHON="$PY" bash experiments/gpu_curve.sh "$curve" "$VARIANT" \
    "${resume[@]}" >"$KEEP/curve.log" 2>&1
  say "curve: rc $?"
fi
# 2. What carrying the rows' hidden states to the host costs a tlt rollout: off, float32 and
# bfloat16 cast on the device, copied asynchronously (experiments/bench_harvest.py, ~1 minute).
harvest=$RUNS/bench_harvest.json
if [ -f "$harvest" ]; then
  say "harvest: finished in an earlier call"
else
  say "harvest: up to 150s"
  case $VARIANT in
    tiny) hargs=(--config=configs/regime.py:tiny --prompts=2 --rounds=1) ;;
    *) hargs=(--config=configs/regime.py:gpu --rounds=5) ;;
  esac
  timeout -k 5 150 "$PY" experiments/bench_harvest.py "${hargs[@]}" --out="$harvest.part" \
    >"$RUNS/bench_harvest.log" 2>&1 && mv "$harvest.part" "$harvest"
  say "harvest: rc $?"
  grep "^|" "$RUNS/bench_harvest.log" | tee -a "$KEEP/sitting.log"
fi

# The report and its plot, and in one archive (a device call brings back 8 files at most)
# the per-step tables, the warm start's summary, the script's log, the copy's benchmark and,
# when the curve was cut short, each run's own per-step metrics; here also when an earlier
# call finished them.
cp "$curve"/learning_curve.json "$curve"/learning_curve.md "$curve"/learning_curve.png \
  "$KEEP/" 2>/dev/null
(cd "$curve" && tar czf "$KEEP/curve_files.tgz" --ignore-failed-read steps_*.csv \
  shared/summary.json gpu_curve.log ./*_s0/metrics.jsonl ../bench_harvest.json \
  ../bench_harvest.log 2>/dev/null)
# 3. Real sizes in the time left (a stage's cell is not cut: the timeout leaves a margin).
sizes=$RUNS/rs
mkdir -p "$sizes"
if [ "$VARIANT" = tiny ]; then # the flags of tests/test_real_sizes.py
  args=(--shapes=tiny --contexts=16 --tokens=1,5 --overhead_tokens=5 --accept=chain4=3.0
    --max_batch=2 --copy_gb=0.01 --update_rows=4 --update_width=16 --reps=2 --steps=2
    --policies=configs/sd_bench.py:tiny)
else
  recorded=experiments/results/regime_curve_stage9_h200_2026-12-04/real_sizes.json
  [ -f "$sizes/real_sizes.json" ] || cp "$recorded" "$sizes/"
  # The update before the grid: two sittings' grids left it no time.
  stages=decode_b1,bandwidth,verify_b1,overhead,policy_overhead,decode_b1_profile,update
  args=(--stages=$stages,decode_grid,rounds,update_unrolled)
fi
left=$((DEADLINE - (SECONDS - start)))
if [ "$left" -lt 60 ]; then
  say "real sizes: ${left}s left, not started"
else
  say "real sizes: up to $((left - 10))s"
  timeout -k 5 $((left - 10)) "$PY" experiments/real_sizes.py --out="$sizes" \
    --stage_s=$((left - 40)) "${args[@]}" >"$KEEP/real_sizes.log" 2>&1
  say "real sizes: rc $?"
fi
[ -f "$sizes/real_sizes.json" ] && cp "$sizes/real_sizes.json" "$KEEP/"
say "sitting: done"

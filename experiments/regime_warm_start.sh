#!/usr/bin/env bash
# The warm start of configs/regime.py's curve, as it was built on host H (2-core CPU,
# 2026-11-28/29; experiments/RESULTS.md): eight SFT stages, each continuing the last, about
# three hours in all (3.2-3.4 s a step of 4 rows x 1,024 tokens there), and a ninth added on
# host J (2026-12-04).
#
#   1-3  the demonstrator 80% hasty, counters that count up: 700 steps at 3e-3 from random
#        weights, 560 at 1e-3, 450 at 5e-4 (7.0M tokens). Careful answers stopped a line or
#        two early or late in half the cases: sampled, they passed less often than hasty ones
#        (0.13 vs 0.30), so GRPO dropped care.
#   4    half hasty, 220 steps at 1e-3: more careful demonstrations alone did not fix it
#        (careful 0.16, hasty 0.30).
#   5-6  counters that count down (the steps left: when to stop is local), 70% hasty,
#        320 steps at 1e-3 (careful 0.25, hasty 0.17: the new format half learnt), then
#        200 at 5e-4 (careful 0.41, hasty 0.24, care's share 0.32; the first curve's warm
#        start, 2026-11-29). Forced careful, sampled: 0.38 on 64 training problems.
#   7-8  short problems (median 4 steps, then 2), 70% hasty, 250 steps at 5e-4 each. Where
#        careful answers went wrong was their first line, copied from the question (the
#        count often read 2 off): teacher-forced, 7% of its tokens wrong and half the
#        solutions with one there, where every later line erred < 0.2% a token
#        (experiments/line_errors.py). Short problems make first lines a quarter to half
#        of the tokens. Forced careful, sampled: 0.52 after stage 7, 0.57 after stage 8
#        (greedy 0.66; the policy's pick: careful 0.58, hasty 0.31, care's share 0.31): the
#        second curve's warm start, on which the reward rose +0.13 in 40 steps.
#   9    90% hasty, median 4, 100 steps at 3e-4 (8 min on host J; STAGE9=0 stops after
#        stage 8): care's share of openings 0.31 -> 0.08, so the effort choice falls inside
#        the curve rather than mostly before its first quarter; the rise doubled on the two
#        seeds that missed the bar on stage 8 (2026-12-04, experiments/RESULTS.md). Packed,
#        with its drafter: experiments/warm_starts/regime_stage9_hostJ_2026-12-04.
#
# Then the curve on it (the drafter's warm start is built there, from this policy):
#   mkdir -p runs/curve/shared && cp -r <OUT>/9/warm_start runs/curve/shared/
#   python experiments/learning_curve.py --config=configs/regime.py --out=runs/curve
#
#   bash experiments/regime_warm_start.sh runs/regime_warm_start
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/regime_warm_start}
PY=${PYTHON:-python}
mkdir -p "$OUT"

stage() {  # stage <n> <from: a warm_start folder or ""> <steps> <lr> <hasty> <countdown> [median]
  local n=$1 from=$2 steps=$3 lr=$4 hasty=$5 countdown=$6 median=${7:-12}
  if [ -f "$OUT/$n/warm_start/commit_success.txt" ]; then
    echo "stage $n: done already ($OUT/$n/warm_start)"
    return
  fi
  echo "stage $n: $steps SFT steps at $lr, hasty_fraction $hasty, countdown $countdown, median $median"
  # rl.steps=0: SFT, then main.py's held-out check of the warm start.
  $PY -m tlt_jax.main --config=configs/regime.py --workdir="$OUT/$n" \
    --config.mode=baseline --config.rl.steps=0 \
    --config.sft.init_from="$from" --config.sft.steps="$steps" \
    --config.sft.learning_rate="$lr" --config.sft.warmup_steps="$([ -z "$from" ] && echo 20 || echo 10)" \
    --config.task.params.hasty_fraction="$hasty" --config.task.params.countdown="$countdown" \
    --config.task.params.median_steps="$median"
}

stage 1 "" 700 3e-3 0.8 False
stage 2 "$OUT/1/warm_start" 560 1e-3 0.8 False
stage 3 "$OUT/2/warm_start" 450 5e-4 0.8 False
stage 4 "$OUT/3/warm_start" 220 1e-3 0.5 False
stage 5 "$OUT/4/warm_start" 320 1e-3 0.7 True
stage 6 "$OUT/5/warm_start" 200 5e-4 0.7 True
stage 7 "$OUT/6/warm_start" 250 5e-4 0.7 True 4
stage 8 "$OUT/7/warm_start" 250 5e-4 0.7 True 2
if [ "${STAGE9:-1}" = 1 ]; then
  stage 9 "$OUT/8/warm_start" 100 3e-4 0.9 True 4
  echo "the curve's warm start: $OUT/9/warm_start"
  exit 0
fi
echo "stage 8's warm start (the curve's until 2026-12-04): $OUT/8/warm_start"

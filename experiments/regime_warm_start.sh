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
#   9    90% hasty, median 4, 100 steps at 3e-4 (8 min on host J): care's share of
#        openings 0.31 -> 0.08, so the effort choice falls inside the curve rather than
#        mostly before its first quarter; the rise doubled on the two seeds that missed the
#        bar on stage 8 (2026-12-04, experiments/RESULTS.md). Its packed copy, with its
#        drafter, is in the repository's history at e59f77e
#        (experiments/warm_starts/regime_stage9_hostJ_2026-12-04).
#   10   longer problems in rows of 2,048 tokens, 90% hasty, at 5e-4 (host J, 2026-12-04,
#        from stage 9's packed copy): a) 100 steps on median 20, spread 1.3, up to 250
#        steps; b) 150 on median 100, spread 0.6; c) 100 on a)'s mix. Later lines of
#        100-170-line answers learnt (token errors 0.3-7%), short counts kept, but the
#        first line of a problem of more than 99 steps (its three-digit count) still wrong
#        in 98%.
#   11   experiments/sft_openings.py: 150 steps at 5e-4 on a)'s whole demonstrations mixed
#        with 20,000 openings (the first 2-16 lines, no EOS) of problems of median 130
#        steps: ~15 three-digit first lines a step. Such first lines 98% -> 35% wrong,
#        free careful answers to 90-250-step problems 864 -> 1,537 tokens, a step's
#        longest answer 7.7x -> 17.7x its median (2026-12-04). Packed, with its drafter:
#        experiments/warm_starts/regime_stage11_hostJ_2026-12-04.
#
# LAST=<n> stops after stage n (default 11; the curves of 2026-11-29 to 2026-12-04 ran
# from stages 8 and 9).
#
# Then the curve on it (the drafter's warm start is built there, from this policy):
#   mkdir -p runs/curve/shared && cp -r <OUT>/11/warm_start runs/curve/shared/
#   python experiments/learning_curve.py --config=configs/regime.py --out=runs/curve
#
#   bash experiments/regime_warm_start.sh runs/regime_warm_start
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/regime_warm_start}
PY=${PYTHON:-python}
mkdir -p "$OUT"

stage() {  # stage <n> <from: a warm_start folder or ""> <steps> <lr> <hasty> <countdown> [median [flags]]
  local n=$1 from=$2 steps=$3 lr=$4 hasty=$5 countdown=$6 median=${7:-12}
  shift $(($# < 7 ? $# : 7))
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
    --config.task.params.median_steps="$median" "$@"
}
done_after() {  # done_after <n>: stop here when LAST=<n>
  if [ "${LAST:-11}" = "$1" ]; then
    echo "the warm start: $OUT/$1/warm_start"
    exit 0
  fi
}

stage 1 "" 700 3e-3 0.8 False
stage 2 "$OUT/1/warm_start" 560 1e-3 0.8 False
stage 3 "$OUT/2/warm_start" 450 5e-4 0.8 False
stage 4 "$OUT/3/warm_start" 220 1e-3 0.5 False
stage 5 "$OUT/4/warm_start" 320 1e-3 0.7 True
stage 6 "$OUT/5/warm_start" 200 5e-4 0.7 True
stage 7 "$OUT/6/warm_start" 250 5e-4 0.7 True 4
stage 8 "$OUT/7/warm_start" 250 5e-4 0.7 True 2
done_after 8
stage 9 "$OUT/8/warm_start" 100 3e-4 0.9 True 4
done_after 9
# Longer problems need rows of 2,048 tokens and answers of up to 3,016.
LONG=(--config.task.params.max_steps=250 --config.sft.row_len=2048
  --config.engine.max_new_tokens=3016 --config.rl_update.pack_width=3032
  --config.eval.num_examples=8 --config.rl.eval_samples=0)
stage 10a "$OUT/9/warm_start" 100 5e-4 0.9 True 20 "${LONG[@]}" --config.task.params.steps_sigma=1.3
stage 10b "$OUT/10a/warm_start" 150 5e-4 0.9 True 100 "${LONG[@]}" --config.task.params.steps_sigma=0.6
stage 10c "$OUT/10b/warm_start" 100 5e-4 0.9 True 20 "${LONG[@]}" --config.task.params.steps_sigma=1.3
done_after 10c
if [ ! -f "$OUT/11/warm_start/commit_success.txt" ]; then
  echo "stage 11: openings of long problems (experiments/sft_openings.py)"
  $PY experiments/sft_openings.py --config=configs/regime.py \
    --init="$OUT/10c/warm_start" --out="$OUT/11"
fi
echo "the curve's warm start: $OUT/11/warm_start"

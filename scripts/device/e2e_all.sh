#!/usr/bin/env bash
# Device: the end-to-end launches of the "prove it on the H200" issue in one call, side by side on one
# GPU, inside a time budget; everything lands in one tarball ($OUT/e2e.tgz, the device tool returns at
# most 8 files) and a summary on stdout.
#   bash scripts/device/setup.sh >/dev/null && . /tmp/site/env.sh && BUDGET=570 bash scripts/device/e2e_all.sh
# Env: BUDGET seconds from now (570), NFT_STEPS (20), NFT_PHASES ("1 2 export": interrupted after the
#      checkpoint of step NFT_KILL_AFTER (NFT_SAVE_FREQ, 5), at NFT_KILL_AT seconds (half the budget) at the latest,
#      and resumed), NFT_REWARDS (TOML array; default JPEG + OCR),
#      NFT_PROMPTS (builtin:ocr), SUITE ("sft video grpo ddrl"; empty = none), SUITE_STEPS (6),
#      NFT_GPU / SUITE_GPU (a CUDA_VISIBLE_DEVICES value each, e.g. 0 and 1 on a 2-GPU machine; unset =
#      every GPU, so both share one).
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
t0=$(date +%s); budget=${BUDGET:-570}
logs=/tmp/e2e-all; mkdir -p "$logs"
nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv -l 5 >"$logs/gpu.csv" 2>&1 &
monitor=$!
on_gpu() {  # $1 = CUDA_VISIBLE_DEVICES value or empty (every GPU); runs the rest
  local gpu=$1; shift
  if [[ -n $gpu ]]; then CUDA_VISIBLE_DEVICES=$gpu "$@"; else "$@"; fi
}
[[ -f /tmp/e2e/model/model_index.json ]] ||
  cosmos-sana make-tiny --out /tmp/e2e/model --preset sana-1600m --device cuda --dtype bfloat16 >"$logs/make_tiny.log" 2>&1
mkdir -p /tmp/suite && ln -sfn /tmp/e2e/model /tmp/suite/model-sana-1600m
echo "model ready at $(( $(date +%s) - t0 )) s"

nft() {
  local phases=${NFT_PHASES:-1 2 export} kill_at=${NFT_KILL_AT:-$(( budget / 2 ))}
  local export_s=90 now
  (( kill_at > 120 && budget - export_s - kill_at > 120 )) || { echo "BUDGET=$budget too small for kill and resume" >&2; return 1; }
  now=$(( $(date +%s) - t0 ))
  (( kill_at - now > 60 )) || { echo "only $(( kill_at - now )) s left for phase 1 (NFT_KILL_AT=$kill_at)" >&2; return 1; }
  PHASES=$phases STEPS=${NFT_STEPS:-20} SAVE_FREQ=${NFT_SAVE_FREQ:-5} PROMPTS=${NFT_PROMPTS:-builtin:ocr} \
    REWARDS=${NFT_REWARDS:-'[{name="jpeg_compressibility"},{name="ocr"}]'} \
    KILL_AFTER=${NFT_KILL_AFTER:-${NFT_SAVE_FREQ:-5}} PHASE1_TIMEOUT=$(( kill_at - now )) PHASE2_DEADLINE=$(( t0 + budget - export_s )) \
    OUT=$logs/nft on_gpu "${NFT_GPU:-}" bash scripts/device/e2e_nft.sh >"$logs/nft.txt" 2>&1
}
nft &
pids=($!)
if [[ -n ${SUITE-sft video grpo ddrl} ]]; then
  # shellcheck disable=SC2086  # SUITE is a list of job names
  DEADLINE=$(( t0 + budget - 20 )) STEPS=${SUITE_STEPS:-6} OUT=$logs/suite \
    on_gpu "${SUITE_GPU:-}" bash scripts/device/e2e_suite.sh ${SUITE-sft video grpo ddrl} >"$logs/suite.txt" 2>&1 &
  pids+=($!)
fi
running() { local p; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while (( $(date +%s) < t0 + budget )) && running; do sleep 2; done
running && pkill -INT -f "cosmos-rl|cosmos_rl"  # past the budget: stop the launches still running
kill "$monitor" 2>/dev/null
[[ -s $logs/nft/metrics.jsonl ]] ||  # e2e_nft.sh writes it when it reaches its export phase
  find /tmp/e2e/out -name metrics.jsonl -print0 2>/dev/null | sort -z | xargs -0r cat >"$logs/nft/metrics.jsonl"
echo "--- nft"; cat "$logs/nft.txt"
echo "--- suite"; cat "$logs/suite.txt" 2>/dev/null
echo "--- peak memory per GPU (timestamp, index, MiB, util)"
tail -n +2 "$logs/gpu.csv" | sort -t, -k3 -n | awk -F, '{peak[$2] = $0} END {for (g in peak) print peak[g]}'
mkdir -p "${OUT:-/tmp}" && tar czf "${OUT:-/tmp}/e2e.tgz" -C "$logs" .
echo "done at $(( $(date +%s) - t0 )) s; logs in ${OUT:-/tmp}/e2e.tgz"

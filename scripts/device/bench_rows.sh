#!/usr/bin/env bash
# Device: bench rows beside bench/run_all.sh — rollout at 512² (B=8, B=1) and 1024² B=1 with fewer
# variants, export of a 1600M checkpoint (all cases, a longer limit), reward scorer throughput at 512²
# (not in run_all.sh) — each under its own limit, JSON + logs
# into $OUT, the table at the end. Fits beside another job on a second GPU (CUDA_VISIBLE_DEVICES).
# ROWS picks rows ("rollout export rewards"; also "defaults"); the rewards row runs twice: Tesseract
# single-threaded (the OCR backend's default) and with its own OpenMP threads (OMP_THREAD_LIMIT=64).
# The defaults row measures the `recipe` variants (toml/sana-image-nft.toml's speed table and gradient
# checkpointing) against eager / plain and the baselines: rollout at 1024², B=8, and the NFT step.
#   bash scripts/device/setup.sh >/dev/null && . /tmp/site/env.sh && OUT=/tmp/bench bash scripts/device/bench_rows.sh
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
out=${OUT:-/tmp/bench}; work=${WORK:-/tmp/bench-work}; mkdir -p "$out" "$work"
export TORCHINDUCTOR_CACHE_DIR=$work/inductor-cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
pipe=$work/sana-1600m
[[ -f $pipe/model_index.json ]] ||
  cosmos-sana make-tiny --out "$pipe" --preset sana-1600m --device cuda --dtype bfloat16 >"$out/make_tiny.log" 2>&1
run() {  # NAME SECONDS ARGS...
  local name=$1 limit=$2 t=$SECONDS rc=0; shift 2
  timeout "$limit" python "$@" >"$out/$name.log" 2>&1 || rc=$?
  echo "$name: rc=$rc in $((SECONDS - t)) s"
}
rollout=(bench/bench_rollout.py --preset sana-1600m --pipeline "$pipe" --device cuda --dtype bfloat16 --steps 20
         --repeats 2 --variants eager compiled compiled_graphs)
rows=" ${ROWS:-rollout export rewards} "
if [[ $rows == *" rollout "* ]]; then
  run rollout-512 "${LIMIT_512:-190}" "${rollout[@]}" --sizes 512 --batches 8 1 --json-out "$out/rollout-512.json"
  run rollout-1024-b1 "${LIMIT_1024:-110}" "${rollout[@]}" --sizes 1024 --batches 1 --json-out "$out/rollout-1024-b1.json"
fi
[[ $rows == *" export "* ]] &&
  run export "${LIMIT_EXPORT:-240}" bench/bench_export.py --preset sana-1600m --pipeline "$pipe" --work "$work" \
    --cases ours/diffusers baseline/save_pretrained ours/lora ours/merged --json-out "$out/export.json"
if [[ $rows == *" rewards "* ]]; then
  rewards=(bench/bench_rewards.py --device cuda --batch 16 --size 512 --repeats 3)
  run rewards "${LIMIT_REWARDS:-60}" "${rewards[@]}" --reward jpeg_compressibility --reward ocr --json-out "$out/rewards.json"
  OMP_THREAD_LIMIT=64 run rewards-omp64 "${LIMIT_REWARDS:-60}" "${rewards[@]}" --reward ocr --json-out "$out/rewards-omp64.json"
fi
if [[ $rows == *" defaults "* ]]; then  # what toml/sana-image-nft.toml's users get, beside the baselines
  run rollout-1024-b8-recipe "${LIMIT_DEFAULTS_ROLLOUT:-200}" bench/bench_rollout.py --preset sana-1600m \
    --pipeline "$pipe" --device cuda --dtype bfloat16 --steps 20 --repeats 2 --variants eager recipe \
    --sizes 1024 --batches 8 --json-out "$out/rollout-1024-b8-recipe.json"
  run nft-step-recipe "${LIMIT_DEFAULTS_NFT:-240}" bench/bench_nft_step.py --preset sana-1600m --pipeline "$pipe" \
    --device cuda --size 1024 --batch 8 --lora-rank 32 --variants plain recipe --json-out "$out/nft-step-recipe.json"
fi
python bench/report.py "$out"

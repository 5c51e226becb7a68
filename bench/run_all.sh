#!/usr/bin/env bash
# Every bench on one GPU (≤ ~8 minutes on an H200), JSON + logs into $OUT, a table at the end.
#   OUT=/path/to/out bash bench/run_all.sh
#   SMOKE=1 bash bench/run_all.sh          # tiny model on the CPU (~4 min): checks the plumbing only
# Env: OUT (default outputs/bench), WORK (scratch, default /tmp/cosmos-sana-bench; the random
# pipeline is built there once and reused), DEVICE (default cuda), PYTHON (default python).
# Needs the project importable (scripts/device/setup.sh on the GPU machine). Each bench has its own
# time limit; a bench stopped early keeps the rows it measured (the report marks it PARTIAL).
set -uo pipefail
cd -- "$(dirname -- "$0")/.."
OUT=${OUT:-outputs/bench}
WORK=${WORK:-/tmp/cosmos-sana-bench}
PY=${PYTHON:-python}
if [[ ${SMOKE:-0} == 1 ]]; then
    DEVICE=cpu PRESET=tiny
    ROLLOUT=(--sizes 64 --batches 4 1 --steps 2 --repeats 1 --threads 1)
    NFT=(--size 64 --batch 4 --lora-rank 4 --timesteps 1 --repeats 1 --threads 1 --max-prompt-length 16 --variants plain)
    LIMIT=(240 240 240)
else
    DEVICE=${DEVICE:-cuda} PRESET=sana-1600m
    ROLLOUT=(--sizes 1024 512 --batches 8 1 --steps 20 --repeats 2 --profile compiled)
    NFT=(--size 1024 --batch 8 --lora-rank 32 --timesteps 2 --repeats 2 --variants fast plain)
    LIMIT=(240 120 60)
fi
PIPE=$WORK/$PRESET
mkdir -p "$OUT" "$WORK"
export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
status=0

run() {  # run NAME SECONDS ARGS...
    local name=$1 limit=$2 began=$SECONDS rc=0
    shift 2
    echo "== $name (limit ${limit} s)"
    timeout "$limit" "$PY" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
    echo "   rc=$rc in $((SECONDS - began)) s; log $OUT/$name.log"
    [[ $rc == 0 ]] || status=1
}

if [[ ! -f $PIPE/model_index.json ]]; then
    run build_pipeline 60 -c "import torch; from cosmos_sana.tools.tiny import build_pipeline; \
build_pipeline('$PIPE', preset='$PRESET', device='$DEVICE', dtype=torch.bfloat16)"
fi
common=(--preset "$PRESET" --pipeline "$PIPE" --dtype bfloat16)
run rollout "${LIMIT[0]}" bench/bench_rollout.py "${common[@]}" --device "$DEVICE" "${ROLLOUT[@]}" \
    --json-out "$OUT/rollout.json"
run nft_step "${LIMIT[1]}" bench/bench_nft_step.py "${common[@]}" --device "$DEVICE" "${NFT[@]}" \
    --json-out "$OUT/nft_step.json"
run export "${LIMIT[2]}" bench/bench_export.py "${common[@]}" --work "$WORK" \
    --cases ours/diffusers baseline/save_pretrained ours/lora --json-out "$OUT/export.json"
echo
"$PY" bench/report.py "$OUT" || status=1
exit $status

#!/usr/bin/env bash
# Device: a bare `cosmos-rl --config` launch of a recipe on a model built on the spot.
#   bash scripts/device/launch_recipe.sh RECIPE [KEY=VALUE ...]
# Env: PRESET (make-tiny preset, default tiny), VIDEO=1, WORK (default /tmp/run),
#      TIMEOUT seconds (default 420), OUT (logs are copied there).
# The recipe is resolved with `cosmos-sana validate --set ... --dump` (paths/steps only).
set -euo pipefail
cd -- "$(dirname -- "$0")/../.."
recipe=$1; shift
work=${WORK:-/tmp/run}
mkdir -p "$work"
video=()
[[ "${VIDEO:-0}" == 1 ]] && video=(--video)
[[ -d "$work/model" ]] || cosmos-sana make-tiny --out "$work/model" --preset "${PRESET:-tiny}" "${video[@]}" --device cuda
sets=(--set "policy.model_name_or_path=$work/model" --set "train.output_dir=$work/out")
for kv in "$@"; do sets+=(--set "$kv"); done
cosmos-sana validate "$recipe" "${sets[@]}" --dump "$work/run.toml"
status=0
timeout "${TIMEOUT:-420}" cosmos-rl --config "$work/run.toml" >"$work/cosmos-rl.log" 2>&1 || status=$?
if [[ -n "${OUT:-}" ]]; then
    cp "$work/cosmos-rl.log" "$OUT/" || true
    find "$work/out" -name "*.log" -newer "$work/run.toml" -exec cp {} "$OUT/" \; 2>/dev/null || true
fi
echo "cosmos-rl exit status: $status"
exit "$status"

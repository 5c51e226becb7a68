#!/usr/bin/env bash
# Device: start-up of a bare `cosmos-rl --config` launch on one GPU, split per process and phase by
# bench/bench_startup.py, once with COSMOS_SANA_FAST_STARTUP=0 (before: cosmos-rl's own start-up and
# shutdown) and once with COSMOS_SANA_FAST_STARTUP=1 (after: the default, cosmos-sana's start-up patches),
# which bench_startup.py --compare sets for each launch. Each launch runs STEPS steps to the end, so the
# shutdown shows too. Exits non-zero unless both launches ended with status 0 and only the second ran the
# patches (bench/results/2026-12-01-h200-startup-fast-vs-default.json is such a run on an H200).
#   bash scripts/device/setup.sh && . /tmp/site/env.sh && bash scripts/device/startup.sh
# Env: RECIPE (toml/tiny/sana-image-nft.toml), PRESET (make-tiny preset, tiny), STEPS (2), SITE (/tmp/site),
#      TIMEOUT seconds per launch (240), WORK (/tmp/startup), OUT (report folder, $WORK/report).
set -euo pipefail
cd -- "$(dirname -- "$0")/../.."
work=${WORK:-/tmp/startup}; out=${OUT:-$work/report}
mkdir -p "$work" "$out"
# byte-compile the carried packages first (install_offline.sh installs them with --no-compile), so
# that neither launch pays for compiling them and both read warm files
python -m compileall -q -j 0 "${SITE:-/tmp/site}" >/dev/null 2>&1 || true
[[ -d $work/model ]] || cosmos-sana make-tiny --out "$work/model" --preset "${PRESET:-tiny}" --device cuda >"$out/make_tiny.log" 2>&1
for mode in before after; do  # a fresh output folder each, so the second launch does not resume the first
    rm -rf "$work/out-$mode"
    cosmos-sana validate "${RECIPE:-toml/tiny/sana-image-nft.toml}" --set "policy.model_name_or_path=$work/model" \
        --set "train.output_dir=$work/out-$mode" --set "train.max_num_steps=${STEPS:-2}" --dump "$work/run-$mode.toml"
done
python bench/bench_startup.py launch --compare --log-dir "$out/startup" --json-out "$out/startup.json" -- \
    timeout -k 30 "${TIMEOUT:-240}" cosmos-rl --config "$work/run-{mode}.toml"
python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
result = json.loads((out / "startup.json").read_text())
patched = {mode: "starting the replicas while the controller" in (out / "startup" / mode / "startup.log").read_text()
           for mode in ("before", "after")}
status = {mode: result[mode]["exit_status"] for mode in ("before", "after")}
print(f"exit status {status}; launcher patch seen {patched}; saved_s {result['saved_s']}")
sys.exit(0 if status == {"before": 0, "after": 0} and patched == {"before": False, "after": True} else 1)
PY

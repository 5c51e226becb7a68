#!/usr/bin/env bash
# Device: start-up of a bare `cosmos-rl --config` launch on one GPU, split per process and phase by
# bench/bench_startup.py, once with cosmos-rl's own start-up and shutdown (before) and once with
# cosmos-sana's start-up patches (after). Each launch runs STEPS steps to the end, so the shutdown shows too.
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

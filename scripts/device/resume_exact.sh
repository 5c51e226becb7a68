#!/usr/bin/env bash
# Device: is resume exact in a real launch? Two bare `cosmos-rl --config` launches of the NFT recipe,
# side by side on one GPU, through launchers/launch_rl_sana-image-nft.sh:
#   a: STEPS steps uninterrupted;
#   b: the same, killed with SIGKILL (the whole process group: launcher, controller, Redis, workers)
#      once checkpoint KILL_AFTER is complete, then resumed with train.resume=true to STEPS.
# Then scripts/compare_checkpoints.py compares a's and b's last checkpoints tensor by tensor and the
# per-step metrics after KILL_AFTER are compared; GPU kernels may be nondeterministic, so the largest
# differences are reported rather than asserted. Summary JSON: $OUT/resume_exact.json.
#   bash scripts/device/setup.sh >/dev/null && . /tmp/site/env.sh && bash scripts/device/resume_exact.sh
# Env: MODEL (a pipeline folder; default: make-tiny PRESET into WORK/model), PRESET (sana-600m), SIZE (256), STEPS (6), KILL_AFTER (3), TIMEOUT per launch (420:
#      with three launches starting side by side on one H200 host a worker took ~140 s to get its
#      configuration, so 160 s ended every launch before its first step),
#      WORK (/tmp/resume-exact),
#      RUNS (a b; "a" runs only the uninterrupted launch and compares its per-step metrics with REFERENCE,
#      a JSON {"rows": {step: {metric: value}}} of an earlier run of these settings, e.g.
#      bench/results/2026-12-01-h200-nft-600m-256-reference-metrics.json: does a code change keep the
#      reward curve of the same seed? Summary: $OUT/reward_curve.json).
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
work=${WORK:-/tmp/resume-exact}; out=${OUT:-$work/report}; mkdir -p "$work" "$out"
steps=${STEPS:-6}; kill_after=${KILL_AFTER:-3}; size=${SIZE:-256}; limit=${TIMEOUT:-420}
t0=$(date +%s); model=${MODEL:-$work/model}
[[ -f $model/model_index.json ]] ||
  cosmos-sana make-tiny --out "$model" --preset "${PRESET:-sana-600m}" --device cuda --dtype bfloat16 >"$out/make_tiny.log" 2>&1
echo "model ready at $(( $(date +%s) - t0 )) s"
overrides=(
  "policy.diffusers.inference_size=[$size, $size]" "rollout.n_generation=4" "rollout.n_generation_mini_batch=4"
  "rollout.batch_size=2" "train.train_batch_per_replica=8" "train.train_policy.mini_batch=4"
  "train.max_num_steps=$steps" "train.ckpt.save_freq=$kill_after" "train.ckpt.export_safetensors=false"
  'logging.logger=["console"]' 'custom.rewards=[{name="jpeg_compressibility"}]'
)
launch() {  # $1 = run name, $2 = port offset, rest = extra overrides; runs in its own process group
  local name=$1 offset=$2; shift 2
  NPROC_PER_NODE=1 DATASET_PATH=builtin:demo BASE_CHECKPOINT_PATH=$model OUTPUT_ROOT=$work/$name \
    MASTER_PORT=$((8300 + offset)) RDZV_PORT=$((29600 + offset)) \
    setsid timeout -k 30 -s INT "$limit" bash launchers/launch_rl_sana-image-nft.sh -- \
    "redis=\"$((13300 + offset))\"" "${overrides[@]}" "$@" >>"$out/$name.log" 2>&1 &
  echo $! >"$work/$name.pgid"  # setsid made it a process-group leader
  wait $!
}
complete_ckpt() {  # $1 = run folder; prints the checkpoint folder of step $kill_after once COMPLETE
  find "$work/$1" -path "*/checkpoints/iter_$(printf %09d "$kill_after")/COMPLETE" -printf '%h\n' 2>/dev/null | head -n 1
}
rm -rf "$work/a" "$work/b"
if [[ ${RUNS:-a b} == a ]]; then
  launch a 1; echo "a: exit $? after $(( $(date +%s) - t0 )) s"
  find "$work/a" \( -name "*.log" -o -name metrics.jsonl \) -print0 | tar czf "$out/logs.tgz" --null -T - 2>/dev/null
  python scripts/launch_metrics.py compare "$work/a" "${REFERENCE:?RUNS=a needs REFERENCE}" --json-out "$out/reward_curve.json"
  exit
fi
( launch a 1; echo "a: exit $? after $(( $(date +%s) - t0 )) s" ) &
pid_a=$!
launch b 2 & pid_b=$!
while kill -0 "$pid_b" 2>/dev/null && [[ -z $(complete_ckpt b) ]]; do sleep 1; done
if [[ -n $(complete_ckpt b) ]]; then
  kill -KILL -- "-$(cat "$work/b.pgid")" 2>/dev/null; kill -KILL "$pid_b" 2>/dev/null; pkill -KILL -f "$work/b/" 2>/dev/null
  echo "b: SIGKILL after checkpoint $kill_after at $(( $(date +%s) - t0 )) s"
  sleep 3
  launch b 3 "train.resume=true"; echo "b (resumed): exit $? after $(( $(date +%s) - t0 )) s"
else
  echo "b: ended before checkpoint $kill_after was complete" >&2
fi
wait "$pid_a"
last=$(printf 'iter_%09d' "$steps")
ckpt_a=$(find "$work/a" -type d -name "$last" | head -n 1); ckpt_b=$(find "$work/b" -type d -name "$last" | head -n 1)
find "$work/a" "$work/b" \( -name "*.log" -o -name metrics.jsonl \) -newermt "@$t0" -print0 |
  tar czf "$out/logs.tgz" --null -T - 2>/dev/null
if [[ -z $ckpt_a || -z $ckpt_b ]]; then echo "missing final checkpoint: a=$ckpt_a b=$ckpt_b" >&2; exit 1; fi
python scripts/compare_checkpoints.py "$ckpt_a" "$ckpt_b" >"$out/compare.json"
# the resumed run's steps after the kill against the uninterrupted run's (clocks and memory left out)
python scripts/launch_metrics.py compare "$work/b" "$work/a" --after "$kill_after" --json-out "$out/metrics.json" || exit 1
python - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
summary = {"bench": "resume_exact", **json.loads((out / "metrics.json").read_text()),
           "checkpoints": json.loads((out / "compare.json").read_text())}
(out / "resume_exact.json").write_text(json.dumps(summary, indent=1))
PY

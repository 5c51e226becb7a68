#!/usr/bin/env bash
# Device: the headline end-to-end NFT run (issue "prove it on the H200", 2a).
#   bash scripts/device/e2e_nft.sh            (after scripts/device/setup.sh and . /tmp/site/env.sh)
# A random-initialised SANA-1600M-shaped pipeline at 512 px, JPEG compressibility, launched with the
# RL launcher (the bare `cosmos-rl --config` underneath); phase 1 is interrupted (SIGINT) once step
# KILL_AFTER + 1 is logged, i.e. after the checkpoint of step KILL_AFTER (default SAVE_FREQ), phase 2
# resumes to STEPS; then LoRA and merged (diffusers folder) exports, each loaded back by stock diffusers
# (--verify). Summaries and logs go to $OUT.
# Env: STEPS (20), SAVE_FREQ (10), KILL_AFTER, REWARDS (TOML array, default [{name="jpeg_compressibility"}]),
#      PROMPTS (builtin:demo), WORK (/tmp/e2e), EXTRA (more key=value overrides, space-separated),
#      PHASE1_TIMEOUT / PHASE2_TIMEOUT seconds (or PHASE2_DEADLINE, epoch seconds), PHASES (default "1 2 export"; separate device calls
#      on a still-warm machine may run "1" then "2 export").
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
work=${WORK:-/tmp/e2e}; out=${OUT:-$work/report}; mkdir -p "$work" "$out"
steps=${STEPS:-20}; save=${SAVE_FREQ:-10}
t0=$(date +%s)
[[ -d $work/model ]] || cosmos-sana make-tiny --out "$work/model" --preset sana-1600m --device cuda --dtype bfloat16 >"$out/make_tiny.log" 2>&1
echo "model built: $(( $(date +%s) - t0 )) s"
rewards=${REWARDS:-'[{name="jpeg_compressibility"}]'}  # (a literal '}' can't sit in a ${...:-default})
overrides=(
  "policy.diffusers.inference_size=[512, 512]" "rollout.n_generation=8" "rollout.n_generation_mini_batch=8"
  "rollout.batch_size=2" "train.train_batch_per_replica=16" "train.train_policy.mini_batch=8"
  "train.max_num_steps=$steps" "train.ckpt.save_freq=$save" "train.ckpt.export_safetensors=false"
  "logging.logger=[\"console\"]" "custom.rewards=$rewards"
)
read -ra extra <<<"${EXTRA:-}"
overrides+=("${extra[@]}")
logged_step() {  # the highest step in a metrics.jsonl written since epoch second $1 (0 when none)
  local step
  step=$( { find "$work/out" -name metrics.jsonl -newermt "@$1" -print0 2>/dev/null || true; } |
    { xargs -0r cat 2>/dev/null || true; } | sed -n 's/.*"step": *\([0-9]*\).*/\1/p' | sort -n | tail -n 1)
  echo "${step:-0}"
}
launch() {  # $1 = phase name, $2 = timeout, $3 = interrupt once this step is logged (0 = never), rest = overrides
  local name=$1 limit=$2 stop_at=$3; shift 3
  local t pid status=0
  t=$(date +%s)
  NPROC_PER_NODE=1 DATASET_PATH=${PROMPTS:-builtin:demo} BASE_CHECKPOINT_PATH=$work/model OUTPUT_ROOT=$work/out \
    MASTER_PORT=${port:-8000} timeout -k 60 -s INT "$limit" bash launchers/launch_rl_sana-image-nft.sh -- "${overrides[@]}" "$@" >"$out/$name.log" 2>&1 &
  pid=$!
  while (( stop_at > 0 )) && kill -0 "$pid" 2>/dev/null; do
    if (( $(logged_step "$t") >= stop_at )); then
      echo "$name: step $stop_at logged at $(( $(date +%s) - t )) s, interrupting"; kill -INT "$pid"; break
    fi
    sleep 2
  done
  wait "$pid" || status=$?
  echo "$name: exit $status after $(( $(date +%s) - t )) s"
  mkdir -p "$out/logs-$name"  # worker and controller logs (cosmos-rl writes them per launch)
  find "$work/out" -newermt "@$t" \( -name "*.log" -o -name metrics.jsonl \) -exec cp {} "$out/logs-$name/" \; 2>/dev/null
}
phases=" ${PHASES:-1 2 export} "
if [[ $phases == *" 1 "* ]]; then
  kill_after=${KILL_AFTER:-$save}
  (( kill_after > 0 && kill_after % save == 0 )) ||
    { echo "KILL_AFTER=$kill_after is not a checkpoint step (a positive multiple of SAVE_FREQ=$save)" >&2; exit 2; }
  rm -rf "$work/out"  # a fresh run: resume and export must not find an earlier call's checkpoints
  stop_at=0  # interrupted only when phase 2 is to resume it
  [[ $phases == *" 2 "* ]] && stop_at=$(( kill_after + 1 ))
  launch phase1 "${PHASE1_TIMEOUT:-330}" "$stop_at"
  find "$work/out" -maxdepth 4 -type d -name "iter_*" | sort | tee "$out/checkpoints_after_phase1.txt"
fi
# a new controller port: the first one may still be closing
if [[ $phases == *" 2 "* ]]; then
  limit=${PHASE2_TIMEOUT:-240}
  [[ -n ${PHASE2_DEADLINE:-} ]] && limit=$(( PHASE2_DEADLINE - $(date +%s) ))
  if (( limit > 30 )); then port=8001 launch phase2 "$limit" 0 "train.resume=true"; else echo "phase2: skipped (${limit} s left)"; fi
fi
[[ $phases == *" export "* ]] || exit 0
ckpt=$(find "$work/out" -maxdepth 4 -type d -name "iter_*" | sort -t_ -k2 | tail -1)
echo "latest checkpoint: $ckpt"
find "$work/out" -name metrics.jsonl -print0 | sort -z | xargs -0r cat >"$out/metrics.jsonl"  # phase order
for fmt in lora merged; do
  t=$(date +%s)
  cosmos-sana export "$ckpt" --out "$work/export-$fmt" --format "$fmt" --verify --verify-size 512 \
    >"$out/export-$fmt.log" 2>&1; echo "export $fmt: exit $? after $(( $(date +%s) - t )) s"
done
python - "$out/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
r = [(row.get("step"), row.get("reward/mean")) for row in rows if "reward/mean" in row]
print("steps logged:", len(r), "| reward first 3:", [round(v, 5) for _, v in r[:3]], "| last 3:", [round(v, 5) for _, v in r[-3:]])
PY

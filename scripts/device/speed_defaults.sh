#!/usr/bin/env bash
# Device: the rollout speed features ([custom.rollout.speed]) inside full NFT launches, one launch per
# configuration, all with the same seed, side by side on one GPU (each with its own ports):
#   off      none (the baseline)             compile  compile_blocks = true
#   bf16     linear_attention = "bf16"       graphs   cuda_graph_max_batch = 4 (the rollout's forward batch)
#   text_kv  cache_text_kv = true            recipe   bf16 + text_kv + compile (what toml/sana-image-nft.toml ships)
#                                            all      the four together
# Every launch sets these four and the two VAE features (off ones off), whatever the recipe ships in [custom.rollout.speed].
# Each is launchers/launch_rl_$RECIPE.sh (default sana-image-nft) on SANA-600M shapes (make-tiny --preset sana-600m, bf16),
# SIZE², 2 prompts x 4 images a step, jpeg_compressibility, builtin:demo prompts: the settings of
# resume_exact.sh, so the "off" launch is also compared with REFERENCE, an earlier launch's metrics.
# COSMOS_SANA_ROLLOUT_DUMP makes every launch save its first step's rollouts (latents, images, seeds);
# scripts/speed_defaults_report.py then gives per configuration the first step's time (compilation,
# graph capture), the median step / rollout / train time of the later steps, reward/mean per step,
# peak memory, and the largest and relative differences of the first step's latents and images from
# the "off" launch's. Every launch compiles into empty caches of its own (a cold first step).
# Side-by-side launches slow each other: each entry says with how many others its
# timed steps overlapped (SERIAL=1 runs them one after another instead, for uncontended times, at
# about N times the wall time). Summary: $OUT/speed_defaults.json; logs: $OUT/logs.tgz.
#   bash scripts/device/setup.sh >/dev/null && . /tmp/site/env.sh && bash scripts/device/speed_defaults.sh
# Env: CONFIGS ("off bf16 text_kv compile graphs all"; also "recipe"; "off" is needed as the baseline), STEPS (4),
#      SIZE (256), BUDGET (540: seconds from this script's start, model build included, by which every
#      launch has been stopped and the report written), TIMEOUT (a shorter limit per launch), PRESET
#      (sana-600m), MODEL (a pipeline folder instead of make-tiny), WORK (/tmp/speed-defaults),
#      REFERENCE (default when SIZE is 256: bench/results/2026-12-01-h200-nft-600m-256-reference-metrics.json,
#      made with STEPS=6 and checkpoints every 3 steps; "none" skips it), SERIAL=1, GPUS ("0"; e.g. "0 1"
#      on a 2-GPU host deals the launches out round-robin), DRY_RUN=1 (each launcher validates its
#      configuration and writes it, nothing runs; needs MODEL), RECIPE (sana-image-nft: the RL recipe whose
#      launcher, launchers/launch_rl_$RECIPE.sh, runs; the default REFERENCE is for sana-image-nft only),
#      PORT_BASE (0; another instance beside this one on the same host needs its own, e.g. 10, and its own
#      WORK: a second instance on a WORK in use stops at once, before deleting anything there),
#      TOLERANCE (the first-step latents' relative-error bar; default per RECIPE, see below).
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
work=${WORK:-/tmp/speed-defaults}; out=${OUT:-$work/report}; mkdir -p "$work" "$out"
# one instance per WORK: each launch starts by deleting $WORK/<configuration>, a second instance's runs
exec 9>"$work/.lock"
flock -n 9 || { echo "WORK $work is in use by another speed_defaults.sh; give this one its own WORK (and PORT_BASE)" >&2; exit 2; }
t0=$(date +%s)
steps=${STEPS:-4}; size=${SIZE:-256}; budget=${BUDGET:-540}; dry=${DRY_RUN:-0}
recipe=${RECIPE:-sana-image-nft}; port_base=${PORT_BASE:-0}
# the first-step latents' bar per recipe: how far diffusers' stock bf16 path lies from fp32 maths under that
# recipe's sampler (SANA-600M shapes, 256², CPU: results/2026-12-01-cpu-sampler-sensitivity.json); else
# the bf16 attention's per-forward bound
case $recipe in sana-image-nft) default_tolerance=0.0025 ;; sana-image-grpo) default_tolerance=0.0088 ;;
  *) default_tolerance=0.005 ;; esac
tolerance=${TOLERANCE:-$default_tolerance}
launcher=launchers/launch_rl_$recipe.sh
[[ -f $launcher ]] || { echo "RECIPE $recipe: no launcher $launcher" >&2; exit 2; }
per_prompt=4  # rollout.n_generation = n_generation_mini_batch: the batch of every rollout forward (no CFG)
report=scripts/speed_defaults_report.py
read -ra configs <<<"${CONFIGS:-off bf16 text_kv compile graphs all}"
read -ra gpus <<<"${GPUS:-0}"
for name in "${configs[@]}"; do  # unknown names fail here, before any launch
  python "$report" overrides "$name" --graph-batch "$per_prompt" >/dev/null || exit 2
done
[[ " ${configs[*]} " == *" off "* ]] || { echo "CONFIGS must include off (the baseline)" >&2; exit 2; }
reference=${REFERENCE:-}
[[ -z $reference && $size == 256 && $recipe == sana-image-nft ]] && reference=bench/results/2026-12-01-h200-nft-600m-256-reference-metrics.json
[[ $reference == none || ! -f $reference ]] && reference=""

model=${MODEL:-$work/model}
if [[ ! -f $model/model_index.json ]]; then
  [[ $dry == 1 ]] && { echo "DRY_RUN=1 needs MODEL (a pipeline folder)" >&2; exit 2; }
  cosmos-sana make-tiny --out "$model" --preset "${PRESET:-sana-600m}" --device cuda --dtype bfloat16 \
    >"$out/make_tiny.log" 2>&1 || { tail -n 20 "$out/make_tiny.log" >&2; exit 1; }
fi
echo "model ready at $(( $(date +%s) - t0 )) s"
overrides=(
  "policy.diffusers.inference_size=[$size, $size]" "rollout.n_generation=$per_prompt"
  "rollout.n_generation_mini_batch=$per_prompt" "rollout.batch_size=2" "train.train_batch_per_replica=8"
  "train.train_policy.mini_batch=4" "train.max_num_steps=$steps" "train.ckpt.enable_checkpoint=false"
  "train.ckpt.export_safetensors=false" 'logging.logger=["console"]' 'custom.rewards=[{name="jpeg_compressibility"}]'
)
launch() {  # $1 = configuration, $2 = port offset; outputs, dump, exit status and wall time under $work/$1
  local name=$1 offset=$2 dir=$work/$1 limit t status=0 speed
  mapfile -t speed < <(python "$report" overrides "$name" --graph-batch "$per_prompt")
  rm -rf "$dir"; mkdir -p "$dir"
  limit=$(( budget - ($(date +%s) - t0) - 40 ))  # 20 s for the kill after SIGINT, 20 s for the report
  [[ -n ${TIMEOUT:-} ]] && (( TIMEOUT < limit )) && limit=$TIMEOUT
  if (( limit < 60 )); then echo "$name: skipped (${limit} s left)"; return; fi
  t=$(date +%s)
  # compile caches of its own, empty: the first step's time is a cold compile, as in a user's first launch
  CUDA_VISIBLE_DEVICES=${gpus[offset % ${#gpus[@]}]} \
    TORCHINDUCTOR_CACHE_DIR=$dir/inductor-cache TRITON_CACHE_DIR=$dir/triton-cache \
    DRY_RUN=$dry COSMOS_SANA_ROLLOUT_DUMP=$dir/rollout-dump NPROC_PER_NODE=1 DATASET_PATH=builtin:demo \
    BASE_CHECKPOINT_PATH=$model OUTPUT_ROOT=$dir MASTER_PORT=$((8400 + offset)) RDZV_PORT=$((29700 + offset)) \
    timeout -k 20 -s INT "$limit" bash "$launcher" -- \
    "redis=\"$((13400 + offset))\"" "${overrides[@]}" "${speed[@]}" >"$dir/launch.log" 2>&1 9>&- || status=$?  # fd 9 (the lock) is not the launches' to hold
  echo "$status" >"$dir/exit_status"; echo $(( $(date +%s) - t )) >"$dir/wall_s"
  echo "$name: exit $status after $(( $(date +%s) - t )) s (${speed[*]:-no speed feature})"
}
offset=0
for name in "${configs[@]}"; do
  offset=$(( offset + 1 ))  # ports: PORT_BASE + the configuration's position
  if [[ ${SERIAL:-0} == 1 ]]; then launch "$name" "$((port_base + offset))"; else launch "$name" "$((port_base + offset))" & fi
done
wait
runs=()
for name in "${configs[@]}"; do [[ -d $work/$name ]] && runs+=(--run "$name" "$work/$name"); done
find "$work" -mindepth 2 \( -name "*.log" -o -name metrics.jsonl -o -name "*.resolved.toml" -o -name exit_status \) \
  -newermt "@$t0" -print0 | tar czf "$out/logs.tgz" --null -T - 2>/dev/null
python "$report" report "${runs[@]}" ${reference:+--reference "$reference"} --relative-tolerance "$tolerance" \
  --json-out "$out/speed_defaults.json"
echo "done at $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# Device: the best-of-n recipe (toml/sana-image-nft-best-of-n.toml: drafts on an FP8 merged copy,
# full rollouts on a compiled merged copy) through its launcher, a few steps; prints the rollout's
# own "best-of-n:" lines (drafts and full rollouts with seconds and images per second).
#   bash scripts/device/setup.sh >/dev/null && . /tmp/site/env.sh && bash scripts/device/best_of_n_fp8.sh
# Env: MODEL (a pipeline folder; default: make-tiny PRESET into WORK/model), PRESET (sana-600m), SIZE (256),
#      STEPS (3), DRAFTS (96), KEEP (24), TIMEOUT (480: the first step compiles the FP8 and the
#      compiled full-rollout copies; at SANA-600M shapes that took over 100 s on an H200), WORK (/tmp/best-of-n),
#      FORM (launcher: the launcher's own `cosmos-rl ... cosmos_sana.bridge`; solrl: the same launch with the
#      Sol-RL how-to's script argument `cosmos_rl.tools.dataset.diffusion_nft` in place of the bridge, which
#      must still run our dataset, rollout and rewards — the "best-of-n:" lines come from our rollout).
set -uo pipefail
cd -- "$(dirname -- "$0")/../.." || exit 2
work=${WORK:-/tmp/best-of-n}; out=${OUT:-$work/report}; mkdir -p "$work" "$out"
model=${MODEL:-$work/model}; size=${SIZE:-256}; keep=${KEEP:-24}
[[ -f $model/model_index.json ]] ||
  cosmos-sana make-tiny --out "$model" --preset "${PRESET:-sana-600m}" --device cuda --dtype bfloat16 >"$out/make_tiny.log" 2>&1
t=$(date +%s); status=0
rm -rf "$work/out"
cosmos_rl=cosmos-rl
if [[ ${FORM:-launcher} == solrl ]]; then  # swap the launcher's last argument (the bridge) for the how-to's script
  cosmos_rl=$work/cosmos-rl-solrl-form
  printf '#!/usr/bin/env bash\nargs=("$@"); args[-1]=cosmos_rl.tools.dataset.diffusion_nft\necho "solrl form: cosmos-rl ${args[*]}"\nexec cosmos-rl "${args[@]}"\n' >"$cosmos_rl"
  chmod +x "$cosmos_rl"
fi
COSMOS_RL=$cosmos_rl NPROC_PER_NODE=1 DATASET_PATH=builtin:ocr BASE_CHECKPOINT_PATH=$model OUTPUT_ROOT=$work/out \
  MASTER_PORT=8350 RDZV_PORT=29650 timeout -k 30 -s INT "${TIMEOUT:-480}" \
  bash launchers/launch_rl_sana-image-nft-best-of-n.sh -- 'redis="13350"' \
  "policy.diffusers.inference_size=[$size, $size]" "rollout.n_generation=$keep" "rollout.n_generation_mini_batch=$keep" \
  "rollout.batch_size=1" "train.train_batch_per_replica=$keep" "train.train_policy.mini_batch=8" \
  "custom.rollout.best_of_n.num_drafts=${DRAFTS:-96}" "train.max_num_steps=${STEPS:-3}" "train.ckpt.save_freq=1000" \
  "train.ckpt.export_safetensors=false" 'logging.logger=["console"]' 'custom.rewards=[{name="jpeg_compressibility"}]' \
  >"$out/best_of_n.log" 2>&1 || status=$?
echo "best-of-n launch (${FORM:-launcher} form): exit $status after $(( $(date +%s) - t )) s"
find "$work/out" \( -name "*.log" -o -name metrics.jsonl \) -print0 | tar czf "$out/best_of_n_logs.tgz" --null -T - 2>/dev/null
grep -rh "best-of-n:" "$work/out" "$out/best_of_n.log" 2>/dev/null | sed 's/.*best-of-n:/best-of-n:/' | sort -u | head -n 20

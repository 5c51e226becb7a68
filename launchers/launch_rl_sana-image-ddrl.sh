#!/usr/bin/env bash
# DDRL of SANA-1.5 1.6B with LoRA: GRPO-style term plus flow matching on real images, colocated rollout (recipe toml/sana-image-ddrl.toml).
#
#   launchers/launch_rl_sana-image-ddrl.sh [--dry-run | --dryrun] [-- key.path=value ...]
#
# Exported variables override the defaults below; see launchers/_sft_launcher_common.sh for all of them.
RECIPE=sana-image-ddrl
MODALITY=image
LAUNCH_KIND=rl
: "${DATASET_PATH:=./data/prompts/pickscore/train.txt}"
: "${REAL_DATA_PATH:=./data/sft/images}"
: "${BASE_CHECKPOINT_PATH:=./checkpoints/SANA1.5_1.6B_1024px_diffusers}"
: "${NPROC_PER_NODE:=8}"

# shellcheck source-path=SCRIPTDIR source=_sft_launcher_common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/_sft_launcher_common.sh" "$@"

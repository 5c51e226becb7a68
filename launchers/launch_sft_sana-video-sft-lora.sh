#!/usr/bin/env bash
# LoRA SFT of SANA-Video 2B on video clips (recipe toml/sana-video-sft-lora.toml).
#
#   launchers/launch_sft_sana-video-sft-lora.sh [--dry-run] [-- key.path=value ...]
#
# Exported variables override the defaults below; see launchers/_sft_launcher_common.sh for all of them.
RECIPE=sana-video-sft-lora
MODALITY=video
: "${DATASET_PATH:=./data/sft/videos}"
: "${BASE_CHECKPOINT_PATH:=./checkpoints/SANA-Video_2B_480p_diffusers}"
: "${NPROC_PER_NODE:=8}"

# shellcheck source-path=SCRIPTDIR source=_sft_launcher_common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/_sft_launcher_common.sh" "$@"

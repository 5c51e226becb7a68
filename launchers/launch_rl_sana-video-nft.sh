#!/usr/bin/env bash
# Diffusion-NFT of SANA-Video 2B with LoRA (default + old adapters), colocated rollout (recipe toml/sana-video-nft.toml).
#
#   launchers/launch_rl_sana-video-nft.sh [--dry-run | --dryrun] [-- key.path=value ...]
#
# Exported variables override the defaults below; see launchers/_sft_launcher_common.sh for all of them.
RECIPE=sana-video-nft
MODALITY=video
LAUNCH_KIND=rl
: "${DATASET_PATH:=./data/prompts/video/train.txt}"
: "${BASE_CHECKPOINT_PATH:=./checkpoints/SANA-Video_2B_480p_diffusers}"
: "${NPROC_PER_NODE:=8}"

# shellcheck source-path=SCRIPTDIR source=_sft_launcher_common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/_sft_launcher_common.sh" "$@"

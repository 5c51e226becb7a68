"""Entry point of the built-in rewards plugin: every scorer, as a lazy ``RewardSpec``."""

from __future__ import annotations

from cosmos_sana.hookspecs import hookimpl
from cosmos_sana.specs import RewardSpec

_PKG = "cosmos_sana_plugins.rewards"


@hookimpl
def cosmos_sana_rewards() -> list[RewardSpec]:
    return [
        RewardSpec(
            name="pickscore", target=f"{_PKG}.clip_scores:PickScore", params=f"{_PKG}.clip_scores:PickScoreOptions",
            factory=True, modality="image", description="PickScore_v1: logit_scale·cos/26",
        ),
        RewardSpec(
            name="clipscore", target=f"{_PKG}.clip_scores:ClipScore", params=f"{_PKG}.clip_scores:ClipScoreOptions",
            factory=True, modality="image", description="CLIP ViT-L/14 text-image cosine",
        ),
        RewardSpec(
            name="aesthetic", target=f"{_PKG}.clip_scores:Aesthetic", params=f"{_PKG}.clip_scores:AestheticOptions",
            factory=True, modality="image", description="LAION aesthetic predictor (CLIP-L + MLP)",
        ),
        RewardSpec(
            name="hpsv2.1", target=f"{_PKG}.hps:HpsV21", params=f"{_PKG}.hps:HpsOptions",
            factory=True, modality="image", description="HPSv2.1 (open_clip ViT-H-14) cosine",
        ),
        RewardSpec(
            name="imagereward", target=f"{_PKG}.image_reward:ImageReward",
            params=f"{_PKG}.image_reward:ImageRewardOptions",
            factory=True, modality="image", description="ImageReward v1.0 (BLIP + MLP), normalised",
        ),
        RewardSpec(
            name="ocr", target=f"{_PKG}.ocr:OcrScorer", params=f"{_PKG}.ocr:OcrOptions", factory=True,
            modality="image", video_reduce="mean_positive",
            description="1 − normalised edit distance to the prompt's quoted text (videos: mean over frames > 0)",
        ),
        RewardSpec(
            name="jpeg_compressibility", target=f"{_PKG}.jpeg:jpeg_compressibility", modality="image",
            description="−(JPEG q95 KB)/500",
        ),
        RewardSpec(
            name="jpeg_incompressibility", target=f"{_PKG}.jpeg:jpeg_incompressibility", modality="image",
            description="JPEG q95 KB",
        ),
        RewardSpec(
            name="remote", target="cosmos_sana.rewards.client:RemoteReward",
            params="cosmos_sana.rewards.client:RemoteRewardOptions", factory=True,
            description="one reward computed by a `cosmos-sana reward-server` (or any server of that protocol)",
        ),
    ]

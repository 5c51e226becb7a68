"""Entry point of the built-in datasets plugin: ``images``, ``videos``, ``prompts`` and the ``sana`` packer."""

from __future__ import annotations

from cosmos_sana.hookspecs import hookimpl
from cosmos_sana.specs import DataPackerSpec, DatasetSpec

_PKG = "cosmos_sana_plugins.datasets"


@hookimpl
def cosmos_sana_datasets() -> list[DatasetSpec]:
    return [
        DatasetSpec(
            name="images",
            target=f"{_PKG}.media:build_images",
            params=f"{_PKG}.params:ImageDataParams",
            modality="image",
            checker=f"{_PKG}.check:CHECKER",
            description="image SFT data: folders (NAME.txt / NNNN.json captions), SANA meta_data.json, JSONL manifest",
        ),
        DatasetSpec(
            name="videos",
            target=f"{_PKG}.media:build_videos",
            params=f"{_PKG}.params:VideoDataParams",
            modality="video",
            checker=f"{_PKG}.check:CHECKER",
            description="video SFT data: the image layouts with .mp4, and SANA-Video zips (KEY.mp4 + KEY.json)",
        ),
        DatasetSpec(
            name="prompts",
            target=f"{_PKG}.prompts:build_prompts",
            params=f"{_PKG}.params:PromptDataParams",
            modality="prompt",
            checker=f"{_PKG}.check:CHECKER",
            description="RL prompts: .txt, OCR (target in quotes), JSONL/GenEval metadata, builtin:demo|ocr|geneval",
        ),
    ]


@hookimpl
def cosmos_sana_data_packers() -> list[DataPackerSpec]:
    return [
        DataPackerSpec(
            name="sana",
            target=f"{_PKG}.packer:SanaDataPacker",
            model_types=("diffusers",),
            description="SANA/SANA-Video packer: prompt-major rollout groups, RL policy batches, SFT batches",
        )
    ]

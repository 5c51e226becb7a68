"""Session-wide tiny random SANA pipeline folders (built offline once per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_image_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``SanaPipeline`` folder (preset ``tiny``, seed 0): 64² images, 32² latents with 4 channels."""
    from cosmos_sana.tools.tiny import build_pipeline

    return build_pipeline(tmp_path_factory.mktemp("tiny_sana_image") / "pipeline")


@pytest.fixture(scope="session")
def tiny_video_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``SanaVideoPipeline`` folder (preset ``tiny``, video, seed 0): 9 frames at 64² → 3×8×8×16 latents."""
    from cosmos_sana.tools.tiny import build_pipeline

    return build_pipeline(tmp_path_factory.mktemp("tiny_sana_video") / "pipeline", video=True)

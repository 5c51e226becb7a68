"""``cosmos-sana generate`` for SANA / SANA-Video: one stock pipeline call per request, conditioned as training was.

The pipeline's own scheduler samples (what a user of the export gets), at the exact requested size
(no resolution binning), with the run's complex-human-instruction mode, prompt suffix and text length
(:func:`~cosmos_sana_plugins.sana.text.pipeline_call_kwargs`). Image ``i`` of the request starts from
the noise of a CPU generator seeded ``request.seeds[i]``, so it does not depend on the device or on
which other images share its batch.
"""

from __future__ import annotations

from typing import Any

import torch

from cosmos_sana_plugins.sana.text import pipeline_call_kwargs


def generate(pipe: Any, request: Any) -> torch.Tensor:
    """``request`` (a ``GenerationRequest``) → images ``B×C×H×W`` or videos ``B×T×C×H×W`` in [0, 1], on CPU."""
    video = hasattr(pipe, "vae_scale_factor_temporal")
    if request.frames is not None and not video:
        raise ValueError(f"--frames {request.frames}: {type(pipe).__name__} samples images, not videos")
    sizes = {"height": request.height, "width": request.width}
    kwargs: dict[str, Any] = {
        **{k: v for k, v in sizes.items() if v is not None},  # unset: the pipeline's default size
        "num_inference_steps": request.steps,
        "guidance_scale": request.guidance,
        "use_resolution_binning": False,
        "generator": [torch.Generator("cpu").manual_seed(seed) for seed in request.seeds],
        "output_type": "pt",
        **pipeline_call_kwargs(request.chi, request.max_sequence_length),
    }
    if video and request.frames is not None:
        kwargs["frames"] = request.frames
    prompts = [prompt + request.prompt_suffix for prompt in request.prompts]
    with torch.inference_mode():
        result = pipe(prompts, **kwargs)
    return (result.frames if video else result.images).float().cpu()

"""Export DCP checkpoints to diffusers pipelines, LoRA files, merged weights or native SANA ``.pth``."""

from cosmos_sana.export.api import FORMATS, MANIFEST_FILE, NonFiniteWeights, export_checkpoint
from cosmos_sana.export.swap import recover_output
from cosmos_sana.export.verify import VerificationFailed, VerifyOptions

__all__ = [
    "FORMATS",
    "MANIFEST_FILE",
    "NonFiniteWeights",
    "VerificationFailed",
    "VerifyOptions",
    "export_checkpoint",
    "recover_output",
]

"""Export DCP checkpoints to diffusers pipelines, LoRA files, merged weights or native SANA ``.pth``."""

from cosmos_sana.export.api import FORMATS, MANIFEST_FILE, export_checkpoint
from cosmos_sana.export.verify import VerificationFailed, VerifyOptions

__all__ = ["FORMATS", "MANIFEST_FILE", "VerificationFailed", "VerifyOptions", "export_checkpoint"]

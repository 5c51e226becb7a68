"""DCP training checkpoints: save, find, resume; HF/native → DCP conversion.

See :mod:`cosmos_sana.checkpoint.training` for how a trainer hands its state over.
"""

from cosmos_sana.checkpoint.convert import convert_to_dcp, load_model_weights
from cosmos_sana.checkpoint.dcp_io import CheckpointError
from cosmos_sana.checkpoint.ema import ParameterEMA
from cosmos_sana.checkpoint.layout import checkpoint_dir, find_latest, list_checkpoints, resolve_resume, runs_root
from cosmos_sana.checkpoint.states import ModelState, OptimizerState, RNGState
from cosmos_sana.checkpoint.training import load_checkpoint, read_meta, save_checkpoint

__all__ = [
    "CheckpointError",
    "ModelState",
    "OptimizerState",
    "ParameterEMA",
    "RNGState",
    "checkpoint_dir",
    "convert_to_dcp",
    "find_latest",
    "list_checkpoints",
    "load_checkpoint",
    "load_model_weights",
    "read_meta",
    "resolve_resume",
    "runs_root",
    "save_checkpoint",
]

"""cosmos-rl's remote reward wire format.

Enqueue body (``application/octet-stream``): ``json(header) + b"\\n" + np.save(array)``
with header ``{"prompts": [...], "reward_fn": {name: weight}, "media_type": ...,
"video_infos"?: [...]}``. ``media_type="image"``: uint8 ``B×H×W×C``; ``"video"``
(ours; decoded frames): uint8 ``B×T×H×W×C``. cosmos-rl's own ``"latent"`` (Wan VAE
latents) is refused: the server has no Wan VAE. Reply ``{"uuid": ...}``.
Pull: form ``{uuid, type}`` → ``{"scores": {name: [...]}}``; HTTP 400 while not ready.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOT_READY = "not ready"


class ProtocolError(ValueError):
    """A malformed request; the message says which part."""


@dataclass
class RewardRequest:
    prompts: list[str]
    rewards: dict[str, float]
    media_type: str
    array: Any  # numpy uint8
    video_infos: list[dict] = field(default_factory=list)


def to_wire(media: Any) -> tuple[Any, str]:
    """Float ``B×C×H×W`` / ``B×T×C×H×W`` in [0, 1] → (uint8 channels-last array, media type)."""
    from cosmos_sana.media_writer import to_uint8

    quantised = to_uint8(media)
    if media.ndim == 4:
        return quantised.permute(0, 2, 3, 1).numpy(), "image"
    if media.ndim == 5:
        return quantised.permute(0, 1, 3, 4, 2).numpy(), "video"
    raise ProtocolError(f"media must be B×C×H×W or B×T×C×H×W, got shape {tuple(media.shape)}")


def from_wire(array: Any, media_type: str) -> Any:
    """The inverse of :func:`to_wire`: a float tensor in [0, 1], channels first."""
    import torch

    tensor = torch.from_numpy(array).float().div_(255)  # in place: one float copy of the batch, not two
    return tensor.permute(0, 3, 1, 2) if media_type == "image" else tensor.permute(0, 1, 4, 2, 3)


def encode_request(header: dict[str, Any], array: Any) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return json.dumps(header).encode("utf-8") + b"\n" + buffer.getvalue()


def decode_request(body: bytes) -> RewardRequest:
    """The request in ``body``; anything malformed is a :class:`ProtocolError` saying what."""
    head, sep, _ = body.partition(b"\n")
    if not sep:
        raise ProtocolError("body must be a JSON header, a newline, then an .npy array")
    try:
        header = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ProtocolError("header must be a JSON object")
    media_type = header.get("media_type", "image")
    if media_type == "latent":
        raise ProtocolError("media_type 'latent' (Wan VAE latents) is not supported: send decoded frames as 'video'")
    layout = {"image": "B×H×W×C", "video": "B×T×H×W×C"}.get(media_type)
    if layout is None:
        raise ProtocolError(f"media_type must be 'image' or 'video', got {media_type!r}")
    array = _media_array(body, len(head) + 1, media_type, layout)
    prompts = header.get("prompts")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise ProtocolError("'prompts' must be a list of strings")
    if len(prompts) != array.shape[0]:
        raise ProtocolError(f"{len(prompts)} prompts for {array.shape[0]} media")
    video_infos = header.get("video_infos") or []
    if not isinstance(video_infos, list) or not all(isinstance(info, dict) for info in video_infos):
        raise ProtocolError("'video_infos' must be a list of objects")
    return RewardRequest(prompts, _weights(header.get("reward_fn")), media_type, array, video_infos)


def _weights(rewards: Any) -> dict[str, float]:
    """``reward_fn`` as ``{name: weight}``: a list of names (weight 1) or an object of finite numbers."""
    if isinstance(rewards, list) and all(isinstance(name, str) for name in rewards):
        rewards = {name: 1.0 for name in rewards}
    if not isinstance(rewards, dict) or not rewards:
        raise ProtocolError("'reward_fn' must be a non-empty {name: weight} object or a list of names")
    for name, weight in rewards.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ProtocolError(f"'reward_fn' weight of {name!r} must be a finite number, got {weight!r}")
    return {name: float(weight) for name, weight in rewards.items()}


def _media_array(body: bytes, offset: int, media_type: str, layout: str) -> Any:
    """The uint8 ``.npy`` array at ``body[offset:]``. Its header is checked before any data is read
    or allocated: a header may declare any shape, and numpy would allocate that much first."""
    import numpy as np
    from numpy.lib import format as npy

    stream = io.BytesIO(memoryview(body)[offset:])
    readers = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
    try:
        version = npy.read_magic(stream)
        if version not in readers:
            raise ValueError(f"unsupported .npy format version {version}")
        shape, fortran_order, dtype = readers[version](stream)
    except (ValueError, TypeError, SyntaxError) as exc:
        raise ProtocolError(f"media is not a .npy array: {exc}") from exc
    ndim = len(layout.split("×"))
    if dtype != np.uint8 or len(shape) != ndim or shape[-1] not in (1, 3):
        raise ProtocolError(f"{media_type} media must be uint8 with shape {layout} (C = 1 or 3), got {dtype} {shape}")
    if min(shape) < 1:
        raise ProtocolError(f"{media_type} media has an empty dimension: shape {shape} ({layout})")
    start = offset + stream.tell()
    if len(body) - start != math.prod(shape):
        raise ProtocolError(
            f"media header declares shape {shape} ({math.prod(shape)} bytes) but {len(body) - start} bytes follow it"
        )
    order = "F" if fortran_order else "C"
    return np.frombuffer(body, np.uint8, math.prod(shape), start).reshape(shape, order=order).copy()


def load_token(env_var: str | None = None, file: str | None = None) -> str | None:
    """The bearer token from a file (first line) or an environment variable; ``None`` if neither is set."""
    if file:
        token = Path(file).read_text().strip()
        if not token:
            raise ValueError(f"token file {file} is empty")
        return token
    if env_var:
        return os.environ.get(env_var) or None
    return None

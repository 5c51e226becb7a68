"""Image and video SFT datasets (registered as ``images`` and ``videos``).

An item is a dict::

    {"prompt": str, "key": str, "index": int, "metadata": dict,
     "pixels": float32 3×H×W (image) | 3×T×H×W (video) in [-1, 1], "cache_path": str | None}

or, on a latent-cache hit, ``"encoded": {name: tensor}`` instead of ``"pixels"`` (no media is
decoded). Under ``on_bad_sample="skip"`` a sample that fails to load is replaced by the next
good one (index + 1, + 2, ... wrapping), so the order stays a function of the seed.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.utils.data import Dataset

from cosmos_sana.log import progress
from cosmos_sana_plugins.datasets.errors import BadSampleError, BadSamplePolicy, DatasetError, OnBadSample
from cosmos_sana_plugins.datasets.images import bucket_size, fit, image_size, open_image, to_pixels
from cosmos_sana_plugins.datasets.latent_cache import LatentCache, content_hash, load_entry
from cosmos_sana_plugins.datasets.layouts import Modality, SampleRef, discover, read_caption
from cosmos_sana_plugins.datasets.params import ImageDataParams, VideoDataParams, config_value
from cosmos_sana_plugins.datasets.report import DataReport
from cosmos_sana_plugins.datasets.videos import decode_clip


class MediaDataset(Dataset, ABC):
    """Shared indexing, caption reading, caching and bad-sample handling."""

    modality: ClassVar[Modality]

    def __init__(self, params: ImageDataParams | VideoDataParams, size: tuple[int, int],
                 policy: BadSamplePolicy, cache: LatentCache | None):
        self.params = params
        self.size = size
        self.policy = policy
        self.cache = cache
        self.decode_count = 0  # media decodes in this process (a cache hit decodes nothing)
        self._known_bad: set[int] = set()
        self.refs, self.candidates = discover(Path(params.path), params.layout, (self.modality,), policy,
                                              allow_outside_root=params.allow_outside_root)
        policy.report_index(self.candidates)

    def require_samples(self) -> MediaDataset:
        """Self, or a :class:`DatasetError` when no usable sample was found."""
        if not self.refs:
            raise DatasetError(f"{self.params.path}: no usable {self.modality} samples "
                               f"({self.candidates} found, {len(self.policy.skipped)} bad)")
        return self

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, index: int) -> dict[str, Any]:
        count = len(self.refs)
        if not -count <= index < count:
            raise IndexError(f"index {index} out of range for {count} samples")
        index %= count
        for offset in range(count):
            current = (index + offset) % count
            if current in self._known_bad:
                continue
            try:
                return self.load(current)
            except BadSampleError as exc:
                self.policy.handle(exc)
                self._known_bad.add(current)
        raise DatasetError(f"{self.params.path}: every sample is bad")

    def load(self, index: int) -> dict[str, Any]:
        """Sample ``index`` without substitution; a bad sample raises :class:`BadSampleError`."""
        ref = self.refs[index]
        caption, metadata = read_caption(ref)
        item: dict[str, Any] = {"prompt": caption, "key": ref.key, "index": index, "metadata": metadata,
                                "cache_path": None}
        if self.cache is not None:
            try:
                entry = self.cache.entry(content_hash(ref.media), caption)
            except (OSError, KeyError) as exc:
                raise BadSampleError(ref.media, f"cannot read media ({exc})") from exc
            encoded = load_entry(entry)
            item["cache_path"] = str(entry)
            if encoded is not None:
                item["encoded"] = encoded
                return item
        item["pixels"], _ = self.decode(ref)
        return item

    @abstractmethod
    def decode(self, ref: SampleRef) -> tuple[torch.Tensor, dict[str, float]]:
        """Pixels and the source's ``height``/``width`` (and ``duration`` for video)."""

    def check(self) -> DataReport:
        """Load every sample (caption and full decode); collect bad ones instead of raising."""
        report = DataReport(str(self.params.path), self.policy.on_bad_sample, bad=list(self.policy.skipped))
        for ref in progress(self.refs, desc=f"checking {self.modality}s", unit="sample"):
            try:
                read_caption(ref)
                _, source = self.decode(ref)
            except BadSampleError as exc:
                report.bad.append(exc.bad)
                continue
            report.add_media(ref.layout, ref.modality, int(source["height"]), int(source["width"]),
                             source.get("duration"))
        return report


class ImageDataset(MediaDataset):
    modality = "image"

    def decode(self, ref: SampleRef) -> tuple[torch.Tensor, dict[str, float]]:
        image = open_image(ref.media)
        self.decode_count += 1
        width, height = image.size
        target = bucket_size(height, width, self.size[0]) if self.params.resize == "bucket" else self.size
        return to_pixels([fit(image, target)])[0], {"height": height, "width": width}

    def bucket_keys(self) -> list[tuple[int, int]]:
        """Each sample's target ``(height, width)`` (read from image headers), for a bucket batch sampler."""
        if self.params.resize != "bucket":
            return [self.size] * len(self.refs)
        return [bucket_size(*image_size(ref.media), self.size[0]) for ref in self.refs]


class VideoDataset(MediaDataset):
    modality = "video"

    def __init__(self, params: VideoDataParams, size: tuple[int, int], num_frames: int,
                 policy: BadSamplePolicy, cache: LatentCache | None):
        self.num_frames = num_frames
        super().__init__(params, size, policy, cache)

    def decode(self, ref: SampleRef) -> tuple[torch.Tensor, dict[str, float]]:
        frames, _, info = decode_clip(ref.media, self.num_frames, fps=self.params.fps, stride=self.params.stride,
                                      short_clip=self.params.short_clip)
        self.decode_count += 1
        pixels = to_pixels([fit(frame, self.size) for frame in frames]).permute(1, 0, 2, 3).contiguous()
        return pixels, {"height": info.height, "width": info.width, "duration": info.duration}


def build_images(params: ImageDataParams, *, cosmos_config: Any = None,
                 on_bad_sample: OnBadSample = "fail") -> ImageDataset:
    """The ``images`` dataset from ``[custom.data] args``."""
    size = _size(params, cosmos_config)
    if params.resize == "bucket" and (size[0] != size[1]):
        raise DatasetError(f"args.size: resize='bucket' needs a square size naming the bin table, got {list(size)}")
    if params.resize == "bucket":
        from cosmos_sana_plugins.datasets.images import aspect_ratio_bins

        try:
            aspect_ratio_bins(size[0])
        except ValueError as exc:
            raise DatasetError(f"args.size: {exc}") from exc
    tag = {"modality": "image", "size": list(size), "resize": params.resize}
    policy = BadSamplePolicy(on_bad_sample, f"images({params.path})")
    return ImageDataset(params, size, policy, _cache(params, cosmos_config, tag)).require_samples()


def build_videos(params: VideoDataParams, *, cosmos_config: Any = None,
                 on_bad_sample: OnBadSample = "fail") -> VideoDataset:
    """The ``videos`` dataset from ``[custom.data] args``."""
    if importlib.util.find_spec("av") is None:
        raise DatasetError(f"videos({params.path}): decoding needs PyAV; pip install 'cosmos-sana[video]' (av>=12)")
    size = _size(params, cosmos_config)
    num_frames = params.num_frames or config_value(cosmos_config, "policy.diffusers.train_frames")
    if not num_frames:
        raise DatasetError("args.num_frames: not set and policy.diffusers.train_frames is absent")
    tag = {"modality": "video", "size": list(size), "num_frames": int(num_frames), "fps": params.fps,
           "stride": params.stride, "short_clip": params.short_clip}
    policy = BadSamplePolicy(on_bad_sample, f"videos({params.path})")
    return VideoDataset(params, size, int(num_frames), policy, _cache(params, cosmos_config, tag)).require_samples()


def _size(params: ImageDataParams | VideoDataParams, cosmos_config: Any) -> tuple[int, int]:
    size = params.size or config_value(cosmos_config, "policy.diffusers.inference_size")
    if not size or len(size) != 2:
        raise DatasetError("args.size: not set and policy.diffusers.inference_size is absent")
    return int(size[0]), int(size[1])


def _cache(params: ImageDataParams | VideoDataParams, cosmos_config: Any, tag: dict[str, Any]) -> LatentCache | None:
    if params.cache_dir is None:
        return None
    model_id = params.cache_model_id or config_value(cosmos_config, "policy.model_name_or_path")
    if not model_id:
        raise DatasetError("args.cache_model_id: caching needs a model id (or policy.model_name_or_path)")
    chi = config_value(cosmos_config, "custom.model.complex_human_instruction") or "off"
    return LatentCache(params.cache_dir, {**tag, "model": str(model_id), "chi": chi})

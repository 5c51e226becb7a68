"""What a plugin hook returns: small, import-free descriptions of components.

``target`` (and ``params``) may be the object itself or a lazy ``"module:attr"``
string; :func:`resolve` imports it on first use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal

Target = Any  # an object, or "package.module:attribute"


def resolve(target: Target) -> Any:
    """Import ``"module:attr"`` strings; return anything else unchanged."""
    if not isinstance(target, str):
        return target
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"lazy target {target!r} must look like 'package.module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class _Spec:
    name: str
    target: Target
    description: str = ""
    # pydantic model (or lazy string) validating this component's ``args`` table
    params: Target = None

    kind = "component"

    def load(self) -> Any:
        return resolve(self.target)

    def params_model(self) -> Any:
        return resolve(self.params) if self.params is not None else None


@dataclass(frozen=True)
class ModelSpec(_Spec):
    """A cosmos-rl model class (subclass of ``DiffuserModel``).

    ``native_loader`` reads the model family's own checkpoint format (``[custom.model] native_checkpoint``):
    ``fn(source, *, base_config, use_ema, torch_dtype) -> transformer``, ``base_config`` a pipeline folder.
    Export calls it to rebuild the base weights a run trained on.

    ``generator`` samples for ``cosmos-sana generate``: ``fn(pipe, request) -> Tensor`` in [0, 1]
    (``B×C×H×W`` images, ``B×T×C×H×W`` videos), ``request`` a :class:`cosmos_sana.generation.GenerationRequest`.
    ``lora_layouts`` are LoRA file layouts of other tools, by ``export --format`` name:
    ``fn(transformer, adapter, out_dir, *, pipeline_class) -> Path`` writes one into ``out_dir``.

    ``lora_writer`` writes ``export --format lora``: ``fn(transformer, adapter, out_dir)`` writes
    :data:`~cosmos_sana.export.writers.LORA_FILE` (what ``pipe.load_lora_weights`` reads) and the PEFT
    adapter folder :data:`~cosmos_sana.export.writers.PEFT_FOLDER`.
    ``native_writer`` writes ``export --format native``: ``fn(transformer, out_dir, *, layout_of) -> Path``
    writes :data:`~cosmos_sana.export.writers.NATIVE_FILE` (``layout_of``: the native checkpoint the run
    started from, or None), which ``native_loader`` reads back.
    ``native_converter`` is ``cosmos-sana convert-native``: ``fn(source, *, base, out, use_ema, torch_dtype)
    -> Path`` writes a pipeline folder whose transformer comes from a native checkpoint.
    ``pipeline_check`` is ``fn(pipeline_dir, transformer)``: raises when the pipeline folder a native
    checkpoint is paired with lacks a component that transformer needs (e.g. the VAE its latents use).
    """

    pipeline_classes: tuple[str, ...] = ()
    native_loader: Target = None
    generator: Target = None
    lora_layouts: tuple[tuple[str, Target], ...] = ()
    lora_writer: Target = None
    native_writer: Target = None
    native_converter: Target = None
    pipeline_check: Target = None
    kind = "model"


@dataclass(frozen=True)
class DatasetSpec(_Spec):
    """``target(params, *, cosmos_config, on_bad_sample) -> torch.utils.data.Dataset``.

    ``checker`` serves ``cosmos-sana data check``: an object with ``check_path(path, *, on_bad_sample,
    size, num_frames, fps, stride, short_clip) -> report`` (a bare dataset path),
    ``check_dataset(dataset, name, on_bad_sample) -> report`` (a dataset built from a recipe, of any
    plugin), ``quiet()`` (a context manager silencing per-sample skip warnings while building and checking)
    and ``error`` (the exception type meaning the data as a whole is unusable). A report has ``fails``,
    ``render() -> str`` and ``to_dict()``.
    """

    modality: Literal["image", "video", "prompt"] = "prompt"
    checker: Target = None
    kind = "dataset"


@dataclass(frozen=True)
class DataPackerSpec(_Spec):
    """A ``cosmos_rl`` ``BaseDataPacker`` subclass.

    ``model_types``: cosmos-rl model types it becomes the default packer for
    (cosmos-rl keys every diffusers model as ``"diffusers"``).
    """

    model_types: tuple[str, ...] = ()
    kind = "data_packer"


@dataclass(frozen=True)
class RewardSpec(_Spec):
    """A scorer.

    With ``factory=False`` the target is one function
    ``fn(media, prompts, metadata, **args) -> Sequence[float]`` where ``media`` is a
    float tensor ``B×C×H×W`` (image) or ``B×T×C×H×W`` (video) in [0, 1].
    With ``factory=True`` the target is called once as ``target(args, device)`` and
    returns such a function (for scorers that load weights).
    ``modality="image"`` scorers also score videos, frame by frame (see ``video_reduce``).
    """

    modality: Literal["image", "video", "any"] = "any"
    factory: bool = False
    # videos through an image scorer: mean over the sampled frames, or mean over
    # the frames scoring > 0 (0 when none does; the OCR rule)
    video_reduce: Literal["mean", "mean_positive"] = "mean"
    kind = "reward"


@dataclass(frozen=True)
class TrainerSpec(_Spec):
    """A cosmos-rl trainer class; ``trainer_type`` is its registry key."""

    trainer_type: str = ""
    kind = "trainer"


@dataclass(frozen=True)
class RolloutSpec(_Spec):
    """A cosmos-rl rollout class, selected by ``[rollout] backend``."""

    kind = "rollout"


SPEC_KINDS: dict[str, str] = {
    "model": "cosmos_sana_models",
    "dataset": "cosmos_sana_datasets",
    "data_packer": "cosmos_sana_data_packers",
    "reward": "cosmos_sana_rewards",
    "trainer": "cosmos_sana_trainers",
    "rollout": "cosmos_sana_rollouts",
}


@dataclass(frozen=True)
class Registered:
    """A spec plus where it came from."""

    spec: Any
    plugin: str
    distribution: str = field(default="<unknown>")

"""What the installed model plugin serving a pipeline class provides beyond training (see :class:`ModelSpec`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cosmos_sana.specs import ModelSpec, resolve


class NoModelTool(ValueError):
    """No installed model plugin provides the asked-for tool for a pipeline class."""


def model_spec_for(pipeline_class: str) -> ModelSpec:
    """The spec of the installed model plugin serving ``pipeline_class`` (``model_index.json`` ``_class_name``)."""
    from cosmos_sana.plugin_manager import installed_plugins

    for entry in installed_plugins().entries("model"):
        if pipeline_class in entry.spec.pipeline_classes:
            return entry.spec
    raise NoModelTool(f"no installed cosmos-sana model plugin serves {pipeline_class} pipelines")


def model_tool(pipeline_class: str, tool: str) -> Callable[..., Any]:
    """The :class:`ModelSpec` field ``tool`` (e.g. ``"native_writer"``) of the plugin serving ``pipeline_class``."""
    spec = model_spec_for(pipeline_class)
    target = getattr(spec, tool)
    if target is None:
        raise NoModelTool(f"model plugin {spec.name!r} has no {tool} for {pipeline_class} pipelines")
    return resolve(target)


def generator_for(pipeline_class: str) -> Callable[..., Any]:
    """``fn(pipe, request) -> Tensor``: how ``cosmos-sana generate`` samples a ``pipeline_class``."""
    return model_tool(pipeline_class, "generator")


def lora_layouts(pipeline_class: str) -> dict[str, Any]:
    """``export --format`` name → writer of another tool's LoRA layout, for a ``pipeline_class``."""
    return dict(model_spec_for(pipeline_class).lora_layouts)


def lora_layout_writer(pipeline_class: str, fmt: str) -> Callable[..., Any]:
    layouts = lora_layouts(pipeline_class)
    if fmt not in layouts:
        raise NoModelTool(f"--format {fmt}: no installed model plugin writes that LoRA layout for {pipeline_class} "
                          f"(available: {', '.join(sorted(layouts)) or 'none'})")
    return resolve(layouts[fmt])

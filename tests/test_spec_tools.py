"""The core finds model- and dataset-specific tools only through the specs plugins register."""

from __future__ import annotations

import argparse

import pytest

from cosmos_sana import plugin_manager
from cosmos_sana.commands import data_check
from cosmos_sana.model_hooks import NoModelTool, model_tool
from cosmos_sana.plugin_manager import PluginRegistry
from cosmos_sana.specs import DatasetSpec, ModelSpec, Registered


def _registry(*specs) -> PluginRegistry:
    registry = PluginRegistry()
    for spec in specs:
        registry.add(Registered(spec=spec, plugin="third_party"))
    return registry


def test_builtin_sana_plugin_provides_every_model_tool():
    for tool in ("native_loader", "native_writer", "lora_writer", "native_converter", "pipeline_check", "generator"):
        for pipeline_class in ("SanaPipeline", "SanaVideoPipeline"):
            assert callable(model_tool(pipeline_class, tool))


def test_a_model_plugin_without_a_tool_is_named(monkeypatch):
    spec = ModelSpec(name="flux", target="x:y", pipeline_classes=("FluxPipeline",))
    monkeypatch.setattr(plugin_manager, "installed_plugins", lambda: _registry(spec))
    with pytest.raises(NoModelTool, match="model plugin 'flux' has no native_writer for FluxPipeline pipelines"):
        model_tool("FluxPipeline", "native_writer")
    with pytest.raises(NoModelTool, match="no installed cosmos-sana model plugin serves SanaPipeline"):
        model_tool("SanaPipeline", "lora_writer")


def _check_args(target: str) -> argparse.Namespace:
    return argparse.Namespace(target=target, on_bad_sample="fail", size=(64, 64), num_frames=5, fps=None, stride=1,
                              short_clip="error", json=False)


def test_data_check_without_a_dataset_checker_is_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(plugin_manager, "installed_plugins", lambda: _registry(DatasetSpec(name="csv", target="x:y")))
    assert data_check.run(_check_args(str(tmp_path))) == 2
    assert "needs exactly one installed dataset checker, found 0 (none)" in capsys.readouterr().err


def test_data_check_with_two_dataset_checkers_names_them(monkeypatch, tmp_path, capsys):
    specs = (DatasetSpec(name="a", target="x:y", checker=object()), DatasetSpec(name="b", target="x:y", checker=object()))
    monkeypatch.setattr(plugin_manager, "installed_plugins", lambda: _registry(*specs))
    assert data_check.run(_check_args(str(tmp_path))) == 2
    assert "found 2 (datasets a; datasets b)" in capsys.readouterr().err

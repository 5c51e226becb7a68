"""The plugin guides' examples, taken from the guides' own text, build with their declared backend, install
beside this environment (``pip --target``), are listed by ``cosmos-sana plugins`` with their descriptions and
work from a recipe's ``[custom]`` table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: a fenced block whose info string names the file it is: ```python file=pkg/module.py
FILE_BLOCK = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```$", re.S | re.M)
GUIDES = {
    "third_party_reward.md": ("sana-brightness-reward", "reward", "brightness",
                              "mean pixel brightness, or closeness to args.target"),
    "third_party_plugins.md": ("sana-csv-prompts", "dataset", "csv_prompts",
                               "RL prompts from a CSV column (args: path, column)"),
}


def package_from(doc: Path, root: Path) -> Path:
    """The package a guide describes, written file by file from its ``file=`` blocks."""
    blocks = FILE_BLOCK.findall(doc.read_text(encoding="utf-8"))
    assert blocks, f"{doc.name} has no ```LANG file=PATH blocks"
    for name, text in blocks:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Both examples installed into a folder of their own, offline, by pip with the declared build backend."""
    work = tmp_path_factory.mktemp("guides")
    packages = []
    for doc, (dist, *_rest) in GUIDES.items():
        root = package_from(DOCS / doc, work / dist)
        build = tomllib.loads((root / "pyproject.toml").read_text())["build-system"]
        assert build["build-backend"] == "hatchling.build"
        packages.append(str(root))
    target = work / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), *packages],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return target


def test_plugins_command_lists_the_examples_with_their_descriptions(site: Path) -> None:
    for dist, _kind, _name, _description in GUIDES.values():
        (info,) = site.glob(f"{dist.replace('-', '_')}-0.1.0.dist-info")
        assert "[cosmos_sana.plugins]" in (info / "entry_points.txt").read_text()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "cosmos_sana.cli", "plugins", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)  # stdout is the JSON alone
    for dist, kind, name, description in GUIDES.values():
        (row,) = [r for r in rows if (r["kind"], r["name"]) == (kind, name)]
        assert row["distribution"] == f"{dist} 0.1.0" and row["description"] == description


def test_the_examples_work_from_a_recipe(site: Path, tmp_path: Path, monkeypatch) -> None:
    from cosmos_sana.config.base import ComponentRef
    from cosmos_sana.plugin_manager import load_plugins
    from cosmos_sana.rewards.scorers import ScorerSet
    from cosmos_sana.settings import component_params
    from cosmos_sana.settings import SettingsError, parse_custom

    monkeypatch.syspath_prepend(str(site))
    registry = load_plugins()

    custom = parse_custom({"package": "cosmos-sana", "rewards": [{"name": "brightness", "args": {"target": 0.6}}]})
    media = torch.stack([torch.full((3, 8, 8), 0.25), torch.full((3, 8, 8), 0.75)])
    scores = ScorerSet.from_settings(custom, registry).score(media, ["a", "b"])
    assert scores.total == pytest.approx([1 - 0.35, 1 - 0.15])  # 1 − |mean − target|

    csv = tmp_path / "prompts.csv"
    csv.write_text("caption,style\na red cube,flat\n,empty\na blue ball,photo\n")
    spec = registry.get("dataset", "csv_prompts")
    ref = ComponentRef(name="csv_prompts", args={"path": str(csv), "column": "caption"})
    params = component_params(registry, "dataset", ref, "custom.data")
    data = spec.load()(params, on_bad_sample="skip")
    assert [data[i] for i in range(len(data))] == [
        {"prompt": "a red cube", "metadata": {"style": "flat"}},
        {"prompt": "a blue ball", "metadata": {"style": "photo"}},
    ]
    with pytest.raises(ValueError, match=r"prompts.csv:3: empty 'caption'"):
        spec.load()(params, on_bad_sample="fail")
    with pytest.raises(SettingsError, match="colum"):  # the params model forbids unknown keys
        component_params(registry, "dataset", ComponentRef(name="csv_prompts", args={"path": "x", "colum": "c"}),
                         "custom.data")

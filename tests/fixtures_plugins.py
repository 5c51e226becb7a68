"""Throwaway third-party distributions, discovered through real entry-point metadata."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest


def write_distribution(root: Path, dist: str, module: str, source: str, version: str = "1.0") -> Path:
    """A minimal installed distribution: ``module.py`` + ``dist.dist-info`` with one plugin entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[cosmos_sana.plugins]\n{module} = {module}\n")
    return root


@pytest.fixture
def make_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """``make_distribution(dist, module, source)`` puts a plugin distribution on ``sys.path``."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def make(dist: str, module: str, source: str) -> Path:
        write_distribution(site, dist, module, source)
        sys.modules.pop(module, None)
        return site

    return make

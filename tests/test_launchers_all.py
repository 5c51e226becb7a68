"""Every recipe in toml/ has a launcher, and each launcher's ``--dryrun`` (cosmos-framework's spelling) resolves a
config that the real ``cosmos-sana validate`` accepts.

The launchers run with a recording stand-in for ``cosmos-sana`` (one process start of the real command takes
seconds); the validate command lines they recorded are then replayed through the real CLI in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAUNCHERS = REPO / "launchers"
RECIPES = sorted(p.stem for p in (REPO / "toml").glob("*.toml"))
#: records its arguments (NUL-separated) and writes the --dump file as the real validate does
RECORDING_COSMOS_SANA = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$RECORD"
recipe=$2
while (($# > 1)); do [[ $1 == --dump ]] && cp "$recipe" "$2"; shift; done
"""


def launcher_of(recipe: str) -> Path:
    found = [p for kind in ("sft", "rl") if (p := LAUNCHERS / f"launch_{kind}_{recipe}.sh").is_file()]
    assert len(found) == 1, f"toml/{recipe}.toml needs exactly one launcher launchers/launch_{{sft,rl}}_{recipe}.sh"
    return found[0]


def read(recipe: str) -> dict:
    with open(REPO / "toml" / f"{recipe}.toml", "rb") as handle:
        return tomllib.load(handle)


def is_video(recipe: str) -> bool:
    return read(recipe)["policy"]["diffusers"]["is_video"]


def test_every_recipe_has_one_launcher_and_every_launcher_a_recipe() -> None:
    launched = {p.stem.split("_", 2)[2] for p in LAUNCHERS.glob("launch_*_*.sh")}
    assert launched == set(RECIPES)
    for recipe in RECIPES:
        text = launcher_of(recipe).read_text()
        assert f"RECIPE={recipe}\n" in text and os.access(launcher_of(recipe), os.X_OK)
        assert ("MODALITY=video" in text) == is_video(recipe), recipe


@pytest.fixture(scope="module")
def dry_runs(tiny_image_pipeline_dir: Path, tiny_video_pipeline_dir: Path, tmp_path_factory) -> dict[str, tuple[list[str], Path]]:
    """Each launcher's ``--dryrun`` in a caller's folder: its recorded ``cosmos-sana`` arguments and its
    pipeline folder, by recipe."""
    work = tmp_path_factory.mktemp("launch")
    (work / "images").mkdir()
    (work / "prompts.txt").write_text("a red cube\n")
    fake = work / "bin" / "cosmos-sana"
    fake.parent.mkdir()
    fake.write_text(RECORDING_COSMOS_SANA)
    fake.chmod(0o755)
    recorded: dict[str, tuple[list[str], Path]] = {}
    for recipe in RECIPES:
        sft = launcher_of(recipe).name.startswith("launch_sft_")
        base = tiny_video_pipeline_dir if is_video(recipe) else tiny_image_pipeline_dir
        env = {k: v for k, v in os.environ.items() if k not in {"DRY_RUN", "OUTPUT_ROOT", "DATASET_PATH"}}
        env.update(
            PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
            COSMOS_SANA=str(fake),
            COSMOS_RL="false",  # a launch would fail loudly
            RECORD=str(work / f"{recipe}.args"),
            BASE_CHECKPOINT_PATH=str(base),
            DATASET_PATH="images" if sft else "prompts.txt",
            REAL_DATA_PATH="images",  # exported for all: only recipes with [custom.real_data] take it
            NPROC_PER_NODE="1",
        )
        if "val_data" in read(recipe)["custom"]:
            env["VAL_DATASET_PATH"] = "images"
        result = subprocess.run(["bash", str(launcher_of(recipe)), "--dryrun"], env=env, cwd=work,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{recipe}: {result.stderr}"
        assert "dry run: configuration valid" in result.stdout, recipe
        args = (work / f"{recipe}.args").read_bytes().decode().split("\0")[:-1]
        assert args[:2] == ["validate", str(REPO / "toml" / f"{recipe}.toml")], args
        recorded[recipe] = args, base
    return recorded


@pytest.mark.parametrize("recipe", RECIPES)
def test_dryrun_config_validates(recipe: str, dry_runs: dict[str, tuple[list[str], Path]], capsys) -> None:
    from cosmos_sana.cli import main

    args, base = dry_runs[recipe]
    dump = Path(args[args.index("--dump") + 1])
    dump.unlink()  # written again by the real command below
    # -v: leave the third-party log filters of the quiet default out of this shared test process
    assert main(["-v", *args]) == 0, capsys.readouterr().err[-3000:]
    resolved = tomllib.loads(dump.read_text())
    assert resolved["policy"]["model_name_or_path"] == str(base)
    assert resolved["policy"]["parallelism"]["dp_shard_size"] == 1  # NPROC_PER_NODE=1
    assert ("real_data" in resolved["custom"]) == ("real_data" in read(recipe)["custom"])
    if "real_data" in resolved["custom"]:
        assert resolved["custom"]["real_data"]["args"]["path"] == str(dump.parents[3] / "images")

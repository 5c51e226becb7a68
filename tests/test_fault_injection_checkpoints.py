"""Fault injection, checkpoints: hostile pickles and damaged DCP folders on export, resume and convert.

The hostile files are real: a DCP checkpoint written by ``convert-to-dcp`` whose ``model/.metadata``
is re-pickled with an object whose ``__reduce__`` creates a marker file, and a native ``.pth`` with
the same payload. Control tests show that plain unpickling (torch's stock ``FileSystemReader``,
``torch.load(weights_only=False)``) does create the marker; every loader here must refuse, name the
file, and leave the marker absent.
"""

from __future__ import annotations

import hashlib
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cosmos_sana.checkpoint import CheckpointError, ModelState, load_checkpoint, load_model_weights
from cosmos_sana.checkpoint.dcp_io import read_metadata
from cosmos_sana.cli import main

pytestmark = pytest.mark.usefixtures("torch_single_thread")


class CreatesFile:
    """Unpickling this opens ``path`` for writing: the file appearing proves code ran."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (str(self.path), "w"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("fault_ckpt") / "dcp"
    assert main(["convert-to-dcp", str(tiny_image_pipeline_dir), "--out", str(out), "--chunk-size", "50KB"]) == 0
    return out


def hostile_copy(converted: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of ``converted`` whose ``model/.metadata`` carries a file-creating payload; (copy, marker)."""
    checkpoint, marker = tmp_path / "ckpt", tmp_path / "PWNED"
    shutil.copytree(converted, checkpoint)
    metadata = read_metadata(checkpoint / "model")
    metadata.planner_data = CreatesFile(marker)  # the rest stays a valid checkpoint
    (checkpoint / "model" / ".metadata").write_bytes(pickle.dumps(metadata))
    return checkpoint, marker


def transformer_of(pipeline: Path) -> torch.nn.Module:
    from diffusers import SanaTransformer2DModel

    return SanaTransformer2DModel.from_pretrained(pipeline, subfolder="transformer")


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_control_stock_dcp_reader_runs_the_payload(converted: Path, tmp_path: Path) -> None:
    """Not a fault case: shows the crafted ``.metadata`` is hostile to torch's own reader."""
    from torch.distributed.checkpoint import FileSystemReader

    checkpoint, marker = hostile_copy(converted, tmp_path)
    FileSystemReader(str(checkpoint / "model")).read_metadata()
    assert marker.exists()


@pytest.mark.fault("refused", guards_data=True)
@pytest.mark.parametrize("path", ["export", "resume", "init_from"])
def test_hostile_dcp_metadata_is_refused_unloaded(
    converted: Path, tiny_image_pipeline_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, path: str
) -> None:
    checkpoint, marker = hostile_copy(converted, tmp_path)
    before = tree_digest(checkpoint)
    named = str(checkpoint / "model" / ".metadata")
    if path == "export":
        out = tmp_path / "export"
        assert main(["export", str(checkpoint), "--out", str(out)]) != 0
        message = capsys.readouterr().err
        assert not out.exists()
    else:
        transformer = transformer_of(tiny_image_pipeline_dir)
        with pytest.raises(CheckpointError) as info:
            if path == "resume":
                load_checkpoint(checkpoint, {"model": ModelState(transformer)})
            else:
                load_model_weights(checkpoint, transformer)
        message = str(info.value)
    assert named in message and "refused" in message and "io.open" in message
    assert not marker.exists()
    assert tree_digest(checkpoint) == before


def hostile_pth(tmp_path: Path) -> tuple[Path, Path]:
    path, marker = tmp_path / "sana.pth", tmp_path / "PWNED"
    torch.save({"state_dict": {}, "note": CreatesFile(marker)}, path)
    return path, marker


def test_control_plain_torch_load_runs_the_payload(tmp_path: Path) -> None:
    path, marker = hostile_pth(tmp_path)
    torch.load(path, weights_only=False)
    assert marker.exists()


def plant_in_hub_cache(monkeypatch: pytest.MonkeyPatch, cache: Path, file: Path) -> str:
    """``file`` as ``hf://org/sana/sana.pth`` in an offline Hugging Face cache; returns the URL."""
    import huggingface_hub.constants as hub

    commit = "0" * 40
    repo = cache / "models--org--sana"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    shutil.copy(file, repo / "snapshots" / commit / file.name)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    return f"hf://org/sana/{file.name}"


@pytest.mark.fault("refused")
@pytest.mark.parametrize("command", ["convert-native", "convert-to-dcp", "convert-to-dcp hf://"])
def test_hostile_native_checkpoint_is_refused_unloaded(
    tiny_image_pipeline_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    path, marker = hostile_pth(tmp_path)
    source = plant_in_hub_cache(monkeypatch, tmp_path / "hub", path) if command.endswith("hf://") else str(path)
    out = tmp_path / "out"
    argv = [command.split()[0], source, "--base", str(tiny_image_pipeline_dir), "--out", str(out)]
    assert main(argv) != 0
    message = capsys.readouterr().err
    assert "sana.pth" in message and "refused to unpickle" in message
    assert not marker.exists() and not out.exists()


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _repickle(file: Path, change: Callable) -> None:
    metadata = read_metadata(file.parent)
    file.write_bytes(pickle.dumps(change(metadata)))


def _escape_folder(metadata):
    for info in metadata.storage_data.values():
        info.relative_path = "../../../../etc/passwd"
    return metadata


DAMAGE: dict[str, tuple[Callable[[Path], None], str, str]] = {
    # name: (damage the checkpoint folder, file the error must name, words it must contain)
    "metadata truncated": (lambda c: _truncate(c / "model/.metadata"), "model/.metadata", "corrupt checkpoint metadata"),
    "metadata empty": (lambda c: (c / "model/.metadata").write_bytes(b""), "model/.metadata", "corrupt"),
    "metadata not DCP": (lambda c: (c / "model/.metadata").write_bytes(pickle.dumps({"a": 1})), "model/.metadata",
                         "not DCP checkpoint metadata"),
    "metadata data path escapes": (lambda c: _repickle(c / "model/.metadata", _escape_folder), "model/.metadata",
                                   "outside its checkpoint folder"),
    "metadata missing": (lambda c: (c / "model/.metadata").unlink(), "model", "no .metadata"),
    "data file missing": (lambda c: next((c / "model").glob("*.distcp")).unlink(), "model", "cannot load"),
    "data file truncated": (lambda c: [_truncate(f) for f in (c / "model").glob("*.distcp")], "model", "cannot load"),
    "COMPLETE missing": (lambda c: (c / "COMPLETE").unlink(), "", "no complete checkpoint"),
    "meta.json corrupt": (lambda c: (c / "meta.json").write_text("{"), "meta.json", "invalid JSON"),
    "model part missing": (lambda c: shutil.rmtree(c / "model"), "model", "model"),
}


@pytest.mark.fault("refused", guards_data=True)
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_checkpoint_export_names_the_file(
    converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture, damage: str
) -> None:
    break_it, named, words = DAMAGE[damage]
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(converted, checkpoint)
    break_it(checkpoint)
    before = tree_digest(checkpoint)
    out = tmp_path / "out"
    out.mkdir()  # an earlier export there survives a failed one
    (out / "export_manifest.json").write_text("{}")
    (out / "model_index.json").write_text("{}")
    assert main(["export", str(checkpoint), "--out", str(out)]) != 0
    message = capsys.readouterr().err
    assert str(checkpoint / named) in message and words in message, message
    assert sorted(p.name for p in out.iterdir()) == ["export_manifest.json", "model_index.json"]
    assert tree_digest(checkpoint) == before


@pytest.mark.fault("refused")
@pytest.mark.parametrize("damage", ["metadata truncated", "metadata data path escapes", "data file truncated"])
def test_damaged_checkpoint_resume_names_the_file(
    converted: Path, tiny_image_pipeline_dir: Path, tmp_path: Path, damage: str
) -> None:
    break_it, named, words = DAMAGE[damage]
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(converted, checkpoint)
    break_it(checkpoint)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(checkpoint, {"model": ModelState(transformer_of(tiny_image_pipeline_dir))})
    assert str(checkpoint / named) in str(info.value) and words in str(info.value)


def test_every_dcp_read_goes_through_the_safe_reader() -> None:
    """Not a fault case: no module outside ``dcp_io`` builds torch's stock reader or unpickles freely."""
    import re

    root = Path(__file__).resolve().parents[1]
    risky = re.compile(r"FileSystemReader\(|dcp\.load\(|pickle\.loads?\(|Unpickler\b|weights_only\s*=\s*False"
                       r"|allow_pickle\s*=\s*True")
    found = [f"{path.relative_to(root)}:{number}"
             for folder in ("cosmos_sana", "plugins", "scripts", "bench")
             for path in sorted((root / folder).rglob("*.py")) if path.name != "dcp_io.py"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if risky.search(line)]
    assert not found, f"unsafe checkpoint reads: {found}"


@pytest.mark.fault("refused")
@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/model.safetensors", "sub/../../x.safetensors"])
def test_native_index_naming_shards_elsewhere_is_refused(tmp_path: Path, shard: str) -> None:
    import json

    from safetensors.torch import save_file

    from cosmos_sana_plugins.sana.native_checkpoint import NativeCheckpointError, read_native_state_dict

    save_file({"w": torch.zeros(2)}, tmp_path / "outside.safetensors")
    folder = tmp_path / "model"
    folder.mkdir()
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(NativeCheckpointError, match="shards must be file names beside the index") as info:
        read_native_state_dict(index)
    assert str(index) in str(info.value)


@pytest.mark.fault("refused")
def test_hostile_non_tensor_entry_is_refused_unloaded(tmp_path: Path) -> None:
    """DCP stores a non-tensor value (a step count, a sampler state) as a pickle of its own; a crafted one
    must not run either. The hostile object is written by DCP itself, as a tampered save would be."""
    from cosmos_sana.checkpoint import save_checkpoint

    marker = tmp_path / "PWNED"
    saved = save_checkpoint(tmp_path / "run", 1, {"trainer": {"step": 3, "sampler": CreatesFile(marker)}})
    assert not marker.exists()
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved, {"trainer": {"step": 0, "sampler": None}})
    assert str(info.value).startswith(f"{saved / 'trainer'}: entry 'sampler' is not plain data")
    assert "io.open" in str(info.value)
    assert not marker.exists()


@pytest.mark.fault("refused", guards_data=True)
def test_metadata_setting_attributes_of_an_allowed_class_is_refused(converted: Path, tmp_path: Path) -> None:
    """Restricting globals is not enough: pickle's BUILD opcode sets attributes on whatever is on the
    stack, an allowed class included (``_str`` on ``PosixPath`` would redirect every path of the process).
    The hostile prefix sets a harmless marker attribute on ``pathlib.PosixPath``, then the real metadata follows."""
    import pathlib

    checkpoint = tmp_path / "ckpt"
    shutil.copytree(converted, checkpoint)
    file = checkpoint / "model" / ".metadata"
    marker = b"cosmos_sana_marker"
    prefix = (b"\x80\x02cpathlib\nPosixPath\nN}X" + len(marker).to_bytes(4, "little") + marker
              + b"\x88s\x86b0")  # PosixPath, (None, {marker: True}), BUILD, POP
    file.write_bytes(prefix + file.read_bytes())
    try:
        with pytest.raises(CheckpointError) as info:
            read_metadata(checkpoint / "model")
        assert not hasattr(pathlib.PosixPath, marker.decode())
    finally:
        if hasattr(pathlib.PosixPath, marker.decode()):
            delattr(pathlib.PosixPath, marker.decode())
    assert str(file) in str(info.value) and "setting attributes of the class pathlib.PosixPath" in str(info.value)

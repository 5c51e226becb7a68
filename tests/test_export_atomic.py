"""A re-export never loses the previous export: failures (refused weights, failed ``--verify``) and
``kill -9`` at any point leave it intact or recoverable, and ``--out`` may not overlap what export reads."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cosmos_sana.checkpoint import ModelState, save_checkpoint
from cosmos_sana.cli import main
from cosmos_sana.export import NonFiniteWeights, export_checkpoint
from cosmos_sana.export.swap import recover_output

pytestmark = pytest.mark.usefixtures("torch_single_thread")

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def siblings(out: Path) -> list[str]:
    """Staging folders and moved-aside copies of ``out``."""
    if not out.parent.is_dir():
        return []
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f"{out.name}."))


def stock(pipeline: Path) -> torch.nn.Module:
    from diffusers import SanaTransformer2DModel

    return SanaTransformer2DModel.from_pretrained(pipeline, subfolder="transformer").eval()


def full_checkpoint(pipeline: Path, root: Path, edit: Callable[[torch.nn.Module], None] | None = None) -> Path:
    transformer = stock(pipeline)
    if edit is not None:
        with torch.no_grad():
            edit(transformer)
    return save_checkpoint(root, 1, {"model": ModelState(transformer, base_pipeline=str(pipeline))})


def lora_checkpoint(pipeline: Path, root: Path, b_value: float) -> Path:
    """A LoRA checkpoint whose adapter ``default`` has every A and B entry equal to ``b_value``."""
    from peft import LoraConfig

    transformer = stock(pipeline)
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=TARGETS), adapter_name="default")
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_" in name:
                p.fill_(b_value)
    return save_checkpoint(root, 1, {"model": ModelState(transformer, lora_only=True, base_pipeline=str(pipeline))})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tiny_image_pipeline_dir: Path) -> tuple[Path, Path]:
    """Two full-weight checkpoints whose exports differ (``proj_out.bias`` 0 vs 1)."""
    root = tmp_path_factory.mktemp("atomic")
    first = full_checkpoint(tiny_image_pipeline_dir, root / "a", lambda t: t.proj_out.bias.fill_(0.0))
    second = full_checkpoint(tiny_image_pipeline_dir, root / "b", lambda t: t.proj_out.bias.fill_(1.0))
    return first, second


def poison(checkpoint: Path, key: str, value: float) -> None:
    """Set the first element of ``key`` in the checkpoint's model part to ``value``. Written past
    ``save_checkpoint`` (which refuses NaN/inf), as an older or externally converted checkpoint may be."""
    from cosmos_sana.checkpoint.dcp_io import load_state, read_metadata, save_state

    model = checkpoint / "model"
    stored = read_metadata(model).state_dict_metadata
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in stored.items()}
    load_state(state, model)
    state[key].view(-1)[0] = value
    shutil.rmtree(model)
    save_state(state, model)


def previous_export(checkpoint: Path, out: Path) -> dict[str, bytes]:
    export_checkpoint(checkpoint, out)
    return files(out)


def in_child(run: Callable[[], None], timeout: float = 120.0) -> int:
    """Run ``run`` in a forked child; its exit status (``-SIGNAL`` when a signal ended it)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            run()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked export did not finish in {timeout} s")
        time.sleep(0.01)
    status = done[1]
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def export_killed_after(checkpoint: Path, out: Path, delay: float) -> None:
    """Fork an export of ``checkpoint`` to ``out`` and SIGKILL it ``delay`` seconds later (or once it is done)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            export_checkpoint(checkpoint, out)
        finally:
            os._exit(0)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_kill_at_random_points_keeps_the_previous_export(checkpoints, tmp_path: Path) -> None:
    """A forked export of another checkpoint over ``out`` is SIGKILLed after a random delay, eight times.
    Each time ``out`` (after the recovery every export starts with) is the old export byte for byte, or,
    when the kill came after the swap, the complete new one; a later export leaves no leftovers."""
    first, second = checkpoints
    out = tmp_path / "export"
    old = previous_export(first, out)
    started = time.perf_counter()  # how long a forked export takes, start to exit
    assert in_child(lambda: export_checkpoint(second, tmp_path / "probe")) == 0
    duration = time.perf_counter() - started
    rng, runs = random.Random(7), 8
    outcomes = []
    for i in range(runs):
        delay = duration * 1.2 * (i + rng.random()) / runs  # spread over the whole export and a little after
        export_killed_after(second, out, delay)
        left = siblings(out)
        recover_output(out)
        now = files(out)
        if now == old:
            outcomes.append("old" if left else "old, nothing left")
        else:
            manifest = json.loads(now["export_manifest.json"])
            assert manifest["source_checkpoint"] == str(second.resolve()) and "COMPLETE" in now
            assert now.keys() - {"export_manifest.json", "COMPLETE"} == manifest["files"].keys()
            outcomes.append("new")
            old = previous_export(first, out)
        assert siblings(out) == [], (i, left)
    assert "old" in outcomes, outcomes  # some kills landed mid-export, with a staging folder to clean

    export_killed_after(second, out, duration * 0.4)  # once more, then a later export leaves nothing behind
    assert [name for name in siblings(out) if ".staging-" in name]
    export_checkpoint(second, out)
    assert siblings(out) == [] and json.loads((out / "export_manifest.json").read_text())["source_checkpoint"] == str(
        second.resolve()
    )


@pytest.mark.parametrize("point", ["after_first_rename", "during_old_removal"])
def test_kill_inside_the_swap_is_recovered(checkpoints, tmp_path: Path, point: str) -> None:
    """Killed between ``out`` → ``out.old-*`` and staging → ``out``: the old export waits complete under
    ``.old-*`` and the next export's recovery puts it back. Killed while deleting the old copy: ``out``
    is the new export and the half-deleted copy (unmarked) is removed."""
    first, second = checkpoints
    out = tmp_path / "export"
    old = previous_export(first, out)
    real_rename, real_rmtree = os.rename, shutil.rmtree

    def run() -> None:
        renames = []

        def rename(src, dst):
            if Path(dst).parent == out.parent:  # the swap's renames, not any a library makes inside staging
                renames.append(dst)
                if point == "after_first_rename" and len(renames) == 2:
                    kill_self()
            real_rename(src, dst)

        def rmtree(path, *args, **kwargs):
            if point == "during_old_removal" and ".old-" in str(path):
                next(p for p in Path(path).rglob("*.safetensors")).unlink()
                kill_self()
            real_rmtree(path, *args, **kwargs)

        os.rename, shutil.rmtree = rename, rmtree
        export_checkpoint(second, out)

    assert in_child(run) == -signal.SIGKILL
    (aside,) = [p for p in out.parent.iterdir() if ".old-" in p.name]
    if point == "after_first_rename":
        assert not out.exists() and files(aside) == old  # readable there until recovered
        assert len(siblings(out)) == 2  # and the unpublished staging folder
        # the next export puts it back first: even one that is then refused leaves it in place
        poisoned = tmp_path / "nan"
        shutil.copytree(first, poisoned)
        poison(poisoned, "proj_out.bias", float("nan"))
        with pytest.raises(NonFiniteWeights, match="proj_out.bias"):
            export_checkpoint(poisoned, out)
        assert files(out) == old
    else:
        assert not (aside / "COMPLETE").exists()
        assert json.loads((out / "export_manifest.json").read_text())["source_checkpoint"] == str(second.resolve())
        export_checkpoint(second, out)
    assert siblings(out) == [] and (out / "COMPLETE").is_file()


def test_recovery_leaves_folders_of_running_exports_alone(tmp_path: Path) -> None:
    out = tmp_path / "export"
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    try:
        live = tmp_path / f"export.staging-{running.pid}-abcd"
        dead = tmp_path / f"export.staging-{finished.pid}-abcd"
        foreign = tmp_path / "export.staging-notes"  # not a name export makes
        for folder in (live, dead, foreign):
            folder.mkdir()
            (folder / "file").write_text("x")
        assert recover_output(out) is None
        assert live.is_dir() and foreign.is_dir() and not dead.exists()
    finally:
        running.kill()
        running.wait()


def test_a_symbolic_link_as_out_is_replaced_and_the_folder_it_names_is_kept(checkpoints, tmp_path: Path) -> None:
    """``--out latest`` with ``latest → v1``: the link becomes the new export, ``v1`` keeps every byte
    (its ``COMPLETE`` marker too); a dangling link is replaced as well. A link moved aside by a kill
    inside the swap is put back as the link it was."""
    first, second = checkpoints
    v1, latest = tmp_path / "v1", tmp_path / "latest"
    kept = previous_export(first, v1)
    latest.symlink_to(v1, target_is_directory=True)
    export_checkpoint(second, latest)
    assert files(v1) == kept and not latest.is_symlink()
    assert json.loads((latest / "export_manifest.json").read_text())["source_checkpoint"] == str(second.resolve())
    assert siblings(latest) == [] and siblings(v1) == []

    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone", target_is_directory=True)
    export_checkpoint(second, dangling)
    assert (dangling / "COMPLETE").is_file() and not dangling.is_symlink() and siblings(dangling) == []

    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    aside = tmp_path / f"moved.old-{finished.pid}-abcd"  # what a kill between the swap's two renames leaves
    aside.symlink_to(v1, target_is_directory=True)
    assert recover_output(tmp_path / "moved") == tmp_path / "moved"
    assert (tmp_path / "moved").resolve() == v1.resolve() and files(v1) == kept


def test_a_moved_aside_export_is_kept_until_out_is_vacant_or_complete(tmp_path: Path) -> None:
    """Killed between the swap's renames, then ``out`` made again before the next export: an empty
    folder gets the previous export back; a folder of other files leaves it aside, complete."""
    from cosmos_sana.checkpoint.layout import write_marker

    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()

    def moved_aside(name: str) -> Path:
        aside = tmp_path / f"{name}.old-{finished.pid}-abcd"
        aside.mkdir()
        (aside / "weights.safetensors").write_bytes(b"previous export")
        write_marker(aside, format="lora")
        return aside

    moved_aside("export")
    before = files(tmp_path / f"export.old-{finished.pid}-abcd")
    (tmp_path / "export").mkdir()  # e.g. a mkdir -p before the next export
    assert recover_output(tmp_path / "export") == tmp_path / "export"
    assert files(tmp_path / "export") == before and siblings(tmp_path / "export") == []

    aside = moved_aside("notes")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    assert recover_output(tmp_path / "notes") is None
    assert files(aside) == before and files(tmp_path / "notes") == {"todo.txt": b"mine"}


def test_an_old_copy_that_cannot_be_deleted_does_not_fail_the_export(checkpoints, tmp_path: Path, monkeypatch, caplog) -> None:
    """The new export is in place once the swap's renames are done: a failure to delete the previous
    copy is a warning naming it, and the next export removes it."""
    from cosmos_sana.export import swap

    first, second = checkpoints
    out = tmp_path / "export"
    previous_export(first, out)
    real_rmtree = shutil.rmtree

    def refuse_old(path, *args, **kwargs):
        if ".old-" in str(path):
            raise PermissionError(13, "Permission denied", str(path))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(swap.shutil, "rmtree", refuse_old)
    assert export_checkpoint(second, out) == out
    (aside,) = [p for p in out.parent.iterdir() if ".old-" in p.name]
    assert f"could not delete the previous export, moved to {aside}" in caplog.text
    assert json.loads((out / "export_manifest.json").read_text())["source_checkpoint"] == str(second.resolve())
    monkeypatch.setattr(swap.shutil, "rmtree", real_rmtree)
    export_checkpoint(first, out)
    assert siblings(out) == []


def test_out_spelled_relative_or_with_dots_is_replaced_in_place(checkpoints, tmp_path: Path, monkeypatch) -> None:
    """``--out .`` inside a previous export, and ``a/../export``: the staging folder goes beside the
    export (a ``.`` has no name to build a sibling's from), and the export is replaced where it is."""
    first, second = checkpoints
    out = tmp_path / "export"
    previous_export(first, out)
    monkeypatch.chdir(out)
    export_checkpoint(second, ".")
    assert json.loads((out / "export_manifest.json").read_text())["source_checkpoint"] == str(second.resolve())
    monkeypatch.chdir(tmp_path)
    export_checkpoint(first, "a/../export/")
    assert json.loads((out / "export_manifest.json").read_text())["source_checkpoint"] == str(first.resolve())
    assert siblings(out) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["export"]


@pytest.fixture
def layout(checkpoints, tmp_path: Path) -> dict[str, Path]:
    """``models/base`` (a previous export, used as the base pipeline) and ``runs/ckpt`` (a checkpoint)."""
    first, _ = checkpoints
    base = tmp_path / "models" / "base"
    export_checkpoint(first, base)
    ckpt = tmp_path / "runs" / "ckpt"
    shutil.copytree(first, ckpt)
    return {"base": base, "checkpoint": ckpt}


@pytest.mark.parametrize(
    ("target", "relation", "place"),
    [
        ("base", "is", lambda p: p),
        ("base", "is inside", lambda p: p / "exports" / "new"),
        ("base", "contains", lambda p: p.parent),
        ("checkpoint", "is", lambda p: p),
        ("checkpoint", "is inside", lambda p: p / "export"),
        ("checkpoint", "contains", lambda p: p.parent.parent),
    ],
)
def test_out_overlapping_the_base_or_checkpoint_is_refused_before_anything_is_touched(
    layout, target: str, relation: str, place, capsys
) -> None:
    before = {name: files(path) for name, path in layout.items()}
    out = place(layout[target])
    args = ["export", str(layout["checkpoint"]), "--out", str(out), "--base", str(layout["base"])]
    assert main(args) == 1
    label = "the base" if target == "base" else "the checkpoint"
    assert f"--out {out}: {relation} {label} {layout[target]}" in capsys.readouterr().err
    assert {name: files(path) for name, path in layout.items()} == before
    assert siblings(out) == []
    if relation == "is inside":
        assert not out.exists()


def test_out_containing_the_native_base_weights_is_refused(tiny_image_pipeline_dir: Path, tmp_path: Path, capsys) -> None:
    from peft import LoraConfig

    from cosmos_sana_plugins.sana.native_checkpoint import save_native

    weights = tmp_path / "weights"
    native = save_native(stock(tiny_image_pipeline_dir), weights / "native.pth")
    transformer = stock(tiny_image_pipeline_dir)
    transformer.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=TARGETS))
    parts = {"model": ModelState(transformer, lora_only=True, base_pipeline=str(tiny_image_pipeline_dir))}
    checkpoint = save_checkpoint(tmp_path / "run", 1, parts, config={"custom": {"model": {"native_checkpoint": str(native)}}})
    data = native.read_bytes()
    assert main(["export", str(checkpoint), "--out", str(weights), "--format", "merged"]) == 1
    assert f"--out {weights}: contains the base weights {native}" in capsys.readouterr().err
    assert native.read_bytes() == data


def test_failing_verify_keeps_the_previous_export(checkpoints, tiny_image_pipeline_dir: Path, tmp_path: Path, capsys) -> None:
    """Finite weights so large that generation overflows: ``--verify`` fails after the export was written."""
    first, _ = checkpoints
    out = tmp_path / "export"
    old = previous_export(first, out)
    huge = full_checkpoint(tiny_image_pipeline_dir, tmp_path / "huge", lambda t: t.proj_out.weight.fill_(3e38))
    assert main(["export", str(huge), "--out", str(out), "--verify", "--verify-size", "64"]) == 2
    assert "verification failed" in capsys.readouterr().err
    assert files(out) == old and siblings(out) == []


@pytest.mark.parametrize(("fmt", "verify"), [("diffusers", []), ("native", []), ("diffusers", ["--verify"])])
def test_non_finite_full_weights_are_refused(
    checkpoints, tmp_path: Path, capsys, fmt: str, verify: list[str]
) -> None:
    """Refused before anything is written or generated, with ``--verify`` or without."""
    first, _ = checkpoints
    out = tmp_path / "export"
    old = previous_export(first, out)
    bad = tmp_path / "bad"
    shutil.copytree(first, bad)
    poison(bad, "caption_norm.weight", float("inf"))
    assert main(["export", str(bad), "--out", str(out), "--format", fmt, *verify, "--verify-size", "64"]) == 1
    assert f"{bad}: weight 'caption_norm.weight' has 1 NaN/inf values of 32; nothing exported" in capsys.readouterr().err
    assert files(out) == old and siblings(out) == []


def test_non_finite_lora_weights_are_refused(tiny_image_pipeline_dir: Path, tmp_path: Path, capsys) -> None:
    checkpoint = lora_checkpoint(tiny_image_pipeline_dir, tmp_path / "run", 0.01)
    key = "transformer_blocks.0.attn2.to_v.lora_B.default.weight"
    poison(checkpoint, key, float("nan"))
    for fmt in ("lora", "merged"):
        out = tmp_path / fmt
        assert main(["export", str(checkpoint), "--out", str(out), "--format", fmt]) == 1
        err = capsys.readouterr().err
        assert f"{checkpoint}: LoRA weight of adapter 'default' '{key}' has 1 NaN/inf values of" in err
        assert not out.exists() and siblings(out) == []


def test_merged_weights_that_overflow_are_refused(tiny_image_pipeline_dir: Path, tmp_path: Path, capsys) -> None:
    """Finite LoRA tensors whose merged result overflows float16: W + (α/r)·B·A with every entry of
    A and B 200 adds 4·200² = 160000 > 65504 to each wrapped weight."""
    checkpoint = lora_checkpoint(tiny_image_pipeline_dir, tmp_path / "run", 200.0)
    out = tmp_path / "merged"
    assert main(["export", str(checkpoint), "--out", str(out), "--format", "merged", "--dtype", "float32"]) == 0
    assert main(["export", str(checkpoint), "--out", str(out), "--format", "merged", "--dtype", "float16"]) == 1
    err = capsys.readouterr().err
    assert f"{checkpoint}: merged weight 'transformer_blocks.0.attn1.to_q.weight' has " in err
    assert json.loads((out / "export_manifest.json").read_text())["format"] == "merged"  # the float32 one stays
    assert siblings(out) == []

"""The offline bundle: planning, manifest, wrappers, ELF closure and the installer (CPU, no network)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from cosmos_sana.tools import wheelhouse as wh
from cosmos_sana.commands import wheelhouse as command

REPO = Path(__file__).resolve().parents[1]
PY_VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"


def make_wheel(
    folder: Path, name: str, version: str, requires: list[str] = (), files: dict[str, str] | None = None
) -> Path:
    """A minimal valid pure-Python wheel."""
    dist = name.replace("-", "_")
    files = dict(files or {f"{dist}/__init__.py": f"__version__ = {version!r}\n"})
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    info = f"{dist}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for arcname, text in files.items():
            archive.writestr(arcname, text)
    return path


# ---------------------------------------------------------------- planning


def test_parse_present_accepts_freeze_list_and_bare_names() -> None:
    text = """
    Package    Version
    ---------- -------
    # comment
    Torch==2.11.0
    huggingface_hub 1.33.0
    peft
    mypkg @ file:///x/mypkg.whl
    """
    assert wh.parse_present(text.splitlines()) == {
        "torch": "2.11.0",
        "huggingface-hub": "1.33.0",
        "peft": None,
        "mypkg": None,
    }


def test_plan_skips_exact_or_unversioned_and_shadows_other_versions() -> None:
    pins = [
        wh.Pin("transformers", "4.57.6"),
        wh.Pin("pydantic", "2.14.4"),
        wh.Pin("toml", "0.10.2"),
        wh.Pin("kernels", "0.12.3", "maybe"),
        wh.Pin("redis", "8.1.0"),
    ]
    present = wh.parse_present(["transformers==5.17.0", "pydantic==2.14.4", "toml"])
    result = wh.plan(pins, present, lean=True)
    assert [p.name for p in result.fetch] == ["transformers", "redis"]
    assert {row["name"]: row["reason"] for row in result.skipped} == {
        "pydantic": "present on node",
        "toml": "present on node",
        "kernels": "lean",
    }
    assert result.shadows == [{"name": "transformers", "node": "5.17.0", "bundled": "4.57.6"}]


def test_default_pins_are_unique_and_none_is_present_on_the_default_image() -> None:
    names = [wh.normalize(p.name) for p in wh.PINS]
    assert len(names) == len(set(names))
    assert not wh.plan(wh.PINS, wh.parse_present(wh.DEFAULT_PRESENT)).skipped
    assert {p.group for p in wh.PINS} == {"core", "maybe", "extra"}


def test_check_pins_fetched_reports_missing_wrong_and_duplicate() -> None:
    pins = [wh.Pin("a-b", "1.0"), wh.Pin("c", "2.0"), wh.Pin("d", "3.0")]
    files = ["a_b-1.0-py3-none-any.whl", "c-2.1-py3-none-any.whl", "e-1-py3-none-any.whl", "e-2-py3-none-any.whl"]
    problems = wh.check_pins_fetched(pins, files)
    assert "no wheel for d==3.0" in problems
    assert "c: wanted 2.0, got ['2.1']" in problems
    assert any(p.startswith("two wheels of e") for p in problems)
    assert not wh.check_pins_fetched(pins[:1], files[:1])


def test_node_requirements_skip_bundled_present_left_out_extras_and_markers(tmp_path: Path) -> None:
    requires = [
        "bundled-b>=1",
        "numpy",
        "av<19",
        "needed-x",
        "tomli>=2; python_version < '3.11'",
        "extra-only; extra == 'dev'",
        "windows-only; sys_platform == 'win32'",
    ]
    wheels = [make_wheel(tmp_path, "a", "1.0", requires), make_wheel(tmp_path, "bundled-b", "2.0")]
    assert wh.node_requirements(wheels, {"numpy": None}, "3.12") == ["needed-x"]
    assert wh.node_requirements(wheels, {"numpy": None}, "3.10") == ["needed-x", "tomli"]


# ---------------------------------------------------------------- wheels


def test_slim_botocore_keeps_code_top_level_data_and_s3(tmp_path: Path) -> None:
    files = {
        "botocore/__init__.py": "",
        "botocore/data/endpoints.json": "{}",
        "botocore/data/s3/2006-03-01/service-2.json.gz": "x" * 100,
        "botocore/data/ec2/2016-11-15/service-2.json.gz": "y" * 5000,
        "botocore/data/s3control/2018-08-20/service-2.json.gz": "z" * 100,
    }
    wheel = make_wheel(tmp_path, "botocore", "1.44.8", files=files)
    assert wh.slim_botocore(wheel, keep=["s3"]) > 0
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        record = archive.read("botocore-1.44.8.dist-info/RECORD").decode()
    assert {
        "botocore/__init__.py",
        "botocore/data/endpoints.json",
        "botocore/data/s3/2006-03-01/service-2.json.gz",
    } <= names
    assert not any("/ec2/" in n or "/s3control/" in n for n in names)
    assert "ec2" not in record and "s3/2006-03-01" in record


# ---------------------------------------------------------------- programs


def test_parse_sonames_reads_ldconfig_output() -> None:
    text = (
        "1234 libs found in cache `/etc/ld.so.cache'\n\tlibxml2.so.2 (libc6,x86-64) => /lib/libxml2.so.2\nlibfoo.so.1\n"
    )
    assert wh.parse_sonames(text.splitlines()) == {"libxml2.so.2", "libfoo.so.1"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF only")
def test_elf_needed_reads_a_real_binary() -> None:
    assert "libc.so.6" in wh.elf_needed(Path(os.path.realpath(shutil.which("sh") or "/bin/sh")))
    with pytest.raises(ValueError):
        wh.elf_needed(Path(__file__))


def test_library_closure_follows_needed_and_stops_at_system(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    graph = {"prog": ["liba.so.1", "libc.so.6"], "liba": ["libb.so.2", "libgone.so.9"], "libb": ["liba.so.1"]}
    monkeypatch.setattr(wh, "elf_needed", lambda path: graph[path.name])
    index = {"liba.so.1": tmp_path / "liba", "libb.so.2": tmp_path / "libb", "libunused.so": tmp_path / "x"}
    carry, missing = wh.library_closure([tmp_path / "prog"], index, {"libc.so.6"})
    assert sorted(carry) == ["liba.so.1", "libb.so.2"] and missing == ["libgone.so.9"]


def test_glibc_needed_takes_the_newest_symbol_version(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"\0GLIBC_2.17\0GLIBC_2.4\0GLIBC_PRIVATE\0")
    (tmp_path / "b").write_bytes(b"\0GLIBC_2.34\0GLIBC_2.2.5\0")
    (tmp_path / "c").write_bytes(b"nothing")
    assert wh.glibc_needed([tmp_path / "a", tmp_path / "b"]) == "2.34"
    assert wh.glibc_needed([tmp_path / "c"]) == ""


def test_library_index_resolves_symlinks(tmp_path: Path) -> None:
    (tmp_path / "usr/lib").mkdir(parents=True)
    real = tmp_path / "usr/lib/libz.so.1.2.13"
    real.write_bytes(b"elf")
    (tmp_path / "usr/lib/libz.so.1").symlink_to("libz.so.1.2.13")
    assert wh.library_index(tmp_path)["libz.so.1"] == real.resolve()


def test_wrapper_scripts_set_libraries_and_defaults(tmp_path: Path) -> None:
    redis = wh.wrapper_script(wh.REDIS, "redis-server")
    assert 'LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"' in redis
    assert 'exec "$root/bin/redis-server" "$@"' in redis and "../redis" in redis and "TESSDATA" not in redis
    tess = wh.wrapper_script(wh.TESSERACT, "tesseract")
    assert ': "${TESSDATA_PREFIX:=$root/share/tessdata}"' in tess
    if shutil.which("shellcheck"):
        for text in (redis, tess):
            (tmp_path / "w.sh").write_text(text)
            subprocess.run(["shellcheck", str(tmp_path / "w.sh")], check=True)


def fake_tool(out: Path, tool: wh.Tool, body: str) -> None:
    """``out/<tool>/bin/<program>`` as a shell script plus its generated wrapper in ``out/bin``."""
    for program in tool.programs:
        target = out / tool.name / "bin" / program
        target.parent.mkdir(parents=True, exist_ok=True)
        (out / tool.name / "lib").mkdir(exist_ok=True)
        target.write_text("#!/bin/sh\n" + body)
        target.chmod(0o755)
        wrapper = out / "bin" / program
        wrapper.parent.mkdir(exist_ok=True)
        wrapper.write_text(wh.wrapper_script(tool, program))
        wrapper.chmod(0o755)


def test_wrapper_runs_the_carried_binary_with_its_env(tmp_path: Path) -> None:
    fake_tool(tmp_path, wh.TESSERACT, 'echo "$LD_LIBRARY_PATH|$TESSDATA_PREFIX|$*"\n')
    env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": "/old"}
    out = subprocess.run(
        [str(tmp_path / "bin/tesseract"), "a", "b"], env=env, capture_output=True, text=True, check=True
    )
    root = (tmp_path / "tesseract").resolve()
    assert out.stdout.strip() == f"{root}/lib:/old|{root}/share/tessdata|a b"


# ---------------------------------------------------------------- manifest and sizes


def test_manifest_records_hashes_and_total_size(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "pydantic", "2.14.4")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/x").write_bytes(b"12345")
    rows = wh.wheel_entries([wheel], {"pydantic": "core"})
    assert rows[0]["name"] == "pydantic" and rows[0]["group"] == "core" and len(rows[0]["sha256"]) == 64
    manifest = wh.write_manifest(tmp_path, {"wheels": rows, "tools": {}})
    assert manifest["total_size"] == wheel.stat().st_size + 5
    assert json.loads((tmp_path / "MANIFEST.json").read_text()) == manifest
    assert wh.describe_sizes(manifest)[-1].startswith("total: ")


def test_project_root_is_the_checkout_that_builds_our_wheel() -> None:
    assert wh.project_root() == Path(__file__).resolve().parents[1]


def test_prepare_out_replaces_a_wheelhouse_but_refuses_other_folders(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(RuntimeError):
        wh.prepare_out(other)
    old = tmp_path / "wh"
    old.mkdir()
    (old / "MANIFEST.json").write_text("{}")
    (old / "stale-1.0-py3-none-any.whl").write_text("")
    wh.prepare_out(old)
    assert old.is_dir() and not any(old.iterdir())


def test_command_builds_a_manifest_from_the_plan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    def fake_download(pins, dest, python_version, platforms):
        assert python_version == "3.12" and platforms == ["manylinux_2_28_x86_64"]
        for pin in pins:
            make_wheel(dest, pin.name, pin.version)

    monkeypatch.setattr(wh, "pip_download", fake_download)
    present = tmp_path / "present.txt"
    present.write_text("toml==0.10.2\ntransformers==5.17.0\n")
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(
        [
            "--out",
            str(tmp_path / "wh"),
            "--platform",
            "manylinux_2_28_x86_64",
            "--skip-present",
            str(present),
            "--no-project",
            "--lean",
        ]
    )
    assert command.run(args) == 0
    manifest = json.loads((tmp_path / "wh/MANIFEST.json").read_text())
    names = {row["name"] for row in manifest["wheels"]}
    assert "cosmos-rl" in names and "toml" not in names and "kernels" not in names
    assert manifest["shadows"] == [{"name": "transformers", "node": "5.17.0", "bundled": "4.57.6"}]
    assert manifest["total_size"] == sum(row["size"] for row in manifest["wheels"])
    assert "total:" in capsys.readouterr().out


# ---------------------------------------------------------------- installer


def fake_wheelhouse(root: Path) -> Path:
    """A wheelhouse for this interpreter: one wheel with a .pth hook, redis packed, tesseract unpacked."""
    out = root / "wh"
    out.mkdir()
    wheel = make_wheel(
        out,
        "fakemod",
        "1.0",
        files={
            "fakemod/__init__.py": "",
            "fakemod_hook.pth": "import os; os.environ['FAKEMOD_PTH'] = '1'\n",
        },
    )
    fake_tool(out, wh.REDIS, 'echo "Redis server v=0.0 fake"\n')
    fake_tool(out, wh.TESSERACT, 'echo "tesseract 0.0 fake"\n')
    with tarfile.open(out / "redis.tar.xz", "w:xz") as tar:
        tar.add(out / "redis", arcname="redis")
    shutil.rmtree(out / "redis")
    wh.write_manifest(
        out,
        {
            "python_version": PY_VERSION,
            "wheels": wh.wheel_entries([wheel], {}),
            "node_requirements": [],
            "tools": {"redis": {}, "tesseract": {}},
        },
    )
    return out


def run_installer(folder: Path, site: Path, imports: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "CHECK_IMPORTS": imports}
    env.pop("PYTHONPATH", None)
    script = REPO / "launchers/install_offline.sh"
    return subprocess.run(["bash", str(script), str(folder), str(site)], env=env, capture_output=True, text=True)


def test_install_offline_installs_links_and_writes_env(tmp_path: Path) -> None:
    folder, site = fake_wheelhouse(tmp_path), tmp_path / "site"
    done = run_installer(folder, site, "fakemod")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "Redis server v=0.0 fake" in done.stdout and "tesseract 0.0 fake" in done.stdout
    assert (site / "tools/redis/bin/redis-server").is_file() and (site / "tools/tesseract").is_symlink()
    probe = (
        f". {site}/env.sh && command -v redis-server && "
        f"{sys.executable} -c \"import os, fakemod; print(fakemod.__file__, os.environ.get('FAKEMOD_PTH'))\""
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == str(site.resolve() / "tools/bin/redis-server")
    assert out[1].startswith(str(site.resolve())) and out[2] == "1"  # SITE first; its .pth ran
    assert not (folder / "redis").exists()  # the wheelhouse is only read


def test_install_offline_fails_clearly(tmp_path: Path) -> None:
    folder = fake_wheelhouse(tmp_path)
    done = run_installer(folder, tmp_path / "site", "no_such_module_xyz")
    assert done.returncode != 0 and "import check failed" in done.stderr
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    (folder / "MANIFEST.json").write_text(json.dumps({**manifest, "python_version": "2.7"}))
    done = run_installer(folder, tmp_path / "site2", "fakemod")
    assert done.returncode != 0 and "wheelhouse is for Python 2.7" in done.stderr
    tools = {"redis": {}, "tesseract": {"min_glibc": "9.99"}}
    (folder / "MANIFEST.json").write_text(json.dumps({**manifest, "tools": tools}))
    done = run_installer(folder, tmp_path / "site3", "fakemod")
    assert done.returncode != 0 and "tesseract needs glibc >= 9.99" in done.stderr
    assert run_installer(tmp_path, tmp_path / "s", "x").returncode != 0  # no MANIFEST.json

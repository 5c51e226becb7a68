"""Offline bundle ("wheelhouse") for air-gapped GPU nodes.

Built on a connected machine by ``cosmos-sana wheelhouse``, installed on the node by
``launchers/install_offline.sh``. A wheelhouse folder holds:

* ``*.whl``: our own wheel plus pinned wheels for what a CUDA/PyTorch image lacks
  (``--no-deps`` installs: the pins are the resolved set, nothing is resolved later);
* ``<tool>/`` (or ``<tool>.tar.xz`` with ``pack``): a program from Debian 12 packages,
  pruned to its binaries, data and the shared libraries it needs (ELF ``DT_NEEDED``
  closure) that are not in :data:`SYSTEM_SONAMES`;
* ``bin/<program>``: a wrapper that puts ``<tool>/lib`` on ``LD_LIBRARY_PATH``;
* ``MANIFEST.json``: names, versions, sha256 and sizes (no paths of this machine, no secrets).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import stat
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = 1
MIB = 1 << 20


@dataclass(frozen=True)
class Pin:
    """One wheel: ``group`` is ``core``, ``maybe`` (dropped by ``lean``) or ``extra``."""

    name: str
    version: str
    group: str = "core"


#: cosmos-rl 0.4.7's resolved needs that a CUDA image lacks (verified on the GPU node).
CORE = [
    Pin(name, version)
    for name, version in [
        ("cosmos-rl", "0.4.7"),
        ("transformers", "4.57.6"),
        ("huggingface-hub", "0.36.2"),
        ("tokenizers", "0.22.2"),
        ("diffusers", "0.39.0"),
        ("pydantic", "2.14.4"),
        ("pydantic-core", "2.50.5"),
        ("annotated-types", "0.8.0"),
        ("typing-inspection", "0.4.5"),
        ("fastapi", "0.165.0"),
        ("starlette", "1.10.0"),
        ("uvicorn", "0.54.0"),
        ("opentelemetry-api", "1.45.2"),
        ("datasets", "5.0.1"),
        ("dill", "0.4.1"),
        ("multiprocess", "0.70.19"),
        ("math-verify", "0.9.0"),
        ("latex2sympy2-extended", "1.11.0"),
        ("antlr4-python3-runtime", "4.13.2"),
        ("boto3", "1.44.8"),
        ("botocore", "1.44.8"),
        ("s3transfer", "0.19.3"),
        ("jmespath", "1.1.0"),
        ("torchao", "0.18.0"),
        ("pyzmq", "27.3.0"),
        ("redis", "8.1.0"),
        ("qwen-vl-utils", "0.0.14"),
        ("toml", "0.10.2"),
        ("strenum", "0.5.0"),
    ]
]
#: Imports worked without these in a CPU check; a GPU launch was only tried with them.
MAYBE = [
    Pin(name, version, "maybe")
    for name, version in [
        ("tensordict", "0.7.2"),
        ("orjson", "3.13.0"),
        ("blobfile", "3.3.0"),
        ("pycryptodomex", "3.24.2"),
        ("nest-asyncio", "1.6.0"),
        ("liger-kernel", "0.8.5"),
        ("kernels", "0.12.3"),
    ]
]
#: cosmos-sana's own runtime needs the image lacks: OCR reward, reward-server forms, TOML writing.
EXTRAS = [
    Pin("pytesseract", "0.3.13", "extra"),
    Pin("python-multipart", "0.0.34", "extra"),
    Pin("tomli-w", "1.2.0", "extra"),
]
PINS = CORE + MAYBE + EXTRAS

#: Declared requirements we do not carry, and why (reported, never an error).
LEFT_OUT = {
    "av": "video datasets (SFT) only: ~33 MiB for cp312, over the transfer budget; rollout videos are logged as GIF without it",
    "wandb": "optional; cosmos-rl only warns without it",
    "modelscope": "not imported on the training path",
    "pynvml": "not imported on the training path (nvidia-ml-py serves)",
    "nvidia-nccl-cu12": "torch's own NCCL is used",
    "zmq": "empty stub package; pyzmq provides zmq",
    "pybind11": "build-time only",
    "open-clip-torch": "needs weights an air-gapped node does not have",
    "importlib-metadata": "diffusers declares it but uses the standard library's on Python >= 3.8",
}

#: What the NVIDIA GPU image this was built for already ships; names without a version match any version.
DEFAULT_PRESENT = (
    "torch==2.11.0 torchvision==0.26.0 peft safetensors accelerate numpy pillow pyyaml rich tqdm "
    "opencv-python-headless imageio pluggy"
).split()

DEFAULT_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]

#: botocore service models kept by :func:`slim_botocore` (cosmos-rl only talks to S3).
BOTOCORE_SERVICES = ("s3", "sts", "sso", "sso-oidc")


def normalize(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------- planning (pure logic)


def parse_present(lines: Iterable[str]) -> dict[str, str | None]:
    """Packages a node has, from ``pip freeze`` / ``pip list`` output or bare names.

    Returns normalised name → version (``None`` = any version).
    """
    present: dict[str, str | None] = {}
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith(("-", "Package ")):
            continue
        if "==" in line:
            name, version = (part.strip() for part in line.split("==", 1))
        elif " @ " in line:
            name, version = line.split(" @ ", 1)[0].strip(), None
        else:
            parts = line.split()
            name, version = parts[0], (parts[1] if len(parts) > 1 else None)
        present[normalize(name)] = version
    return present


@dataclass
class Plan:
    """Which pins to fetch and which the node already has."""

    fetch: list[Pin] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    shadows: list[dict[str, str]] = field(default_factory=list)


def plan(pins: Iterable[Pin], present: dict[str, str | None], lean: bool = False) -> Plan:
    """Skip a pin when the node has that exact version, or lists the name without one.

    A different version on the node is kept and recorded as shadowed (SITE comes first
    on ``PYTHONPATH``), e.g. the image's transformers 5.x.
    """
    result = Plan()
    for pin in pins:
        if lean and pin.group == "maybe":
            result.skipped.append({"name": pin.name, "version": pin.version, "reason": "lean"})
            continue
        key = normalize(pin.name)
        if key in present and present[key] in (None, pin.version):
            result.skipped.append({"name": pin.name, "version": pin.version, "reason": "present on node"})
            continue
        if key in present:
            result.shadows.append({"name": pin.name, "node": str(present[key]), "bundled": pin.version})
        result.fetch.append(pin)
    return result


def wheel_name_version(filename: str) -> tuple[str, str]:
    """``foo_bar-1.2-py3-none-any.whl`` → (``foo-bar``, ``1.2``)."""
    parts = Path(filename).name.split("-")
    return normalize(parts[0]), parts[1]


def check_pins_fetched(pins: Iterable[Pin], wheel_files: Iterable[str]) -> list[str]:
    """Problems: a pin with no wheel, a wheel at another version, or two wheels of one name."""
    found: dict[str, list[str]] = {}
    for filename in wheel_files:
        name, version = wheel_name_version(filename)
        found.setdefault(name, []).append(version)
    problems = [f"two wheels of {name}: {versions}" for name, versions in found.items() if len(versions) > 1]
    for pin in pins:
        versions = found.get(normalize(pin.name), [])
        if not versions:
            problems.append(f"no wheel for {pin.name}=={pin.version}")
        elif pin.version not in versions:
            problems.append(f"{pin.name}: wanted {pin.version}, got {versions}")
    return problems


def wheel_requirements(path: Path) -> list[str]:
    """``Requires-Dist`` lines of a wheel's METADATA."""
    with zipfile.ZipFile(path) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode("utf-8", "replace")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def node_requirements(wheels: Iterable[Path], present: dict[str, str | None], python_version: str) -> list[str]:
    """Names the bundled wheels require (no extras, markers for Linux + ``python_version``)
    that are neither bundled, nor listed present, nor in :data:`LEFT_OUT`: the node must have them."""
    from packaging.requirements import Requirement

    wheels = list(wheels)
    env = {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    bundled = {wheel_name_version(w.name)[0] for w in wheels}
    needed: set[str] = set()
    for wheel in wheels:
        for line in wheel_requirements(wheel):
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = normalize(req.name)
            if name not in bundled and name not in present and name not in LEFT_OUT:
                needed.add(name)
    return sorted(needed)


# ---------------------------------------------------------------- wheels


def pip_download(pins: Iterable[Pin], dest: Path, python_version: str, platforms: Iterable[str]) -> None:
    """``pip download --no-deps --only-binary=:all:`` for one target interpreter."""
    cmd = [sys.executable, "-m", "pip", "download", "-qq", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "cp", "-d", str(dest)]
    for platform in platforms:
        cmd += ["--platform", platform]
    subprocess.run(cmd + [f"{p.name}=={p.version}" for p in pins], check=True)


def build_own_wheel(project: Path, dest: Path) -> Path:
    """Build this project's wheel (pip's isolated build, so hatchling comes from PyPI)."""
    before = set(dest.glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(project)], check=True)
    (built,) = set(dest.glob("*.whl")) - before
    return built


def slim_botocore(wheel: Path, keep: Iterable[str] = BOTOCORE_SERVICES) -> int:
    """Drop botocore service models except ``keep`` (rewrites the wheel and its RECORD).

    Returns the bytes saved. Clients for the kept services work as before.
    """
    keep_dirs = tuple(f"botocore/data/{service}/" for service in keep)

    def wanted(name: str) -> bool:
        if not name.startswith("botocore/data/"):
            return True
        rest = name[len("botocore/data/") :]
        return "/" not in rest or name.startswith(keep_dirs)

    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if not wanted(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines()
                data = ("\n".join(r for r in rows if wanted(r.split(",", 1)[0])) + "\n").encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(wheel)
    return before - wheel.stat().st_size


# ---------------------------------------------------------------- programs from Debian packages


@dataclass(frozen=True)
class Tool:
    """A program carried from Debian 12 packages."""

    name: str
    packages: tuple[str, ...]
    programs: dict[str, str]  # wrapper name → path in the unpacked packages
    data: dict[str, str] = field(default_factory=dict)  # dest in the tool folder → path in the packages
    env: dict[str, str] = field(default_factory=dict)  # default env (relative to the tool folder)


REDIS = Tool(
    "redis",
    ("redis-server", "redis-tools", "libjemalloc2", "liblzf1", "libatomic1"),
    {"redis-server": "usr/bin/redis-server", "redis-cli": "usr/bin/redis-cli"},
)
TESSERACT = Tool(
    "tesseract",
    (
        "tesseract-ocr",
        "tesseract-ocr-eng",
        "libtesseract5",
        "liblept5",
        "libarchive13",
        "libcurl4",
        "libxml2",
        "libicu72",
        "libgif7",
        "libjpeg62-turbo",
        "libopenjp2-7",
        "libpng16-16",
        "libtiff6",
        "libwebp7",
        "libwebpmux3",
        "libdeflate0",
        "libjbig0",
        "liblerc4",
        "libgomp1",
        "libnghttp2-14",
        "librtmp1",
        "libssh2-1",
        "libpsl5",
        "libldap-2.5-0",
        "libgssapi-krb5-2",
        "libkrb5-3",
        "libk5crypto3",
        "libkrb5support0",
        "libkeyutils1",
        "libsasl2-2",
        "libbrotli1",
        "libgnutls30",
        "libnettle8",
        "libhogweed6",
        "libunistring2",
        "libidn2-0",
        "libp11-kit0",
        "libtasn1-6",
        "libffi8",
        "libgmp10",
        "libacl1",
        "liblz4-1",
    ),
    {"tesseract": "usr/bin/tesseract"},
    {"share/tessdata": "usr/share/tesseract-ocr/5/tessdata"},
    {"TESSDATA_PREFIX": "share/tessdata"},
)
TOOLS = {tool.name: tool for tool in (REDIS, TESSERACT)}

#: Libraries every glibc node with OpenSSL 3 and systemd has; never carried.
SYSTEM_SONAMES = frozenset(
    (
        "ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 "
        "libstdc++.so.6 libgcc_s.so.1 libz.so.1 liblzma.so.5 libzstd.so.1 libbz2.so.1.0 libcom_err.so.2 "
        "libssl.so.3 libcrypto.so.3 libsystemd.so.0"
    ).split()
)


def parse_sonames(lines: Iterable[str]) -> set[str]:
    """Sonames from ``ldconfig -p`` output or one name per line."""
    names = set()
    for line in lines:
        token = line.strip().split(" ", 1)[0]
        if ".so" in token:
            names.add(token)
    return names


def elf_needed(path: Path) -> list[str]:
    """``DT_NEEDED`` entries of a 64-bit little-endian ELF file (what ``readelf -d`` lists)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path.name}: not a 64-bit little-endian ELF file")
    phoff, (phentsize, phnum) = struct.unpack_from("<Q", data, 0x20)[0], struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for index in range(phnum):
        p_type, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + index * phentsize)
        if p_type == 1:  # PT_LOAD
            loads.append((vaddr, offset, filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (offset, filesz)
    if dynamic is None:
        return []
    needed, strtab = [], None
    for pos in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, pos)
        if tag == 0:
            break
        if tag == 1:
            needed.append(value)
        elif tag == 5:
            strtab = next(off + value - va for va, off, size in loads if va <= value < va + size)
    if strtab is None:
        return []
    return [data[strtab + n : data.index(b"\0", strtab + n)].decode() for n in needed]


def glibc_needed(paths: Iterable[Path]) -> str:
    """Newest ``GLIBC_2.N`` symbol version the files reference (their minimum glibc), or ``""``."""
    found = {m.decode() for path in paths for m in re.findall(rb"GLIBC_(2\.[0-9]+)\b", path.read_bytes())}
    return max(found, key=lambda v: tuple(map(int, v.split("."))), default="")


def library_index(root: Path) -> dict[str, Path]:
    """soname → real file, for every ``*.so*`` under ``root`` (symlinks resolved)."""
    index = {}
    for path in sorted(root.rglob("*.so*")):
        real = path.resolve()
        if real.is_file() and real.is_relative_to(root.resolve()):
            index.setdefault(path.name, real)
    return index


def library_closure(
    programs: Iterable[Path], index: dict[str, Path], system: set[str]
) -> tuple[dict[str, Path], list[str]]:
    """Libraries to carry for ``programs`` and sonames found nowhere (neither carried nor system)."""
    carry: dict[str, Path] = {}
    missing: list[str] = []
    todo = [name for program in programs for name in elf_needed(program)]
    while todo:
        name = todo.pop()
        if name in carry or name in system or name in missing:
            continue
        if name not in index:
            missing.append(name)
            continue
        carry[name] = index[name]
        todo += elf_needed(index[name])
    return carry, sorted(missing)


def wrapper_script(tool: Tool, program: str) -> str:
    """``bin/<program>``: run the carried binary with its libraries (and env defaults)."""
    lines = [
        "#!/bin/sh",
        f"# {program} from a cosmos-sana wheelhouse ({tool.name}: Debian 12 build). Generated.",
        'here=$(dirname -- "$(readlink -f -- "$0")")',
        f'root=$(cd -- "$here/../{tool.name}" && pwd) || exit 127',
        'LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"',
        "export LD_LIBRARY_PATH",
    ]
    for key, rel in tool.env.items():
        lines += [f': "${{{key}:=$root/{rel}}}"', f"export {key}"]
    lines.append(f'exec "$root/bin/{program}" "$@"')
    return "\n".join(lines) + "\n"


def run_checked(cmd: list[str], cwd: Path | None = None) -> str:
    """Run a command; on failure raise with its stderr."""
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-800:]}")
    return done.stdout


def fetch_debs(packages: Iterable[str], dest: Path) -> list[dict[str, str | int]]:
    """``apt-get download`` into ``dest``; returns package, version, file, sha256, size per .deb."""
    packages = list(packages)
    try:
        run_checked(["apt-get", "download", *packages], cwd=dest)
    except (OSError, RuntimeError) as exc:
        raise RuntimeError(f"{exc}\nNeeds Debian 12 (bookworm) apt sources; run 'apt-get update' first.") from exc
    debs = []
    for deb in sorted(dest.glob("*.deb")):
        name, version = run_checked(["dpkg-deb", "--show", "--showformat=${Package}\t${Version}", str(deb)]).split("\t")
        debs.append(
            {"package": name, "version": version, "file": deb.name, "sha256": sha256(deb), "size": deb.stat().st_size}
        )
    return debs


def build_tool(tool: Tool, out: Path, system: set[str], pack: bool = False) -> dict:
    """Fetch, unpack (``dpkg -x``) and prune ``tool`` into ``out/<name>``; write its wrappers."""
    with tempfile.TemporaryDirectory(prefix=f"wheelhouse-{tool.name}-") as tmp:
        debs_dir, tree = Path(tmp, "debs"), Path(tmp, "tree")
        debs_dir.mkdir()
        debs = fetch_debs(tool.packages, debs_dir)
        for deb in debs:
            run_checked(["dpkg", "-x", str(debs_dir / str(deb["file"])), str(tree)])
        programs = {name: (tree / rel).resolve() for name, rel in tool.programs.items()}
        carry, missing = library_closure(programs.values(), library_index(tree), system)
        if missing:
            raise RuntimeError(f"{tool.name}: no package provides {missing}; add it to the Tool's packages")
        dest = out / tool.name
        shutil.rmtree(dest, ignore_errors=True)
        (dest / "bin").mkdir(parents=True)
        (dest / "lib").mkdir()
        for name, src in programs.items():
            shutil.copy2(src, dest / "bin" / name)
        for soname, src in carry.items():
            shutil.copy2(src, dest / "lib" / soname)
        for rel, src_rel in tool.data.items():
            shutil.copytree(tree / src_rel, dest / rel, symlinks=False)
    (out / "bin").mkdir(exist_ok=True)
    for program in tool.programs:
        wrapper = out / "bin" / program
        wrapper.write_text(wrapper_script(tool, program))
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    files = [
        {"path": str(p.relative_to(out)), "size": p.stat().st_size, "sha256": sha256(p)}
        for p in sorted(dest.rglob("*"))
        if p.is_file()
    ]
    entry = {
        "debs": debs,
        "programs": sorted(tool.programs),
        "libraries": sorted(carry),
        "min_glibc": glibc_needed([dest / "bin" / p for p in tool.programs] + [dest / "lib" / n for n in carry]),
        "files": files,
        "unpacked_size": sum(int(f["size"]) for f in files),
    }
    if pack:
        archive = out / f"{tool.name}.tar.xz"
        with tarfile.open(archive, "w:xz") as tar:
            tar.add(dest, arcname=tool.name)
        shutil.rmtree(dest)
        entry["archive"] = {"path": archive.name, "size": archive.stat().st_size, "sha256": sha256(archive)}
    return entry


# ---------------------------------------------------------------- manifest and sizes


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_size(root: Path) -> int:
    """Bytes of all regular files under ``root`` (what a copy of the folder carries)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def wheel_entries(wheels: Iterable[Path], groups: dict[str, str]) -> list[dict]:
    """Manifest rows for wheels; ``groups`` maps normalised name → pin group."""
    rows = []
    for wheel in sorted(wheels):
        name, version = wheel_name_version(wheel.name)
        rows.append(
            {
                "file": wheel.name,
                "name": name,
                "version": version,
                "group": groups.get(name, "project"),
                "sha256": sha256(wheel),
                "size": wheel.stat().st_size,
            }
        )
    return rows


def write_manifest(out: Path, manifest: dict) -> dict:
    """Write ``out/MANIFEST.json`` with the folder's total size (the manifest itself excluded)."""
    manifest = {"format": FORMAT, **manifest, "total_size": folder_size(out)}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def prepare_out(out: Path) -> None:
    """Empty ``out`` if it is a previous wheelhouse (or empty); refuse any other folder."""
    if out.exists() and any(out.iterdir()):
        if not (out / "MANIFEST.json").exists():
            raise RuntimeError(f"{out} is not empty and holds no MANIFEST.json; pick another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def project_root() -> Path | None:
    """The source checkout this module runs from, if any (needed to build our own wheel)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def os_codename() -> str:
    """``VERSION_CODENAME`` of this machine (``bookworm`` expected for the Debian tools)."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return ""
    match = re.search(r"^VERSION_CODENAME=\"?([^\"\n]*)", text, re.M)
    return match.group(1) if match else ""


def describe_sizes(manifest: dict) -> list[str]:
    """Human lines: size per group of wheels, per tool, and the total."""
    groups: dict[str, int] = {}
    for row in manifest["wheels"]:
        groups[row["group"]] = groups.get(row["group"], 0) + row["size"]
    lines = [f"wheels[{g}]: {n / MIB:.1f} MiB" for g, n in sorted(groups.items())]
    for name, tool in manifest.get("tools", {}).items():
        packed = f", packed {tool['archive']['size'] / MIB:.1f} MiB" if "archive" in tool else ""
        lines.append(f"{name}: {tool['unpacked_size'] / MIB:.1f} MiB{packed} ({len(tool['libraries'])} libraries)")
    lines.append(f"total: {manifest['total_size'] / MIB:.1f} MiB")
    return lines

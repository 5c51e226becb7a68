"""Find samples in the supported on-disk layouts, without decoding any media.

* ``folder``: ``NAME.{png,jpg,jpeg,webp,mp4}`` with a ``NAME.txt`` (first line = caption, "flat")
  or ``NAME.json`` (``{"prompt": ...}``, cosmos-rl's ``NNNN.json``, "cosmos") beside it; searched
  recursively; ``.zip`` archives found there are read as the ``zip`` layout.
* ``sana_meta``: SANA's ``meta_data.json`` (``{"img_names": [...]}``) lists the samples of a folder.
* ``jsonl``: a manifest, one ``{"media": path relative to the manifest, "caption": ..., ...}`` a line.
* ``imagefolder``: Hugging Face's imagefolder (diffusers' training convention): a folder whose
  ``metadata.jsonl`` holds one ``{"file_name": path relative to the folder, "text": caption, ...}`` a line.
* ``zip``: SANA-Video's archives of ``KEY.mp4`` + ``KEY.json`` (``height``, ``width``, ``prompt``).

Order is sorted by path, so it is the same on every machine. Captions are read lazily
(:func:`read_caption`) so indexing a large folder opens no sidecar.
"""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Literal

from cosmos_sana_plugins.datasets.errors import BadSampleError, BadSamplePolicy, DatasetError, json_object

Modality = Literal["image", "video"]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
VIDEO_SUFFIXES = (".mp4",)
SIDECAR_SUFFIXES = (".txt", ".json")
META_FILE = "meta_data.json"
HF_METADATA_FILE = "metadata.jsonl"


def modality_of(name: str) -> Modality | None:
    suffix = PurePosixPath(name).suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in VIDEO_SUFFIXES:
        return "video"
    return None


#: open archives, most recently used last; bounded so a folder of many zips stays under ``ulimit -n``
_ARCHIVES: OrderedDict[tuple[str, int, int], zipfile.ZipFile] = OrderedDict()
_ARCHIVES_LOCK = threading.Lock()
MAX_OPEN_ARCHIVES = 32


def _forget_archives() -> None:  # a forked DataLoader worker opens its own handles
    global _ARCHIVES_LOCK
    _ARCHIVES_LOCK = threading.Lock()
    _ARCHIVES.clear()


os.register_at_fork(after_in_child=_forget_archives)


def read_member(path: Path, member: str) -> bytes:
    """``member`` of the zip at ``path``; the archive's index is read once per file version
    (an epoch over its members was O(members²)), at most :data:`MAX_OPEN_ARCHIVES` stay open."""
    stat = os.stat(path)
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _ARCHIVES_LOCK:  # zipfile's shared handle is not safe for concurrent readers: read under the lock
        archive = _ARCHIVES.get(key)
        if archive is None:
            for old in [k for k in _ARCHIVES if k[0] == key[0]]:  # the file was replaced
                _ARCHIVES.pop(old).close()
            archive = _ARCHIVES[key] = zipfile.ZipFile(path)
            while len(_ARCHIVES) > MAX_OPEN_ARCHIVES:
                _ARCHIVES.popitem(last=False)[1].close()
        _ARCHIVES.move_to_end(key)
        return archive.read(member)


@dataclass(frozen=True)
class MediaSource:
    """A file on disk, or a ``member`` of the zip archive at ``path``."""

    path: Path
    member: str | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.member}" if self.member else str(self.path)

    @property
    def name(self) -> str:
        return PurePosixPath(self.member).name if self.member else self.path.name

    def read_bytes(self) -> bytes:
        if self.member is None:
            return self.path.read_bytes()
        return read_member(self.path, self.member)

    def open(self) -> BinaryIO:
        """A seekable binary stream (zip members are read into memory)."""
        if self.member is None:
            return open(self.path, "rb")
        return io.BytesIO(self.read_bytes())

    def stamp(self) -> tuple[str, str | None, int, int]:
        """Identity of the current file content (path, member, size, mtime) for memoised hashes."""
        stat = os.stat(self.path)
        return str(self.path), self.member, stat.st_size, stat.st_mtime_ns


@dataclass(frozen=True)
class SampleRef:
    """One sample: its media, where its caption comes from, and the layout it was found in."""

    key: str
    media: MediaSource
    modality: Modality
    layout: str
    caption: str | None = None
    sidecar: MediaSource | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)


def read_caption(ref: SampleRef) -> tuple[str, dict[str, Any]]:
    """The caption and extra fields of ``ref``; a missing/empty/ill-typed caption is a :class:`BadSampleError`."""
    if ref.caption is not None:
        return ref.caption, dict(ref.extra)
    if ref.sidecar is None:
        raise BadSampleError(ref.media, "no caption")
    try:
        text = ref.sidecar.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadSampleError(ref.sidecar, f"caption is not UTF-8 ({exc.reason})") from exc
    except (OSError, KeyError) as exc:
        raise BadSampleError(ref.sidecar, f"cannot read caption ({exc})") from exc
    if ref.sidecar.name.lower().endswith(".txt"):
        caption = text.splitlines()[0].strip() if text.strip() else ""
        if not caption:
            raise BadSampleError(ref.sidecar, "empty caption (first line is blank)")
        return caption, dict(ref.extra)
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadSampleError(ref.sidecar, f"invalid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(record, dict):
        raise BadSampleError(ref.sidecar, f"expected a JSON object, got {type(record).__name__}")
    caption = _string_field(record, "prompt", str(ref.sidecar))
    extra = {k: v for k, v in record.items() if k != "prompt"}
    return caption, {**ref.extra, **extra}


def _string_field(record: dict[str, Any], key: str, where: str) -> str:
    if key not in record:
        raise BadSampleError(where, f"missing {key!r}")
    value = record[key]
    if not isinstance(value, str):
        raise BadSampleError(where, f"{key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise BadSampleError(where, f"empty {key!r}")
    return value.strip()


def relative_inside(root: Path, relative: str, where: str) -> Path:
    """``root / relative``, refusing absolute paths and any ``..`` that could leave ``root``."""
    posix = PurePosixPath(relative.replace("\\", "/"))
    if not relative or posix.is_absolute() or ".." in posix.parts:
        raise BadSampleError(where, f"path {relative!r} escapes the dataset root {root}")
    return root.joinpath(*posix.parts)


def detect_layout(path: Path) -> str:
    """The layout ``auto`` resolves to for ``path``."""
    if not path.exists():
        raise DatasetError(f"{path}: no such file or directory")
    if path.is_dir():
        if (path / META_FILE).is_file():
            return "sana_meta"
        return "imagefolder" if (path / HF_METADATA_FILE).is_file() else "folder"
    suffix = path.suffix.lower()
    if path.name == HF_METADATA_FILE:
        return "imagefolder"
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".zip":
        return "zip"
    raise DatasetError(f"{path}: not a dataset folder, .jsonl manifest or .zip archive")


def outside_root(ref: SampleRef, root: Path, named: Path) -> BadSampleError | None:
    """An error naming the file of ``ref`` (media, caption, or the archive holding them) that
    resolves, through symbolic links, outside the real path ``root``; None when all are inside.
    ``named`` (the real path of the archive the dataset names) is always allowed."""
    for source in (ref.media, ref.sidecar):
        if source is None:
            continue
        real = source.path.resolve()
        if real != named and not real.is_relative_to(root):
            return BadSampleError(source.path, f"resolves to {real}, outside the dataset root {root} "
                                  "(a symbolic link); set args.allow_outside_root = true to read it")
    return None


def discover(
    path: Path, layout: str, modalities: tuple[Modality, ...], policy: BadSamplePolicy, *,
    allow_outside_root: bool = False,
) -> tuple[list[SampleRef], int]:
    """Samples of ``modalities`` under ``path`` and the number of candidates looked at.

    Bad candidates go to ``policy`` (raise under "fail", recorded under "skip"). A sample whose
    files lead outside the dataset (the folder, or the folder of a manifest or archive) through
    symbolic links is bad unless ``allow_outside_root``.
    """
    resolved = detect_layout(path) if layout == "auto" else layout
    if not path.exists():
        raise DatasetError(f"{path}: no such file or directory")
    def folder(root: Path, modalities: tuple[Modality, ...]) -> Iterator[SampleRef | BadSampleError]:
        return _folder(root, modalities, allow_outside_root=allow_outside_root)

    finders = {"folder": folder, "sana_meta": _sana_meta, "jsonl": _jsonl, "imagefolder": _imagefolder, "zip": _zip}
    if resolved not in finders:
        raise DatasetError(f"{path}: unknown layout {resolved!r} (one of {sorted(finders)})")
    named = path.resolve()  # a manifest's samples are relative to the folder it is named in, link or not
    root = named if named.is_dir() else path.absolute().parent.resolve()
    refs: list[SampleRef] = []
    candidates = 0
    for item in finders[resolved](path, modalities):
        candidates += 1
        if not isinstance(item, BadSampleError) and not allow_outside_root:
            item = outside_root(item, root, named) or item
        if isinstance(item, BadSampleError):
            policy.handle(item)
        else:
            refs.append(item)
    return refs, candidates


def _folder(
    root: Path, modalities: tuple[Modality, ...], *, allow_outside_root: bool = False
) -> Iterator[SampleRef | BadSampleError]:
    if not root.is_dir():
        raise DatasetError(f"{root}: layout 'folder' needs a directory")
    found, outside = _files_under(root, allow_outside_root)
    for link in outside:
        if not _hidden(link.relative_to(root)):
            yield BadSampleError(link, f"resolves to {link.resolve()}, outside the dataset root {root.resolve()} "
                                 "(a symbolic link to a folder); set args.allow_outside_root = true to read it")
    files = sorted(p for p in found if not _hidden(p.relative_to(root)))
    stems: dict[Path, list[Path]] = {}
    for file in files:
        stems.setdefault(file.with_suffix(""), []).append(file)
    for stem, group in sorted(stems.items()):
        media = [f for f in group if modality_of(f.name) is not None]
        sidecars = {f.suffix.lower(): f for f in group if f.suffix.lower() in SIDECAR_SUFFIXES}
        for file in media:
            if modality_of(file.name) not in modalities:
                continue
            yield _with_sidecar(root, file, sidecars)
        if not media and sidecars and stem != root / "meta_data":
            sidecar = sidecars.get(".txt") or sidecars[".json"]
            yield BadSampleError(sidecar, "caption without a media file beside it "
                                 f"(looked for {', '.join(IMAGE_SUFFIXES + VIDEO_SUFFIXES)})")
        for archive in (f for f in group if f.suffix.lower() == ".zip"):
            yield from _zip(archive, modalities)


def _files_under(root: Path, allow_outside_root: bool) -> tuple[list[Path], list[Path]]:
    """Every file below ``root``, entering linked folders too (each real folder once, so a link
    cycle ends), and the linked folders not entered because they lead outside ``root`` (unless
    ``allow_outside_root``: a link to a large tree is not listed only to refuse its files);
    :func:`discover` then refuses files that resolve outside the dataset."""
    top = Path(os.path.realpath(root))
    seen: set[str] = set()
    files: list[Path] = []
    outside: list[Path] = []
    for folder, subfolders, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders.clear()
            continue
        seen.add(real)
        files.extend(path for path in (Path(folder) / name for name in names) if path.is_file())
        if not allow_outside_root:
            leaving = [name for name in subfolders
                       if not Path(os.path.realpath(Path(folder) / name)).is_relative_to(top)]
            outside.extend(Path(folder) / name for name in leaving)
            subfolders[:] = [name for name in subfolders if name not in leaving]
    return files, sorted(outside)


def _with_sidecar(root: Path, file: Path, sidecars: dict[str, Path]) -> SampleRef | BadSampleError:
    modality = modality_of(file.name)
    key = file.relative_to(root).as_posix()
    if ".txt" in sidecars:
        return SampleRef(key, MediaSource(file), modality, "flat", sidecar=MediaSource(sidecars[".txt"]))
    if ".json" in sidecars:
        return SampleRef(key, MediaSource(file), modality, "cosmos", sidecar=MediaSource(sidecars[".json"]))
    return BadSampleError(file, f"missing caption: neither {file.stem}.txt nor {file.stem}.json beside it"
                                f"{_imagefolder_hint(root, file.parent)}")


def _imagefolder_hint(root: Path, folder: Path) -> str:
    """Why an image of a Hugging Face imagefolder read as the ``folder`` layout has no caption: its
    ``metadata.jsonl`` is in a subfolder (a split such as ``train/``), or its metadata is a CSV."""
    if folder != root and (folder / HF_METADATA_FILE).is_file():
        return f"; {folder / HF_METADATA_FILE} is read when the dataset path is {folder} itself"
    if (folder / "metadata.csv").is_file():
        return (f"; {folder / 'metadata.csv'} is not read: write it as {HF_METADATA_FILE}, one "
                '{"file_name": ..., "text": ...} a line')
    return ""


def _sana_meta(root: Path, modalities: tuple[Modality, ...]) -> Iterator[SampleRef | BadSampleError]:
    meta_path = root / META_FILE
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{meta_path}: unreadable ({exc})") from exc
    names = meta.get("img_names") if isinstance(meta, dict) else None
    if not isinstance(names, list):
        raise DatasetError(f"{meta_path}: expected an object with an 'img_names' list")
    for i, name in enumerate(names):
        where = f"{meta_path}[img_names][{i}]"
        if not isinstance(name, str):
            yield BadSampleError(where, f"expected a file name string, got {type(name).__name__}")
            continue
        try:
            base = relative_inside(root, name, where)
        except BadSampleError as exc:
            yield exc
            continue
        found = _media_for_name(base, modalities)
        if found is None:
            yield BadSampleError(where, f"no media file for {name!r} (tried {', '.join(_suffixes(modalities))})")
            continue
        stem = found.with_suffix("")
        sidecars = {s: stem.with_suffix(s) for s in SIDECAR_SUFFIXES if stem.with_suffix(s).is_file()}
        ref = _with_sidecar(root, found, sidecars)
        yield ref if isinstance(ref, BadSampleError) else SampleRef(
            ref.key, ref.media, ref.modality, "sana_meta", sidecar=ref.sidecar
        )


def _media_for_name(base: Path, modalities: tuple[Modality, ...]) -> Path | None:
    if modality_of(base.name) in modalities:
        return base if base.is_file() else None
    for suffix in _suffixes(modalities):
        candidate = base.with_name(base.name + suffix)
        if candidate.is_file():
            return candidate
    return None


def _suffixes(modalities: tuple[Modality, ...]) -> tuple[str, ...]:
    return (IMAGE_SUFFIXES if "image" in modalities else ()) + (VIDEO_SUFFIXES if "video" in modalities else ())


def _jsonl(manifest: Path, modalities: tuple[Modality, ...], media_key: str = "media", caption_key: str = "caption",
           layout: str = "jsonl") -> Iterator[SampleRef | BadSampleError]:
    root = manifest.parent
    try:
        lines = manifest.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{manifest}: unreadable ({exc})") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{manifest}:{number}"
        try:
            yield _manifest_record(root, line, where, modalities, media_key, caption_key, layout)
        except BadSampleError as exc:
            yield exc


def _imagefolder(path: Path, modalities: tuple[Modality, ...]) -> Iterator[SampleRef | BadSampleError]:
    """The folder, or its ``metadata.jsonl`` itself."""
    manifest = path if path.is_file() else path / HF_METADATA_FILE
    if not manifest.is_file():
        raise DatasetError(f"{path}: layout 'imagefolder' needs a {HF_METADATA_FILE} in the folder")
    yield from _jsonl(manifest, modalities, "file_name", "text", "imagefolder")


def _manifest_record(root: Path, line: str, where: str, modalities: tuple[Modality, ...], media_key: str = "media",
                     caption_key: str = "caption", layout: str = "jsonl") -> SampleRef:
    record = json_object(line, where)
    media_rel = record.get(media_key)
    if not isinstance(media_rel, str):
        raise BadSampleError(where, f"{media_key!r} must be a path string, got {type(media_rel).__name__}")
    caption = _string_field(record, caption_key, where)
    media = relative_inside(root, media_rel, where)
    modality = modality_of(media.name)
    if modality is None:
        raise BadSampleError(where, f"unsupported media type {media.suffix!r}")
    if modality not in modalities:
        raise BadSampleError(where, f"{modality} sample in a {'/'.join(modalities)} dataset")
    if not media.is_file():
        raise BadSampleError(where, f"media file {media} does not exist")
    extra = {k: v for k, v in record.items() if k not in (media_key, caption_key)}
    return SampleRef(media.relative_to(root).as_posix(), MediaSource(media), modality, layout, caption, extra=extra)


def _zip(archive: Path, modalities: tuple[Modality, ...]) -> Iterator[SampleRef | BadSampleError]:
    try:
        with zipfile.ZipFile(archive) as handle:
            names = sorted(n for n in handle.namelist() if not n.endswith("/"))
    except (OSError, zipfile.BadZipFile) as exc:
        yield BadSampleError(archive, f"unreadable zip archive ({exc})")
        return
    members = set(names)
    for name in names:
        modality = modality_of(name)
        if modality is None or modality not in modalities:
            continue
        where = f"{archive}:{name}"
        try:
            relative_inside(Path(archive.name), name, where)
        except BadSampleError as exc:
            yield exc
            continue
        stem = str(PurePosixPath(name).with_suffix(""))
        sidecar = next((stem + s for s in (".json", ".txt") if stem + s in members), None)
        if sidecar is None:
            yield BadSampleError(where, f"missing caption: neither {stem}.json nor {stem}.txt in the archive")
            continue
        yield SampleRef(f"{archive.name}:{name}", MediaSource(archive, name), modality, "zip",
                        sidecar=MediaSource(archive, sidecar))


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)

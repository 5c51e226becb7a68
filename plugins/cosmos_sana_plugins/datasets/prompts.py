"""RL prompt sets (registered as ``prompts``): local files, or the shipped ``builtin:NAME`` sets.

An item is ``{"prompt": str, "metadata": dict}`` (the shape cosmos-rl's diffusers rollout reads
from ``RLPayload.prompt``). Formats:

* ``text``: one prompt a line; blank lines separate nothing and are not samples.
* ``ocr``: one prompt a line; the text between the first pair of double quotes is the target
  (``metadata["ocr_target"]``); a line without one is a bad sample.
* ``jsonl``: ``{"prompt": ..., ...}`` a line; the other fields are the metadata.
* ``geneval``: GenEval records ``{"tag", "include": [{"class", "count", "color"?, "position"?}],
  "exclude"?, "prompt"}``; the whole record is the metadata.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from cosmos_sana_plugins.datasets.errors import BadSampleError, BadSamplePolicy, DatasetError, OnBadSample, json_object
from cosmos_sana_plugins.datasets.params import BUILTIN_PROMPTS, PROMPTS_DIR, PromptDataParams
from cosmos_sana_plugins.datasets.report import DataReport

_QUOTED = re.compile(r'"([^"]*)"')


def ocr_target(prompt: str) -> str | None:
    """The text between the first pair of double quotes (None when there is none or it is empty)."""
    match = _QUOTED.search(prompt)
    return match.group(1) if match and match.group(1).strip() else None


def resolve_source(path: str, fmt: str) -> tuple[Path, str]:
    """The prompt file and its concrete format (``auto`` resolved)."""
    if path.startswith("builtin:"):
        name = path.removeprefix("builtin:")
        if name not in BUILTIN_PROMPTS:
            raise DatasetError(f"args.path: unknown builtin prompt set {name!r} (have {sorted(BUILTIN_PROMPTS)})")
        file_name, builtin_format = BUILTIN_PROMPTS[name]
        return PROMPTS_DIR / file_name, builtin_format if fmt == "auto" else fmt
    file = Path(path)
    if not file.is_file():
        raise DatasetError(f"{file}: no such prompt file")
    if fmt != "auto":
        return file, fmt
    if file.suffix.lower() == ".txt":
        return file, "text"
    if file.suffix.lower() == ".jsonl":
        return file, "geneval" if _first_record_has(file, "include") else "jsonl"
    raise DatasetError(f"{file}: cannot tell the prompt format from the suffix; set args.format")


def _first_record_has(file: Path, key: str) -> bool:
    for line in _read_lines(file):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                return False
            return isinstance(record, dict) and key in record
    return False


def _read_lines(file: Path) -> list[str]:
    try:
        return file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{file}: unreadable prompt file ({exc})") from exc


def parse_prompts(file: Path, fmt: str) -> Iterator[dict[str, Any] | BadSampleError]:
    """Items, or a :class:`BadSampleError` naming ``file:line`` for each bad line."""
    for number, line in enumerate(_read_lines(file), start=1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            yield _PARSERS[fmt](line, where)
        except BadSampleError as exc:
            yield exc


def _text(line: str, where: str) -> dict[str, Any]:
    return {"prompt": line.strip(), "metadata": {}}


def _ocr(line: str, where: str) -> dict[str, Any]:
    target = ocr_target(line)
    if target is None:
        raise BadSampleError(where, 'OCR prompt has no target text in double quotes')
    return {"prompt": line.strip(), "metadata": {"ocr_target": target}}


def _record(line: str, where: str) -> dict[str, Any]:
    record = json_object(line, where)
    prompt = record.get("prompt")
    if not isinstance(prompt, str):
        raise BadSampleError(where, f"'prompt' must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise BadSampleError(where, "empty 'prompt'")
    return record


def _jsonl(line: str, where: str) -> dict[str, Any]:
    record = _record(line, where)
    return {"prompt": record["prompt"].strip(), "metadata": {k: v for k, v in record.items() if k != "prompt"}}


def _geneval(line: str, where: str) -> dict[str, Any]:
    record = _record(line, where)
    _expect(record, "tag", str, where)
    include = _expect(record, "include", list, where)
    if not include:
        raise BadSampleError(where, "'include' is empty")
    for key, entries in (("include", include), ("exclude", record.get("exclude", []))):
        if not isinstance(entries, list):
            raise BadSampleError(where, f"{key!r} must be a list, got {type(entries).__name__}")
        for i, entry in enumerate(entries):
            _geneval_object(entry, f"{key}[{i}]", where)
    return {"prompt": record["prompt"].strip(), "metadata": record}


def _geneval_object(entry: Any, path: str, where: str) -> None:
    if not isinstance(entry, dict):
        raise BadSampleError(where, f"{path} must be an object, got {type(entry).__name__}")
    _expect(entry, "class", str, where, path)
    count = _expect(entry, "count", int, where, path)
    if count < 1:
        raise BadSampleError(where, f"{path}.count must be ≥ 1, got {count}")
    if "color" in entry:
        _expect(entry, "color", str, where, path)
    if "position" in entry:
        position = entry["position"]
        if not (isinstance(position, list) and len(position) == 2 and isinstance(position[0], str)
                and isinstance(position[1], int) and not isinstance(position[1], bool)):
            raise BadSampleError(where, f"{path}.position must be [relation, index], got {position!r}")


def _expect(record: dict[str, Any], key: str, kind: type, where: str, path: str = "") -> Any:
    name = f"{path}.{key}" if path else repr(key)
    if key not in record:
        raise BadSampleError(where, f"missing {name}")
    value = record[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadSampleError(where, f"{name} must be {kind.__name__}, got {type(value).__name__}")
    return value


_PARSERS = {"text": _text, "ocr": _ocr, "jsonl": _jsonl, "geneval": _geneval}


class PromptDataset(Dataset):
    """Prompts with metadata, all validated when the file is read."""

    def __init__(self, file: Path, fmt: str, policy: BadSamplePolicy):
        self.file, self.format, self.policy = file, fmt, policy
        self.items: list[dict[str, Any]] = []
        candidates = 0
        for item in parse_prompts(file, fmt):
            candidates += 1
            if isinstance(item, BadSampleError):
                policy.handle(item)
            else:
                self.items.append(item)
        policy.report_index(candidates)
        if not self.items:
            raise DatasetError(f"{file}: no usable prompts ({candidates} lines, {len(policy.skipped)} bad)")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.items[index]
        return {"prompt": item["prompt"], "metadata": dict(item["metadata"])}

    def check(self) -> DataReport:
        report = DataReport(str(self.file), self.policy.on_bad_sample, bad=list(self.policy.skipped))
        report.counts[f"{self.format}/prompt"] = len(self.items)
        return report


def build_prompts(params: PromptDataParams, *, cosmos_config: Any = None,
                  on_bad_sample: OnBadSample = "fail") -> PromptDataset:
    """The ``prompts`` dataset from ``[custom.data] args``."""
    file, fmt = resolve_source(params.path, params.format)
    return PromptDataset(file, fmt, BadSamplePolicy(on_bad_sample, f"prompts({params.path})"))

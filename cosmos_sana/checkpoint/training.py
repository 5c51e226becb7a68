"""Save and resume complete training state as DCP.

A trainer hands over its state as named parts, each a ``Stateful`` (see
:mod:`cosmos_sana.checkpoint.states`) or a plain dict of tensors/values::

    parts = {
        "model": ModelState(transformer, lora_only=True, base_pipeline=path),
        "optim": OptimizerState(transformer, optimizer),
        "scheduler": lr_scheduler,           # anything with state_dict/load_state_dict
        "ema": ParameterEMA(transformer, 0.9),
        "rng": RNGState(seed),
        "dataloader": sampler,
        "trainer": {"consumed_samples": n},
    }
    save_checkpoint(output_dir, step, parts, config=cosmos_config, keep_last=5)
    ...
    path = resolve_resume(config.train.resume, output_dir)
    step = load_checkpoint(path, parts) if path else 0

Each part becomes one DCP folder ``iter_<step>/<part>/``; ``meta.json`` records
the step, rank count and part descriptions, ``run_config.json`` the resolved
(redacted) config, ``config.json`` the model architecture.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cosmos_sana.checkpoint.dcp_io import (
    CheckpointError,
    any_rank,
    barrier,
    load_state,
    non_finite_entry,
    rank_and_world,
    save_state,
    stored_keys,
)
from cosmos_sana.checkpoint.layout import (
    STAGING_PREFIX,
    checkpoint_dir,
    clear_stale,
    is_complete,
    iter_name,
    prune,
    publish,
    write_marker,
)
from cosmos_sana.checkpoint.states import RNGState
from cosmos_sana.config.checkpoint import parse_size
from cosmos_sana.log import get_logger
from cosmos_sana.redaction import redact

logger = get_logger(__name__)

FORMAT = "cosmos-sana-dcp"
FORMAT_VERSION = 1
META_FILE = "meta.json"
RUN_CONFIG_FILE = "run_config.json"
MODEL_PART = "model"
EMA_PART = "ema"


def _state_of(part: Any) -> dict[str, Any]:
    if hasattr(part, "state_dict") and callable(part.state_dict):
        return part.state_dict()
    if isinstance(part, dict):
        return part
    raise TypeError(f"checkpoint part must be a dict or have state_dict/load_state_dict, got {type(part).__name__}")


def config_dict(config: Any) -> dict[str, Any]:
    """A cosmos-rl ``Config`` (pydantic), a mapping or None, as a redacted plain dict."""
    if config is None:
        return {}
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping or a pydantic model, got {type(config).__name__}")
    return redact(json.loads(json.dumps(dict(config), default=str)))


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a (redacted) config."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


#: settings that differ between the run that wrote a checkpoint and its continuation by design
RUN_IDENTITY_KEYS = frozenset({"train.output_dir", "train.timestamp", "train.resume"})


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping):
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): node}


def changed_settings(checkpoint: str | Path, config: Any) -> list[str]:
    """Dotted keys whose value in ``config`` differs from the resolved config of the run that wrote
    ``checkpoint`` (its ``run_config.json``), run identity (output folder, timestamp, resume) aside.
    A continuation with any of them is not the run the checkpoint belongs to."""
    path = Path(checkpoint) / RUN_CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (not a cosmos-sana training checkpoint)")
    stored = _flatten(read_run_config(checkpoint))
    current = _flatten(config_dict(config))
    ignored = RUN_IDENTITY_KEYS | (RUN_LENGTH_KEYS if not schedule_spans_run(current) else frozenset())
    return sorted(
        key for key in set(stored) | set(current)
        if key not in ignored and stored.get(key) != current.get(key)
    )


#: settings that only change the run's number of steps (what extending a finished run changes)
RUN_LENGTH_KEYS = frozenset({"train.max_num_steps", "train.epoch"})


def schedule_spans_run(flat_config: Mapping[str, Any]) -> bool:
    """Whether cosmos-rl's learning-rate schedule depends on the run's number of steps: a warm-up
    (its steps are capped by, or given as a fraction of, the total) or a decay (over a share of the
    total). Without either the rate is constant, and a longer run trains its first steps alike."""
    decay = flat_config.get("train.optm_decay_type")
    return bool(flat_config.get("train.optm_warmup_steps")) or decay not in (None, "none")


#: settings whose change makes a continuation train something else: another trainer, or other LoRA
#: tensors (an adapter the checkpoint lacks would be skipped silently by a partial load; LoRA on or
#: off, another rank or other target modules). A LoRA setting that keeps the tensors (alpha,
#: dropout) only makes the continuation differ.
RUN_KIND_KEYS = frozenset({
    "train.train_policy.type", "train.train_policy.trainer_type",
    "policy.lora.lora_names", "policy.lora.r", "policy.lora.r_pattern", "policy.lora.target_modules",
    "policy.lora.modules_to_save",
})


def refuse_other_run(checkpoint: str | Path, changed: list[str]) -> None:
    """Raise :class:`CheckpointError` when ``changed`` (from :func:`changed_settings`) holds a
    setting that makes ``checkpoint`` another kind of run; other changes only make it differ."""
    kind = [key for key in changed if key in RUN_KIND_KEYS]
    if kind:
        raise CheckpointError(
            f"train.resume: {checkpoint} was written by another kind of run ({', '.join(kind)} differ); "
            "resume continues the run a checkpoint belongs to: use another train.output_dir, or "
            "train.resume = false, to start this recipe afresh"
        )


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("cosmos-sana", "cosmos-rl", "torch", "diffusers", "transformers", "peft", "safetensors"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def write_meta(folder: Path, *, kind: str, step: int, parts: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """``meta.json`` plus the model's ``config.json`` (rank 0 only)."""
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "step": step,
        "world_size": rank_and_world()[1],
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config_sha256": config_hash(config),
        "versions": package_versions(),
        "parts": {name: (part.describe() if hasattr(part, "describe") else {}) for name, part in parts.items()},
    }
    (folder / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    model = parts.get(MODEL_PART)
    if model is not None and hasattr(model, "write_config"):
        model.write_config(folder)


def read_run_config(checkpoint: str | Path) -> dict[str, Any]:
    """The resolved config of the run that wrote ``checkpoint`` (its ``run_config.json``), or {}
    for a checkpoint without one (``convert-to-dcp`` output)."""
    path = Path(checkpoint) / RUN_CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: invalid JSON ({exc})") from exc


def read_meta(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (not a cosmos-sana checkpoint)") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: invalid JSON ({exc})") from exc
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def refuse_non_finite(states: Mapping[str, Any], target: Path) -> None:
    """Raise :class:`CheckpointError` (on every rank) when any part holds a NaN or inf tensor: such
    weights are never written, let alone marked ``COMPLETE``; earlier checkpoints stay as they are."""
    found = next(((name, key) for name, state in states.items() if (key := non_finite_entry(state)) is not None), None)
    if any_rank(found is not None):
        where = f"part {found[0]!r} entry {found[1]!r}" if found else "another rank's shard"
        raise CheckpointError(f"{target}: not saved: {where} holds NaN or inf; earlier checkpoints are kept")


def save_checkpoint(
    root: str | Path,
    step: int,
    parts: Mapping[str, Any],
    *,
    config: Any = None,
    keep_last: int | None = None,
    chunk_size: str | int | None = None,
) -> Path:
    """Write ``parts`` as ``<root>/checkpoints/iter_<step>``; collective on every rank.

    Atomic: written to a staging folder, renamed, then marked ``COMPLETE``.
    ``keep_last`` (cosmos-rl's ``max_keep``; None/-1 keeps all) prunes older ones.
    ``chunk_size`` ("5GB") bounds each rank's DCP data files.
    """
    if not parts:
        raise ValueError("save_checkpoint needs at least one part")
    rank, _ = rank_and_world()
    final = checkpoint_dir(root, step)
    states = {name: _state_of(part) for name, part in parts.items()}
    refuse_non_finite(states, final)
    staging = final.with_name(f"{STAGING_PREFIX}{iter_name(step)}")
    if rank == 0:
        clear_stale(root)
        staging.mkdir(parents=True)
    barrier()
    chunk_bytes = parse_size(chunk_size) if chunk_size is not None else None
    for name, state in states.items():
        save_state(state, staging / name, chunk_bytes=chunk_bytes)
    if rank == 0:
        run_config = config_dict(config)
        (staging / RUN_CONFIG_FILE).write_text(
            json.dumps(run_config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        write_meta(staging, kind="training", step=step, parts=parts, config=run_config)
        publish(staging, final)
        write_marker(final, step=step)
        prune(root, keep_last)
        logger.info("saved checkpoint %s", final)
    barrier()
    return final


def load_checkpoint(path: str | Path, parts: Mapping[str, Any]) -> int:
    """Restore ``parts`` (in place) from a complete checkpoint folder; returns its step.

    Parts stored but not asked for are skipped (the log line names them). A rank with no
    stored RNG state (the run now has more ranks) gets fresh deterministic seeds.
    """
    path = Path(path)
    if not is_complete(path):
        raise CheckpointError(f"{path}: no COMPLETE marker (missing or partially written checkpoint)")
    meta = read_meta(path)
    step = int(meta["step"])
    for name, part in parts.items():
        folder = path / name
        if not folder.is_dir():
            raise CheckpointError(f"{path}: has no part {name!r} (stored: {sorted(meta['parts'])})")
        if isinstance(part, RNGState) and part.key not in {k.split(".")[0] for k in stored_keys(folder)}:
            logger.warning("%s: no RNG state for %s (saved with %s ranks); reseeding", folder, part.key, meta["world_size"])
            part.seed_missing_rank(step)
            continue
        state = _state_of(part)
        load_state(state, folder)
        if state is not part:
            part.load_state_dict(state)
    skipped = sorted(set(meta["parts"]) - set(parts))
    # one line, read the same by a resume (every part) and by export or generate (the model alone)
    left = f"; not read: {', '.join(skipped)}" if skipped else ""
    logger.info("read checkpoint %s (step %d): %s%s", path, step, ", ".join(parts), left)
    return step


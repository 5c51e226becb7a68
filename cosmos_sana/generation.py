"""Look at what was trained: sample a training checkpoint, an export or a pipeline folder (``cosmos-sana generate``).

Sources:

* a training checkpoint (``iter_N`` folder, or a run folder = its latest): the trained transformer is
  rebuilt in memory by the export code (LoRA adapters on the base the run trained on; the EMA weights
  when the run kept an EMA), and the run's ``run_config.json`` supplies the sampling defaults;
* an export folder (``export_manifest.json``; diffusers, lora, merged or native), loaded the way a user
  loads it with stock diffusers (:func:`cosmos_sana.export.verify.load_export`);
* any diffusers pipeline folder (``model_index.json``), e.g. a base model.

The model plugin serving the pipeline class samples (``ModelSpec.generator``). Every prompt gets
``batch`` images seeded ``seed, seed + 1, …``; with ``compare_base`` the base (the weights training
started from) samples the same prompts and seeds, and a grid PNG per prompt shows them side by side
(a row per seed: base left, trained right).
``generate.json`` beside the media records the source, every setting and every file written.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from cosmos_sana.checkpoint.dcp_io import CheckpointError
from cosmos_sana.checkpoint.pipeline_folder import is_pipeline_folder
from cosmos_sana.checkpoint.training import package_versions, read_run_config
from cosmos_sana.export.model_card import lookup

GENERATE_FILE = "generate.json"
DEFAULT_STEPS = 20
DEFAULT_GUIDANCE = 4.5
DEFAULT_TEXT_LENGTH = 300
DEFAULT_FPS = 16
GRID_DIR = "compare"
BASE_DIR = "base"
RUN_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class GenerationRequest:
    """One pipeline call: ``prompts[i]`` is sampled from noise seeded ``seeds[i]``."""

    prompts: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    guidance: float
    height: int | None = None  # None: the pipeline's default size
    width: int | None = None
    frames: int | None = None  # videos only; None: the pipeline's default
    chi: str = "off"  # complex-human-instruction mode, as in [custom.model]
    prompt_suffix: str = ""
    max_sequence_length: int = DEFAULT_TEXT_LENGTH


@dataclass(frozen=True)
class Settings:
    """Sampling settings: what the command line says, else the run's config, else the defaults above."""

    steps: int
    guidance: float
    height: int | None
    width: int | None
    frames: int | None
    chi: str
    prompt_suffix: str
    max_sequence_length: int
    fps: int

    def request(self, prompts: Sequence[str], seeds: Sequence[int]) -> GenerationRequest:
        return GenerationRequest(
            prompts=tuple(prompts), seeds=tuple(seeds), steps=self.steps, guidance=self.guidance,
            height=self.height, width=self.width, frames=self.frames, chi=self.chi,
            prompt_suffix=self.prompt_suffix, max_sequence_length=self.max_sequence_length,
        )


def resolve_settings(
    run: dict[str, Any], *, steps: int | None = None, guidance: float | None = None,
    size: tuple[int, int] | None = None, frames: int | None = None, chi: str | None = None,
) -> Settings:
    """Command-line values win; then the run's evaluation settings (``[policy.diffusers.sample]``
    ``eval_num_steps``, ``guidance_scale``, ``[policy.diffusers] inference_size/inference_frames``,
    ``[custom.model]`` CHI, prompt suffix, fps)."""
    def pick(given: Any, *keys: str, default: Any = None) -> Any:
        if given is not None:
            return given
        for key in keys:
            value = lookup(run, key)
            if value is not None:
                return value
        return default

    height, width = size if size is not None else (pick(None, "policy.diffusers.inference_size") or (None, None))
    return Settings(
        steps=int(pick(steps, "policy.diffusers.sample.eval_num_steps", "policy.diffusers.sample.num_steps",
                       default=DEFAULT_STEPS)),
        guidance=float(pick(guidance, "policy.diffusers.sample.guidance_scale", default=DEFAULT_GUIDANCE)),
        height=height,
        width=width,
        frames=pick(frames, "policy.diffusers.inference_frames"),
        chi=pick(chi, "custom.model.complex_human_instruction", default="off"),
        prompt_suffix=pick(None, "custom.model.prompt_suffix", default=""),
        max_sequence_length=int(pick(None, "policy.diffusers.max_prompt_length", default=DEFAULT_TEXT_LENGTH)),
        fps=int(pick(None, "custom.model.fps", default=DEFAULT_FPS)),
    )


@dataclass
class LoadedSource:
    """The trained pipeline, how to build the base transformer, and what to record about both."""

    kind: str  # "checkpoint" | "export" | "pipeline"
    path: Path
    pipeline: Any
    run: dict[str, Any]
    build_base: Callable[[], torch.nn.Module] | None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def pipeline_class(self) -> str:
        return type(self.pipeline).__name__


def load_source(
    source: str | Path, *, base: str | Path | None = None, ema: bool | None = None, adapter: str | None = None,
    dtype: torch.dtype | None = None,
) -> LoadedSource:
    """Open ``source`` (see the module notes); ``ema=None`` uses EMA weights when the run kept an EMA;
    ``dtype=None`` keeps stored dtypes (a checkpoint: its run's ``policy.diffusers.dtype``)."""
    from cosmos_sana.export.api import MANIFEST_FILE

    path = Path(source)
    if not path.exists():
        raise CheckpointError(f"{path}: does not exist")
    folder_kind = "export" if (path / MANIFEST_FILE).is_file() else "pipeline" if is_pipeline_folder(path) else None
    if folder_kind is None:
        return _load_checkpoint(path, base=base, ema=ema, adapter=adapter, dtype=dtype)
    if ema is not None or adapter is not None:
        raise ValueError(f"--ema/--adapter choose checkpoint weights; {path} is an {folder_kind} folder")
    if folder_kind == "export":
        return _load_export(path, base=base, dtype=dtype)
    return _load_pipeline(path, base=base, dtype=dtype)


def _load_checkpoint(
    path: Path, *, base: str | Path | None, ema: bool | None, adapter: str | None, dtype: torch.dtype | None,
) -> LoadedSource:
    from diffusers import DiffusionPipeline

    from cosmos_sana.export.api import pick_adapter
    from cosmos_sana.export.restore import open_source, restore_transformer

    checkpoint = open_source(path, base)
    run = read_run_config(checkpoint.path)
    if dtype is None and lookup(run, "policy.diffusers.dtype") in RUN_DTYPES:
        dtype = getattr(torch, lookup(run, "policy.diffusers.dtype"))
    use_ema = ema if ema is not None else bool(lookup(run, "train.ema_enable")) and checkpoint.has_ema
    chosen = pick_adapter(checkpoint, adapter) if checkpoint.is_lora else None
    transformer = restore_transformer(checkpoint, ema=use_ema, dtype=dtype)
    if chosen is not None:
        transformer.set_adapter(chosen)
    pipe = DiffusionPipeline.from_pretrained(str(checkpoint.base_pipeline), transformer=transformer,
                                             **({"torch_dtype": dtype} if dtype else {}))
    for component, key in (("vae", "custom.model.vae_dtype"), ("text_encoder", "custom.model.text_encoder_dtype")):
        if lookup(run, key) in RUN_DTYPES:  # the precisions the run sampled its rollouts with
            getattr(pipe, component).to(getattr(torch, lookup(run, key)))
    info = {"step": checkpoint.step, "checkpoint": str(checkpoint.path.resolve()), "adapter": chosen,
            "ema": use_ema, "base_pipeline": str(checkpoint.base_pipeline.resolve())}
    return LoadedSource("checkpoint", checkpoint.path, pipe, run, checkpoint.base.build, info)


def _load_export(path: Path, *, base: str | Path | None, dtype: torch.dtype | None) -> LoadedSource:
    from cosmos_sana.export.api import MANIFEST_FILE
    from cosmos_sana.export.base import BaseWeights
    from cosmos_sana.export.verify import load_export

    manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    fmt = manifest.get("format")
    if fmt not in ("diffusers", "merged", "lora", "native"):
        raise ValueError(f"{path}: a {fmt!r} export holds no weights diffusers loads; generate from its checkpoint "
                         f"{manifest.get('source_checkpoint')} or from a lora/merged export")
    pipeline = Path(base if base is not None else manifest["base_pipeline"])
    if not is_pipeline_folder(pipeline):
        origin = "--base" if base is not None else f"base pipeline recorded in {path / MANIFEST_FILE}"
        raise CheckpointError(f"{origin} {pipeline}: not a diffusers pipeline folder (no model_index.json); pass --base")
    recorded = manifest.get("base") or {}
    native = recorded.get("native_checkpoint") or {}
    init_from = (recorded.get("init_from") or {}).get("source")
    weights = BaseWeights(pipeline=pipeline, native_checkpoint=native.get("source"),
                          native_use_ema=bool(native.get("use_ema", False)),
                          init_from=Path(init_from) if init_from else None, recorded_in=path / MANIFEST_FILE)
    pipe = load_export(path, fmt, pipeline, base_transformer=weights.build)
    if dtype is not None:
        pipe.to(dtype)
    source_checkpoint = Path(manifest.get("source_checkpoint") or path)
    info = {"format": fmt, "step": manifest.get("step"), "checkpoint": manifest.get("source_checkpoint"),
            "adapter": manifest.get("adapter"), "ema": manifest.get("ema"), "base_pipeline": str(pipeline.resolve())}
    return LoadedSource("export", path, pipe, read_run_config(source_checkpoint), weights.build, info)


def _load_pipeline(path: Path, *, base: str | Path | None, dtype: torch.dtype | None) -> LoadedSource:
    from diffusers import DiffusionPipeline

    from cosmos_sana.export.base import BaseWeights

    pipe = DiffusionPipeline.from_pretrained(str(path), **({"torch_dtype": dtype} if dtype else {}))
    build_base = None
    if base is not None:
        if not is_pipeline_folder(base):
            raise CheckpointError(f"--base {base}: not a diffusers pipeline folder (no model_index.json)")
        build_base = BaseWeights(pipeline=Path(base)).build
    info = {"base_pipeline": str(Path(base).resolve()) if base is not None else None}
    return LoadedSource("pipeline", path, pipe, {}, build_base, info)


def read_prompts(prompts: Sequence[str], prompts_file: str | Path | None) -> list[str]:
    """``--prompt`` values, then the non-blank lines of ``--prompts FILE``; at least one."""
    found = [p for p in prompts if p.strip()]
    if prompts_file is not None:
        path = Path(prompts_file)
        try:
            found += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--prompts {path}: cannot read it ({exc})") from exc
    if not found:
        raise ValueError("no prompt: pass --prompt TEXT or --prompts FILE (one prompt a line)")
    return found


def slug(prompt: str, limit: int = 40) -> str:
    return re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:limit].rstrip("-") or "prompt"


def prepare_output(out: Path) -> None:
    """``out`` may be missing, empty or an earlier ``generate`` output (whose listed files are removed);
    anything else is refused rather than mixed into."""
    if not out.exists():
        out.mkdir(parents=True)
        return
    if not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    record = out / GENERATE_FILE
    if not record.is_file():
        if any(out.iterdir()):
            raise ValueError(f"--out {out}: not empty and holds no {GENERATE_FILE}; choose another folder")
        return
    try:
        previous = json.loads(record.read_text(encoding="utf-8")).get("files", {})
    except json.JSONDecodeError as exc:
        raise ValueError(f"--out {out}: {GENERATE_FILE} is not valid JSON ({exc}); remove the folder") from exc
    for names in previous.values():
        for name in names:
            target = (out / name).resolve()
            if out.resolve() in target.parents:
                target.unlink(missing_ok=True)
    record.unlink()


def _still(sample: torch.Tensor) -> torch.Tensor:
    """The image of a sample, or the middle frame of a video (``T×C×H×W``), for the comparison grid."""
    return sample[sample.shape[0] // 2] if sample.ndim == 4 else sample


def generate(
    loaded: LoadedSource, prompts: Sequence[str], settings: Settings, out: str | Path, *, batch: int = 1,
    seed: int = 0, compare_base: bool = False, device: str | None = None,
) -> dict[str, Any]:
    """Sample every prompt ``batch`` times (and the base too with ``compare_base``); write media and
    ``generate.json`` under ``out``; return that record."""
    from cosmos_sana.media_writer import save_grid, save_media
    from cosmos_sana.model_hooks import generator_for

    if batch < 1:
        raise ValueError(f"--batch must be at least 1, got {batch}")
    if compare_base and loaded.build_base is None:
        raise ValueError(f"--compare-base: {loaded.path} is a pipeline folder with no known base; pass --base")
    sample = generator_for(loaded.pipeline_class)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(out)
    source = loaded.path.resolve()
    if loaded.kind == "checkpoint" and (out.resolve() == source or source in out.resolve().parents):
        raise ValueError(f"--out {out}: inside the checkpoint {loaded.path}, which pruning (keep_last) deletes; "
                         "choose a folder outside it")
    prepare_output(out)
    started = time.perf_counter()
    trained = loaded.pipeline.to(device)
    base = None
    if compare_base:
        base_transformer = loaded.build_base().to(device=device, dtype=trained.transformer.dtype)
        base = type(trained)(**{**trained.components, "transformer": base_transformer})
    for pipe in (trained, base):
        if pipe is not None:  # a denoising bar in a terminal only, like cosmos-sana's own progress bars
            pipe.set_progress_bar_config(disable=None)
    seeds = list(range(seed, seed + batch))
    files: dict[str, list[str]] = {"trained": [], "base": [], "grids": []}
    shapes: list[list[int]] = []

    def write(media: torch.Tensor, which: str, index: int, prompt: str) -> list[torch.Tensor]:
        if not bool(torch.isfinite(media).all()):  # would be saved as black or clipped pixels
            raise ValueError(f"the {which} model sampled NaN/inf for prompt {index} ({prompt!r}, seeds {seeds}); "
                             "nothing written for it (check --dtype, --guidance and the weights)")
        folder = out / BASE_DIR if which == "base" else out
        shapes.append(list(media.shape[1:]))
        for item, item_seed in zip(media, seeds):
            path = save_media(item, folder / f"{index:03d}-{slug(prompt)}-seed{item_seed}", settings.fps)
            files[which].append(path.relative_to(out).as_posix())
        return [_still(item) for item in media]

    for index, prompt in enumerate(prompts):
        request = settings.request([prompt] * batch, seeds)
        trained_stills = write(sample(trained, request), "trained", index, prompt)
        if base is not None:
            base_stills = write(sample(base, request), "base", index, prompt)
            rows = [list(pair) for pair in zip(base_stills, trained_stills)]
            grid = save_grid(rows, out / GRID_DIR / f"{index:03d}-{slug(prompt)}.png")
            files["grids"].append(grid.relative_to(out).as_posix())
    record = {
        "source": str(loaded.path.resolve()),
        "source_kind": loaded.kind,
        "pipeline_class": loaded.pipeline_class,
        **loaded.info,
        "prompts": list(prompts),
        "seeds": seeds,
        "batch": batch,
        "settings": asdict(settings),
        "media_shape": shapes[0],  # C×H×W (images) or T×C×H×W (videos): the size actually sampled
        "compare_base": compare_base,
        "grid_columns": ["base", "trained"] if compare_base else None,  # one row per seed
        "device": device,
        "dtype": str(trained.transformer.dtype).removeprefix("torch."),
        "files": files,
        "seconds": round(time.perf_counter() - started, 3),
        "versions": package_versions(),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out / GENERATE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record

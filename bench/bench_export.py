"""Export time and peak host memory: DCP checkpoint → stock-diffusers folder, vs plain save_pretrained.

    python bench/bench_export.py --preset sana-1600m [--build-device cuda] [--pipeline DIR] --json-out FILE
    python bench/bench_export.py --preset tiny --json-out FILE          # smoke

Cases, each in a fresh child process (so its peak RSS is its own):

* ``convert_to_dcp`` — ``cosmos_sana.checkpoint.convert_to_dcp`` of the pipeline's transformer
  (also the input of the next case);
* ``ours/diffusers`` — ``cosmos_sana.export.export_checkpoint(fmt="diffusers")``: full pipeline folder
  (sharded safetensors, manifest, completion marker);
* ``ours/lora`` and ``ours/merged`` — from a LoRA checkpoint (r ``--lora-rank`` on the attention
  projections, adapters ``default`` + ``old``): LoRA file only / LoRA folded into a full pipeline;
* ``baseline/save_pretrained`` — ``DiffusionPipeline.from_pretrained(torch_dtype=--dtype)`` +
  ``save_pretrained`` of the same pipeline (5 GB shards): what writing an already-diffusers model costs.

Per case: wall seconds up to the output being on disk (``os.sync`` before and after), peak RSS
(``VmHWM``) and RSS before the case's work (after imports), and the tracemalloc peak of Python-level
allocations. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import torch

from benchlib import DTYPES, GIB, environment, ensure_pipeline, ratio, write_json

CASES = ("convert_to_dcp", "ours/diffusers", "ours/lora", "ours/merged", "baseline/save_pretrained")
LORA_TARGETS = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"]
SHARD = "5GB"


def _status_gib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # no /proc: lifetime peak


def _lora_checkpoint(pipeline: Path, out: Path, rank: int) -> None:
    """Setup (untimed): a LoRA training checkpoint on ``pipeline``'s transformer."""
    from diffusers import SanaTransformer2DModel
    from peft import LoraConfig

    from cosmos_sana.checkpoint import ModelState, save_checkpoint

    transformer = SanaTransformer2DModel.from_pretrained(pipeline, subfolder="transformer")
    transformer.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights="gaussian", target_modules=LORA_TARGETS)
    for name in ("default", "old"):
        transformer.add_adapter(config, adapter_name=name)
    transformer.set_adapter("default")
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(std=1e-3)
    parts = {"model": ModelState(transformer, lora_only=True, base_pipeline=str(pipeline))}
    save_checkpoint(out, 1, parts, config={"policy": {"lora": {"r": rank}}})


def run_case(case: str, work: Path, pipeline: Path, dtype: torch.dtype) -> None:
    """Child process: do ``case``'s work, print its measurements as one JSON line."""
    from cosmos_sana.checkpoint.convert import convert_to_dcp
    from cosmos_sana.checkpoint.layout import checkpoint_dir
    from cosmos_sana.export import export_checkpoint
    from diffusers import DiffusionPipeline

    torch.set_grad_enabled(False)
    out = work / case.replace("/", "_")
    shutil.rmtree(out, ignore_errors=True)
    before = _status_gib("VmRSS")
    os.sync()  # earlier cases' dirty pages must not be written back on this case's clock
    tracemalloc.start()
    began = time.perf_counter()
    if case == "convert_to_dcp":
        convert_to_dcp(str(pipeline), work / "dcp")
        out = work / "dcp"
    elif case == "ours/diffusers":
        export_checkpoint(work / "dcp", out, fmt="diffusers", max_shard_size=SHARD)
    elif case in ("ours/lora", "ours/merged"):
        export_checkpoint(checkpoint_dir(work / "lora_run", 1), out, fmt=case.split("/")[1], max_shard_size=SHARD)
    elif case == "baseline/save_pretrained":
        # in the pipeline's dtype, so both write the same bytes (without it, diffusers upcasts to fp32)
        DiffusionPipeline.from_pretrained(str(pipeline), torch_dtype=dtype).save_pretrained(
            str(out), safe_serialization=True, max_shard_size=SHARD)
    else:
        raise ValueError(f"unknown case {case!r}")
    os.sync()  # the output on disk, not just in the page cache
    seconds = time.perf_counter() - began
    _, traced_peak = tracemalloc.get_traced_memory()
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(json.dumps({"impl": case, "seconds": seconds, "peak_rss_gib": _status_gib("VmHWM"),
                      "rss_before_gib": before, "tracemalloc_peak_gib": traced_peak / GIB, "output_gib": size / GIB}))


def child(case: str, work: Path, pipeline: Path, dtype: str, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", case, "--work", str(work), "--pipeline", str(pipeline), "--dtype", dtype],
        capture_output=True, text=True, timeout=timeout,
    )
    if done.returncode:
        raise RuntimeError(f"{case} failed:\n{done.stderr[-4000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{case:26s} {row['seconds']:7.2f} s  peak RSS {row['peak_rss_gib']:.2f} GiB", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="sana-1600m")
    parser.add_argument("--pipeline", help="existing pipeline folder (built from --preset when missing)")
    parser.add_argument("--build-device", default="cpu", help="device the random weights are created on")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per case")
    parser.add_argument("--work", help="scratch folder (default: a temporary one)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.child:
        run_case(args.child, Path(args.work), Path(args.pipeline), DTYPES[args.dtype])
        return
    with tempfile.TemporaryDirectory(dir=args.work) as scratch:
        work = Path(scratch)
        device = torch.device(args.build_device)
        pipeline = ensure_pipeline(args.pipeline, args.preset, device, DTYPES[args.dtype], work)
        rows = []
        for case in args.cases:
            if case == "ours/diffusers" and not (work / "dcp").exists():
                child("convert_to_dcp", work, pipeline, args.dtype, args.timeout)
            if case in ("ours/lora", "ours/merged") and not (work / "lora_run").exists():
                _lora_checkpoint(pipeline, work / "lora_run", args.lora_rank)
            rows.append(child(case, work, pipeline, args.dtype, args.timeout))
            write_json({"bench": "export", "partial": True, "results": rows}, args.json_out, quiet=True)
            if case != "convert_to_dcp":
                shutil.rmtree(work / case.replace("/", "_"), ignore_errors=True)
    by_impl = {r["impl"]: r for r in rows}
    base, ours = by_impl.get("baseline/save_pretrained"), by_impl.get("ours/diffusers")
    result = {
        "bench": "export",
        "env": environment(torch.device("cpu")),
        "config": {k: v for k, v in vars(args).items() if k not in ("json_out", "child")},
        "baseline": "diffusers DiffusionPipeline.from_pretrained(torch_dtype=--dtype) + save_pretrained of the same pipeline",
        "results": rows,
        "summary": {
            "speedup_vs_save_pretrained": ratio(base["seconds"], ours["seconds"]) if base and ours else None,
            "peak_rss_vs_save_pretrained": ratio(ours["peak_rss_gib"], base["peak_rss_gib"]) if base and ours else None,
        },
    }
    write_json(result, args.json_out)


if __name__ == "__main__":
    main()

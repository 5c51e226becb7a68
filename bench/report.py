"""A short table of the bench JSON files in a folder (``run_all.sh`` prints it at the end; also
``python bench/report.py bench/results``).

    python bench/report.py OUT_DIR

Targets (H200, SANA-1600M shapes, bf16; ``bench/README.md`` "Targets") are checked where a row has one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench_rollout import summarize

#: (size, batch, cfg, decode) → images/s the rollout must reach
ROLLOUT_TARGETS = {(1024, 8, 1.0, False): 9.0, (1024, 8, 1.0, True): 7.0, (1024, 1, 1.0, False): 4.0}
NFT_TARGETS = {"samples_per_s": 30.0, "mfu": 0.45, "speedup_vs_upstream": 1.3}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def targeted(data: dict[str, Any]) -> bool:
    """Targets hold for SANA-1600M shapes on a GPU only."""
    config = data.get("config", {})
    return config.get("preset") == "sana-1600m" and str(config.get("device", "")).startswith("cuda")


def rollout_rows(data: dict[str, Any]) -> list[list[str]]:
    rows, check_targets = [], targeted(data)
    for e in data.get("summary") or summarize(data["results"]):
        key = (e["size"], e["batch"], e["cfg"], e["decode"])
        target = ROLLOUT_TARGETS.get(key) if check_targets else None
        check = "" if target is None else (f"{'PASS' if e['ours_images_per_s'] >= target else 'FAIL'} ≥{target:g}")
        for base in ("diffusers", "upstream"):
            if f"{base}_images_per_s" not in e:
                continue
            rows.append([
                f"rollout img/s {e['size']}px B{e['batch']} cfg{e['cfg']:g} {'decode' if e['decode'] else 'latents'}",
                f"{_fmt(e['ours_images_per_s'])} ({e['ours_best'].removeprefix('ours/')}, "
                f"MFU {_fmt(e['ours_transformer_mfu'])})",
                f"{base} {_fmt(e[f'{base}_images_per_s'])}", _fmt(e[f"vs_{base}"]),
                check if base == "diffusers" else "",
            ])
    return rows


def nft_rows(data: dict[str, Any]) -> list[list[str]]:
    rows, base = [], next((r for r in data["results"] if r["impl"] == "upstream"), None)
    for r in data["results"]:
        if r["impl"] == "upstream":
            continue
        checks = []
        for key, target in NFT_TARGETS.items():
            if targeted(data) and r.get(key) is not None:
                checks.append(f"{key} {'PASS' if r[key] >= target else 'FAIL'}")
        if targeted(data) and base and r.get("peak_memory_gib") is not None:
            checks.append(f"memory {'PASS' if r['peak_memory_gib'] <= base['peak_memory_gib'] else 'FAIL'}")
        rows.append([
            f"NFT step samples/s ({r['impl']})",
            f"{_fmt(r['samples_per_s'])} (MFU {_fmt(r['mfu'])}, {_fmt(r['peak_memory_gib'])} GiB)",
            f"upstream {_fmt(base['samples_per_s'])} ({_fmt(base['peak_memory_gib'])} GiB)" if base else "-",
            _fmt(r.get("speedup_vs_upstream")), ", ".join(checks),
        ])
    return rows


def export_rows(data: dict[str, Any]) -> list[list[str]]:
    rows = {r["impl"]: r for r in data["results"]}
    base = rows.get("baseline/save_pretrained")
    out = []
    for name, r in rows.items():
        if name.startswith("baseline"):
            continue
        out.append([
            f"export {name} s (peak RSS GiB)", f"{_fmt(r['seconds'], 1)} ({_fmt(r['peak_rss_gib'])})",
            f"save_pretrained {_fmt(base['seconds'], 1)} ({_fmt(base['peak_rss_gib'])})" if base else "-",
            _fmt(base["seconds"] / r["seconds"]) if base and name == "ours/diffusers" else "", "",
        ])
    return out


def reward_rows(data: dict[str, Any]) -> list[list[str]]:
    limit = data.get("ocr_omp_thread_limit")
    return [
        [f"reward img/s {name}{f' (OMP_THREAD_LIMIT={limit})' if name == 'ocr' and limit else ''}",
         f"{_fmt(r['images_per_s'])} (B{r['batch']}, {r['size']}px, {r['weights']} weights)", "-", "", ""]
        for name, r in data["throughput"].items()
    ]


def ocr_rows(data: dict[str, Any]) -> list[list[str]]:
    """OCR read speed of each variant vs ``today`` (the program once per image), with its accuracy."""
    variants = data["variants"]
    base = variants[data["baseline"]]
    return [
        [f"OCR img/s {name} ({data.get('machine') or '?'}, {data['config']['threads']} workers)",
         f"{_fmt(r['images_per_s'])} (|Δreward| on text {_fmt(r['mean_abs_diff_vs_today_text'], 3)}, "
         f"exact reads kept {r['exact_reads_kept']})",
         f"{data['baseline']} {_fmt(base['images_per_s'])}", _fmt(r["speedup_vs_today"]), ""]
        for name, r in variants.items() if name != data["baseline"]
    ]


def main(folder: str) -> None:
    """Every ``*.json`` in ``folder`` whose ``bench`` is rollout, nft_step, export, rewards or ocr, in file-name
    order; each row names its file (results from different machines sit side by side)."""
    row_builders = {"rollout": rollout_rows, "nft_step": nft_rows, "export": export_rows, "rewards": reward_rows,
                   "ocr": ocr_rows}
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {name: [] for name in row_builders}
    table = [["metric", "ours", "baseline", "ratio", "target", "file"]]
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            table.append([f"unreadable JSON ({exc.msg}, line {exc.lineno})", "", "", "", "", path.name])
            continue
        if isinstance(data, dict) and data.get("bench") in row_builders:
            found[data["bench"]].append((path.name, data))
    for name, rows_of in row_builders.items():
        if not found[name]:
            table.append([f"{name}: no result", "", "", "", "", ""])
        for file_name, data in found[name]:
            if data.get("partial"):
                table.append([f"{name}: PARTIAL (run stopped early)", "", "", "", "", file_name])
            table.extend(row + [file_name] for row in rows_of(data))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench-out")

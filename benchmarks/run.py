"""The command line: run every workload, print the table, write ``results.json`` and
``results.png``.

    python -m benchmarks [--quick] [--smoke] [--threads N] [--device cpu|cuda|hpu|auto]
                         [--dtype bfloat16|float16] [--rounds N] [--out DIR]

The exit status is 0 whether or not a target is met (this is a report); it is non-zero only
when the benchmark itself cannot run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

import hpu_autocast

from . import workloads
from .harness import Figure, Timings, interleave, make_figure
from .workloads import FULL, SMOKE, Backend, Scale

__all__ = ["Settings", "FIGURES", "TARGETS", "settings_for", "run_benchmarks", "write_results", "main"]

# (id, label, workload, ours, reference). Every figure is ours over its reference.
FIGURES = (
    ("op.passthrough.noop", "pass-through op (relu) / no-op mode", "op.passthrough", "ours", "noop"),
    ("op.passthrough.native", "pass-through op (relu) / native autocast", "op.passthrough", "ours", "native"),
    ("op.cast.noop", "cast op (mm) / no-op mode", "op.cast", "ours", "noop"),
    ("op.cast.native", "cast op (mm) / native autocast", "op.cast", "ours", "native"),
    ("step.transformer", "transformer step / native autocast", "step.transformer", "ours", "native"),
    ("step.cnn", "small CNN step / native autocast", "step.cnn", "ours", "native"),
    ("step.mlp", "24-layer tiny MLP step / native autocast", "step.mlp", "ours", "native"),
)

# The targets, stated for this project's CPU machine; other devices are reported only.
TARGETS: Dict[str, Dict[str, float]] = {
    "cpu": {"op.passthrough.noop": 1.2, "step.transformer": 1.10, "step.mlp": 1.8},
}


@dataclass(frozen=True)
class Settings:
    """How long to measure. ``iters`` is per timed block, by workload."""

    rounds: int
    warmup: int
    iters: Dict[str, int]
    scale: Scale = FULL
    mode: str = "full"  # full | quick | smoke
    workloads: Sequence[str] = field(default=("op.passthrough", "op.cast", "step.transformer", "step.cnn",
                                               "step.mlp"))


def settings_for(mode: str, rounds: Optional[int] = None) -> Settings:
    """``full`` (the figures to quote), ``quick`` (under a minute on a 2-core CPU) or ``smoke``
    (tiny models, a few seconds: checks the machinery; its numbers mean nothing)."""
    if mode == "full":
        iters = {"op.passthrough": 2000, "op.cast": 1000, "step.transformer": 2, "step.cnn": 10, "step.mlp": 10}
        return Settings(rounds or 15, 2, iters, FULL, mode)
    if mode == "quick":
        iters = {"op.passthrough": 500, "op.cast": 300, "step.transformer": 1, "step.cnn": 4, "step.mlp": 5}
        return Settings(rounds or 7, 1, iters, FULL, mode)
    if mode == "smoke":
        iters = {"op.passthrough": 20, "op.cast": 20, "step.transformer": 1, "step.cnn": 1, "step.mlp": 1}
        return Settings(rounds or 2, 1, iters, SMOKE, mode)
    raise ValueError(f"unknown mode {mode!r}")


def _variants(workload: str, backend: Backend, dtype: torch.dtype, settings: Settings):
    kind, name = workload.split(".", 1)
    if kind == "op":
        return workloads.op_variants(name, backend, dtype, settings.scale)
    return workloads.step_variants(name, backend, dtype, settings.scale)


def _git_commit() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info(backend: Backend) -> Dict[str, object]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": workloads._cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "hpu_autocast": hpu_autocast.__version__,
        "commit": _git_commit(),
        "device": backend.name,
        "device_name": backend.device_name,
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def run_benchmarks(settings: Settings, device: str = "cpu", dtype: torch.dtype = torch.bfloat16,
                   progress: bool = False) -> Dict[str, object]:
    """Run every workload of ``settings``; return the results as a JSON-ready dict."""
    backend = workloads.backend_for(workloads.resolve_device(device))
    why = workloads.check_dtype(backend, dtype)
    if why is not None:
        raise ValueError(f"--dtype {str(dtype).replace('torch.', '')} on {backend.name}: {why}")
    started = time.perf_counter()
    timings: Dict[str, Timings] = {}
    for workload in settings.workloads:
        if progress:
            print(f"  {workload} ...", file=sys.stderr, flush=True)
        torch.manual_seed(0)
        variants = _variants(workload, backend, dtype, settings)
        timings[workload] = interleave(variants, rounds=settings.rounds, iters=settings.iters[workload],
                                       warmup=settings.warmup, sync=backend.sync)
    targets = TARGETS.get(backend.name, {})
    figures: List[Figure] = [make_figure(fid, label, wl, timings[wl], ours, ref, targets.get(fid))
                             for fid, label, wl, ours, ref in FIGURES if wl in timings]
    return {
        "machine": machine_info(backend),
        "settings": {"mode": settings.mode, "rounds": settings.rounds, "warmup": settings.warmup,
                     "iters": dict(settings.iters), "dtype": str(dtype).replace("torch.", ""),
                     "policy": backend.policy, "native": f"torch.autocast({backend.autocast_type!r})",
                     "scale": asdict(settings.scale)},
        "medians_ms": {wl: {v: t.median_ms(v) for v in t.rounds} for wl, t in timings.items()},
        "figures": [{**asdict(f), "verdict": f.verdict} for f in figures],
        "wall_s": round(time.perf_counter() - started, 2),
    }


def _fmt_ms(ms: float) -> str:
    return f"{ms * 1e3:8.1f} us" if ms < 1 else f"{ms:8.2f} ms"


def _spread(ratios: Sequence[float]) -> str:
    """The middle half of the per-round ratios (first to third quartile)."""
    if len(ratios) < 2:
        return "-"
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return f"{q1:.2f}-{q3:.2f}"


def format_table(results: Dict[str, object]) -> str:
    """The figures as a fixed-width text table, then every variant's median by workload.
    ``spread`` is the middle half of the per-round ratios, a measure of the machine's noise."""
    m = results["machine"]
    s = results["settings"]
    lines = [f"hpu_autocast benchmarks: {m['device_name']} ({m['device']}), {m['cores']} cores, "
             f"threads={m['threads']}, torch {m['torch']}, {s['dtype']}, policy {s['policy']}, "
             f"{s['mode']}, {s['rounds']} rounds",
             "",
             f"{'figure':<42} {'ours':>11} {'reference':>11} {'ratio':>8} {'spread':>11} {'target':>6}  verdict"]
    for f in results["figures"]:
        target = f"{f['target']:.2f}" if f["target"] is not None else "-"
        lines.append(f"{f['label']:<42} {_fmt_ms(f['ours_ms'])} {_fmt_ms(f['ref_ms'])} {f['ratio']:7.3f}x "
                     f"{_spread(f['round_ratios']):>11} {target:>6}  {f['verdict']}")
    lines += ["", f"{'median per iteration':<22}" + "".join(f"{v:>12}" for v in workloads.VARIANTS)]
    for wl, med in results["medians_ms"].items():
        lines.append(f"{wl:<22}" + "".join(f"{_fmt_ms(med[v]) if v in med else '-':>12}" for v in workloads.VARIANTS))
    return "\n".join(lines)


def write_chart(results: Dict[str, object], path: Path) -> bool:
    """Bar chart of the ratios with their targets; ``False`` (and nothing written) without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figs = results["figures"]
    colors = {"PASS": "tab:green", "FAIL": "tab:red", "-": "tab:gray"}
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(figs) + 1.6))
    ys = range(len(figs))[::-1]
    ax.barh(list(ys), [f["ratio"] for f in figs], color=[colors[f["verdict"]] for f in figs])
    for y, f in zip(ys, figs):
        ax.text(max(f["ratio"], f["target"] or 0), y, f"  {f['ratio']:.2f}x", va="center", fontsize=8)
        if f["target"] is not None:
            ax.plot([f["target"]] * 2, [y - 0.4, y + 0.4], color="black", linewidth=2)
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([f["label"] for f in figs], fontsize=8)
    ax.set_xlabel("ratio (ours / reference), median of interleaved rounds; black tick = target")
    m = results["machine"]
    ax.set_xlim(0, 1.12 * max(max(f["ratio"], f["target"] or 0) for f in figs))
    ax.set_title(f"hpu_autocast, {m['device_name']}, {m['threads']} thread(s), torch {m['torch']}, "
                 f"{results['settings']['dtype']}, {m['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_results(results: Dict[str, object], out: Path) -> List[Path]:
    """Write ``results.json`` and (with matplotlib) ``results.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json"]
    written[0].write_text(json.dumps(results, indent=2) + "\n")
    if write_chart(results, out / "results.png"):
        written.append(out / "results.png")
    else:
        print("note: matplotlib is not installed; skipped results.png", file=sys.stderr)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="Time hpu_autocast against a no-op dispatch mode and native torch.autocast; "
                                     "write results.json and results.png.")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and iterations (under a minute)")
    parser.add_argument("--smoke", action="store_true", help="tiny models, 2 rounds: checks that it runs")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "hpu"),
                        help="auto: hpu if habana_frameworks is importable, else cuda if available, else cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"), help="lower precision")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per workload (default 15, quick 7)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads(N) first; 0 leaves torch's default (default: 1, see "
                             "docs/performance.md)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.threads < 0:
        parser.error("--threads must be 0 (torch's default) or more")
    settings = settings_for("smoke" if args.smoke else "quick" if args.quick else "full", args.rounds)
    started = time.perf_counter()
    threads = torch.get_num_threads()
    try:
        if args.threads:
            # Note: one intra-op thread by default. On a shared machine a second OpenMP thread
            # waits on a busy core and a step's time swings several-fold between runs; with one
            # thread the figures repeat. The count is printed and recorded with the results.
            torch.set_num_threads(args.threads)
        results = run_benchmarks(settings, args.device, getattr(torch, args.dtype), progress=True)
    except (RuntimeError, ValueError) as e:
        print(f"python -m benchmarks: {e}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (the tests do)
    print(format_table(results))
    written = write_results(results, args.out)
    print(f"\nwrote {', '.join(str(p) for p in written)} in {time.perf_counter() - started:.1f} s")
    return 0

"""The command line: run every workload, print the table, write ``results.json`` and
``results.png``.

    python -m benchmarks [--quick] [--smoke] [--threads N] [--device cpu|cuda|hpu|auto]
                         [--dtype bfloat16|float16] [--rounds N] [--only W1,W2] [--out DIR]

The exit status is 0 whether or not a target is met (this is a report); it is non-zero only
when the benchmark itself cannot run, or, under ``--smoke`` (which judges no figure), when the
compiled step's loss differs from native's.
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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

import hpu_autocast

from . import workloads
from .harness import Figure, Timings, interleave, make_absolute_figure, make_figure
from .workloads import FULL, QUICK, SMOKE, Backend, Scale

__all__ = ["Settings", "FIGURES", "TARGETS", "WORKLOADS", "settings_for", "run_benchmarks", "write_results", "main"]

# (id, label, workload, ours, reference). Every figure is ours over its reference, except the
# first region's, a time in seconds (workload "first.region", timed in fresh processes).
FIGURES = (
    ("op.passthrough.native", "pass-through op (add 8x8) / native", "op.passthrough", "ours", "native"),
    ("op.passthrough.noop", "pass-through op / no-op dispatch mode", "op.passthrough", "ours", "disp-mode"),
    ("op.cast.native", "cast op (mm 8x8) / native", "op.cast", "ours", "native"),
    ("op.cast.noop", "cast op / no-op dispatch mode", "op.cast", "ours", "disp-mode"),
    ("fwd.mlp", "24-layer tiny MLP forward / native", "fwd.mlp", "ours", "native"),
    ("loop.linear", "24 Linear(16) fwd, fresh input / native", "loop.linear", "ours", "native"),
    ("loop.linear-grad", "24 Linear(16) fwd+bwd, fresh input / native", "loop.linear-grad", "ours", "native"),
    ("loop.mm", "16 mm 8x8 per region, fresh inputs / native", "loop.mm", "ours", "native"),
    ("region.policy", "region enter+exit ({policy}) / native", "region", "ours", "native"),
    ("region.hpu", "region enter+exit (hpu) / native", "region", "ours-hpu", "native"),
    (
        "op.passthrough.after_hpu",
        "pass-through op after an hpu region / native",
        "op.passthrough-after-hpu",
        "ours",
        "native",
    ),
    ("first.region", "first region, fresh process (seconds)", "first.region", "ours", "native"),
    ("step.transformer", "transformer step / native", "step.transformer", "ours", "native"),
    ("step.cnn", "small CNN step / native", "step.cnn", "ours", "native"),
    ("step.mlp", "24-layer tiny MLP step / native", "step.mlp", "ours", "native"),
    ("compiled.transformer", "compiled transformer step / native", "compiled.transformer", "ours", "native"),
    ("fp8.linear", "{fp8_width}-wide linear fwd+bwd, {fp8} / bf16 region", "fp8.linear", "fp8", "bf16"),
    ("fp8.transformer", "transformer step, {fp8} / bf16 region", "fp8.transformer", "fp8", "bf16"),
    # module maps (issue 37): a map's hooks against the same region without a map
    ("map.mlp.one", "12 Linear(16) fwd, map of 1 module / no map", "map.mlp", "map-one", "ours"),
    ("map.mlp.none", "12 Linear(16) fwd, map matching none / no map", "map.mlp", "map-none", "ours"),
    ("map.mlp.native", "12 Linear(16) fwd, map of 1 module / native", "map.mlp", "map-one", "native"),
    ("map.mlp-grad.one", "12 Linear(16) fwd+bwd, map of 1 / no map", "map.mlp-grad", "map-one", "ours"),
    ("map.mlp-grad.none", "12 Linear(16) fwd+bwd, map of none / no map", "map.mlp-grad", "map-none", "ours"),
    ("map.gpt2.one", "tiny GPT-2 fwd, map of lm_head / no map", "map.gpt2", "map-one", "ours"),
    ("map.gpt2.none", "tiny GPT-2 fwd, map matching none / no map", "map.gpt2", "map-none", "ours"),
    ("map.gpt2.native", "tiny GPT-2 fwd, map of lm_head / native", "map.gpt2", "map-one", "native"),
    ("map.gpt2-grad.one", "tiny GPT-2 fwd+bwd, map of 1 / no map", "map.gpt2-grad", "map-one", "ours"),
    ("map.gpt2-grad.none", "tiny GPT-2 fwd+bwd, map of none / no map", "map.gpt2-grad", "map-none", "ours"),
)

# The targets, stated for CPU; other devices are reported, not judged. All are ratios
# except first.region (seconds).
TARGETS: Dict[str, Dict[str, float]] = {
    "cpu": {
        "op.passthrough.native": 1.6,
        "op.passthrough.noop": 1.2,
        "op.cast.native": 1.5,
        "fwd.mlp": 2.2,
        "region.policy": 3.0,
        "region.hpu": 3.0,
        "first.region": 0.5,
        "step.transformer": 1.10,
        "step.mlp": 1.8,
        "compiled.transformer": 1.10,
    },
}

#: Timed in this order: the ``hpu`` region registers that preset's kernels (``add`` among them)
#: for the life of the process, and a compiled step imports Dynamo; neither should reach the
#: eager workloads before them (docs/performance.md, "Order").
#: The module-map GPT-2 workloads come after the compiled step: transformers imports Dynamo.
WORKLOADS = (
    "op.passthrough",
    "op.cast",
    "fwd.mlp",
    "loop.linear",
    "loop.linear-grad",
    "loop.mm",
    "map.mlp",
    "map.mlp-grad",
    "step.transformer",
    "step.cnn",
    "step.mlp",
    "compiled.transformer",
    "map.gpt2",
    "map.gpt2-grad",
    "fp8.linear",
    "fp8.transformer",
    "region",
    "op.passthrough-after-hpu",
    "first.region",
)


@dataclass(frozen=True)
class Settings:
    """How long to measure. ``iters`` is per timed block, by workload; ``first.region`` is the
    number of fresh processes."""

    rounds: int
    warmup: int
    iters: Dict[str, int]
    scale: Scale = FULL
    mode: str = "full"  # full | quick | smoke
    workloads: Sequence[str] = field(default=WORKLOADS)
    #: Fewer rounds for a workload whose round takes long (a bfloat16 transformer step on a CPU
    #: without fast bfloat16 takes seconds).
    rounds_for: Dict[str, int] = field(default_factory=dict)
    #: The scale of a workload on CPU where it is not ``scale`` (none today: since issue 38 the
    #: CPU's fp8 emulation runs ``--quick``'s 1024-wide linear in milliseconds).
    cpu_scale_for: Dict[str, Scale] = field(default_factory=dict)

    def scale_of(self, workload: str, device: str) -> Scale:
        return self.cpu_scale_for.get(workload, self.scale) if device == "cpu" else self.scale

    def rounds_of(self, workload: str) -> int:
        return min(self.rounds, self.rounds_for.get(workload, self.rounds))


def settings_for(mode: str, rounds: Optional[int] = None, only: Optional[Sequence[str]] = None) -> Settings:
    """``full`` (the figures to quote), ``quick`` (fewer rounds and iterations) or ``smoke`` (tiny
    models, a compiled step on ``aot_eager``: checks the machinery; its numbers mean nothing).
    ``only`` keeps those workloads (in the usual order)."""
    keep = WORKLOADS if not only else tuple(w for w in WORKLOADS if w in only)
    if only:
        unknown = sorted(set(only) - set(WORKLOADS))
        if unknown:
            raise ValueError(f"unknown workload(s) {', '.join(unknown)}; expected some of {', '.join(WORKLOADS)}")
    if mode == "full":
        iters = {
            "op.passthrough": 2000,
            "op.cast": 1000,
            "fwd.mlp": 20,
            "loop.linear": 20,
            "loop.linear-grad": 10,
            "loop.mm": 50,
            "region": 1000,
            "step.transformer": 1,
            "step.cnn": 10,
            "step.mlp": 10,
            "compiled.transformer": 5,
            "first.region": 3,
            "op.passthrough-after-hpu": 2000,
            "fp8.linear": 1,
            "fp8.transformer": 1,
            "map.mlp": 20,
            "map.mlp-grad": 10,
            "map.gpt2": 10,
            "map.gpt2-grad": 5,
        }
        return Settings(
            rounds or 15, 1, iters, FULL, mode, keep, {"step.transformer": 7, "fp8.linear": 3, "fp8.transformer": 3}
        )
    if mode == "quick":
        iters = {
            "op.passthrough": 500,
            "op.cast": 300,
            "fwd.mlp": 5,
            "loop.linear": 5,
            "loop.linear-grad": 3,
            "loop.mm": 15,
            "region": 300,
            "step.transformer": 1,
            "step.cnn": 4,
            "step.mlp": 5,
            "compiled.transformer": 2,
            "first.region": 1,
            "op.passthrough-after-hpu": 500,
            "fp8.linear": 1,
            "fp8.transformer": 1,
            "map.mlp": 10,
            "map.mlp-grad": 5,
            "map.gpt2": 5,
            "map.gpt2-grad": 2,
        }
        return Settings(rounds or 7, 1, iters, QUICK, mode, keep, {"step.transformer": 3, "fp8.transformer": 2})
    if mode == "smoke":
        iters = {
            "op.passthrough": 20,
            "op.cast": 20,
            "fwd.mlp": 1,
            "loop.linear": 1,
            "loop.linear-grad": 1,
            "loop.mm": 2,
            "region": 20,
            "step.transformer": 1,
            "step.cnn": 1,
            "step.mlp": 1,
            "compiled.transformer": 1,
            "first.region": 1,
            "op.passthrough-after-hpu": 20,
            "fp8.linear": 1,
            "fp8.transformer": 1,
            "map.mlp": 1,
            "map.mlp-grad": 1,
            "map.gpt2": 1,
            "map.gpt2-grad": 1,
        }
        return Settings(rounds or 2, 1, iters, SMOKE, mode, keep)
    raise ValueError(f"unknown mode {mode!r}")


def _variants(workload: str, backend: Backend, dtype: torch.dtype, settings: Settings):
    if workload == "op.passthrough-after-hpu":
        return workloads.passthrough_after_hpu_variants(backend, dtype, settings.scale)
    kind, name = workload.split(".", 1) if "." in workload else (workload, "")
    if kind == "map":
        return workloads.map_variants(name, backend, dtype, settings.scale)
    if kind == "fp8":
        return workloads.fp8_variants(name, backend, settings.scale_of(workload, backend.name))
    if kind == "op":
        return workloads.op_variants(name, backend, dtype, settings.scale)
    if kind == "fwd":
        return workloads.mlp_forward_variants(backend, dtype, settings.scale)
    if kind == "region":
        return workloads.region_variants(backend, dtype, settings.scale)
    if kind == "loop":
        steps = settings.warmup + settings.rounds_of(workload) * settings.iters[workload]
        return workloads.fresh_loop_variants(name, backend, dtype, settings.scale, steps)
    return workloads.step_variants(name, backend, dtype, settings.scale)


def _git_commit() -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info(backend: Backend) -> Dict[str, object]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": workloads.cpu_model(),
        "fast_bf16": workloads.fast_bf16(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "hpu_autocast": hpu_autocast.__version__,
        "engine": hpu_autocast.ENGINE,
        "commit": _git_commit(),
        "device": backend.name,
        "device_name": backend.device_name,
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _clock(backend: Backend):
    """The CPU time of this thread on a one-thread CPU run, else the wall clock (harness note)."""
    if backend.name == "cpu" and torch.get_num_threads() == 1:
        return "thread_time", time.thread_time
    return "perf_counter", time.perf_counter


def _fp8_kind(device: str) -> str:
    """``fp8 emulated`` where the fp8 workloads' regions (``hpu``'s default recipe) multiply
    dequantized float32 matrices (a CPU: their ratio is the emulation's cost), else ``fp8``."""
    from hpu_autocast import _torch
    from hpu_autocast.policies.recipes import emulates

    return (
        "fp8 emulated"
        if emulates(hpu_autocast.get_preset("hpu").fp8, device, _torch.scaled_mm_runs_on(device))
        else "fp8"
    )


def run_benchmarks(
    settings: Settings, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, progress: bool = False
) -> Dict[str, object]:
    """Run every workload of ``settings``; return the results as a JSON-ready dict."""
    backend = workloads.backend_for(workloads.resolve_device(device))
    why = workloads.check_dtype(backend, dtype)
    if why is not None:
        raise ValueError(f"--dtype {str(dtype).replace('torch.', '')} on {backend.name}: {why}")
    started = time.perf_counter()
    clock_name, clock = _clock(backend)
    timings: Dict[str, Timings] = {}
    compiled: Optional[Dict[str, object]] = None
    first: Optional[Dict[str, object]] = None
    module_calls: Dict[str, int] = {}
    for workload in settings.workloads:
        if progress:
            print(f"  {workload} ...", file=sys.stderr, flush=True)
        torch.manual_seed(0)
        if workload == "first.region":
            first = workloads.first_region(backend, dtype, settings.iters[workload], torch.get_num_threads())
            continue
        if workload == "compiled.transformer":
            compiler = workloads.compile_backend(settings.mode != "full")
            step = workloads.CompiledStep(backend, dtype, settings.scale, compiler)
            losses = step.losses()  # compiles both variants' graphs
            compiled = {"backend": compiler, "loss": losses, "loss_equal": losses["ours"] == losses["native"]}
            variants = step.variants()
        elif workload.startswith("map."):
            mapped = _variants(workload, backend, dtype, settings)
            if mapped is None:  # the GPT-2 one without transformers
                continue
            variants, module_calls[workload] = mapped.variants, mapped.module_calls
        else:
            variants = _variants(workload, backend, dtype, settings)
        timings[workload] = interleave(
            variants,
            rounds=settings.rounds_of(workload),
            iters=settings.iters[workload],
            warmup=settings.warmup,
            sync=backend.sync,
            clock=clock,
        )
    if compiled is not None:
        torch._dynamo.reset()  # main() may be called in-process (the tests do)
    # Note: a verdict only where the figure means what its target says: on the device the
    # targets are stated for, and never for --smoke, whose tiny workloads and two rounds check
    # that everything runs (its ratios are noise: pass-through 18.8x in one run).
    targets = TARGETS.get(backend.name, {}) if settings.mode != "smoke" else {}
    figures: List[Figure] = []
    for fid, label, wl, ours, ref in FIGURES:
        label = label.format(
            policy=backend.policy, fp8_width=settings.scale_of(wl, backend.name).fp8_width, fp8=_fp8_kind(backend.name)
        )
        if wl == "first.region" and first is not None:
            figures.append(
                make_absolute_figure(
                    fid, label, wl, first["ours"]["s"], first["native"]["s"], first["ours"]["runs_s"], targets.get(fid)
                )
            )
        elif wl in timings:
            fig = make_figure(fid, label, wl, timings[wl], ours, ref, targets.get(fid))
            if wl == "compiled.transformer" and not compiled["loss_equal"] and fig.target is not None:
                fig = replace(fig, passed=False)  # faster with other numbers is no pass
            figures.append(fig)
    return {
        "machine": machine_info(backend),
        "settings": {
            "mode": settings.mode,
            "rounds": settings.rounds,
            "warmup": settings.warmup,
            "iters": dict(settings.iters),
            "dtype": str(dtype).replace("torch.", ""),
            "policy": backend.policy,
            "native": f"torch.autocast({backend.autocast_type!r})",
            "rounds_for": dict(settings.rounds_for),
            "clock": clock_name,
            "scale": asdict(settings.scale),
        },
        "medians_ms": {wl: {v: t.median_ms(v) for v in t.rounds} for wl, t in timings.items()},
        "compiled": compiled,
        "first_region": first,
        "module_maps": _module_map_costs(timings, module_calls),
        "figures": [{**asdict(f), "verdict": f.verdict} for f in figures],
        "wall_s": round(time.perf_counter() - started, 2),
    }


def _module_map_costs(timings: Dict[str, Timings], module_calls: Dict[str, int]) -> Dict[str, object]:
    """Per module-map workload: the modules one forward calls, and what each map variant adds
    over the region without a map, in microseconds per module call (medians' difference over
    the calls; ``map-one``'s includes its one override region)."""
    out: Dict[str, object] = {}
    for wl, calls in module_calls.items():
        t = timings[wl]
        out[wl] = {
            "module_calls": calls,
            "us_per_module": {
                v: round((t.median_ms(v) - t.median_ms("ours")) * 1e3 / calls, 3) for v in workloads.MAP_VARIANTS
            },
        }
    return out


def _fmt_ms(ms: float) -> str:
    return f"{ms * 1e3:8.1f} us" if ms < 1 else f"{ms:8.2f} ms"


def _spread(ratios: Sequence[float]) -> str:
    """The middle half of the per-round ratios (first to third quartile)."""
    if len(ratios) < 2:
        return "-"
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return f"{q1:.2f}-{q3:.2f}"


def _fast_bf16(flags: Optional[List[str]]) -> str:
    if flags is None:
        return "fast bfloat16: unknown"
    return f"fast bfloat16: yes ({', '.join(flags)})" if flags else "fast bfloat16: no (no avx512_bf16/amx)"


def format_table(results: Dict[str, object]) -> str:
    """The figures as a fixed-width text table, then every variant's median by workload.
    ``spread`` is the middle half of the per-round ratios, a measure of the machine's noise."""
    m = results["machine"]
    s = results["settings"]
    device = f"{m['cpu']}, {_fast_bf16(m.get('fast_bf16'))}" if m["device"] == "cpu" else m["device_name"]
    lines = [
        f"hpu_autocast benchmarks: {device} ({m['device']}), {m['cores']} cores, threads={m['threads']}, "
        f"torch {m['torch']}, engine {m.get('engine', 'python')}",
        f"  {s['dtype']}, policy {s['policy']} vs {s['native']}, {s['mode']}, {s['rounds']} rounds, "
        f"clock {s.get('clock', '?')}",
        *(
            ["  smoke: checks that every workload runs; its figures are not measurements, so none is judged"]
            if s["mode"] == "smoke"
            else []
        ),
        "",
        f"{'figure':<44} {'ours':>11} {'reference':>11} {'ratio':>8} {'spread':>11} {'target':>6}  verdict",
    ]
    for f in results["figures"]:
        if f.get("unit") == "s":
            target = f"{f['target']:.2f}s" if f["target"] is not None else "-"
            runs = f["round_ratios"]
            spread = f"{min(runs):.2f}-{max(runs):.2f}" if len(runs) > 1 else "-"
            lines.append(
                f"{f['label']:<44} {_fmt_ms(f['ours_ms'])} {_fmt_ms(f['ref_ms'])} {f['ratio']:7.3f}s "
                f"{spread:>11} {target:>6}  {f['verdict']}"
            )
            continue
        target = f"{f['target']:.2f}" if f["target"] is not None else "-"
        lines.append(
            f"{f['label']:<44} {_fmt_ms(f['ours_ms'])} {_fmt_ms(f['ref_ms'])} {f['ratio']:7.3f}x "
            f"{_spread(f['round_ratios']):>11} {target:>6}  {f['verdict']}"
        )
    compiled = results.get("compiled")
    if compiled:
        loss = compiled["loss"]
        lines.append(
            f"  compiled step: torch.compile(backend={compiled['backend']!r}); loss under the region "
            f"{loss['ours']!r}, under native {loss['native']!r}: "
            f"{'identical' if compiled['loss_equal'] else 'DIFFERENT'}"
        )
    first = results.get("first_region")
    if first:
        lines.append(
            f"  first region: ours {first['ours']['s']:.3f} s, native {first['native']['s']:.3f} s "
            f"(median of {len(first['ours']['runs_s'])} processes); torch._dynamo imported by it: "
            f"{'yes' if first['ours']['dynamo_imported'] else 'no'}"
        )
    maps = results.get("module_maps")
    if maps:
        lines.append(
            "  module maps, added per module call over a region without a map: "
            + "; ".join(
                f"{wl} ({c['module_calls']} modules) "
                + ", ".join(f"{v} {us:+.2f} us" for v, us in c["us_per_module"].items())
                for wl, c in maps.items()
            )
        )
    columns = [
        v
        for v in workloads.VARIANTS + workloads.MAP_VARIANTS + workloads.FP8_VARIANTS
        if any(v in med for med in results["medians_ms"].values())
    ]
    lines += ["", f"{'median per iteration':<26}" + "".join(f"{v:>12}" for v in columns)]
    for wl, med in results["medians_ms"].items():
        lines.append(f"{wl:<26}" + "".join(f"{_fmt_ms(med[v]) if v in med else '-':>12}" for v in columns))
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
    figs = [f for f in results["figures"] if f.get("unit", "x") == "x"]  # ratios only
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
    ax.set_title(
        f"hpu_autocast, {m['device_name']}, {m['threads']} thread(s), torch {m['torch']}, "
        f"{results['settings']['dtype']}, {m['date'][:10]}",
        fontsize=9,
    )
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
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time hpu_autocast against native torch.autocast and the floors "
        "(plain, no-op function and dispatch modes); write results.json "
        "and results.png.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer rounds and iterations, the compiled step on aot_eager, the fp8 linear 1024 wide (under a minute)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny models, 2 rounds: checks that it runs (no verdicts; exit 1 if the compiled "
        "step's loss differs from native's)",
    )
    parser.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda", "hpu"),
        help="auto: hpu if habana_frameworks is importable, else cuda if available, else cpu",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"), help="lower precision")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per workload (default 15, quick 7)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads(N) first; 0 leaves torch's default (default: 1, see docs/performance.md)",
    )
    parser.add_argument("--only", default=None, help=f"comma-separated workloads to run (of {', '.join(WORKLOADS)})")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.threads < 0:
        parser.error("--threads must be 0 (torch's default) or more")
    only = [w.strip() for w in args.only.split(",") if w.strip()] if args.only else None
    try:
        settings = settings_for("smoke" if args.smoke else "quick" if args.quick else "full", args.rounds, only)
    except ValueError as e:
        parser.error(str(e))
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
    compiled = results.get("compiled")
    if settings.mode == "smoke" and compiled and not compiled["loss_equal"]:
        # Smoke judges no speed, but a compiled step that computes another loss did not run right.
        print("python -m benchmarks: the compiled step's loss differs from native's", file=sys.stderr)
        return 1
    return 0

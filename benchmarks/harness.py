"""Timing and judging: interleaved rounds, medians, ratios, PASS/FAIL.

Note: a figure is the median of per-round ratios, not the ratio of two medians. Both variants
of a round run back to back, so a slow spell on a shared machine (another process, frequency
scaling) slows both and mostly cancels in their ratio; the median then drops the rounds where
it did not. The per-variant medians are reported too, for scale.

Note: on a CPU run with one intra-op thread the clock is ``time.thread_time``, the CPU time of
the thread that runs the ops, kernels included: time spent waiting for a core that another
process holds is not counted, which a wall clock on a shared machine would add to whichever
variant it fell on. With more threads (OpenMP workers do part of the work) or a device that
runs asynchronously (CUDA, HPU) it is the wall clock, ``time.perf_counter``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

__all__ = ["Figure", "Timings", "interleave", "judge", "verdict", "make_figure", "make_absolute_figure"]

# A variant runs its workload ``n`` times: ``run(n)``.
Runner = Callable[[int], None]


@dataclass(frozen=True)
class Timings:
    """Per-iteration seconds of each variant, one entry per round (same order for all)."""

    rounds: Dict[str, List[float]]

    def median_ms(self, variant: str) -> float:
        return statistics.median(self.rounds[variant]) * 1e3

    def ratio(self, ours: str, ref: str) -> float:
        """Median over rounds of ``ours / ref`` measured in the same round."""
        return statistics.median(a / b for a, b in zip(self.rounds[ours], self.rounds[ref]))


def interleave(
    variants: Dict[str, Runner],
    *,
    rounds: int,
    iters: int,
    warmup: int,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> Timings:
    """Time every variant ``rounds`` times, ``iters`` iterations each, interleaved.

    Each round runs all variants once, starting from a different one each round (a rotation),
    so neither drift nor a fixed "second in line" position favours any of them. ``sync`` waits
    for the device (CUDA, HPU) before the clock is read; ``clock`` is the clock (see the note at
    the top).
    """
    names = list(variants)
    for name in names:
        variants[name](warmup)
    sync()
    out: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            sync()
            start = clock()
            variants[name](iters)
            sync()
            out[name].append((clock() - start) / iters)
    return Timings(out)


def judge(ratio: float, target: Optional[float]) -> Optional[bool]:
    """``True`` when ``ratio`` meets ``target`` (lower is better, equal passes), ``None`` when
    the figure has no target. A ratio that is not a positive finite number never passes."""
    if target is None:
        return None
    if not (math.isfinite(ratio) and ratio > 0):
        return False
    return ratio <= target


def verdict(passed: Optional[bool]) -> str:
    return "-" if passed is None else ("PASS" if passed else "FAIL")


@dataclass(frozen=True)
class Figure:
    """One reported number: ``ours`` against ``ref`` on one workload. ``unit`` is ``"x"`` for a
    ratio judged against its target, ``"s"`` for a time in seconds judged as such (``ratio`` is
    then ``ours_ms / 1000``, ``round_ratios`` each run's seconds, and ``ref_ms`` is shown for
    scale)."""

    id: str
    label: str
    workload: str
    ours: str
    ref: str
    ours_ms: float
    ref_ms: float
    ratio: float
    round_ratios: List[float]
    target: Optional[float]
    passed: Optional[bool]
    unit: str = "x"

    @property
    def verdict(self) -> str:
        return verdict(self.passed)


def make_figure(
    fid: str, label: str, workload: str, timings: Timings, ours: str, ref: str, target: Optional[float]
) -> Figure:
    ratio = timings.ratio(ours, ref)
    round_ratios = [a / b for a, b in zip(timings.rounds[ours], timings.rounds[ref])]
    return Figure(
        fid,
        label,
        workload,
        ours,
        ref,
        timings.median_ms(ours),
        timings.median_ms(ref),
        ratio,
        round_ratios,
        target,
        judge(ratio, target),
    )


def make_absolute_figure(
    fid: str, label: str, workload: str, ours_s: float, ref_s: float, runs_s: List[float], target_s: Optional[float]
) -> Figure:
    """A figure that is a time (seconds), not a ratio: the first region of a fresh process."""
    return Figure(
        fid,
        label,
        workload,
        "ours",
        "native",
        ours_s * 1e3,
        ref_s * 1e3,
        ours_s,
        list(runs_s),
        target_s,
        judge(ours_s, target_s),
        unit="s",
    )

"""Benchmarks of ``hpu_autocast`` against native ``torch.autocast`` and the floors (no autocast,
a no-op ``TorchFunctionMode``, a no-op ``TorchDispatchMode``).

    python -m benchmarks [--quick] [--smoke] [--threads N] [--device cpu|cuda|hpu|auto]
                         [--dtype bfloat16|float16] [--rounds N] [--only W1,W2] [--out DIR]

Every figure is a ratio of two variants timed side by side in one process, interleaved within
each round, and reduced to the median over rounds. See docs/performance.md.
"""

from .harness import Figure, judge, verdict
from .run import main, run_benchmarks

__all__ = ["Figure", "judge", "verdict", "main", "run_benchmarks"]

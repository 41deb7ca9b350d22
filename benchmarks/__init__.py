"""Benchmarks of ``hpu_autocast`` against the floor of any Python interceptor and against
native ``torch.autocast``.

    python -m benchmarks [--quick] [--smoke] [--threads N] [--device cpu|cuda|hpu|auto]
                         [--dtype bfloat16|float16] [--rounds N] [--out DIR]

Every figure is a ratio of two variants timed side by side in one process, interleaved within
each round, and reduced to the median over rounds. See docs/performance.md.
"""

from .harness import Figure, judge, verdict
from .run import main, run_benchmarks

__all__ = ["Figure", "judge", "verdict", "main", "run_benchmarks"]

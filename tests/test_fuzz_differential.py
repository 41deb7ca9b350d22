"""Issue 18's differential fuzzer: random short programs run under native
``torch.autocast("cpu")`` and under ``HpuAutocastMode(policy="torch-cpu")`` must leave equal
traces, bit for bit (outputs, gradients, exceptions, guard answers). The programs, their
interpreter and the comparison are in tests/_fuzz.py.

CI runs a bounded profile from a fixed seed (the same examples on every run, no example
database; hypothesis's ``derandomize`` stream met none of issue 18's differences in its first
100 programs, where a seeded run meets one in ten).
Environment variables (docs/testing.md):

* ``HPU_AUTOCAST_FUZZ_EXAMPLES=2000``: the number of programs (default 100);
* ``HPU_AUTOCAST_FUZZ_SEED=7``: a random run from this seed instead of the fixed one;
* ``HPU_AUTOCAST_FUZZ_EXCLUDE=disable_casts,mode_off``: ops, events or block kinds to leave
  out, to hunt past a difference already known.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings

import _fuzz
from _fuzz import Block, Event, Op, Program, describe, difference, minimise, programs as fuzz_programs

EXAMPLES = int(os.environ.get("HPU_AUTOCAST_FUZZ_EXAMPLES", "100"))
SEED = os.environ.get("HPU_AUTOCAST_FUZZ_SEED")
EXCLUDE = [n for n in os.environ.get("HPU_AUTOCAST_FUZZ_EXCLUDE", "").split(",") if n]
_unknown = [n for n in EXCLUDE if n not in (*_fuzz.OPS, *_fuzz.EVENTS, *_fuzz.KINDS)]
if _unknown:
    raise ValueError(f"HPU_AUTOCAST_FUZZ_EXCLUDE: unknown names {_unknown}; accepted: the ops, events and "
                     f"block kinds of tests/_fuzz.py ({', '.join([*_fuzz.OPS, *_fuzz.EVENTS, *_fuzz.KINDS])})")

# No explain phase: it reruns a failing program a thousand times to annotate it (70 s here).
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

programs = fuzz_programs(exclude=EXCLUDE)


def _final() -> bool:
    """Whether hypothesis is replaying the example it reports (minimising only then)."""
    from hypothesis.control import current_build_context
    return getattr(current_build_context(), "is_final", True)


@seed(int(SEED or 0))  # (seed 0 is CI's)
@FUZZ
@given(program=programs)
def test_a_torch_cpu_region_runs_programs_as_native_autocast_does(program):
    found = difference(program)
    if found is None:
        return
    kind, diff, ours = found
    message = f"{diff}\n\nthe program, as it ran under the package:\n{describe(program, ours)}"
    if _final():
        smaller = minimise(program, kind)
        kind, diff, ours = difference(smaller)
        message += f"\n\nminimised ({kind}): {diff}\n{describe(smaller, ours)}"
    raise AssertionError(message)

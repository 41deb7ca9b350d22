"""Issue 18's differential fuzzer: random short programs run under native
``torch.autocast("cpu")`` and under ``HpuAutocastMode(policy="torch-cpu")`` must leave equal
traces, bit for bit (outputs, gradients, exceptions, guard answers). The programs, their
interpreter and the comparison are in tests/_fuzz.py.

CI runs a bounded, derandomized profile (the same examples on every run, no example database);
``HPU_AUTOCAST_FUZZ_EXAMPLES=2000`` runs a longer one (docs/testing.md).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, given, settings

from _fuzz import describe, difference, minimise, programs as fuzz_programs

EXAMPLES = int(os.environ.get("HPU_AUTOCAST_FUZZ_EXAMPLES", "60"))
# No explain phase: it reruns a failing program a thousand times to annotate it (70 s here).
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

programs = fuzz_programs()


def _final() -> bool:
    """Whether hypothesis is replaying the example it reports (minimising only then)."""
    from hypothesis.control import current_build_context
    return getattr(current_build_context(), "is_final", True)


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

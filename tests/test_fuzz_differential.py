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

from _fuzz import describe, first_difference, programs as fuzz_programs, run_both

EXAMPLES = int(os.environ.get("HPU_AUTOCAST_FUZZ_EXAMPLES", "60"))
# No explain phase: it reruns a failing program a thousand times to annotate it (70 s here).
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

programs = fuzz_programs()


@FUZZ
@given(program=programs)
def test_a_torch_cpu_region_runs_programs_as_native_autocast_does(program):
    native, ours = run_both(program)
    diff = first_difference(native.trace, ours.trace)
    assert diff is None, f"{diff}\n\nthe program, as it ran under the package:\n{describe(program, ours)}"

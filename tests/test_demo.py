"""The README's first command ends in ``python examples/demo.py``: a few training steps under the
mode, then the precision report. It must run quietly and say what it measured."""

import os
import pathlib
import subprocess
import sys

import hpu_autocast
from hpu_autocast._facts import devices as _devices

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = pathlib.Path(hpu_autocast.__file__).resolve().parents[1]


def test_the_demo_trains_and_reports_under_its_policy():
    # Not under the suite's GPU emulation (--as-if-cuda, Note: the test suite's GPU emulation):
    # the demo puts its model on the machine's device and leaves its region to the default, which
    # agree on every machine; the emulation would move the region to cuda and leave the tensors
    # on CPU. On a GPU machine the demo runs on CUDA tensors, as this test then does.
    env = {k: v for k, v in os.environ.items() if k != _devices.AS_IF_CUDA_ENV}
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--steps", "2"],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(SRC)},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr == ""  # no warning on a plain run
    lines = run.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["step 0", "step 1"]
    # Was "(torch.float32)" beside a bfloat16 run: the loss's dtype alone, which is float32.
    assert all(line.endswith("(logits bfloat16, loss float32)") for line in lines[:2]), lines[:2]
    # The report's header named neither ("policy ?, dtype ?") before the demo gave its recorder
    # them; and it is said once (the demo's own line said policy, dtype and engine again).
    assert f"hpu_autocast precision report: policy hpu, dtype bf16, engine {hpu_autocast.ENGINE}" in lines
    assert sum("policy" in line for line in lines) == 1, lines
    assert any(line.startswith("aten.linear.default") and " lower " in line for line in lines)

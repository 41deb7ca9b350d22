"""The integration examples run: a transformers ``Trainer`` whose autocast is ``HpuAutocastMode``
(``examples/trainer_example.py``) and a plain loop under ``accelerate.Accelerator``
(``examples/accelerate_example.py``), a few steps each. Under the native preset of the device
each also matches, loss for loss, the same run with native ``torch.autocast`` in the same place.

Skipped where the ``models`` extra (``transformers``, ``accelerate``) is not installed.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import runpy

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
# The device Trainer and accelerate pick here, and the preset that is native autocast's there.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NATIVE_PRESET = f"torch-{DEVICE}"


def _example(name: str) -> dict:
    return runpy.run_path(os.path.join(EXAMPLES, name), run_name="example")


def _printed_losses(text: str) -> list:
    return [float(x) for x in re.findall(r"^step \d+: loss (\S+)$", text, flags=re.M)]


def test_trainer_example_runs(tmp_path, capsys):
    losses = _example("trainer_example.py")["main"](["--steps", "3", "--output-dir", str(tmp_path)])
    printed = _printed_losses(capsys.readouterr().out)
    assert len(losses) == len(printed) == 3 and all(math.isfinite(x) for x in losses)
    assert printed == [round(x, 4) for x in losses]
    assert not any(p.name.startswith("checkpoint") for p in tmp_path.iterdir())  # save_strategy="no"


def test_trainer_example_matches_native_autocast(tmp_path):
    # The control: the same Trainer with torch.autocast returned from the same hook.
    example = _example("trainer_example.py")

    class NativeAutocastTrainer(example["HpuAutocastTrainer"]):
        def autocast_smart_context_manager(self, cache_enabled=True):
            return torch.autocast(DEVICE, dtype=self.autocast_dtype, cache_enabled=cache_enabled)

    class Float32Trainer(example["HpuAutocastTrainer"]):
        def autocast_smart_context_manager(self, cache_enabled=True):
            return contextlib.nullcontext()

    ours = example["train"](3, NATIVE_PRESET, str(tmp_path / "ours"))
    native = example["train"](3, NATIVE_PRESET, str(tmp_path / "native"), trainer_cls=NativeAutocastTrainer)
    plain = example["train"](3, NATIVE_PRESET, str(tmp_path / "plain"), trainer_cls=Float32Trainer)
    assert ours == native
    assert ours != plain  # the hook is in force: the region changes the losses


def test_accelerate_example_runs(capsys):
    losses = _example("accelerate_example.py")["main"](["--steps", "3"])
    printed = _printed_losses(capsys.readouterr().out)
    assert len(losses) == len(printed) == 3 and all(math.isfinite(x) for x in losses)
    assert printed == [round(x, 4) for x in losses]


def test_accelerate_example_matches_native_autocast():
    from hpu_autocast import HpuAutocastMode

    train = _example("accelerate_example.py")["train"]
    ours = train(3, lambda: HpuAutocastMode(torch.bfloat16, policy=NATIVE_PRESET))
    native = train(3, lambda: torch.autocast(DEVICE, dtype=torch.bfloat16))
    assert ours == native
    assert ours != train(3, contextlib.nullcontext)  # the region changes the losses

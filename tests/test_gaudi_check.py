"""``hpu-autocast gaudi-check`` (issue 29), run as a Gaudi user runs it, against the stand-in.

A ``habana_frameworks`` package on ``PYTHONPATH`` whose import installs the stand-in plays the
bridge for every process the command starts (as ``import torch`` loads the real one on a
Gaudi): so the command's versions, its test run (the bridge imported first) and the benchmark
see a loaded bridge. The stand-in has no device, so the benchmark runs on the CPU here, with
``--smoke`` and one workload, and the tests are a small selection.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpu_autocast import cli
from hpu_autocast.cli import gaudi_check as _gaudi_check

ROOT = Path(__file__).resolve().parents[1]

_BRIDGE = """\
import pytest, _fake_habana
_fake_habana.install(pytest.MonkeyPatch(), lazy=False, device_name="GAUDI2")
"""


@pytest.mark.engine_independent
def test_gaudi_check_prints_a_block_to_paste(tmp_path):
    (tmp_path / "habana_frameworks").mkdir()
    (tmp_path / "habana_frameworks" / "__init__.py").write_text(_BRIDGE)
    path = [str(tmp_path), str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpu_autocast",
            "gaudi-check",
            "--smoke",
            "--device",
            "cpu",
            "--only",
            "op.cast",
            "-k",
            "stand_in or reach or mlp",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.startswith("hpu-autocast gaudi-check: tests passed, benchmark ran.")
    block = out[out.index("```text\n") + 8 : out.rindex("```")]
    assert f"torch {torch.__version__}, Python" in block
    assert "habana_frameworks 0.0+stand-in; device GAUDI2; mode eager" in block  # the stand-in's
    assert re.search(r"^\d+ passed.* in [\d.]+s$", block, re.M) and " failed" not in block
    assert "test_hpu_fake_tensors.py" in block and "-k stand_in or reach or mlp" in block
    assert "$ python -m benchmarks --device cpu --smoke --only op.cast" in block
    assert "cast op (mm 8x8) / native" in block  # the benchmark's table


def test_gaudi_check_outside_a_checkout_says_where_to_run_it(monkeypatch, capsys):
    monkeypatch.setattr(_gaudi_check, "repo_root", lambda: None)
    assert cli.main(["gaudi-check"]) == 2
    assert "source checkout" in capsys.readouterr().err

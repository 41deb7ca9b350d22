"""``hpu-autocast gaudi-check``: what a Gaudi user runs to check this package on their machine,
and pastes into an issue (docs/hpu.md, "Checking a Gaudi machine").

    python -m hpu_autocast gaudi-check [--smoke] [--device hpu|cpu|cuda|auto] [-k EXPR] [--only W1,W2]

It prints one fenced block: the versions (Python, torch, this package and its engine, Gaudi's
bridge, the device's name, lazy or eager mode), the summary of the HPU tests (``HPU_TESTS``,
run by pytest in a fresh process that loads the bridge first, so they run against the real
``AutocastHPU`` kernels), and the table of ``python -m benchmarks --device hpu`` (``--quick``;
``--smoke`` for a run that only checks it works). The tests and benchmarks are the repository's:
it runs from a source checkout. Exit status 0 when both passed, 1 when either failed, 2 when
they cannot be found.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

__all__ = ["HPU_TESTS", "add_parser", "repo_root", "versions"]

#: The tests that say something about Gaudi and hold where its bridge is loaded: the ``hpu``
#: preset's calls against the bridge's own AutocastHPU kernels (on fake HPU tensors), list files
#: as the bridge reads them, and the glue (against the stand-in: skipped where the bridge is
#: loaded). Not test_hpu_preset.py nor test_gaudi_config.py: they run CPU tensors in ``hpu``
#: regions, whose device is ``hpu`` once the bridge is loaded.
HPU_TESTS = ("tests/test_hpu_fake_tensors.py", "tests/test_hpu_list_files.py", "tests/test_hpu_glue.py")

# Note: the bridge is imported before pytest starts. On a Gaudi, torch's backend autoload
# usually imports it with torch; where it does not, a test's stand-in would otherwise register
# on AutocastHPU first, and the bridge's own registration would then fail.
_PYTEST_BOOT = """
import importlib.util, sys
if importlib.util.find_spec("habana_frameworks") is not None:
    import habana_frameworks.torch.core
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""

_SUMMARY = re.compile(r"^=* ?\d+ (passed|failed|error|skipped|xfailed|xpassed|deselected)\b.* in [\d.]+s")


def repo_root() -> Optional[Path]:
    """The checkout holding ``tests/`` and ``benchmarks/``: this package's, else the working
    directory; ``None`` when neither has them (an installed copy)."""
    for root in (Path(__file__).resolve().parents[3], Path.cwd()):
        if (root / "tests").is_dir() and (root / "benchmarks").is_dir():
            return root
    return None


def _bridge() -> Tuple[str, str, str]:
    """Gaudi's bridge: its version, the device's name and the execution mode."""
    from .. import hpu

    if not hpu.hpu_importable():
        return "not installed", "-", "-"
    device = hpu.default_device()  # imports habana_frameworks.torch.core
    module = sys.modules.get("habana_frameworks.torch")
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("habana-torch-plugin")
        except Exception:  # noqa: BLE001  (any failure: the version is unknown)
            version = "unknown"
    import torch

    torch_hpu = getattr(torch, "hpu", None)  # registered by the bridge's core
    name = torch_hpu.get_device_name() if device == "hpu" and torch_hpu is not None else f"none ({device})"
    lazy = os.environ.get("PT_HPU_LAZY_MODE", "unset")
    return str(version), name, f"{'lazy' if hpu.lazy_mode() else 'eager'} (PT_HPU_LAZY_MODE={lazy})"


def versions() -> List[str]:
    """One line per thing the result depends on."""
    import platform

    import torch

    from .. import __version__
    from .._engine import core as _core

    bridge, device, mode = _bridge()
    return [
        f"hpu_autocast {__version__}, engine {_core.ENGINE} ({_core.REASON})",
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.platform()}",
        f"habana_frameworks {bridge}; device {device}; mode {mode}",
    ]


def _run(cmd: List[str], root: Path) -> Tuple[int, str]:
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def _pytest(root: Path, keyword: Optional[str]) -> Tuple[int, List[str]]:
    """The HPU tests' summary line and the short summary of what failed or passed unexpectedly."""
    args = [*HPU_TESTS, "-o", "addopts=", "-q", "-rfEX", "-p", "no:cacheprovider"]
    if keyword:
        args += ["-k", keyword]
    rc, out = _run([sys.executable, "-c", _PYTEST_BOOT, *args], root)
    lines = out.splitlines()
    shown = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR ", "XPASS "))]
    shown += [ln.strip("= ") for ln in lines if _SUMMARY.match(ln)] or lines[-20:]
    return rc, ["$ pytest " + " ".join(args), *shown]


def _benchmark(root: Path, device: str, smoke: bool, only: Optional[str]) -> Tuple[int, List[str]]:
    """The benchmark's table (its progress lines and written files left out)."""
    with tempfile.TemporaryDirectory() as out:
        args = ["-m", "benchmarks", "--device", device, "--smoke" if smoke else "--quick", "--out", out]
        if only:
            args += ["--only", only]
        r = subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True)
    table = [ln for ln in r.stdout.splitlines() if not ln.startswith("wrote ")]
    if r.returncode != 0:
        table += r.stderr.splitlines()[-20:]
    return r.returncode, ["$ python " + " ".join(a for a in args if a != out and a != "--out"), *table]


def _cmd_gaudi_check(ns: argparse.Namespace) -> int:
    root = repo_root()
    if root is None:
        print(
            "error: gaudi-check runs the repository's tests/ and benchmarks/; run it in a source "
            "checkout of hpu_autocast (git clone, then pip install -e .)",
            file=sys.stderr,
        )
        return 2
    head = versions()
    print("\n".join(head), file=sys.stderr)  # at once: the tests take a while
    tests_rc, tests = _pytest(root, ns.keyword)
    bench_rc, bench = _benchmark(root, ns.device, ns.smoke, ns.only)
    verdict = f"tests {'passed' if tests_rc == 0 else 'FAILED'}, benchmark {'ran' if bench_rc == 0 else 'FAILED'}"
    print(f"hpu-autocast gaudi-check: {verdict}. Paste the block below into the issue.\n")
    print("```text\n" + "\n".join([*head, "", *tests, "", *bench]) + "\n```")
    return 0 if tests_rc == bench_rc == 0 else 1


def add_parser(sub) -> None:
    p = sub.add_parser(
        "gaudi-check",
        help="run the HPU tests and benchmarks on this machine and print a block to paste into an issue (docs/hpu.md)",
    )
    p.add_argument("--smoke", action="store_true", help="the benchmark's --smoke (checks it runs) instead of --quick")
    p.add_argument(
        "--device", default="hpu", choices=("hpu", "cpu", "cuda", "auto"), help="the benchmark's device (default: hpu)"
    )
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="run only the HPU tests pytest -k EXPR selects")
    p.add_argument("--only", metavar="W1,W2", help="run only these benchmark workloads (python -m benchmarks --only)")
    p.set_defaults(func=_cmd_gaudi_check)

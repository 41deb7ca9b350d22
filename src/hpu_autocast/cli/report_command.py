"""``hpu-autocast report SCRIPT.py [args]``: run an unmodified script under the mode and print
the precision report when it ends.

``cli/__init__.py`` registers the subcommand with ``add_parser(subparsers)``; ``python -m
hpu_autocast.cli.report_command report ...`` runs it on its own.
"""

from __future__ import annotations

import argparse
import collections
import os
import runpy
import sys
import traceback
from typing import List, Optional

import torch

from .._facts.devices import REGION_DEVICE_TYPES
from ..policies.builder import policy_from_files

__all__ = [
    "add_parser",
    "add_script_arguments",
    "check_script_arguments",
    "policy_of",
    "UsageError",
    "Parser",
    "DTYPES",
    "run",
    "main",
]


class UsageError(Exception):
    """A command given what it cannot run (an unknown preset, a missing script): exit status 2
    and one line on stderr, before the script runs."""


class Parser(argparse.ArgumentParser):
    """``argparse``'s parser, whose usage errors are one line on stderr (exit status 2), naming the
    command and where its help is, as ``UsageError``s are (the subcommands' parsers are of this
    class too: ``add_subparsers`` makes its parsers of the parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "f16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8": torch.float8_e4m3fn,
}


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``report`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "report",
        help="run a script under the mode and print what ran in which dtype",
        description="Run SCRIPT.py (with its arguments) under HpuAutocastMode and print the precision report at exit.",
    )
    add_script_arguments(p, "the Python script to run")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the report as Markdown")
    p.add_argument("--plot", metavar="PATH", help="also draw the report (PNG or SVG; needs matplotlib)")
    p.set_defaults(func=run)
    return p


def add_script_arguments(p: argparse.ArgumentParser, script_help: str) -> None:
    """The arguments of a command that runs a script under a policy (``report``, ``tune``): the
    script and its arguments, the preset, the dtype and list files replacing the preset's lists
    (read by ``policy_of``), and the region's device type."""
    p.add_argument("script", help=script_help)
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script (sys.argv)")
    p.add_argument("--preset", default="hpu", help="policy preset (default: hpu)")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=sorted(DTYPES),
        help="lower-precision dtype (default: bfloat16; fp8: the policy's GEMMs in float8_e4m3fn)",
    )
    p.add_argument("--lower-list", metavar="FILE", help="file of op names that run in lower precision")
    p.add_argument("--fp32-list", metavar="FILE", help="file of op names that run in float32")
    # A script's tensors need not be on the machine's device (a CPU script on a GPU machine).
    p.add_argument(
        "--device-type",
        choices=REGION_DEVICE_TYPES,
        default=None,
        help="the tensors the region casts (default: the preset's device, else hpu, cuda or cpu, "
        "the device this machine runs on)",
    )


def check_script_arguments(ns: argparse.Namespace) -> None:
    """Raise ``UsageError`` for what would make the command fail once started: the preset is not
    one, the script is not a file."""
    from ..policies.presets import preset_names

    if ns.preset not in preset_names():
        raise UsageError(f"--preset {ns.preset!r} is not a preset; valid presets: {', '.join(preset_names())}")
    if not os.path.isfile(ns.script):
        what = "is a directory" if os.path.isdir(ns.script) else "does not exist"
        raise UsageError(f"script {ns.script!r} {what}; give the path of a Python file")


def policy_of(ns: argparse.Namespace):
    """The policy ``add_script_arguments``' flags name: the preset, or it with list files."""
    if ns.lower_list or ns.fp32_list:
        return policy_from_files(ns.preset, lower=ns.lower_list, fp32=ns.fp32_list)
    return ns.preset


def run(ns: argparse.Namespace) -> int:
    """Run the script under the mode; print the report (also when the script fails).

    The script ends as it would under ``python SCRIPT.py``: ``sys.exit(n)`` gives status ``n``,
    ``sys.exit("message")`` prints the message to stderr and gives 1, an exception prints its
    traceback (from the script's frames on) to stderr and gives 1; the report is printed and
    written first. ``KeyboardInterrupt`` propagates (after the report)."""
    from ..mode import HpuAutocastMode, watch
    from ..report import Recorder

    check_script_arguments(ns)
    if ns.plot:
        _check_plot(ns.plot)
    rec = Recorder()
    # Note: the whole script is one region, optimizer steps included. The cast cache assumes
    # weights do not change inside a region (as torch.autocast's does), so it is off here.
    mode = HpuAutocastMode(
        DTYPES[ns.dtype], policy=policy_of(ns), device_type=ns.device_type, cache_enabled=False, observer=rec
    )
    rec.policy, rec.dtype = mode.policy.name, mode.dtype  # the header, even if the script fails early
    argv, sys.argv = sys.argv, [ns.script, *ns.args]
    code, message, error = 0, None, None
    opened: list = []
    try:
        # Note: a region the script opens itself is the innermost there, and only its own
        # observer saw its calls (its forward was missing from the report): watch makes each
        # such region report here too; the runner's own region is entered first, outside it.
        with mode, watch(rec) as opened:
            try:
                # As the interpreter does (3.9+), the script's __file__ is absolute; argv[0] is as given.
                runpy.run_path(os.path.abspath(ns.script), run_name="__main__")
            except SystemExit as e:
                code, message = _exit_status(e.code)
            except Exception as e:  # the script's own error: reported as Python reports it
                code, error = 1, e
    finally:
        sys.argv = argv
        report = rec.report()
        print(report)
        if opened:
            kinds = ", ".join(
                f"{n} x {p} ({str(d).replace('torch.', '')})" for (p, d), n in collections.Counter(opened).items()
            )
            print(
                f"\nnote: this report includes the {len(opened)} region(s) the script opened itself, each with "
                f"its own policy and dtype: {kinds}"
            )
    if ns.json:
        with open(ns.json, "w") as f:
            f.write(report.to_json() + "\n")
    if ns.markdown:
        with open(ns.markdown, "w") as f:
            f.write(report.to_markdown() + "\n")
    if ns.plot:
        report.plot(ns.plot)
    if error is not None:
        _print_script_traceback(error)
    elif message is not None:
        print(message, file=sys.stderr)
    return code


def _check_plot(path: str) -> None:
    """``--plot``'s needs, asked before the script runs (not after a long run): matplotlib, and a
    suffix it writes."""
    if os.path.splitext(path)[1].lower() not in (".png", ".svg"):
        raise UsageError(f"--plot {path!r}: give a .png or .svg path")
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None


def _exit_status(code) -> tuple:
    """(status, message) of ``sys.exit(code)``, as the interpreter turns it into an exit: ``None``
    is 0, an int is itself, anything else is printed to stderr and gives 1."""
    if code is None:
        return 0, None
    if isinstance(code, int):
        return code, None
    return 1, code


def _print_script_traceback(exc: BaseException) -> None:
    """The traceback the interpreter would print: the runner's own frames (this module's and
    runpy's) left out."""
    tb = exc.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__ or tb.tb_frame.f_globals.get("__name__") == "runpy"
    ):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    parser = Parser(prog="python -m hpu_autocast.cli.report_command")
    add_parser(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(argv)
    try:
        return ns.func(ns)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

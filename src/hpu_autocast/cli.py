"""The ``hpu-autocast`` / ``python -m hpu_autocast`` command line: one parser, one sub-command per job."""

from __future__ import annotations

import argparse
from typing import List, Optional

from . import _report_cli

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpu-autocast", description="Mixed-precision policies for PyTorch.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _report_cli.add_parser(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    ns = build_parser().parse_args(argv)
    return ns.func(ns)

"""``hpu-autocast tune SCRIPT.py [args]``: tune a policy for the function a script names.

The script is run as a module (``__name__`` is ``"__hpu_autocast_tune__"``, so its ``if __name__
== "__main__":`` block does not run), with ``sys.argv = [SCRIPT.py, args...]``, and must define

    def tune_target():
        return fn, inputs              # or (fn, inputs, metric)

``fn(*inputs)`` is what ``hpu_autocast.tune`` runs (``inputs``: a tuple of positional
arguments, or one tensor); ``metric(reference, outputs) -> float`` replaces the default error.
``--per-module`` tunes a module map over the modules ``fn`` calls (``tune(per_module=True)``).
``cli/__init__.py`` registers the subcommand with ``add_parser(subparsers)``.
"""

from __future__ import annotations

import argparse
import ast
import os
import runpy
import sys
from typing import Callable, Optional, Tuple

import torch

from .report_command import DTYPES, add_script_arguments, check_script_arguments, policy_of

__all__ = ["add_parser", "run", "load_target", "TargetError", "TARGET", "RUN_NAME"]

#: The function a script defines for the command.
TARGET = "tune_target"
#: The script's ``__name__`` under the command.
RUN_NAME = "__hpu_autocast_tune__"


class TargetError(Exception):
    """The script does not say what to tune, or says it in a shape the command cannot use."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``tune`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "tune",
        help="find the policy with the most lower-precision work within a tolerance of float32",
        description=f"Tune a policy for the function SCRIPT.py's {TARGET}() returns, as (fn, inputs) or "
        "(fn, inputs, metric): ops move to float32 until fn(*inputs) is within the tolerance "
        "of its float32 run. Prints the result and a row per op.",
    )
    add_script_arguments(p, f"a Python script defining {TARGET}()")
    p.add_argument("--tolerance", type=float, default=0.01, help="largest error accepted (default: 0.01)")
    p.add_argument("--max-runs", type=int, default=200, help="most runs of fn the search may make (default: 200)")
    p.add_argument(
        "--per-module",
        action="store_true",
        help="tune a module map instead of the lists: the most modules of the model in the lower dtype "
        "(fp8: in fp8), the others in float32 (fp8: bfloat16); prints the modules= map",
    )
    p.add_argument("--lists", metavar="DIR", help="write the tuned lists as DIR/lower_ops.txt and DIR/fp32_ops.txt")
    p.add_argument("--gaudi-config", metavar="PATH", help="write optimum-habana's gaudi_config.json")
    p.add_argument("--quiet", action="store_true", help="no progress line per run on stderr")
    p.set_defaults(func=run)
    return p


def _no_target(script: str) -> TargetError:
    return TargetError(
        f"{script} defines no {TARGET}(); define one returning (fn, inputs) or "
        f"(fn, inputs, metric), e.g.\n\n    def {TARGET}():\n"
        f"        model = build_model().eval()\n        return model, (example_input,)"
    )


def _may_define_target(script: str) -> bool:
    """Whether the script's top level can bind ``tune_target`` (a ``def``, an assignment, an
    import, or a ``*`` import, which may): read before the script runs, so that a script without
    one is refused before its own loop runs. A script that does not parse is left to run (its
    ``SyntaxError`` is the interpreter's)."""
    try:
        with open(script, "rb") as f:
            tree = ast.parse(f.read(), script)
    except (SyntaxError, ValueError, OSError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == TARGET:
            return True
        if isinstance(node, ast.Name) and node.id == TARGET and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            a.name == "*" or (a.asname or a.name.split(".")[0]) == TARGET for a in node.names
        ):
            return True
        if isinstance(node, ast.Constant) and node.value == TARGET:  # globals()["tune_target"] = ...
            return True
    return False


def load_target(script: str, args: list) -> Tuple[Callable, tuple, Optional[Callable]]:
    """``(fn, inputs, metric)`` from the script's ``tune_target()``."""
    if not _may_define_target(script):
        raise _no_target(script)
    argv, sys.argv = sys.argv, [script, *args]
    try:
        # As the interpreter does (3.9+), the script's __file__ is absolute.
        names = runpy.run_path(os.path.abspath(script), run_name=RUN_NAME)
        target = names.get(TARGET)
        if not callable(target):
            raise _no_target(script)
        got = target()
    finally:
        sys.argv = argv
    if not isinstance(got, tuple) or len(got) not in (2, 3) or not callable(got[0]):
        raise TargetError(
            f"{script}: {TARGET}() must return (fn, inputs) or (fn, inputs, metric) with fn "
            f"callable, got {type(got).__name__}"
        )
    fn, inputs = got[0], got[1]
    metric = got[2] if len(got) == 3 else None
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, list):
        inputs = tuple(inputs)
    elif not isinstance(inputs, tuple):
        raise TargetError(
            f"{script}: {TARGET}()'s inputs must be a tuple of fn's positional arguments or one "
            f"tensor, got {type(inputs).__name__}"
        )
    return fn, inputs, metric


def run(ns: argparse.Namespace) -> int:
    """Tune and print the result; write the files asked for. Exit status 0 when the tolerance
    is met, 1 when it is not, 2 when the script names nothing to tune or a flag is out of range
    (``UsageError``, also for an unknown preset or a missing script: 1 keeps meaning "not met")."""
    from ..tuning import tune

    check_script_arguments(ns)
    if not ns.tolerance >= 0 or ns.max_runs < 3:  # `not >=`: a nan tolerance too
        print(
            f"error: --tolerance must be >= 0 (got {ns.tolerance}) and --max-runs at least 3 (got {ns.max_runs})",
            file=sys.stderr,
        )
        return 2
    try:
        fn, inputs, metric = load_target(ns.script, ns.args)
    except TargetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    progress = None if ns.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    result = tune(
        fn,
        *inputs,
        dtype=DTYPES[ns.dtype],
        policy=policy_of(ns),
        tolerance=ns.tolerance,
        metric=metric,
        max_runs=ns.max_runs,
        device_type=ns.device_type,
        progress=progress,
        per_module=ns.per_module,
    )
    print(result)
    if ns.lists:
        env = result.environment(*result.write_lists(ns.lists))
        print("\nlists written; on Gaudi (or here, under the hpu preset):")
        print("\n".join(f"  export {name}={path}" for name, path in env.items()))
    if ns.gaudi_config:
        print(f"\ngaudi_config.json written: {result.write_gaudi_config(ns.gaudi_config)}")
    return 0 if result.met else 1

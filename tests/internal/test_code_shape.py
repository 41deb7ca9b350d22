"""The mechanism's shape (issue 20): small functions, and the engine's modules each small
enough to read in one sitting. A function that grows past the limit is split where it has a
second job."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hpu_autocast"
MECHANISM = ("_engine.py", "_regions.py", "_kernels.py", "_cast_cache.py", "_inplace.py", "_dispatch.py",
             "_torch.py", "_devices.py", "_table.py", "_compile_guard.py")
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450


def test_no_function_is_over_sixty_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_the_mechanism_modules_are_under_450_lines():
    sizes = {name: len((PACKAGE / name).read_text().splitlines()) for name in MECHANISM}
    assert all(n <= MAX_MODULE_LINES for n in sizes.values()), sizes

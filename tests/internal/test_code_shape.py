"""The package's shape (issues 20 and 30): small functions; the engine's modules each small
enough to read in one sitting; and folders that show the layers, so that few modules sit
directly in ``src/hpu_autocast`` (the public modules and the tools; the engine, the policies and
torch's surface each a package of their own). A function that grows past the limit is split
where it has a second job."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hpu_autocast"
MECHANISM = ("_engine/__init__.py", "_engine/entry.py", "_engine/regions.py", "_engine/kernels.py",
             "_engine/cast_cache.py", "_engine/inplace.py", "_engine/dispatch.py", "_engine/hops.py",
             "_torch/__init__.py", "_torch/compile_guard.py", "policies/_devices.py", "policies/_table.py")
LAYERS = ("_engine", "policies", "_torch")
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450
MAX_TOP_LEVEL_MODULES = 16


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


def test_at_most_sixteen_modules_sit_directly_in_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_each_layer_is_a_package():
    assert all((PACKAGE / layer / "__init__.py").is_file() for layer in LAYERS)

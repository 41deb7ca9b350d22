"""The mechanism's shape (issue 20): small functions, and the engine's modules each small
enough to read in one sitting. A function that grows past the limit is split where it has a
second job."""

import ast
import re
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


MAX_CPP_FUNCTION_LINES = 40
# A function's head: a line at any indentation that ends a signature with "{" (not a control
# statement, a lambda, a struct or a namespace).
_CPP_HEAD = re.compile(r"^\s*(?=\S)(?!if\b|for\b|while\b|switch\b|else\b|do\b|struct\b|namespace\b|class\b|enum\b)"
                       r"[\w:<>,*&\s~]+\([^;]*\)\s*(const\s*)?(override\s*)?\{\s*$")


def _cpp_functions(text: str):
    """``(name, first line, lines)`` of each function in C++ source: from its head to the
    line where its braces close."""
    lines = re.sub(r",\n\s*", ", ", text).splitlines()  # a signature over several lines as one
    i = 0
    while i < len(lines):
        head = lines[i]
        if _CPP_HEAD.match(head) or head.startswith("PYBIND11_MODULE("):
            depth, j = 0, i
            while True:
                depth += lines[j].count("{") - lines[j].count("}")
                if depth <= 0 and j > i or (depth == 0 and j == i and "}" in lines[j]):
                    break
                j += 1
            yield head.strip(), i + 1, j - i + 1
            i += 1  # a function's lambdas and members are measured too
        else:
            i += 1


def test_no_cpp_function_is_over_forty_lines():
    text = (PACKAGE / "csrc" / "core.cpp").read_text()
    found = list(_cpp_functions(text))
    assert any("Kernel::apply" in name for name, _, _ in found)  # the measure sees the kernel's body
    long = [(name, line, n) for name, line, n in found if n > MAX_CPP_FUNCTION_LINES]
    assert not long, f"C++ functions over {MAX_CPP_FUNCTION_LINES} lines in csrc/core.cpp: {long}"

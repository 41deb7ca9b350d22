"""Torch's private surface stays in two modules: ``_torch`` (the dispatcher and thread-local
state: every ``torch._C._`` name) and ``_compile_guard`` (Dynamo). Read with ``ast`` from the
source of every module: attribute chains (``torch._C._set_grad_enabled``), ``getattr(torch._C,
"_name")``, and imports (``from torch._dynamo import ...``, inside functions included)."""

from __future__ import annotations

import ast
import pathlib
from typing import List

import hpu_autocast

PACKAGE = pathlib.Path(hpu_autocast.__file__).resolve().parent
ALLOWED = {"_torch.py": "torch._C._", "_compile_guard.py": "torch._dynamo"}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _private(name: str) -> bool:
    return name.startswith("torch._C._") or name == "torch._dynamo" or name.startswith("torch._dynamo.")


def _reaches(source: str, filename: str) -> List[str]:
    """The private names a module's source reaches for, as ``line: name`` (through a name bound
    to ``torch._C`` too: ``_C = torch._C``, ``from torch import _C``)."""
    tree = ast.parse(source, filename)
    aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _dotted(node.value) == "torch._C"
               for t in node.targets if isinstance(t, ast.Name)}
    aliases |= {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "torch" for a in node.names if a.name == "_C"}

    def spelled(name: str) -> str:
        head, _, rest = name.partition(".")
        return f"torch._C.{rest}" if head in aliases and rest else name

    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Attribute):
            names.append(_dotted(node))
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.extend(f"{node.module}.{a.name}" for a in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            names.append(f"{_dotted(node.args[0])}.{node.args[1].value}")
        found.extend(f"{node.lineno}: {spelled(n)}" for n in names if _private(spelled(n)))
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def test_the_reader_finds_each_way_of_reaching():
    source = ("import torch\nimport torch._dynamo\nfrom torch._dynamo import guards\nx = torch._C._set_grad_enabled\n"
              "y = getattr(torch._C, '_stash_obj_in_tls', None)\nz = torch._C.DispatchKey\n_C = torch._C\n"
              "w = _C._len_torch_dispatch_stack\n")
    assert _reaches(source, "t.py") == ["2: torch._dynamo", "3: torch._dynamo.guards", "4: torch._C._set_grad_enabled",
                                        "5: torch._C._stash_obj_in_tls", "8: torch._C._len_torch_dispatch_stack"]


def test_only_the_private_surface_modules_reach_for_torchs_private_names():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        allowed = ALLOWED.get(path.name) if path.parent == PACKAGE else None
        names = [n for n in _reaches(path.read_text(), str(path)) if not (allowed and n.split(": ")[1].startswith(allowed))]
        if names:
            offenders[str(path.relative_to(PACKAGE))] = names
    assert offenders == {}, "private torch names outside _torch.py / _compile_guard.py: " + repr(offenders)


def test_the_surface_modules_list_what_they_use():
    # Each torch._C._ name _torch.py uses is in its docstring's table (with its versions and fallback).
    source = (PACKAGE / "_torch.py").read_text()
    doc = ast.get_docstring(ast.parse(source))
    used = {n.split(": ")[1].rsplit(".", 1)[1] for n in _reaches(source, "_torch.py")}
    assert used and [n for n in sorted(used) if n not in doc] == []

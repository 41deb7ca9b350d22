"""The package's modules import one another without cycles.

Every import statement of every module counts, those inside functions included: a "lazy"
import only hides a cycle until the function runs. Edges are read with ``ast`` from the
source, relative (``from .names import resolve``) and absolute (``import hpu_autocast.hmp``).
"""

from __future__ import annotations

import ast
import collections
import pathlib
from typing import Dict, List, Set

import hpu_autocast

PACKAGE = pathlib.Path(hpu_autocast.__file__).resolve().parent

#: Edges known to close a cycle: none. (The engine rewrite removed the last, mode -> report ->
#: mode: the report consumes events and imports nothing above it.) Nothing may be added here.
KNOWN: Set[tuple] = set()


def _modules() -> Dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("hpu_autocast",) + path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _edges() -> Dict[str, Set[str]]:
    edges: Dict[str, Set[str]] = {}
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                # `from . import names` imports a module; `from .names import resolve` its parent.
                targets.update(f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                               for a in node.names)
        edges[name] = {_module_of(t) for t in targets if _module_of(t)} - {name}
    return edges


def _module_of(target: str) -> str:
    """The package module an import target is, or is inside (``""`` for other packages)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target


def _cycle(edges: Dict[str, Set[str]]) -> List[str]:
    """A cycle as the modules along it (first == last), or ``[]``."""
    state: Dict[str, int] = collections.defaultdict(int)  # 0 new, 1 on the path, 2 done
    path: List[str] = []

    def visit(m: str) -> List[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state[n] == 1:
                return path[path.index(n):] + [n]
            if state[n] == 0:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return []

    for m in sorted(edges):
        if state[m] == 0:
            found = visit(m)
            if found:
                return found
    return []


def test_the_reader_sees_imports_inside_functions():
    # mode imports report only inside __enter__; the graph has the edge all the same.
    assert "hpu_autocast.report" in _edges()["hpu_autocast.mode"]
    assert "hpu_autocast.policies._build" in _edges()["hpu_autocast.policies.presets"]


def test_no_import_cycles():
    edges = _edges()
    assert KNOWN <= {(a, b) for a, bs in edges.items() for b in bs}, "a known edge is gone: drop it from KNOWN"
    for a, b in KNOWN:
        edges[a].discard(b)
    cycle = _cycle(edges)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_the_frame_stack_knows_nothing_of_the_core_or_the_patches():
    # A region's entry is composed in _engine.entry (its Note); the frame stack only keeps frames.
    assert _edges()["hpu_autocast._engine.regions"].isdisjoint({
        "hpu_autocast._engine.core", "hpu_autocast._engine.kernels", "hpu_autocast._engine.entry",
        "hpu_autocast._torch.autocast", "hpu_autocast._torch.torchscript", "hpu_autocast._torch.compile_guard"})


def test_the_policies_do_not_import_the_engine_or_the_tools():
    # Policies are data below the engine: they ask torch's surface (_torch) and nothing above.
    for name, targets in _edges().items():
        if name.startswith("hpu_autocast.policies"):
            assert {t for t in targets if not t.startswith("hpu_autocast.policies") and t != "hpu_autocast._torch"} == set(), name


def test_no_two_modules_share_a_name():
    # hpu.py and presets/hpu.py did; a traceback or a `from . import hpu` then reads two ways.
    names = collections.Counter(p.stem for p in MODULES.values() if p.stem not in ("__init__", "__main__"))
    assert [n for n, count in names.items() if count > 1] == []

"""Torch's private surface stays in one package, ``hpu_autocast._torch`` (at most four modules):
``__init__`` (every private torch name the rest of the package asks, each with the versions it
was checked on and its fallback, and the accessors of torch's objects' private attributes) and
``compile_guard`` (Dynamo). The patches of torch made while a region is open are the engine's
(``_engine/torch_autocast.py``, ``_engine/torchscript.py``) and take their private names from it.

Read with ``ast`` from the source of every module outside it (and the pytest plugin beside the
package), through names the module binds to a torch module or object (``_C = torch._C``,
``from torch import _C``, ``import torch.utils as tu``). Attributes of torch's objects reached
through a value (``op._schema``, ``t._is_view()``) are found by name: the ``_``-prefixed
attributes of the torch objects the package handles (``PRIVATE_ATTRIBUTES``), less the names the
package binds itself (its own ``self._x``).

* a private torch name: an attribute chain from ``torch`` with a ``_``-prefixed part
  (``torch._C.DispatchKey``, ``torch.utils._pytree.tree_map``, ``torch.ops.aten._to_copy``;
  dunders such as ``torch.__version__`` are public), an import of one (``import torch._dynamo``,
  ``from torch._ops import OpOverload``, ``from torch import _C``), and ``getattr`` / ``hasattr``
  of a ``_``-prefixed name on something from torch (``getattr(torch.ops, "_x")``);
* an assignment to a torch attribute: ``torch.x = ...`` (``+=``, annotated, ``del`` too),
  ``setattr`` / ``delattr`` on something from torch;
* the interpreter's hacks: ``sys._getframe`` and ``ctypes``.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, FrozenSet, List

import torch
import torch.fx

import hpu_autocast

PACKAGE = pathlib.Path(hpu_autocast.__file__).resolve().parent
SURFACE = PACKAGE / "_torch"
PLUGIN = PACKAGE.parent / "pytest_hpu_autocast.py"
MAX_SURFACE_MODULES = 4


def _private_attributes() -> FrozenSet[str]:
    """The ``_``-prefixed attributes (dunders left out) of the torch objects the package handles:
    an overload and its packet, a tensor, a library, FX's nodes and graphs, schemas, modules."""
    objects = (
        torch.ops.aten.mm.default,
        torch.ops.aten.mm,
        torch.zeros(1),
        torch.library.Library,
        torch.fx.Node,
        torch.fx.Graph,
        torch.fx.GraphModule,
        torch._C.FunctionSchema,
        torch._C.Argument,
        torch.nn.Module,
        torch.optim.Optimizer,
        torch.autograd.Function,
        torch.dtype,
        torch.device,
    )
    return frozenset(n for o in objects for n in dir(o) if n.startswith("_") and not n.endswith("__"))


def _bound(tree: ast.AST) -> FrozenSet[str]:
    """Every name a module binds: functions, classes, variables, attributes it assigns (``self._x``),
    arguments, imports, ``__slots__`` strings."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Store):
            out.add(n.id if isinstance(n, ast.Name) else n.attr)
        elif isinstance(n, ast.alias):
            out.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            out.add(n.value)
    return frozenset(out)


PRIVATE_ATTRIBUTES = _private_attributes()


def _private_attribute_uses(source: str, filename: str, own: FrozenSet[str]) -> List[str]:
    """``line: .name`` for each private attribute of torch's objects a module's source reads
    (``op._schema``), where the package does not bind that name itself (``own``)."""
    return sorted(
        (
            f"{n.lineno}: .{n.attr}"
            for n in ast.walk(ast.parse(source, filename))
            if isinstance(n, ast.Attribute) and n.attr in PRIVATE_ATTRIBUTES and n.attr not in own
        ),
        key=lambda s: (int(s.split(":")[0]), s),
    )


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
    """Whether a dotted name is torch's and private (a ``_``-prefixed part, not a dunder), or a hack."""
    parts = name.split(".")
    if parts[0] == "ctypes" or name == "sys._getframe" or name.startswith("sys._getframe."):
        return True
    return parts[0] == "torch" and any(p.startswith("_") and not p.endswith("__") for p in parts[1:])


def _module_level(tree: ast.Module) -> List[ast.AST]:
    """The module's own statements (inside ``if`` / ``try`` too), not those of its functions and
    classes, whose local names may shadow a module (``for m in module.modules()``)."""
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt))
    return out


def _aliases(tree: ast.Module) -> Dict[str, str]:
    """Names the module binds to something of torch's (or to ``sys`` / ``ctypes``), by the dotted
    name they stand for."""
    out: Dict[str, str] = {}
    statements = _module_level(tree)
    for node in statements:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name.split(".")[0] in ("torch", "sys", "ctypes"):
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in ("torch", "sys"):
                for a in node.names:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in statements:  # `_C = torch._C`, `ag = torch.autograd`
        if isinstance(node, ast.Assign) and _dotted(node.value).split(".")[0] in ("torch", *out):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, _spelled(_dotted(node.value), out))
    return out


def _spelled(name: str, aliases: Dict[str, str]) -> str:
    head, dot, rest = name.partition(".")
    return aliases[head] + dot + rest if head in aliases else name


def _reaches(source: str, filename: str) -> List[str]:
    """What a module's source does to torch's private surface, as ``line: name`` (private names
    and hacks) and ``line: set name`` (an assignment to a torch attribute)."""
    tree = ast.parse(source, filename)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        names, sets = [], []
        if isinstance(node, ast.Attribute):
            names.append(_dotted(node))
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.extend(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            sets.extend(_dotted(t) for t in targets if isinstance(t, ast.Attribute))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            if (
                node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                names.append(f"{_dotted(node.args[0])}.{node.args[1].value}")
            elif node.func.id in ("setattr", "delattr"):
                sets.append(f"{_dotted(node.args[0])}.?")
        found.extend(f"{node.lineno}: {_spelled(n, aliases)}" for n in names if _private(_spelled(n, aliases)))
        found.extend(
            f"{node.lineno}: set {_spelled(n, aliases)}" for n in sets if _spelled(n, aliases).split(".")[0] == "torch"
        )
    return sorted(set(found), key=lambda s: (int(s.split(":")[0]), s))


def test_the_reader_finds_each_way_of_reaching():
    source = (
        "import torch\nimport torch._dynamo\nfrom torch._dynamo import guards\nx = torch._C._set_grad_enabled\n"
        "y = getattr(torch._C, '_stash_obj_in_tls', None)\nz = torch.ops.aten._to_copy.default\n_C = torch._C\n"
        "w = _C._len_torch_dispatch_stack\nfrom torch import _C as C2\nfrom torch.utils import _pytree\n"
        "v = torch.__version__ + torch.autograd.grad.__name__\ngetattr(torch.ops, '_x')\n"
    )
    assert _reaches(source, "t.py") == [
        "2: torch._dynamo",
        "3: torch._dynamo.guards",
        "4: torch._C",
        "4: torch._C._set_grad_enabled",
        "5: torch._C",
        "5: torch._C._stash_obj_in_tls",
        "6: torch.ops.aten._to_copy",
        "6: torch.ops.aten._to_copy.default",
        "7: torch._C",
        "8: torch._C._len_torch_dispatch_stack",
        "9: torch._C",
        "10: torch.utils._pytree",
        "12: torch.ops._x",
    ]


def test_the_reader_finds_each_way_of_patching_and_the_hacks():
    source = (
        "import torch, sys, ctypes\nimport torch.autograd as ag\nfrom torch import autograd\n"
        "torch.is_autocast_enabled = f\nsetattr(torch.autograd, 'grad', g)\nag.backward = h\n"
        "delattr(autograd, 'grad')\ntorch.x.y += 1\nf = sys._getframe(1)\nctypes.pythonapi\n"
        "obj.attr = torch.mm\nsetattr(obj, 'mm', torch.mm)\n"
    )
    assert _reaches(source, "t.py") == [
        "1: ctypes",
        "4: set torch.is_autocast_enabled",
        "5: set torch.autograd.?",
        "6: set torch.autograd.backward",
        "7: set torch.autograd.?",
        "8: set torch.x.y",
        "9: sys._getframe",
        "10: ctypes.pythonapi",
    ]


def test_only_the_surface_package_reaches_for_torchs_private_names_or_patches_torch():
    offenders = {}
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if SURFACE not in p.parents] + [PLUGIN]
    for path in paths:
        names = _reaches(path.read_text(), str(path))
        if names:
            offenders[str(path.relative_to(PACKAGE.parent))] = names
    assert offenders == {}, "private torch names, patches of torch or hacks outside hpu_autocast/_torch: " + repr(
        offenders
    )


def test_the_reader_finds_private_attributes_of_torchs_objects():
    source = (
        "s = op._schema.arguments\nop._op(x)\nt._is_view()\nlib._destroy()\nn = op._overloadname\nself._cache = 1\n"
    )
    assert {"_schema", "_op", "_is_view", "_destroy", "_overloadname", "_version", "_rename"} <= PRIVATE_ATTRIBUTES
    assert _private_attribute_uses(source, "t.py", frozenset({"_cache"})) == [
        "1: ._schema",
        "2: ._op",
        "3: ._is_view",
        "4: ._destroy",
        "5: ._overloadname",
    ]


def test_only_the_surface_package_reads_private_attributes_of_torchs_objects():
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if SURFACE not in p.parents] + [PLUGIN]
    own = frozenset().union(*(_bound(ast.parse(p.read_text())) for p in paths))
    offenders = {}
    for path in paths:
        uses = _private_attribute_uses(path.read_text(), str(path), own)
        if uses:
            offenders[str(path.relative_to(PACKAGE.parent))] = uses
    assert offenders == {}, "private attributes of torch's objects outside hpu_autocast/_torch: " + repr(offenders)


def test_the_surface_is_one_package_of_at_most_four_modules():
    modules = sorted(p.name for p in SURFACE.rglob("*.py"))
    assert 0 < len(modules) <= MAX_SURFACE_MODULES, modules


def test_the_surface_lists_the_private_names_it_uses():
    # Each private torch name the names module (_torch/__init__.py) uses is in its docstring's table,
    # with its versions and fallback.
    source = (SURFACE / "__init__.py").read_text()
    doc = ast.get_docstring(ast.parse(source))
    used = {
        n.split(": ")[1].rsplit(".", 1)[1]
        for n in _reaches(source, "__init__.py")
        if n.split(": ")[1].startswith("torch.") and " set " not in n
    }
    used = {n for n in used if n.startswith("_")}
    assert used and [n for n in sorted(used) if n not in doc] == []

"""Per-module precision without editing the model: ``HpuAutocastMode(..., modules={...})``.

    >>> with HpuAutocastMode(torch.bfloat16, modules={"lm_head": torch.float32, "*.ln_*": "fp32"}):
    ...     logits = model(x)

A module map takes glob patterns (``fnmatch`` over dotted module names, as ``named_modules()``
gives them, relative to the outermost module the region calls: the model, whose own name is
``""``) to what the matched module's forward runs under (``Override``; docs/modules.md):

* ``torch.float32`` or ``"fp32"``: float32, as if the module's forward were wrapped in
  ``HpuAutocastMode(enabled=False)`` with its floating inputs (positional and keyword) of a lower
  precision (bfloat16, float16, fp8) cast to float32 first;
* a lower dtype (``torch.bfloat16``, ``torch.float16``, an fp8 dtype): a nested region of the
  enclosing region's policy in that dtype;
* a preset name or a ``Policy``: a nested region of that policy in the enclosing region's dtype;
* ``None`` or ``"off"``: casting off, inputs as they come (``HpuAutocastMode(enabled=False)``).

Besides names and globs, two selectors name a module by its place (Note: selectors):
``"<first>"`` the first leaf linear layer, ``"<last>"`` the output head; ``first_last(dtype)``
is ``{"<first>": dtype, "<last>": dtype}``, the standard fp8 recipe's exception.

[Note: which entry wins]
Overrides are nested regions, so for modules inside modules the innermost match wins (its region
is the innermost). For one module matched by several patterns, an exact name (no ``*?[``) beats a
glob, and among equals the entry given last in the mapping wins (as later keys of a dict update
win). A pattern that matches no module of any model a region called warns once per mode, at its
exit, naming the pattern and a few module names.

[Note: the mechanism]
While a region with a map is open in some context, two process-wide module hooks are installed
(``register_module_forward_pre_hook`` / ``register_module_forward_hook(always_call=True)``, the
second also after a forward that raised), counted across threads and removed with the last such
region. They read the calling context's ``_ACTIVE`` (a context variable) and do nothing
elsewhere. The first module called with no mapped call in flight is a root: its names come from
``named_modules()`` once per root and map (weakly cached). A matched module's pre-hook enters its
override's nested region (and casts its inputs), its forward hook exits it. The map's key is part
of the compile guard token (``regions.TAG``), so a frame compiled under one map recompiles under
another; a checkpoint's recomputation runs under the map it ran its forward with
(``_engine.torch_autocast.add_recompute_capture``). Keyword inputs of a float32 module are cast
by a hook of the module's own (Note: keyword inputs); a module run by calling ``.forward``
directly, not the module, is not seen. A root's resolved names are checked against its modules
at each call (``_resolve``), so a model that gains or replaces a submodule is resolved again.
"""

from __future__ import annotations

import fnmatch
import functools
import sys
import threading
import warnings
import weakref
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch.nn.modules import module as _nn_module

from . import _torch
from ._engine import regions as _regions
from ._engine import torch_autocast as _torch_autocast
from .policies.builder import as_policy
from .policies.policy import Policy

__all__ = ["ModuleMap", "Override", "parse_modules", "first_last", "FIRST", "LAST", "SELECTORS"]

_GLOB = frozenset("*?[")
_LOWER_FLOATS = (torch.bfloat16, torch.float16)

#: [Note: selectors] Patterns that name a module by its place in the model, resolved against each
#: root at its first call (with the names): ``<first>`` is the first leaf linear layer in
#: registration order (``named_modules()``); ``<last>`` the model's output head, that is the
#: module ``get_output_embeddings()`` returns (Hugging Face models: ``lm_head``), else a module
#: named ``lm_head``, else the last leaf linear layer in registration order. A linear layer is an
#: ``nn.Linear`` (subclasses too) or Hugging Face's ``Conv1D`` (GPT-2's transposed linear). A
#: selector counts as an exact name (it beats a glob). Registration order, not call order: it is
#: known before the forward runs, and is the order of the layers in nearly every model.
FIRST = "<first>"
LAST = "<last>"
SELECTORS = (FIRST, LAST)


def first_last(dtype: object = torch.bfloat16) -> Dict[str, object]:
    """The standard fp8 recipe's exception as a module map: the first and the last linear layer
    (or the output head, ``lm_head``) run as ``dtype`` says (default ``torch.bfloat16``), the rest
    as the region does (Note: selectors). Give it as ``modules=``, or merge it into a map:

        >>> with HpuAutocastMode(torch.float8_e4m3fn, modules=first_last(torch.bfloat16)):
        ...     loss = model(x).loss
        >>> modules = {**first_last(), "*.ln_*": "fp32"}
    """
    return {FIRST: dtype, LAST: dtype}


@dataclass(frozen=True)
class Override:
    """What one pattern maps a module to: ``kind`` is ``"fp32"`` (casting off, lower floating
    inputs cast to float32), ``"off"`` (casting off), ``"dtype"`` (the region's policy in
    ``dtype``) or ``"policy"`` (``policy`` in the region's dtype)."""

    kind: str
    dtype: Optional[torch.dtype] = None
    policy: Optional[Policy] = None

    def __str__(self) -> str:
        if self.kind == "dtype":
            return str(self.dtype).replace("torch.", "")
        if self.kind == "policy":
            return f"policy {self.policy.name}"
        return {"fp32": "float32", "off": "off"}[self.kind]


@dataclass(frozen=True)
class ModuleMap:
    """A parsed ``modules=`` argument: (pattern, override) pairs in the order given."""

    entries: Tuple[Tuple[str, Override], ...]

    @functools.cached_property
    def key(self) -> str:
        """A string naming the map exactly (the compile guard's part for it; made once per map:
        it is read at each region's entry and each call of a root)."""
        return ";".join(
            f"{p}={o.kind}:{o.dtype}:{o.policy.name if o.policy else ''}:{id(o.policy) if o.policy else ''}"
            for p, o in self.entries
        )

    @property
    def selectors(self) -> Tuple[str, ...]:
        """The selectors (``<first>``, ``<last>``) among the patterns."""
        return tuple(p for p, _ in self.entries if p in SELECTORS)

    def match(self, name: str, selected: Optional[Mapping[str, str]] = None) -> Optional[Tuple[str, Override]]:
        """The entry that decides for the module ``name`` (Note [which entry wins]), or ``None``;
        ``selected``: the module name each selector stands for in this root."""
        best = None
        for pattern, override in self.entries:
            if pattern in SELECTORS:
                exact, hit = True, selected is not None and selected.get(pattern) == name
            else:
                exact = not (_GLOB & set(pattern))
                hit = (pattern == name) if exact else fnmatch.fnmatchcase(name, pattern)
            if hit:
                if best is None or exact or not best[0]:
                    best = (exact, pattern, override)
        return None if best is None else (best[1], best[2])


def _override(pattern: str, value, dtype: torch.dtype) -> Override:
    accepted = (
        "torch.float32 or 'fp32', a lower dtype (torch.bfloat16, torch.float16, an fp8 dtype), "
        "a preset name, a Policy, or None / 'off'"
    )
    if value is None or (isinstance(value, str) and value == "off"):
        return Override("off")
    if value is torch.float32 or (isinstance(value, str) and value in ("fp32", "float32")):
        return Override("fp32")
    if isinstance(value, torch.dtype):
        if value.is_floating_point and value.itemsize < 4:
            return Override("dtype", dtype=value)
        raise ValueError(
            f"HpuAutocastMode(modules=...): {pattern!r} maps to {value}, which is not a dtype a "
            f"region computes in; accepted: {accepted}"
        )
    if isinstance(value, (str, Policy)):
        try:
            policy = as_policy(value)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"HpuAutocastMode(modules=...): {pattern!r} maps to {value!r}: {e}") from None
        policy.check_dtype(dtype)
        return Override("policy", policy=policy)
    raise TypeError(
        f"HpuAutocastMode(modules=...): {pattern!r} maps to {value!r} ({type(value).__name__}); accepted: {accepted}"
    )


#: Parsed maps whose values are all dtypes, ``None`` or the strings below (nothing read from a
#: preset or the environment), by their items and dtype: a loop that makes its region each step
#: parses its map once (Note: the hot path). Bounded: cleared when full.
_parsed: Dict[tuple, ModuleMap] = {}
_PLAIN_VALUES = ("fp32", "float32", "off")


def parse_modules(modules: Optional[Mapping[str, object]], dtype: torch.dtype) -> Optional[ModuleMap]:
    """``modules=`` as a ``ModuleMap`` (``None`` for none or an empty mapping); bad patterns and
    values raise, naming them and what is accepted."""
    if modules is None:
        return None
    if type(modules) is dict and type(dtype) is torch.dtype:
        key = (tuple(modules.items()), dtype)
        if all(
            type(p) is str and (v is None or type(v) is torch.dtype or (type(v) is str and v in _PLAIN_VALUES))
            for p, v in key[0]
        ):
            got = _parsed.get(key)
            if got is None:
                got = _parse(modules, dtype)
                if len(_parsed) >= 256:
                    _parsed.clear()
                _parsed[key] = got
            return got
    return _parse(modules, dtype)


def _parse(modules: Optional[Mapping[str, object]], dtype: torch.dtype) -> Optional[ModuleMap]:
    if not isinstance(modules, Mapping):
        raise TypeError(
            f"HpuAutocastMode: modules must be a mapping of module-name patterns to dtypes, "
            f"presets, Policies or None, got {modules!r} ({type(modules).__name__})"
        )
    entries = []
    for pattern, value in modules.items():
        if not isinstance(pattern, str):
            raise TypeError(
                f"HpuAutocastMode(modules=...): a pattern must be a string (a dotted module name "
                f"or an fnmatch glob such as 'h.*.attn'), got {pattern!r}"
            )
        if pattern.startswith("<") and pattern not in SELECTORS:
            raise ValueError(
                f"HpuAutocastMode(modules=...): {pattern!r} is no selector; accepted: "
                f"{', '.join(map(repr, SELECTORS))} (first_last()), or a module name or glob"
            )
        entries.append((pattern, _override(pattern, value, dtype)))
    return ModuleMap(tuple(entries)) if entries else None


# -- the hooks ----------------------------------------------------------------------------------
class _Active:
    """A region's map in force in one context: what its hooks read."""

    __slots__ = ("map", "make", "thread", "root", "resolved", "hits", "stack", "matched", "names", "tokens", "kw_hooks")

    def __init__(self, map_: ModuleMap, make, root=None, resolved=None) -> None:
        self.map = map_
        self.make = make  # Override, module name -> an HpuAutocastMode for it (not entered)
        self.thread = threading.get_ident()
        self.root = root
        self.resolved: Optional[Dict[object, Tuple[str, str, Override]]] = resolved
        #: The current root's matched modules, held strongly for the region's life: {module: entry}
        #: (Note: the hot path).
        self.hits: Dict[object, Tuple[str, str, Override]] = {} if resolved is None else dict(resolved.items(root))
        #: The root and the matched modules in flight, innermost last: (module, its override's
        #: region or None, its name).
        self.stack: List[tuple] = [] if root is None else [(None, None, None)]  # a recomputation: inside its root
        self.matched: set = set()
        self.names: List[str] = []  # a few module names of the first root (for the unmatched warning)
        self.kw_hooks: Dict[int, object] = {}  # id(module) -> the handle of its keyword-input hook
        if resolved is not None:
            self.hook_keywords(root)

    def hook_keywords(self, root) -> None:
        """Give each module mapped to float32 a forward pre-hook that casts its keyword inputs
        (torch's global pre-hooks see positional inputs only; Note: keyword inputs)."""
        for module, (_, _, override) in self.resolved.items(root):
            if override.kind == "fp32" and isinstance(module, torch.nn.Module) and id(module) not in self.kw_hooks:
                self.kw_hooks[id(module)] = module.register_forward_pre_hook(_keywords_hook, with_kwargs=True)

    def unhook(self) -> None:
        while self.kw_hooks:
            self.kw_hooks.popitem()[1].remove()

    def pre(self, module, args):
        if self.stack:
            hit = self.hits.get(module)
            if hit is None:
                return None  # unmatched inside the root: nothing to do (Note: the hot path)
        else:
            if _is_compiled_wrapper(module):
                return None  # torch.compile(model)'s wrapper: the model it calls is the root
            self.resolved, names, matched = _resolve(module, self.map)  # may refuse (Note: FSDP2)
            self.root = module
            self.hits = dict(self.resolved.items(module))
            self.matched.update(matched)
            self.hook_keywords(module)
            if not self.names:
                self.names = names
            hit = self.hits.get(module)
            if hit is None:
                self.stack.append((module, None, None))  # the root in flight: its modules are inside it
                return None
        pattern, name, override = hit
        mode = self.make(override, name)
        mode.__enter__()
        self.stack.append((module, mode, name))
        if override.kind == "fp32":
            return cast_inputs(args)
        return None

    def post(self, module) -> None:
        if not self.stack or self.stack[-1][0] is not module:
            return  # unmatched (never pushed), or its pre-hook ran before the map was in force
        entry = self.stack.pop()
        if entry[1] is not None:
            entry[1].__exit__(None, None, None)

    def module_name(self) -> Optional[str]:
        """The innermost mapped module in flight (``None``: none)."""
        for entry in reversed(self.stack):
            if entry[1] is not None:
                return entry[2]
        return None


def _keywords_hook(module, args, kwargs):
    """[Note: keyword inputs] A module mapped to float32 gets its lower floating keyword inputs
    cast too (``forward(x=...)``), by a pre-hook of its own (``with_kwargs=True``) that the map adds
    when it resolves the root's names and removes when the region closes; it acts only while the
    module's float32 entry is the innermost in flight. The root's own keyword inputs at the call
    that makes it the root are not cast: its hooks for that call were read before it was resolved."""
    active = _ACTIVE.get()
    if active is None or active.thread != threading.get_ident() or not active.stack:
        return None
    top = active.stack[-1]
    if top[0] is not module or top[1] is None or not kwargs:
        return None
    hit = active.resolved.get(module)
    if hit is None or hit[2].kind != "fp32":
        return None
    cast = dict(zip(kwargs, cast_inputs(tuple(kwargs.values()))))
    return args, cast


def cast_inputs(args: tuple) -> tuple:
    """``args`` with each floating tensor of a lower precision than float32 (also in a list or
    tuple) cast to float32 (float64 and float32 stay)."""

    def cast(a):
        if isinstance(a, torch.Tensor):
            return a.float() if a.is_floating_point() and a.element_size() < 4 else a
        if isinstance(a, (list, tuple)) and not hasattr(a, "_fields"):
            return type(a)(cast(x) for x in a)
        return a

    return tuple(cast(a) for a in args)


_names_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # root -> {map key: (resolved, names)}


def _resolve(root, map_: ModuleMap):
    """For ``root``: {module: (pattern, name, override)} of the modules ``map_`` matches, and a
    few module names (cached per root and map)."""
    per_root = _names_cache.get(root)
    if per_root is None:
        per_root = {}
        try:
            _names_cache[root] = per_root
        except TypeError:  # not weakly referable: resolved each time
            pass
    # Note: a model that gains, loses or replaces a submodule between calls (model.lm_head = ...)
    # is resolved again: the cache keeps the modules the names were read from, and a walk of
    # root.modules() (no names, no fnmatch: a small part of resolving) says whether they are the
    # same ones. A module renamed in place (the same objects under other names) is not seen.
    seen = _module_ids(root)
    got = per_root.get(map_.key)
    if got is not None and got[3] == seen:
        return got[:3]
    resolved, names = {}, []
    all_names = []
    named = list(root.named_modules(remove_duplicate=False))
    selected = _select(root, named) if map_.selectors else None
    for name, mod in named:
        all_names.append(name)
        if len(names) < 6 and name:
            names.append(name)
        hit = map_.match(name, selected)
        if hit is not None and mod not in resolved:
            resolved[mod] = (hit[0], name, hit[1])
    _check_fsdp(named, resolved)
    # Note: the value must not hold the root strongly (it is the weak key): its entry holds the
    # module through a weak proxy of the dict key only, so the root maps under a sentinel.
    if root in resolved:
        resolved[_ROOT] = resolved.pop(root)
    matched = {
        p
        for p, _ in map_.entries
        if (p in selected if p in SELECTORS else any(fnmatch.fnmatchcase(n, p) for n in all_names))
    }
    got = per_root[map_.key] = (_RootView(root, resolved), names, matched, seen)
    return got[:3]


def _fsdp_module_class():
    """FSDP2's ``FSDPModule`` where torch.distributed's FSDP2 is imported (else no module can be
    one): ``torch.distributed.fsdp`` (torch >= 2.6), ``torch.distributed._composable.fsdp`` before."""
    for name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        cls = getattr(sys.modules.get(name), "FSDPModule", None)
        if isinstance(cls, type):
            return cls
    return None


def _fsdp_param_dtype(module) -> Optional[torch.dtype]:
    """The dtype FSDP2 gathers the parameters of ``module`` (an ``FSDPModule``) in for the forward:
    its ``MixedPrecisionPolicy.param_dtype`` (``None``: as they are). Read from FSDP2's state, a
    private attribute; where a torch has it elsewhere, ``None``."""
    try:
        return module._get_fsdp_state()._mp_policy.param_dtype
    except (AttributeError, TypeError):
        return None


def _check_fsdp(named, resolved) -> None:
    """[Note: FSDP2] ``fully_shard`` keeps a model's module names (it changes the modules' class
    and adds hooks of their own, no wrapper module), so a map reads them as they are. Its hooks
    run after the map's (a module's own hooks follow the global ones): a module mapped to float32
    gets its inputs cast to float32 and casting off, then FSDP2 gathers its parameters and, with a
    ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``, casts them and the inputs to bfloat16:
    the module would compute in bfloat16 with no word. That is refused when the names are resolved,
    naming the module, the ``fully_shard``ed module whose policy gathers its parameters (the
    innermost around them) and the fix. A lower dtype, a policy or ``off`` is not refused: those
    compute in whatever the parameters are gathered in, as without FSDP2."""
    fsdp = _fsdp_module_class()
    if fsdp is None or not any(o.kind == "fp32" for _, _, o in resolved.values()):
        return
    by_name: Dict[str, object] = {}
    for name, mod in named:
        by_name.setdefault(name, mod)
    for module, (pattern, name, override) in resolved.items():
        if override.kind != "fp32":
            continue
        for sub_name, sub in module.named_modules(prefix=name):
            if next(sub.parameters(recurse=False), None) is None:
                continue
            parts = sub_name.split(".") if sub_name else []
            for depth in range(len(parts), -1, -1):  # the innermost fully_shard around ``sub``
                owner_name = ".".join(parts[:depth])
                owner = by_name.get(owner_name)
                if isinstance(owner, fsdp):
                    break
            else:
                continue
            dtype = _fsdp_param_dtype(owner)
            if isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype.itemsize < 4:
                shown = repr(owner_name) if owner_name else "the model"
                raise ValueError(
                    f"HpuAutocastMode(modules=...): {pattern!r} maps module {name or '(the model)'!r} to float32, "
                    f"but FSDP2 gathers its parameters in {str(dtype).replace('torch.', '')} "
                    f"(fully_shard({shown}, mp_policy=MixedPrecisionPolicy(param_dtype={dtype}))), so it "
                    f"would compute in {str(dtype).replace('torch.', '')}. Give it a fully_shard of its own "
                    f"with MixedPrecisionPolicy(param_dtype=torch.float32) (before its parent's), or map it "
                    f"to {dtype} (docs/modules.md, FSDP2)"
                )


def _module_ids(root) -> tuple:
    """``tuple(map(id, root.modules()))``, the same ids in the same order (preorder, each module
    once), without ``named_modules``' names: read at each call of a root (Note: the hot path)."""
    ids: List[int] = []
    seen: set = set()
    todo = [root]
    while todo:
        module = todo.pop()
        key = id(module)
        if key in seen:
            continue
        seen.add(key)
        ids.append(key)
        children = getattr(module, "_modules", None)
        if children:
            todo.extend(m for m in reversed(children.values()) if m is not None)
    return tuple(ids)


def _is_linear(module) -> bool:
    """A leaf linear layer: ``nn.Linear`` or a subclass, or Hugging Face's ``Conv1D`` (by name, so
    that transformers is not imported here)."""
    if next(iter(module.children()), None) is not None:
        return False
    if isinstance(module, torch.nn.Linear):
        return True
    weight = getattr(module, "weight", None)
    return type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2


def _select(root, named) -> Dict[str, str]:
    """The module name each selector stands for in ``root`` (Note: selectors); a selector with no
    module to stand for (a model without linear layers) is left out."""
    linears = [(n, m) for n, m in named if _is_linear(m)]
    out = {}
    if linears:
        out[FIRST] = linears[0][0]
    head = None
    get_head = getattr(root, "get_output_embeddings", None)
    if callable(get_head):
        try:
            head = get_head()
        except (NotImplementedError, AttributeError):
            head = None
    names = {id(m): n for n, m in reversed(named)}  # a module's first name
    if isinstance(head, torch.nn.Module) and id(head) in names:
        out[LAST] = names[id(head)]
    else:
        heads = [n for n, _ in named if n.rpartition(".")[2] == "lm_head"]
        if heads:
            out[LAST] = heads[-1]
        elif linears:
            out[LAST] = linears[-1][0]
    return out


def _is_compiled_wrapper(module) -> bool:
    """Whether ``module`` is ``torch.compile(model)``'s ``OptimizedModule`` (read without Dynamo)."""
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


_ROOT = object()


class _RootView:
    """``resolved`` with the root looked up without a strong reference to it."""

    __slots__ = ("_root", "_resolved")

    def __init__(self, root, resolved: dict) -> None:
        self._root = weakref.ref(root) if _weakrefable(root) else (lambda r=root: r)
        self._resolved = resolved

    def get(self, module):
        if module is self._root():
            return self._resolved.get(_ROOT)
        return self._resolved.get(module)

    def values(self):
        return self._resolved.values()

    def items(self, root):
        """``(module, entry)`` pairs, the root's under ``root`` (given by the caller, held here weakly)."""
        for key, entry in self._resolved.items():
            yield (root if key is _ROOT else key), entry


def _weakrefable(obj) -> bool:
    try:
        weakref.ref(obj)
        return True
    except TypeError:
        return False


_ACTIVE: ContextVar[Optional[_Active]] = ContextVar("hpu_autocast_module_map", default=None)


_get_ident = threading.get_ident


# [Note: the hot path] While a map is open the two global hooks run for every module call in the
# process (and make torch take its slower call path, about 1.9 us a module call here for two
# hooks that do nothing). What they add is kept to a context-variable read, a thread-id compare
# and, inside a root, one dict lookup (``_Active.hits``: the root's matched modules, made when the
# root is resolved): a module no pattern matches is not pushed on the stack, so its forward hook
# finds another module on top and returns. Only the root and the matched modules are pushed;
# the root stays on the stack while it runs, so "no module in flight" still means "a new root".
def _pre_hook(module, args):
    active = _ACTIVE.get()
    if active is None or active.thread != _get_ident():
        return None
    if active.stack and module not in active.hits:
        return None
    return active.pre(module, args)


def _post_hook(module, args, output):
    active = _ACTIVE.get()
    if active is not None and active.stack and active.stack[-1][0] is module and active.thread == _get_ident():
        active.post(module)
    return None


def _register_hooks() -> tuple:
    return (
        _nn_module.register_module_forward_pre_hook(_pre_hook),
        _nn_module.register_module_forward_hook(_post_hook, always_call=True),
    )


def _remove_hooks(handles: tuple) -> None:
    for handle in reversed(handles):
        handle.remove()


#: The two global hooks, registered while any region with a map is open in the process.
_hooks = _torch.Held(_register_hooks, _remove_hooks)


def activate(active: _Active):
    """Put ``active`` in force in the calling context; returns the token for ``deactivate``."""
    _hooks.acquire()
    return _ACTIVE.set(active), _regions.TAG.set(active.map.key)


def deactivate(tokens) -> None:
    active_token, tag_token = tokens
    try:
        _regions.TAG.reset(tag_token)
        _ACTIVE.reset(active_token)
    except ValueError:  # exited in another context than it was entered in
        _regions.TAG.set("")
        _ACTIVE.set(None)
    _hooks.release()


def current_module() -> Optional[str]:
    """The innermost mapped module in flight in the calling context (what events are tagged with)."""
    active = _ACTIVE.get()
    return active.module_name() if active is not None and active.thread == threading.get_ident() else None


def unmatched(active: _Active) -> List[str]:
    """The patterns that matched no module of any root ``active`` saw (none if it saw no root)."""
    if active.root is None and not active.names:
        return []
    return [p for p, _ in active.map.entries if p not in active.matched]


def warn_unmatched(active: _Active, warned: set) -> None:
    for pattern in unmatched(active):
        if pattern in warned:
            continue
        warned.add(pattern)
        names = ", ".join(repr(n) for n in active.names) or "(no submodules)"
        if pattern in SELECTORS:
            why = "the model has no leaf linear layer (nn.Linear, Hugging Face's Conv1D) nor output head"
        else:
            why = f"names are relative to the model, e.g. {names}"
        warnings.warn(
            f"hpu_autocast: modules= pattern {pattern!r} matched no module of the model ({why})",
            UserWarning,
            stacklevel=4,
        )


def _capture():
    """For a checkpoint's recomputation: the map in force at the forward, to run it under again."""
    active = _ACTIVE.get()
    if active is None or active.thread != threading.get_ident():
        return None
    # A checkpoint called inside a module recomputes inside its root (resolved as at the forward);
    # one called with no module in flight (checkpoint(model, x)) recomputes the root itself,
    # which the recomputation's map resolves as a fresh region's does.
    inside = bool(active.stack)
    snapshot = (active.map, active.make, active.root, active.resolved)

    class _Again:
        def __enter__(self):
            if inside:
                self.active = _Active(snapshot[0], snapshot[1], snapshot[2] or object(), snapshot[3])
            else:
                self.active = _Active(snapshot[0], snapshot[1])
            self.tokens = activate(self.active)

        def __exit__(self, *exc):
            self.active.unhook()
            deactivate(self.tokens)

    return _Again


_torch_autocast.add_recompute_capture(_capture)


# -- a region's map ----------------------------------------------------------------------------
def open_map(mode, observer, recorder=None) -> _Active:
    """Put ``mode.modules`` in force in the calling context for the region ``mode`` just entered
    (``observer``: the region's, which the overrides' regions report to, tagged with the module).
    An override's region is a mode of ``mode``'s own class: this module sits below ``mode``'s and
    imports nothing of it."""
    HpuAutocastMode = type(mode)

    def make(override: Override, name: str):
        if recorder is not None:
            recorder.note_module(name, str(override))
        if override.kind in ("fp32", "off"):
            return HpuAutocastMode(enabled=False)
        tagged = None
        if observer is not None:

            def tagged(event, _name=name):
                observer(event._replace(module=_name))

        dtype = override.dtype if override.kind == "dtype" else mode.dtype
        policy = override.policy if override.kind == "policy" else mode.policy
        return HpuAutocastMode(
            dtype, policy=policy, device_type=mode.device_type, cache_enabled=mode.cache_enabled, observer=tagged
        )

    active = _Active(mode.modules, make)
    active.tokens = activate(active)
    return active


def close_map(active: _Active, warned: set) -> None:
    """Take ``active`` out of force (closing the overrides' regions still open: a region exited
    inside a module's forward), then warn of its patterns that matched nothing."""
    try:
        while active.stack:
            entry = active.stack.pop()
            if entry[1] is not None:
                entry[1].__exit__(None, None, None)
    finally:
        active.unhook()
        deactivate(active.tokens)
    warn_unmatched(active, warned)

"""Which engine runs the kernels on the ops key: the C++ core (``csrc/core.cpp``), where it was
built for the installed torch, else the Python kernels (``_kernels``), with the same results.

[Note: two engines, one set of rules]
The core is a faster body for the same decisions, not a second implementation to keep in step
by hand: it reads the compiled policy (``_table``) through one table per policy and device type
(``table``, built here from the same ``OpRule`` fields the Python kernels read), and it hands
every call it cannot decide exactly as the Python kernel would to that Python kernel
(``OpRule.core``'s Note: which calls the core decides, and csrc/core.cpp): observing regions, tracing, named in-place
and ``out=`` overloads, ops left to native autocast, banned ops, errors. Both share one cast
cache per region (``new_cache``), so a weight cast by either is cast once. Which engine runs is
decided once per process, at import:

* ``HPU_AUTOCAST_ENGINE=python``: the Python kernels;
* ``HPU_AUTOCAST_ENGINE=c++``: the core, or ``ImportError`` saying why it cannot load;
* unset or ``auto``: the core where built (``hpu-autocast build-core``), else the Python kernels.

``ENGINE`` says which (``"c++"`` or ``"python"``) and ``REASON`` why.
"""

from __future__ import annotations

import importlib.util
import os
from typing import List, NamedTuple, Optional, Tuple

import torch

from . import cast_cache as _cast_cache, core_build as _core_build
from .. import _torch
from .._facts import ops as _ops
from .._facts.devices import native_autocast_keys
from ..policies.recipes import is_fp8

__all__ = ["core", "ENGINE", "REASON", "new_cache", "region_for", "set_frame", "register"]


def _load() -> tuple:
    choice = os.environ.get("HPU_AUTOCAST_ENGINE", "auto").strip().lower() or "auto"
    if choice not in ("auto", "c++", "python"):
        raise ValueError(f"HPU_AUTOCAST_ENGINE={choice!r}: expected 'auto', 'c++' or 'python'")
    if choice == "python":
        return None, "HPU_AUTOCAST_ENGINE=python"
    path = _core_build.built_path()
    if path is None:
        reason = (
            f"the C++ core is not built for torch {torch.__version__} (run `hpu-autocast build-core` once to build it)"
        )
        if choice == "c++":
            raise ImportError(f"HPU_AUTOCAST_ENGINE=c++, but {reason}")
        return None, reason
    try:
        spec = importlib.util.spec_from_file_location(_core_build.MODULE, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError) as e:
        if choice == "c++":
            raise ImportError(f"HPU_AUTOCAST_ENGINE=c++, but the C++ core at {path} does not load: {e}") from e
        return None, f"the C++ core at {path} does not load ({e})"
    return module, f"the C++ core, {path}"


core, REASON = _load()
#: Which engine runs the kernels in this process: ``"c++"`` or ``"python"`` (``REASON`` says why).
ENGINE = "c++" if core is not None else "python"

if core is not None:
    core.set_native_autocast_keys(list(native_autocast_keys()))
    _ACTION = core.action_codes()
    _KIND = core.kind_codes()


def new_cache():
    """A region's cast cache: the core's (its kernels and the Python path share it), else the
    Python one (``_cast_cache.Cache``, the same interface)."""
    return core.Cache() if core is not None else _cast_cache.Cache()


class CoreRule(NamedTuple):
    """One rule as it crosses to the core: csrc/core.cpp's ``make_rule`` reads each field by its
    name into its ``Rule`` struct, once, when a table is built."""

    #: The op's index in the core's tables (``register``'s).
    index: int
    #: ``action_codes()``'s code of the cast policy the core applies; ``PYTHON`` hands the call on.
    action: int
    #: It casts its first tensor alone (Gaudi's norms) on this device.
    input_only: bool
    #: It decomposes above autograd (``_ops.is_composite``).
    composite: bool
    #: ``kind_codes()``'s code per schema argument: positional, written, keyword or skip.
    kinds: List[int]
    #: ``OpRule.dtype_args``: the dtype arguments the rule reads.
    dtype_args: List[int]
    #: A call passing a dtype runs unchanged (``OpRule.leave_explicit``).
    leave_explicit: bool
    #: FP32_APPEND_DTYPE's overload with a dtype, as ``(name, overload name)``; ``("", "")``: none.
    redispatch: Tuple[str, str]


def _row(rule, index: int, device_type: str) -> CoreRule:
    """One rule as the core reads it (``CoreRule``). Which rules the core applies is
    ``OpRule.core`` (Note: which calls the core decides); the rest are ``PYTHON``."""
    kinds = []
    for i, a in enumerate(_torch.schema(rule.op).arguments):
        if a.kwarg_only:
            kinds.append(_KIND["skip"] if a.name in rule.written_names else _KIND["keyword"])
        else:
            kinds.append(_KIND["written"] if i in rule.protected else _KIND["positional"])
    redispatch = _torch.schema(rule.redispatch) if rule.redispatch is not None else None
    return CoreRule(
        index=index,
        action=_ACTION[rule.action.name if rule.core else "PYTHON"],
        input_only=rule.input_only and rule.casts_input_only(device_type),
        composite=_ops.is_composite(rule.op),
        kinds=kinds,
        dtype_args=list(rule.dtype_args),
        leave_explicit=rule.leave_explicit,
        redispatch=(redispatch.name, redispatch.overload_name) if redispatch is not None else ("", ""),
    )


_NO_RULES: dict = {}  # the kinds of regions with no policy (a disable_casts() outside any region)


def _kind(compiled, device_type: str, keys):
    """What the core's regions of ``compiled`` on ``device_type`` share (its table of the
    policy's rules, the device, the engine's keys): built once, again when rules were added to
    the policy since (``CompiledPolicy.native_ops``) or the observing key moved."""
    kinds = compiled.tables if compiled is not None else _NO_RULES
    count = len(compiled.rules) if compiled is not None else 0
    entry = kinds.get(device_type)
    if entry is None or entry[0] != count or entry[1] is not keys.all:
        if count:
            # A disabled region keeps its policy for a torch.autocast inside to turn on, whether
            # or not a region of it has opened yet: its rules need the kernels registered.
            keys.register(compiled.rules)
        rows = [_row(rule, keys.indices[op], device_type) for op, rule in compiled.rules.items()] if count else []
        entry = kinds[device_type] = (
            count,
            keys.all,
            core.RegionKind(core.make_table(rows), device_type, keys.ops, keys.all),
        )
    return entry[2]


def region_for(region, cache, keys) -> Optional[object]:
    """The core's state for ``region`` (a ``_regions.Region`` being entered, with the cast
    ``cache`` it shares, on the borrowed ``keys``), or ``None`` where the Python kernels decide its calls: no core, a region that
    observes (events are Python's), or an fp8 region (its GEMMs are ``_fp8``'s: Note: fp8 regions)."""
    if core is None or region.observer is not None or region.observes or is_fp8(region.dtype):
        return None
    return _kind(region.compiled, region.device_type, keys).open(cache)


def set_frame(state, frame) -> None:
    """Tell the core the calling context's innermost frame and the core's ``state`` for its region
    (``region_for``'s; ``None``: the Python kernels decide) (csrc/core.cpp, Note [the frame in C++])."""
    if core is None:
        return
    if state is not None:
        core.set_frame(state, frame.enabled, frame.dtype)
    else:
        core.clear_frame()


def register(ns: str, name: str, overload: str, key, kernel) -> int:
    """Register the core's kernel for one overload on ``key``; ``kernel`` is the Python kernel it
    hands the calls it does not decide to. Returns the overload's index in the core's tables."""
    return core.register_kernel(ns, name, "" if overload == "default" else overload, key, kernel)

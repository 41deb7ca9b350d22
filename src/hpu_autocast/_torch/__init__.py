"""Torch's private surface, in one package (``hpu_autocast._torch``): this module holds every
private torch name the rest of the package asks (``torch._C``'s, the private module paths torch
keeps public types under, torch's own autocast state), each with what it is for, the torch
versions it was checked on, and what happens where it is missing, and the private attributes of
torch's objects (``op._schema``, ``op._op``, ...) as named accessors; ``compile_guard`` holds
Dynamo's names. It is the bottom layer: it imports nothing of the package. The patches of torch
made while a region is open are the engine's (``_engine.torch_autocast``, ``_engine.torchscript``),
and take their private names from here. No module outside the package reaches for a private
torch name or attribute, assigns a torch attribute (the engine's patches excepted), or uses
``ctypes`` or ``sys._getframe`` (tests/internal/test_private_surface.py).

Checked on: present in torch 2.4.1, 2.13.0 and 2.14.1 (``hasattr`` on each, and the suite run
on 2.13.0); the suite also ran on 2.6.0 and 2.9.1 (README). "Fallback" says what a torch without
the name gets.

==========================================  ==================================================
name (``torch._C.``)                        use; fallback
==========================================  ==================================================
``_dispatch_tls_set_dispatch_key_excluded`` the thread's excluded key set (``KeyGuard``); none:
``_dispatch_tls_is_dispatch_key_excluded``  the engine is dispatcher kernels (required)
``_dispatch_tls_set_dispatch_key_included`` the thread's included set (a region switching its
``_dispatch_tls_is_dispatch_key_included``  keys on); none (required)
``_dispatch_keyset_full_after``             the key set below the ops key (a kernel passing a
                                            call on); none (required)
``_dispatch_has_backend_fallback``          whether a backend claimed a borrowed key; none
``_get_privateuse1_backend_name``           whether a PrivateUse1 backend loaded; none
``_jit_get_all_schemas``                    every op, for the observing fallback; none
``_dispatch_get_all_op_names``              every op name (names, composites); none
``_dispatch_has_kernel_for_dispatch_key``   composites and views; none
``_dispatch_get_registrations_for_dispatch_key``  custom ops a native key has kernels for
                                            (``Policy.native``); none
``_len_torch_dispatch_stack``               whether a dispatch mode is on (tracing); none
``_ExcludeDispatchKeyGuard``                the engine's keys excluded around a kernel's call
                                            (``Keys.excluded``; checked on 2.13.0); missing:
                                            ``KeyGuard``, in Python
``_set_grad_enabled``                       grad mode for one cast (``torch.set_grad_enabled``
                                            builds an object per call); none
``_stash_obj_in_tls`` / ``_get_obj_in_tls`` the frame stashed for autograd's worker threads;
/ ``_is_key_in_tls``                        missing: no stash (backward on a worker thread of
                                            its own casts as outside a region)
``_is_any_autocast_enabled``                patched while a region is open (``_torch_autocast``);
                                            none
``_current_autograd_node``                  the backward node running (``testing``); none
``torch.library._impls``                    how many Python registrations (when to ask the
                                            dispatcher again); missing: asked once
``torch._ops._higher_order_ops``            every higher-order operator made (``_engine.hops``);
                                            missing: none covered
``torch._ops._compute_keyset``              a higher-order operator's key set; missing: ``None``
``ScriptFunction`` / ``ScriptMethod``         TorchScript's callables, patched while a region is
                                            open (``_torchscript``); none
``_global_optimizer_pre_hooks`` /           the dicts of torch's global optimizer step hooks
``_global_optimizer_post_hooks``            (``torch.optim.optimizer``'s; ``OPTIMIZER_STEP_HOOKS``:
                                            ``_torch_autocast``'s step hooks); none
``torch.utils.checkpoint._checkpoint_without_reentrant_generator_impl`` (2.14) or
``..._generator`` (before)                  the generator non-reentrant ``checkpoint`` calls
                                            (``CHECKPOINT_GENERATOR``, its name); none
``sys._getframe``                           ``caller_frame``: the frames an optimizer step runs
                                            in (``_torch_autocast``); CPython's, none
``torch._scaled_mm``                        fp8 regions' GEMMs (``scaled_mm``; checked on 2.13.0,
                                            CPU, and 2.4.1, whose takes the scales by keyword,
                                            returns a pair and has no CPU kernel:
                                            ``scaled_mm_runs_on``); missing: ``scaled_mm``
                                            raises, naming the torch
``_current_graph_task_id``                  whether a backward runs (``in_backward``: an fp8
                                            region's recomputation under checkpointing);
                                            missing: ``False``
==========================================  ==================================================

Public in use, but under private paths (present on 2.4.1, 2.13.0 and 2.14.1; required, no
fallback): from ``torch._ops``, ``OpOverload``, ``OpOverloadPacket``, ``OperatorBase`` (the
types of ops); from ``torch.utils._python_dispatch``, ``TorchDispatchMode`` (the report's and
the checker's modes); from ``torch.utils._pytree``, ``tree_map``, ``tree_flatten``,
``tree_unflatten``, ``tree_flatten_with_path``, ``tree_leaves``, ``keystr``; ``torch.ops.aten._to_copy.default``
(``TO_COPY``: the op every cast is); from ``torch._C``, the schema types ``TensorType``,
``OptionalType``, ``ListType``, ``TensorBase`` (and its C function modules,
``c_function_namespace``), ``DispatchKey``, ``DispatchKeySet``, and torch's own autocast state, read and set
as its C functions (``native_autocast_enabled``, ``set_native_autocast_enabled``,
``native_autocast_dtype``, ``set_native_autocast_dtype``, ``autocast_cache_enabled``,
``set_autocast_cache_enabled``; ``torch.is_autocast_enabled`` and the other Python functions
answer for a region while one is open, ``autocast``'s patches, so the engine asks these).

``torch._C.DispatchKey`` by name: ``dispatch_key`` (``None`` for a key this torch lacks).

Private attributes of torch's objects, read only through these accessors (present on 2.4.1,
2.13.0 and 2.14.1; required, no fallback): ``schema(op)`` (``op._schema``, an overload's or
packet's ``FunctionSchema``), ``op_function(op)`` (``op._op``, the overload's C++ callable
without ``OpOverload.__call__``'s frame, which the kernels call), ``overload_name(op)``
(``op._overloadname``), ``overload_packet(op)`` (``op._overloadpacket``), ``is_view(t)``
(``t._is_view()``), ``version_counter(t)`` (``t._version``), ``destroy_library(lib)``
(``Library._destroy()``), ``rename_node(node, name)`` (``torch.fx.Node._rename``).

The C++ core (``csrc/core.cpp``) reaches torch's C++ surface, compiled against the installed
torch's headers; it was built and its suite run on torch 2.4.1, 2.6.0, 2.9.1, 2.13.0 and 2.14.1.
Where a name is missing the build fails and the Python kernels run (``_core``). What it uses
beyond the public ``torch::Library`` and ``c10::OperatorHandle`` (boxed calls, redispatch):

================================================  ==============================================
C++ name                                          use
================================================  ==============================================
``c10::impl::ExcludeDispatchKeyGuard``            the engine's keys excluded around a call
``c10::impl::tls_is_dispatch_key_excluded``       whether a native autocast key is on
``c10::impl::TorchDispatchModeTLS::stack_len``    a dispatch mode is on: hand the call to Python
``at::autocast::is_autocast_cache_enabled``       torch's cache flag (as the Python path reads it)
``torch::jit::toPyObject`` / ``toIValue``         the hand-off's arguments and result
``torch::getTHPDtype`` / ``getTHPLayout``,        the same, for ``ScalarType``, ``Layout`` and
``torch::utils::getTHPMemoryFormat``              ``MemoryFormat`` arguments
``PyThreadState.context`` (CPython)               the running context (Note [the frame in C++])
================================================  ==============================================
"""

from __future__ import annotations

import ctypes
import functools
import operator
import sys
import threading
from typing import Callable, Optional

import torch
import torch.optim.optimizer as _optimizer
import torch.utils.checkpoint as _checkpoint
from torch._ops import OperatorBase, OpOverload, OpOverloadPacket
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path, tree_leaves, tree_map, tree_unflatten

__all__ = [
    "set_excluded",
    "is_excluded",
    "set_included",
    "is_included",
    "keyset_after",
    "has_backend_fallback",
    "privateuse1_backend_name",
    "all_schemas",
    "all_op_names",
    "has_kernel_for",
    "registrations_for",
    "python_registrations",
    "dispatch_mode_depth",
    "exclude_guard",
    "DispatchKeySet",
    "set_grad_enabled",
    "tls_stash",
    "tls_stashed",
    "ANY_AUTOCAST_ENABLED",
    "current_autograd_node",
    "dispatch_key",
    "HIGHER_ORDER_OPS",
    "hop_keyset",
    "OpOverload",
    "OpOverloadPacket",
    "OperatorBase",
    "TorchDispatchMode",
    "tree_map",
    "tree_flatten",
    "tree_leaves",
    "tree_unflatten",
    "tree_flatten_with_path",
    "keystr",
    "TO_COPY",
    "DispatchKey",
    "TensorType",
    "OptionalType",
    "ListType",
    "TensorBase",
    "c_function_namespace",
    "native_autocast_enabled",
    "set_native_autocast_enabled",
    "native_autocast_dtype",
    "set_native_autocast_dtype",
    "autocast_cache_enabled",
    "set_autocast_cache_enabled",
    "increment_autocast_nesting",
    "decrement_autocast_nesting",
    "clear_native_autocast_cache",
    "Held",
    "wrap_autograd",
    "unwrap_autograd",
    "scaled_mm",
    "HAS_SCALED_MM",
    "scaled_mm_runs_on",
    "schema",
    "op_function",
    "overload_name",
    "overload_packet",
    "is_view",
    "version_counter",
    "destroy_library",
    "rename_node",
    "ScriptFunction",
    "ScriptMethod",
    "OPTIMIZER_STEP_HOOKS",
    "CHECKPOINT_GENERATOR",
    "caller_frame",
    "autograd_cache_off",
]

_C = torch._C

# -- types: ops, schema types, dispatch keys; the op every cast is --------------------------------
DispatchKey = _C.DispatchKey
TensorType = _C.TensorType
OptionalType = _C.OptionalType
ListType = _C.ListType
#: The C class of every tensor's methods (a name there with no function variant is method-only).
TensorBase = _C.TensorBase


def c_function_namespace(name: str) -> object:
    """torch's C module of functions called ``name`` (``_VariableFunctions``, ``_nn``, ``_linalg``,
    ...), or ``None`` where this torch has none."""
    return getattr(_C, name, None)


TO_COPY = torch.ops.aten._to_copy.default

# -- private attributes of torch's objects (the table above) -------------------------------------
#: ``schema(op)``: an overload's (or packet's) ``FunctionSchema``.
schema = operator.attrgetter("_schema")
#: ``op_function(op)``: an overload's C++ callable; calling it skips ``OpOverload.__call__``'s frame.
op_function = operator.attrgetter("_op")
#: ``overload_name(op)``: ``"default"``, ``"out"``, ``"Tensor"``, ...
overload_name = operator.attrgetter("_overloadname")
#: ``overload_packet(op)``: the ``OpOverloadPacket`` an overload belongs to.
overload_packet = operator.attrgetter("_overloadpacket")
#: ``is_view(t)``: whether a tensor is a view of another.
is_view = operator.methodcaller("_is_view")
#: ``version_counter(t)``: a tensor's version, bumped by each in-place write.
version_counter = operator.attrgetter("_version")


def destroy_library(lib: torch.library.Library) -> None:
    """Remove every registration ``lib`` made (``Library._destroy``)."""
    lib._destroy()


def rename_node(node: torch.fx.Node, name: str) -> None:
    """Rename an FX node in its graph's namespace (``Node._rename``)."""
    node._rename(name)


# -- TorchScript's callables, optimizer hooks, checkpointing: what the engine's patches reach ---
ScriptFunction = _C.ScriptFunction
ScriptMethod = _C.ScriptMethod
#: The dicts torch's global optimizer step hooks live in: (pre-step, post-step).
OPTIMIZER_STEP_HOOKS = (_optimizer._global_optimizer_pre_hooks, _optimizer._global_optimizer_post_hooks)
#: The name of the generator non-reentrant ``checkpoint`` calls: from torch 2.14, ``..._impl`` (the
#: old name is kept as a shim ``checkpoint`` no longer calls; patching it left recomputations to
#: native autocast there).
CHECKPOINT_GENERATOR = next(
    n
    for n in ("_checkpoint_without_reentrant_generator_impl", "_checkpoint_without_reentrant_generator")
    if hasattr(_checkpoint, n)
)
#: ``caller_frame(depth)``: CPython's ``sys._getframe``.
caller_frame = sys._getframe

# -- the fp8 GEMM (_engine/fp8.py) ----------------------------------------------------------------
_scaled_mm = getattr(torch, "_scaled_mm", None)
#: Whether this torch has ``torch._scaled_mm`` (fp8 regions need it).
HAS_SCALED_MM = _scaled_mm is not None
#: torch 2.4's ``_scaled_mm`` takes the scales by keyword and returns ``(product, amax)``; from
#: 2.5 on they are positional and it returns the product alone.
_SCALES_BY_KEYWORD = HAS_SCALED_MM and torch.ops.aten._scaled_mm.default._schema.arguments[2].kwarg_only
_SCALED_MM_BACKENDS = {"cpu": "CPU", "cuda": "CUDA"}


@functools.lru_cache(maxsize=None)
def scaled_mm_runs_on(device_type: str) -> bool:
    """Whether ``torch._scaled_mm`` has a kernel for ``device_type``'s tensors: torch 2.4's has
    CUDA's alone. (A device type not named here is the bridge's or unknown: true.) Asked of the
    dispatcher once per device type: an fp8 region's router asks it at every GEMM."""
    key = _SCALED_MM_BACKENDS.get(device_type)
    return HAS_SCALED_MM and (key is None or _C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_mm", key))


_GRAPH_TASK_ID = getattr(_C, "_current_graph_task_id", None)


def in_backward() -> bool:
    """Whether this thread runs a backward (autograd's engine executes a graph task): a forward op
    seen now is a recomputation (``torch.utils.checkpoint``) or a double backward."""
    return _GRAPH_TASK_ID is not None and _GRAPH_TASK_ID() != -1


def scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=None):
    """``torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype)``: the product of
    two fp8 matrices (``a`` row-major, ``b`` column-major) times their float32 dequantization
    scales; ``RuntimeError`` naming the torch version where torch has none."""
    if _scaled_mm is None:
        raise RuntimeError(
            f"fp8 regions need torch._scaled_mm, which torch {torch.__version__} lacks; "
            "accepted: a torch that has it (2.4 or later), or a bfloat16 region"
        )
    if _SCALES_BY_KEYWORD:
        return _scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype)[0]
    return _scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype)


# -- torch's own autocast state, as its C functions (the Python ones answer for a region) --------
native_autocast_enabled = _C.is_autocast_enabled
set_native_autocast_enabled = _C.set_autocast_enabled
native_autocast_dtype = _C.get_autocast_dtype
set_native_autocast_dtype = _C.set_autocast_dtype
autocast_cache_enabled = _C.is_autocast_cache_enabled
set_autocast_cache_enabled = _C.set_autocast_cache_enabled
#: torch.autocast's nesting count and the C function that clears native's cast cache (the
#: Python ``torch.clear_autocast_cache`` is patched while a region is open: ``_engine.torch_autocast``).
increment_autocast_nesting = torch.autocast_increment_nesting
decrement_autocast_nesting = torch.autocast_decrement_nesting
clear_native_autocast_cache = _C.clear_autocast_cache

# -- the dispatcher: thread-local key sets, key sets, fallbacks, registrations ---------------
set_excluded = _C._dispatch_tls_set_dispatch_key_excluded
is_excluded = _C._dispatch_tls_is_dispatch_key_excluded
set_included = _C._dispatch_tls_set_dispatch_key_included
is_included = _C._dispatch_tls_is_dispatch_key_included
keyset_after = _C._dispatch_keyset_full_after
has_backend_fallback = _C._dispatch_has_backend_fallback
privateuse1_backend_name = _C._get_privateuse1_backend_name
all_schemas = _C._jit_get_all_schemas
all_op_names = _C._dispatch_get_all_op_names
has_kernel_for = _C._dispatch_has_kernel_for_dispatch_key
registrations_for = _C._dispatch_get_registrations_for_dispatch_key
dispatch_mode_depth = _C._len_torch_dispatch_stack
#: torch's C++ guard excluding a ``DispatchKeySet`` (at its exit, what it added is removed: the
#: state at its entry is restored): ``KeyGuard``'s job in one C++ call; ``None`` where missing.
exclude_guard = getattr(_C, "_ExcludeDispatchKeyGuard", None)
DispatchKeySet = _C.DispatchKeySet


# -- higher-order operators (``torch._ops``; checked on 2.4.1, 2.6.0, 2.9.1, 2.13.0, 2.14.1) ------
#: Every ``HigherOrderOperator`` made in the process, by name (each registers itself here).
HIGHER_ORDER_OPS: dict = getattr(torch._ops, "_higher_order_ops", {})
_compute_keyset = getattr(torch._ops, "_compute_keyset", None)


def _hop_keyset(op, args: tuple, kwargs: dict):
    return _compute_keyset(args, kwargs, op.non_fallthrough_keys)


#: ``hop_keyset(op, args, kwargs)``: the key set a call of the higher-order operator ``op``
#: dispatches on, the keys it skips left out (as its ``__call__`` computes it); ``None`` where
#: torch has no such function.
hop_keyset = _hop_keyset if _compute_keyset is not None else None


def dispatch_key(name: str):
    """``torch._C.DispatchKey.<name>``, or ``None`` where this torch has no such key."""
    return getattr(_C.DispatchKey, name, None)


def python_registrations() -> Optional[int]:
    """How many kernels were registered from Python (``torch.library``'s record), or ``None``
    where torch keeps no record."""
    impls = getattr(torch.library, "_impls", None)
    return len(impls) if impls is not None else None


# -- autograd ------------------------------------------------------------------------------------
set_grad_enabled = _C._set_grad_enabled
current_autograd_node = _C._current_autograd_node

#: The private getter ``_torch_autocast`` answers for while a region is open: (owner, name).
ANY_AUTOCAST_ENABLED = (_C, "_is_any_autocast_enabled")


# -- the thread-local stash autograd's worker threads inherit -----------------------------------
_stash = getattr(_C, "_stash_obj_in_tls", None)
_stashed = getattr(_C, "_get_obj_in_tls", None)
_has_stash = getattr(_C, "_is_key_in_tls", None)


def _incref(obj: object) -> None:
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def _stash_steals(key: str) -> bool:
    """Whether ``_stash_obj_in_tls`` keeps the object without a reference of its own: torch before
    2.13 wraps the borrowed pointer in a ``SafePyObject``, which releases a reference when it is
    replaced or its thread ends, so each object stashed must be given one (else a stashed frame,
    or ``None``, is freed while still in use). Probed once, on a fresh object; the probe leaves
    ``None`` stashed in the importing thread, which reads as "nothing inherited"."""
    if _stash is None:
        return False
    probe = object()
    before = sys.getrefcount(probe)
    _stash(key, probe)
    steals = sys.getrefcount(probe) == before
    if steals:
        _incref(probe)  # the reference the stash drops when None replaces the probe, below
        _incref(None)
    _stash(key, None)
    return steals


_STASH_KEY = "hpu_autocast.frame"
_STASH_STEALS = _stash_steals(_STASH_KEY)


def _stash_with_reference(obj: object) -> None:
    _incref(obj)
    _stash(_STASH_KEY, obj)


def _no_stash(obj: object) -> None:
    pass


#: ``tls_stash(obj)``: stash ``obj`` in the calling thread's state that autograd's worker threads
#: inherit; nothing where torch has no stash. (Chosen once; each thread stashes one object, ``_regions._stashed_cell``.)
tls_stash = (
    _no_stash if _stash is None else _stash_with_reference if _STASH_STEALS else functools.partial(_stash, _STASH_KEY)
)


def tls_stashed() -> object:
    """What ``tls_stash`` left in this thread's state, or inherited with it; ``None`` if nothing."""
    if _has_stash is None or not _has_stash(_STASH_KEY):
        return None
    return _stashed(_STASH_KEY)


# -- something process-wide, installed by its first holder and removed by its last -------------
class Held:
    """What several holders share process-wide (hooks, wrapped functions, a config value): the
    first ``acquire`` installs it (``install(*args)``, whose result is kept), the matching last
    ``release`` removes it (``remove(kept)``); counted under a lock, so threads may hold it at once."""

    def __init__(self, install: Callable[..., object], remove: Callable[[object], None]) -> None:
        self._install, self._remove = install, remove
        self._lock = threading.Lock()
        self.holders = 0
        self._kept: object = None

    def acquire(self, *args) -> None:
        with self._lock:
            if self.holders == 0:
                self._kept = self._install(*args)
            self.holders += 1

    def release(self) -> None:
        with self._lock:
            self.holders -= 1
            if self.holders == 0:
                kept, self._kept = self._kept, None
                self._remove(kept)


# -- torch.autograd's entry points, wrapped while ``hmp.convert`` holds them ----------------------
_AUTOGRAD_ENTRIES = ("backward", "grad")


def _wrap_entries(wrap: Callable[[Callable], Callable]) -> dict:
    originals = {name: getattr(torch.autograd, name) for name in _AUTOGRAD_ENTRIES}
    for name, fn in originals.items():
        setattr(torch.autograd, name, wrap(fn))
    return originals


def _restore_entries(originals: dict) -> None:
    for name, fn in originals.items():
        setattr(torch.autograd, name, fn)


_autograd = Held(_wrap_entries, _restore_entries)


def wrap_autograd(wrap: Callable[[Callable], Callable]) -> None:
    """Replace ``torch.autograd.backward`` and ``grad`` by ``wrap(fn)`` of each, counted: the
    first call wraps them, the matching last ``unwrap_autograd`` puts torch's back."""
    _autograd.acquire(wrap)


def unwrap_autograd() -> None:
    """``wrap_autograd``'s counterpart: the last holder's call restores torch's functions."""
    _autograd.release()

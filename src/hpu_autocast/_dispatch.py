"""Where the engine meets torch's dispatcher: the two dispatch keys it borrows, the Python kernels
it registers there, and the per-thread switches that route calls to them.

[Note: autocast as dispatcher kernels]
Native autocast is a set of C++ kernels on the ``AutocastCPU`` / ``AutocastCUDA`` dispatch keys.
Those keys come before autograd and before ``CompositeImplicitAutograd`` ops decompose; an op
without a kernel there falls through at no cost. ``torch.autocast`` switches them on per thread
(it removes the key from the thread's excluded set), and a kernel excludes its key while it runs
the op, so the op's insides are left alone while calls made from C++ inside *other* composites
(``at::linear`` in ``lstm``, ``bmm`` in ``einsum``) still reach the key.

This package does the same in Python. It registers, through ``torch.library``, one kernel per
policy overload on an autocast key that no backend in this process uses (``AutocastPrivateUse1``
unless a PrivateUse1 backend is loaded), and switches that key on for a thread by adding it to the
thread's *included* set while a region is open there (tensors do not carry it; the included set
reaches every call). Hence:

* an op no policy names never enters Python: it falls through, as under native autocast;
* a policy op is cast where native autocast casts it, above autograd (the casts are ordinary
  autograd ops) and before decomposition, so the results are native's bit for bit where the policy
  is native's;
* the thread's key sets travel with ``ThreadLocalState`` to autograd's worker threads, and
  ``torch.compile`` traces through the kernels (its AOT tracing dispatches like eager), so the
  casts land in the compiled graph.

A second borrowed key carries a Python kernel for *every* op, the *fallback*, which sees each op
the first key let through: it is switched on only for regions that observe (``verbose``,
``record``, ``observer=``) or whose policy has a rule for ops on no list (HMP), so other regions
never pay for it. It sits below the first key, so it sees only ops that no kernel handled. (It is
one kernel per op, registered when first needed, rather than a dispatcher fallback: torch routes
a Python *fallback* through the active ``TorchDispatchMode``'s interpreter, which knows only
per-op registrations, and fails an internal assert there; and torch 2.4 has no Python fallbacks.)
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, Dict, Optional

import torch
from torch._ops import OpOverload
from torch.library import Library, fallthrough_kernel

from . import _ops

__all__ = ["Keys", "keys", "ThreadSwitch", "thread_switch"]

_DK = torch._C.DispatchKey
_set_included = torch._C._dispatch_tls_set_dispatch_key_included
_set_excluded = torch._C._dispatch_tls_set_dispatch_key_excluded
_is_included = torch._C._dispatch_tls_is_dispatch_key_included
_is_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded

# Autocast keys of devices this package does not cast for natively, in order of preference, with
# the device whose backend would own them. A key is borrowed only while no backend claims it.
# AutocastHPU comes last: Gaudi's bridge registers its own fallback there when it loads.
_CANDIDATES = (("AutocastPrivateUse1", "privateuseone"), ("AutocastIPU", "ipu"), ("AutocastHPU", "hpu"))


def _claimed(name: str, device: str) -> bool:
    key = getattr(_DK, name, None)
    if key is None:
        return True
    if torch._C._dispatch_has_backend_fallback(key):
        return True  # some library registered a fallback: the key is in use
    if device == "privateuseone":
        return torch._C._get_privateuse1_backend_name() != "privateuseone"
    if device == "hpu":
        return "habana_frameworks.torch" in sys.modules
    return False


class Keys:
    """The two borrowed keys and the libraries holding this package's registrations on them.

    ``ops`` carries one kernel per policy overload (registered as policies are first used, kept
    for the life of the process: a kernel whose region does not name its op calls it through);
    ``all`` carries the observing fallback. ``ops`` has the higher priority."""

    def __init__(self, make_kernel: Callable[[OpOverload], Callable],
                 make_fallback: Callable[[OpOverload], Callable]) -> None:
        free = [(name, device) for name, device in _CANDIDATES if not _claimed(name, device)]
        if len(free) < 2:
            raise RuntimeError(
                "hpu_autocast needs two autocast dispatch keys that no backend uses; of "
                f"{', '.join(n for n, _ in _CANDIDATES)} only {', '.join(n for n, _ in free) or 'none'} "
                "are free in this process")
        (ops_name, self.ops_device), (all_name, self.all_device) = sorted(
            free[:2], key=lambda nd: int(getattr(_DK, nd[0])), reverse=True)
        self.ops = getattr(_DK, ops_name)
        self.all = getattr(_DK, all_name)
        self.ops_name, self.all_name = ops_name, all_name
        self._make_kernel = make_kernel
        self._make_fallback = make_fallback
        self._globals = [_fall_through(name) for name in (ops_name, all_name)]
        self._libs: Dict[str, Library] = {}
        self._registered: set = set()
        self._lock = threading.Lock()
        self._fallback_ready = False

    def _lib(self, ns: str) -> Library:
        lib = self._libs.get(ns)
        if lib is None:
            lib = self._libs[ns] = Library(ns, "IMPL")
        return lib

    def prepare_fallback(self) -> None:
        """Register the fallback's kernel for every op the dispatcher has (once, before the
        fallback's key is first switched on; ops registered later fall through it).

        [Note: views never enter the fallback] A view neither computes nor casts, and a Python
        kernel that returns a tensor gives it a Python object, which C++ code wrapping a fresh
        tensor in a subclass does not expect: ``nn.Parameter(t)`` detaches ``t`` and fails with
        "the raw Tensor object is already associated to a python object". So every overload whose
        schema returns an alias it does not write (``detach``, ``view``, ``t``, ...) is left to
        fall through (``_ops.is_view``: views and in-place views such as ``detach_``)."""
        if self._fallback_ready:
            return
        with self._lock:
            if self._fallback_ready:
                return
            for schema in torch._C._jit_get_all_schemas():
                ns, _, name = schema.name.partition("::")
                qualified = f"{name}.{schema.overload_name}" if schema.overload_name else name
                try:
                    op = getattr(getattr(getattr(torch.ops, ns), name), schema.overload_name or "default")
                except (AttributeError, RuntimeError):
                    continue  # a TorchScript-only schema (aten::__getitem__.t): no dispatcher entry
                if _ops.is_view(op):
                    continue
                try:
                    self._lib(ns).impl(qualified, self._make_fallback(op), self.all_name)
                except RuntimeError:
                    continue  # an op whose schema the dispatcher does not accept a Python kernel for
            self._fallback_ready = True

    def register(self, ops) -> None:
        """Register the kernel of every overload in ``ops`` not registered yet."""
        todo = [op for op in ops if op not in self._registered]
        if not todo:
            return
        with self._lock:
            for op in todo:
                if op in self._registered:
                    continue
                ns, _, name = op._schema.name.partition("::")
                lib = self._lib(ns)
                overload = op._overloadname
                # with_keyset: the kernel gets the call's dispatch key set, to pass an op it has
                # no rule for on below its key as a fallthrough would (_engine._make_kernel).
                lib.impl(name if overload == "default" else f"{name}.{overload}", self._make_kernel(op),
                         self.ops_name, with_keyset=True)
                self._registered.add(op)


def _fall_through(key_name: str) -> Library:
    """Make ``key_name`` fall through for every op without a kernel there; returns the library
    holding that registration (it lasts as long as the library object)."""
    lib = Library("_", "IMPL", key_name)
    if hasattr(lib, "fallback"):
        lib.fallback(fallthrough_kernel, key_name)
    else:  # torch < 2.5 has no Library.fallback
        lib.m.fallback_fallthrough()
    return lib


_keys: Optional[Keys] = None
_keys_lock = threading.Lock()


def keys(make_kernel: Callable[[OpOverload], Callable], make_fallback: Callable[[OpOverload], Callable]) -> Keys:
    """The process's ``Keys``, chosen and set up on first use (the first region)."""
    global _keys
    if _keys is None:
        with _keys_lock:
            if _keys is None:
                _keys = Keys(make_kernel, make_fallback)
    return _keys


class ThreadSwitch:
    """How many regions are open in one thread, and so whether its keys are switched on.

    Counted per thread because the key sets are thread-local in C++; a region remembers the switch
    of the thread that entered it, so an exit from another thread still counts it down (that
    thread's key sets are brought in line at its next region). Switching on saves the key sets'
    previous state and switching off restores it, so a region opened and closed in an autograd
    worker thread (``custom_bwd``) leaves the state that thread inherited."""

    __slots__ = ("ops", "all", "thread", "_saved_ops", "_saved_all")

    def __init__(self) -> None:
        self.ops = 0
        self.all = 0
        self.thread = threading.get_ident()
        self._saved_ops: Optional[tuple] = None
        self._saved_all: Optional[tuple] = None

    def sync(self, k: Keys) -> None:
        """Switch this thread's keys to match the counts. Call from the owning thread."""
        if (self.ops > 0) is (self._saved_ops is None):
            self._saved_ops = _switch(k.ops, self.ops > 0, self._saved_ops)
        if (self.all > 0) is (self._saved_all is None):
            self._saved_all = _switch(k.all, self.all > 0, self._saved_all)


def _switch(key, on: bool, saved: Optional[tuple]) -> Optional[tuple]:
    """Turn ``key`` on (saving its state) or back to the saved state; returns the new saved state."""
    if on and saved is None:
        saved = (_is_included(key), _is_excluded(key))
        _set_included(key, True)
        _set_excluded(key, False)
    elif not on and saved is not None:
        _set_included(key, saved[0])
        _set_excluded(key, saved[1])
        saved = None
    return saved


_tls = threading.local()


def thread_switch() -> ThreadSwitch:
    """The calling thread's switch."""
    switch = getattr(_tls, "switch", None)
    if switch is None:
        switch = _tls.switch = ThreadSwitch()
    return switch

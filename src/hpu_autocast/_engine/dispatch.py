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
policy overload on a borrowed autocast key (the *ops key*), and switches that key on for a thread
by adding it to the thread's *included* set while a region is open there (tensors do not carry
it; the included set reaches every call). Hence:

* an op no policy names never enters Python: it falls through, as under native autocast;
* a policy op is cast where native autocast casts it, above autograd (the casts are ordinary
  autograd ops) and before decomposition, so the results are native's bit for bit where the policy
  is native's;
* the thread's key sets travel with ``ThreadLocalState`` to autograd's worker threads, and
  ``torch.compile`` traces through the kernels (its AOT tracing dispatches like eager), so the
  casts land in the compiled graph.

A second borrowed key (the *observing key*) carries a Python kernel for *every* op, the
*fallback*: it is switched on only for regions that observe (``verbose``, ``record``,
``observer=``) or whose policy has a rule for ops on no list (HMP), so other regions never pay
for it. It sits *above* the ops key: it sees each op first, hands an op of the region's policy
down to the ops key with itself excluded, and observes or applies its default to the rest. (It
is one kernel per op, registered when first needed, rather than a dispatcher fallback: torch
routes a Python *fallback* through the active ``TorchDispatchMode``'s interpreter, which knows
only per-op registrations, and fails an internal assert there; and torch 2.4 has no Python
fallbacks.)

[Note: borrowing keys that a backend may claim later]
A key needs a *backend fallback* that falls through, or every op without a kernel there fails
("Could not run ... with arguments from the 'AutocastX' backend") once the key is on. A key has
one fallback: a backend that loads later and registers its own on a key this package holds
fails ("Tried to register multiple backend fallbacks for the same dispatch key"), and a C++
extension that does so in its static initialisation aborts the process. The free autocast keys
and who would claim them:

* ``AutocastIPU``: Graphcore's IPU, whose PyTorch support has ended: no backend loads there;
* ``AutocastHPU``: Gaudi's bridge registers a fallthrough fallback and its list kernels there;
* ``AutocastPrivateUse1``: every out-of-tree PrivateUse1 backend (torch_npu, torch_musa,
  torch-spyre, torch's openreg test backend) does the same.

So the ops key, on in every region, is ``AutocastIPU`` (unless something claimed it), and holds
its fallthrough fallback for the life of the process. The observing key must sit above it,
so it is ``AutocastHPU`` or ``AutocastPrivateUse1``: ``AutocastPrivateUse1`` when Gaudi's bridge is
installed here (keeping the key it will load onto free), else ``AutocastHPU`` (no Gaudi bridge
can load where none is installed). It holds its fallback only while an observing region is open
anywhere in the process (registered when the first opens, released when the last closes: ~1 ms
for the pair, as the dispatcher updates every operator's table; nested observing regions pay
nothing), and its per-op kernels pass every call on when no region observes. A backend loaded
while no observing region is open therefore registers its fallback freely; its own kernels on
that key win over this package's (torch warns once: "Overriding a previously registered
kernel"), so its autocast works, only through one Python call per op it does not list until the
next observing region, which finds the key claimed, removes every registration of its own
there, and moves to the other key. When both are claimed, observing regions (and HMP policies)
raise ``RuntimeError`` naming the backends; regions that do not observe keep casting. A backend
loaded *while* an observing region is open (a script run under ``hpu-autocast report``, or
``hmp.convert``, which holds one for the process) still fails as before.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
from typing import Callable, Dict, Optional

import torch
from torch.library import Library, fallthrough_kernel

from . import core as _core
from .. import _torch
from .._torch import OpOverload
from .._facts import ops as _ops

__all__ = ["Keys", "keys", "KeyGuard", "ThreadSwitch", "thread_switch"]

_DK = _torch.DispatchKey
_set_included = _torch.set_included
_set_excluded = _torch.set_excluded
_is_included = _torch.is_included
_is_excluded = _torch.is_excluded

# The autocast keys no in-tree backend uses, with the device whose backend would claim each,
# lowest dispatch priority first (the ops key is the first free one; Note: borrowing keys).
_CANDIDATES = (("AutocastIPU", "ipu"), ("AutocastHPU", "hpu"), ("AutocastPrivateUse1", "privateuseone"))
_DEVICE_OF_KEY = {getattr(_DK, name): device for name, device in _CANDIDATES}


# [Note: excluding keys around a call]
# The dispatcher picks a call's kernel from its key set: the keys its tensors carry, plus the
# calling thread's *included* set, minus the thread's *excluded* set (both thread-local, copied to
# autograd's worker threads with ``ThreadLocalState``), highest priority first. So a call made
# with a key excluded runs as if that key had no kernel, and only in this thread: this is how
# native autocast's kernels leave an op's insides alone (``ExcludeDispatchKeyGuard``), and how
# the engine does, with ``KeyGuard``. A guard *restores* each key's exclusion to what it was at
# its entry rather than resetting it to "not excluded": calls nest (a kernel's op calls an
# observer, which calls torch under ``keys_excluded``; a region runs inside a backward whose
# thread inherited excluded keys), and a reset would switch a key back on inside an outer guard
# that excluded it.
class KeyGuard:
    """While open, the calling thread's dispatch excludes the keys ``exclude`` and no longer
    excludes the keys ``unexclude`` (a native autocast key switched on); on exit, each of those
    keys is excluded exactly as it was at the entry (Note: excluding keys around a call). One
    guard per use: it holds the state it restores."""

    __slots__ = ("_keys", "_flags", "_was")

    def __init__(self, exclude: tuple = (), unexclude: tuple = ()) -> None:
        self._keys = (*exclude, *unexclude)
        self._flags = (True,) * len(exclude) + (False,) * len(unexclude)

    def __enter__(self) -> "KeyGuard":
        self._was = tuple(map(_is_excluded, self._keys))
        for key, flag in zip(self._keys, self._flags):
            _set_excluded(key, flag)
        return self

    def __exit__(self, *exc) -> None:
        for key, was in zip(self._keys, self._was):
            _set_excluded(key, was)


_exclude_guard = _torch.exclude_guard


def _keyset(*keys) -> object:
    """The key set of ``keys`` (for ``_torch.exclude_guard``)."""
    out = _torch.DispatchKeySet(keys[0])
    for key in keys[1:]:
        out = out | _torch.DispatchKeySet(key)
    return out


def _claimed(name: str, device: str) -> bool:
    """Whether a backend holds ``name`` (call only while this package holds no fallback there)."""
    key = getattr(_DK, name, None)
    if key is None:
        return True
    if _torch.has_backend_fallback(key):
        return True  # some library registered a fallback: the key is in use
    if device == "privateuseone":
        return _torch.privateuse1_backend_name() != "privateuseone"
    if device == "hpu":
        return "habana_frameworks.torch" in sys.modules
    return False


def _gaudi_installed() -> bool:
    """Whether Gaudi's bridge could be imported here (``hpu.hpu_importable``, not imported: that
    module sits above this one)."""
    if "habana_frameworks" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("habana_frameworks") is not None
    except (ImportError, ValueError):
        return False


def _describe(name: str, device: str) -> str:
    if device == "privateuseone" and _torch.privateuse1_backend_name() != "privateuseone":
        return f"{name} (PrivateUse1 backend {_torch.privateuse1_backend_name()!r})"
    if device == "hpu" and "habana_frameworks.torch" in sys.modules:
        return f"{name} (Gaudi's bridge)"
    return f"{name} (a library registered a fallback there)"


class Keys:
    """The two borrowed keys and the libraries holding this package's registrations on them.

    ``ops`` carries one kernel per policy overload (registered as policies are first used, kept
    for the life of the process: a kernel whose region does not name its op calls it through)
    and a fallthrough fallback; ``all``, above it, carries the observing kernels, registered at
    the first observing region, with a fallthrough fallback while any observing region is open
    (Note: borrowing keys that a backend may claim later)."""

    def __init__(
        self, make_kernel: Callable[[OpOverload], Callable], make_fallback: Callable[[OpOverload], Callable]
    ) -> None:
        free = [(n, d) for n, d in _CANDIDATES if not _claimed(n, d)]
        if not free or free[0][0] == _CANDIDATES[-1][0]:
            taken = [_describe(n, d) for n, d in _CANDIDATES if (n, d) not in free]
            raise RuntimeError(
                "hpu_autocast needs an autocast dispatch key that no backend uses, below another one; of "
                f"{', '.join(n for n, _ in _CANDIDATES)}, these are taken in this process: {', '.join(taken)}"
            )
        self.ops_name, self.ops_device = free[0]
        self.ops = getattr(_DK, self.ops_name)
        #: The observing key: a candidate above ``ops`` (possibly claimed: ``prepare_fallback`` checks).
        self.all_name, self.all_device = self._above_ops()[0]
        self.all = getattr(_DK, self.all_name)
        self._guards()
        self._make_kernel = make_kernel
        self._make_fallback = make_fallback
        self._ops_fallback = _fall_through(self.ops_name)
        self._ops_libs: Dict[str, Library] = {}
        self._all_libs: Dict[str, Library] = {}
        self._all_fallback: Optional[Library] = None
        self._registered: set = set()
        #: Each overload registered, by its index in the C++ core's tables (with the core only).
        self.indices: Dict[OpOverload, int] = {}
        self._lock = threading.Lock()
        self._fallback_ready = False
        self._observing = 0

    def _above_ops(self) -> list:
        """The candidates for the observing key, in order of preference."""
        above = [nd for nd in _CANDIDATES if int(getattr(_DK, nd[0])) > int(self.ops)]
        if _gaudi_installed():  # keep AutocastHPU free for the bridge
            above.sort(key=lambda nd: nd[1] == "hpu")
        else:  # keep AutocastPrivateUse1 free for PrivateUse1 backends
            above.sort(key=lambda nd: nd[1] == "privateuseone")
        return above

    @staticmethod
    def _lib(libs: Dict[str, Library], ns: str) -> Library:
        lib = libs.get(ns)
        if lib is None:
            lib = libs[ns] = Library(ns, "IMPL")
        return lib

    def observing_opened(self) -> None:
        """An observing region opens: make the observing key ready and hold its fallback.

        The first of the process's open observing regions checks that no backend claimed the key
        since the last one closed (none can while one is open: the fallback is held), and if one
        did, gives it up for the other candidate; raises ``RuntimeError`` naming the backends
        when both are claimed."""
        with self._lock:
            if self._observing == 0:
                if _claimed(self.all_name, self.all_device):
                    self._move_all()
                self.prepare_fallback()
                self._all_fallback = _fall_through(self.all_name)
            self._observing += 1

    def observing_closed(self) -> None:
        """An observing region closes: the last one releases the observing key's fallback."""
        with self._lock:
            self._observing -= 1
            if self._observing == 0:
                fallback, self._all_fallback = self._all_fallback, None
                _torch.destroy_library(fallback)

    def _move_all(self) -> None:
        for lib in self._all_libs.values():
            _torch.destroy_library(lib)  # the backend's kernels on the key are left, and win again
        self._all_libs.clear()
        self._fallback_ready = False
        free = [nd for nd in self._above_ops() if not _claimed(*nd)]
        if not free:
            raise RuntimeError(
                "hpu_autocast: a region that observes (record=True, verbose=True, observer=) or whose "
                "policy has defaults for ops on no list (hmp) needs a second autocast dispatch key that "
                "no backend uses, above "
                + self.ops_name
                + "; these are taken in this process: "
                + ", ".join(_describe(*nd) for nd in self._above_ops())
                + ". Regions that do not observe still cast"
            )
        self.all_name, self.all_device = free[0]
        self.all = getattr(_DK, self.all_name)
        self._guards()

    def _guards(self) -> None:
        #: ``excluded()``: a guard; while open, this thread's dispatch excludes both keys, with
        #: ``KeyGuard``'s restoring rule (torch's C++ guard, where torch has it: one C call).
        #: Rebuilt when the observing key moves.
        both = (self.ops, self.all)
        self.excluded = (
            functools.partial(KeyGuard, both)
            if _exclude_guard is None
            else functools.partial(_exclude_guard, _keyset(*both))
        )

    def prepare_fallback(self) -> None:
        """Register the fallback's kernel on the observing key for every op the dispatcher has
        (once per key; ops registered later reach the key's fallthrough fallback while it is held).

        [Note: views never enter the fallback] A view neither computes nor casts, and a Python
        kernel that returns a tensor gives it a Python object, which C++ code wrapping a fresh
        tensor in a subclass does not expect: ``nn.Parameter(t)`` detaches ``t`` and fails with
        "the raw Tensor object is already associated to a python object". So every overload whose
        schema returns an alias it does not write (``detach``, ``view``, ``t``, ...) falls
        through, per op (``_ops.is_view``: views and in-place views such as ``detach_``)."""
        if self._fallback_ready:
            return
        for schema in _torch.all_schemas():
            ns, _, name = schema.name.partition("::")
            qualified = f"{name}.{schema.overload_name}" if schema.overload_name else name
            try:
                op = getattr(getattr(getattr(torch.ops, ns), name), schema.overload_name or "default")
            except (AttributeError, RuntimeError):
                continue  # a TorchScript-only schema (aten::__getitem__.t): no dispatcher entry
            kernel = fallthrough_kernel if _ops.is_view(op) else self._make_fallback(op)
            try:
                self._lib(self._all_libs, ns).impl(qualified, kernel, self.all_name)
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
                ns, _, name = _torch.schema(op).name.partition("::")
                overload = _torch.overload_name(op)
                if _core.core is not None:
                    # The core's kernel, which hands what it does not decide to the Python one.
                    self.indices[op] = _core.register(ns, name, overload, self.ops, self._make_kernel(op))
                    self._registered.add(op)
                    continue
                lib = self._lib(self._ops_libs, ns)
                # with_keyset: the kernel gets the call's dispatch key set, to pass an op it has
                # no rule for on below its key as a fallthrough would (_kernels.make_kernel).
                lib.impl(
                    name if overload == "default" else f"{name}.{overload}",
                    self._make_kernel(op),
                    self.ops_name,
                    with_keyset=True,
                )
                self._registered.add(op)


def _fall_through(key_name: str) -> Library:
    """Make ``key_name`` fall through for every op without a kernel there; returns the library
    holding that registration (it lasts until the library is destroyed)."""
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


def borrowed_was_enabled(device: Optional[str]) -> Optional[bool]:
    """What ``torch.is_autocast_enabled(device)`` answered before this thread's regions switched on
    the borrowed key of ``device`` (``"ipu"``: ``AutocastIPU``), or ``None`` when no borrowed key of
    that device is switched on here. torch's getter reads the key's exclusion, which a region
    clears to run its kernels: the key is the engine's, not that device's autocast."""
    switch = getattr(_tls, "switch", None)
    if switch is None or device is None:
        return None
    for saved in (switch._saved_ops, switch._saved_all):
        if saved is not None and _DEVICE_OF_KEY.get(saved[0]) == device:
            return not saved[2]
    return None


def _switch(key, on: bool, saved: Optional[tuple]) -> Optional[tuple]:
    """Turn ``key`` on (saving its state) or back to the saved state; returns the new saved state.
    The saved state names its key: the observing key may have moved since (``Keys._move_all``)."""
    if on and saved is None:
        saved = (key, _is_included(key), _is_excluded(key))
        _set_included(key, True)
        _set_excluded(key, False)
    elif not on and saved is not None:
        _set_included(saved[0], saved[1])
        _set_excluded(saved[0], saved[2])
        saved = None
    return saved


_tls = threading.local()


def thread_switch() -> ThreadSwitch:
    """The calling thread's switch."""
    switch = getattr(_tls, "switch", None)
    if switch is None:
        switch = _tls.switch = ThreadSwitch()
    return switch

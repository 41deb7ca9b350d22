"""What ``torch.compile`` needs from the engine: a guard that recompiles a frame traced inside a
region when the region's policy, dtype, device or on/off state differs.

[Note: torch.compile inside a region]
Dynamo traces Python; the engine is dispatcher kernels, which Dynamo never sees as Python: its
fake-tensor propagation and AOTAutograd's tracing dispatch every op like eager code does, so the
kernels run there and their casts are recorded as ``_to_copy`` nodes of the graph. Dynamo
already guards on the thread's autocast state (``GlobalStateGuard``), which covers whether the
engine's key is on, but not *which* policy and dtype a region applies. So while Dynamo traces,
the first kernel that runs installs one guard on ``hpu_autocast._engine.GUARD.token``, a
property that describes the calling context's innermost region; a compiled frame called under
another region fails it and is traced again (once per distinct region state, then cached).

Only Dynamo's internals offer this (``install_guard``, ``AttrSource``, ``ImportSource``,
``GuardBuilder.EQUALS_MATCH``); where a torch lacks them nothing is installed and a frame
compiled under one policy would keep its casts under another (``supported()`` says which).
"""

from __future__ import annotations

import sys
import threading
import warnings

import torch

__all__ = ["tracing", "install", "supported", "observing_opened", "observing_closed"]

_PACKAGE = "hpu_autocast"


_try_get = None  # TracingContext.try_get, once Dynamo is loaded


def tracing() -> bool:
    """True while Dynamo traces a frame in this thread (cheap when Dynamo is not loaded; every
    policy op's kernel asks, so the import is done once)."""
    global _try_get
    if _try_get is None:
        if "torch._dynamo" not in sys.modules:
            return False
        from torch._guards import TracingContext

        _try_get = TracingContext.try_get
    return _try_get() is not None


def _package_source():
    """A Dynamo source for the imported ``hpu_autocast`` package (``ImportSource`` is new in
    torch 2.13; before it, the tracer in flight imports it into the frame's globals)."""
    try:
        from torch._dynamo.source import ImportSource
    except ImportError:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        return tx.import_source(_PACKAGE) if tx is not None else None
    return ImportSource(_PACKAGE)


def supported() -> bool:
    """Whether this torch lets the engine guard compiled frames on the region's policy."""
    try:
        from torch._dynamo.guards import GuardBuilder, install_guard  # noqa: F401
        from torch._dynamo.source import AttrSource  # noqa: F401
    except ImportError:
        return False
    return hasattr(GuardBuilder, "EQUALS_MATCH")


def install() -> None:
    """Guard the frame Dynamo is tracing on the innermost region's state (idempotent: Dynamo's
    guard set deduplicates equal guards)."""
    try:
        from torch._dynamo.guards import GuardBuilder, install_guard
        from torch._dynamo.source import AttrSource
    except ImportError:
        return
    package = _package_source()
    if package is None:  # no frame being traced (AOT tracing after Dynamo's own)
        return
    source = AttrSource(AttrSource(AttrSource(package, "_engine"), "GUARD"), "token")
    install_guard(source.make_guard(GuardBuilder.EQUALS_MATCH))



# [Note: observing regions run compiled code eagerly]
# A compiled graph runs without Python, so an observer (record=True, verbose=True, observer=...)
# would see the calls Dynamo traced once, on fake tensors, and none of the real ones. So while a
# region with an observer is open, the compiler's stance is "force_eager": compiled callables run
# their original code, under the region, and the observer sees each call. The stance is
# process-wide (torch has no per-thread one), counted across threads and restored when the last
# observing region exits. Nothing is done when Dynamo is not loaded: nothing compiled exists.
_lock = threading.Lock()
_observing = 0
_restore = None
_warned = False


def observing_opened() -> bool:
    """An observing region opens; returns whether it counted (pass that to ``observing_closed``)."""
    global _observing, _restore, _warned
    if "torch._dynamo" not in sys.modules:
        return False
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:  # torch < 2.6
        return False
    with _lock:
        if _observing == 0:
            try:
                _restore = set_stance("force_eager")
            except Exception:  # entered inside a compiled frame: torch forbids changing the stance
                return False
            if not _warned:  # once a process: a training loop opens a region per step
                _warned = True
                warnings.warn("hpu_autocast: compiled code runs eagerly while a region with an observer "
                              "(record=True, verbose=True, observer=...) is open, so the observer sees each call",
                              UserWarning, stacklevel=4)
        _observing += 1
        return True


def observing_closed(counted: bool) -> None:
    global _observing, _restore
    if not counted:
        return
    with _lock:
        _observing -= 1
        if _observing == 0:
            restore, _restore = _restore, None
            try:
                restore.__exit__(None, None, None)
            except RuntimeError:
                warnings.warn("hpu_autocast: could not restore torch.compile's stance (exited inside a compiled "
                              "frame); it stays 'force_eager'", RuntimeWarning, stacklevel=4)

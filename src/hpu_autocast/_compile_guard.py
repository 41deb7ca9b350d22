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

__all__ = ["tracing", "install", "supported"]

_SOURCE_MODULE = "hpu_autocast._engine"


def tracing() -> bool:
    """True while Dynamo traces a frame in this thread (cheap when Dynamo is not loaded)."""
    if "torch._dynamo" not in sys.modules:
        return False
    from torch._guards import TracingContext

    return TracingContext.try_get() is not None


def supported() -> bool:
    """Whether this torch lets the engine guard compiled frames on the region's policy."""
    try:
        from torch._dynamo.guards import GuardBuilder, install_guard  # noqa: F401
        from torch._dynamo.source import AttrSource, ImportSource  # noqa: F401
    except ImportError:
        return False
    return hasattr(GuardBuilder, "EQUALS_MATCH")


def install() -> None:
    """Guard the frame Dynamo is tracing on the innermost region's state (idempotent: Dynamo's
    guard set deduplicates equal guards)."""
    try:
        from torch._dynamo.guards import GuardBuilder, install_guard
        from torch._dynamo.source import AttrSource, ImportSource
    except ImportError:
        return
    source = AttrSource(AttrSource(ImportSource(_SOURCE_MODULE), "GUARD"), "token")
    install_guard(source.make_guard(GuardBuilder.EQUALS_MATCH))

"""Gaudi (HPU) glue, without importing ``habana_frameworks`` unless it is there.

``habana_frameworks.torch`` (Intel Gaudi's PyTorch bridge) is not on the package registries, so it
is never a dependency: everything here degrades to "no HPU" when it is absent. Detection uses
``importlib.util.find_spec`` and ``sys.modules``; the bridge is imported only by the functions
that exist to use it (``default_device``, ``wrap_in_hpu_graph``), never by ``HpuAutocastMode``.

The Gaudi names used here, as documented at docs.habana.ai:

* ``habana_frameworks.torch.core``: importing it loads the bridge and registers ``torch.hpu``;
  ``core.mark_step(device_str="", sync=False)`` flushes the ops accumulated in lazy mode.
* ``habana_frameworks.torch.hpu``: ``is_available()``, and ``wrap_in_hpu_graph(module, ...)``
  (defined in ``habana_frameworks.torch.hpu.graphs``), which captures ``module.forward`` in an
  HPU graph on its first call for a key and replays it afterwards (the key is the inputs';
  ``wrap_in_hpu_graph`` here adds the region's).
* ``habana_frameworks.torch.utils.internal.is_lazy()``: lazy vs eager execution, from the
  ``PT_HPU_LAZY_MODE`` variable (read before the bridge loads).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import warnings

import torch

from . import _engine
from ._facts.devices import check_dtype, default_cache_enabled  # the HPU's device rules, with every device's

__all__ = [
    "backend_loaded",
    "hpu_importable",
    "default_cache_enabled",
    "check_dtype",
    "default_device",
    "lazy_mode",
    "mark_step",
    "wrap_in_hpu_graph",
]

_MODULE = "habana_frameworks.torch"
_MISSING = (
    "the Intel Gaudi PyTorch bridge (habana_frameworks.torch) is not installed; it ships "
    "with the Intel Gaudi software stack, not on PyPI"
)


def backend_loaded() -> bool:
    """True once the Gaudi PyTorch bridge has been imported in this process."""
    return _MODULE in sys.modules


def hpu_importable() -> bool:
    """True when the Gaudi bridge could be imported (without importing it)."""
    if backend_loaded():
        return True
    try:
        return importlib.util.find_spec("habana_frameworks") is not None
    except (ImportError, ValueError):
        return False


def default_device() -> str:
    """``"hpu"`` when the Gaudi bridge imports and ``torch.hpu.is_available()``, else ``"cuda"``
    when available, else ``"cpu"``.

    Asking for the device is asking for the bridge: this imports ``habana_frameworks.torch.core``
    when it is importable (that import registers ``torch.hpu``). A bridge that is installed but
    fails to import warns and falls back.
    """
    if hpu_importable():
        try:
            importlib.import_module(_MODULE + ".core")
        except ImportError as e:
            warnings.warn(
                f"hpu_autocast: habana_frameworks is installed but did not import ({e}); not using HPU",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            hpu = getattr(torch, "hpu", None) or importlib.import_module(_MODULE + ".hpu")
            if hpu.is_available():
                return "hpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def lazy_mode() -> bool:
    """True when the loaded Gaudi bridge runs in lazy mode (ops accumulate until ``mark_step``).

    False when no bridge is loaded. The bridge's own
    ``habana_frameworks.torch.utils.internal.is_lazy()`` is asked when it has one; otherwise
    ``PT_HPU_LAZY_MODE`` is read with the default of the stacks that lack it, lazy (``1``).
    Newer stacks default to eager (``0``), which is why the bridge is asked first.
    """
    if not backend_loaded():
        return False
    try:
        from habana_frameworks.torch.utils.internal import is_lazy
    except ImportError:
        return os.environ.get("PT_HPU_LAZY_MODE", "1") != "0"
    return bool(is_lazy())


def mark_step(*args, **kwargs) -> None:
    """``habana_frameworks.torch.core.mark_step(*args, **kwargs)`` when the bridge is loaded, else
    nothing, so a training loop can call it on every device.

    In lazy mode, call it after ``loss.backward()`` and after ``optimizer.step()``, as Gaudi's
    guides do. ``HpuAutocastMode`` itself never calls it and never reads a tensor's value, so the
    graph boundaries are the ones the script sets.
    """
    if backend_loaded():
        importlib.import_module(_MODULE + ".core").mark_step(*args, **kwargs)


def wrap_in_hpu_graph(module: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
    """``habana_frameworks.torch.hpu.wrap_in_hpu_graph(module, *args, **kwargs)``, with the
    calling context's region state part of what selects a graph.

    [Note: one HPU graph per region state]
    The bridge captures ``module.forward`` on the first call for a key and replays the device
    graph afterwards without running Python. Its key (``input_hash`` in the bridge's
    ``hpu/graphs.py``) holds the inputs' shapes and views, other arguments by value, and native
    HPU autocast's on/off state, nothing of this package's regions; yet the casts a region
    makes during the capture are part of the graph. So this passes the region's state (what
    ``torch.compile`` is guarded on: policy, dtype, device, on/off; ``_engine.GUARD``) to the
    bridge as one more keyword argument, which the bridge hashes by value and the wrapped
    forward drops: each region state gets a capture of its own, and a graph captured in a
    bfloat16 region is never replayed outside it, under another policy or dtype, or in a
    disabled region. No region and a disabled one are one state (nothing is cast).

    Each state's graphs are held on the device until ``module.clear_cache()`` (the bridge's),
    as the bridge holds one per input shape: ``max_graphs=`` bounds them all together (a call
    for a new key past the bound runs ``forward`` uncaptured, with its region's casts). A
    region that observes (``record=True``, ``verbose=True``, ``observer=``) runs ``forward``
    itself, uncaptured, so the observer sees its calls (a replay would show none).

    [Note: HPU graphs in eager mode]
    Bridge 1.19 exports ``wrap_in_hpu_graph`` in lazy mode only (``PT_HPU_LAZY_MODE=1``), and
    newer stacks run eager by default. Where the bridge has none, the module is returned as it
    is, with one ``RuntimeWarning`` naming the mode and the remedy: it runs without HPU graphs,
    every call through its Python and the calling region's casts, which is what the module
    computes with graphs too, only slower. A warning rather than an error, because a script
    written for lazy mode then runs unchanged in eager mode (where ``torch.compile(backend=
    "hpu_backend")`` is Gaudi's way to a graph); ``warnings.simplefilter("error",
    RuntimeWarning)`` makes it one. ``module.clear_cache()`` exists there too, doing nothing.

    Raises ``ModuleNotFoundError`` naming ``habana_frameworks.torch`` when it is not installed.
    """
    if not hpu_importable():
        raise ModuleNotFoundError(f"hpu_autocast.hpu.wrap_in_hpu_graph: {_MISSING}", name=_MODULE)
    bridge = importlib.import_module(_MODULE + ".hpu")
    if not hasattr(bridge, "wrap_in_hpu_graph"):
        return _without_graphs(module)

    forward = module.forward

    @functools.wraps(forward)
    def captured(*a, **kw):
        kw.pop(_REGION_KEYWORD, None)
        return forward(*a, **kw)

    module.forward = captured
    wrapped = bridge.wrap_in_hpu_graph(module, *args, **kwargs)  # replaces module.forward
    replay = wrapped.forward

    @functools.wraps(forward)
    def keyed(*a, **kw):
        if _engine.observing():
            return forward(*a, **kw)
        state = _engine.GUARD.token if _engine.current().enabled else ""
        return replay(*a, **kw, **{_REGION_KEYWORD: state})

    wrapped.forward = keyed
    return wrapped


#: The keyword argument that carries the region's state to the bridge's graph key.
_REGION_KEYWORD = "hpu_autocast_region"


def _without_graphs(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` unchanged but for a no-op ``clear_cache``, with the warning of the Note: HPU
    graphs in eager mode."""
    mode = "eager" if not lazy_mode() else "this"
    warnings.warn(
        f"hpu_autocast.hpu.wrap_in_hpu_graph: Gaudi's bridge has no wrap_in_hpu_graph in {mode} mode "
        f"(bridge 1.19 exports it with PT_HPU_LAZY_MODE=1 only); {type(module).__name__} runs without "
        f"HPU graphs, each call eagerly with its region's casts. Set PT_HPU_LAZY_MODE=1 before importing "
        f'habana_frameworks for HPU graphs, or use torch.compile(backend="hpu_backend") in eager mode.',
        RuntimeWarning,
        stacklevel=3,
    )
    if not hasattr(module, "clear_cache"):
        module.clear_cache = lambda: None
    return module

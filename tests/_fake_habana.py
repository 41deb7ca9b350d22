"""A stand-in for Intel Gaudi's PyTorch bridge (``habana_frameworks.torch``), for testing the glue.

``install(monkeypatch)`` puts into ``sys.modules`` the modules ``hpu_autocast.hpu`` uses, with the
names and signatures of the real ones (gaudi-pytorch-bridge 1.19), and registers ``torch.hpu`` as
importing ``habana_frameworks.torch.core`` does. Every call is appended to the returned
``Bridge.calls``. There is no device: tensors stay on the CPU; what is tested is the glue, not
Gaudi. The monkeypatch removes the modules when the test ends.

    core.mark_step(device_str="", sync=False)   -> ("mark_step", device_str, sync)
    hpu.is_available()                          -> Bridge.available
    hpu.is_autocast_hpu_enabled()               -> native autocast's state for "hpu"
    utils.internal.is_lazy()                    -> Bridge.lazy (module absent when with_is_lazy=False)
    hpu.wrap_in_hpu_graph(module, asynchronous=False, disable_tensor_cache=False, dry_run=False,
                          max_graphs=None)      -> ("wrap", type name, kwargs), and module.forward
        replaced, as the bridge's ``wrapped_hpugraph_forward`` (hpu/graphs.py) does:
        * ``bypass_hpu_graphs=True``: the original forward runs            -> ("bypass",)
        * else the call's key is ``input_hash((args, kwargs))``, the bridge's: tensors by shape and
          view (``get_view_hash``), other values by value, each hashed with native HPU autocast's
          on/off state; not a tensor's dtype or device, nor anything of an hpu_autocast region;
        * a new key, with ``max_graphs`` graphs held already: the original forward runs,
          nothing is kept                                                   -> ("uncached",)
        * a new key: captured                                              -> ("capture", n)
          The capture is ``make_fx`` of the forward on the call's tensors (real tensors, so a
          region open at capture records its casts as ``_to_copy`` nodes); its outputs are the
          graph's outputs on them (the bridge returns the outputs of the captured run).
        * a known key: replayed                                             -> ("replay", n)
          The module's Python does not run: the captured ATen graph runs on the call's tensors,
          converted to the dtypes captured (the bridge copies them into its static inputs), with
          every autocast dispatch key excluded, as a device graph replays without dispatching;
          the results are written into the tensors the capture returned, and those are returned
          (the bridge's static outputs: a later replay overwrites an earlier result).
        ``module.clear_cache()`` drops the graphs, as the bridge's does.

Importing the bridge also registers, once per process (a loaded backend stays loaded), what
``habana_frameworks.torch`` registers on the ``AutocastHPU`` dispatch key: a fallthrough backend
fallback and kernels for its lower-precision list. The stand-in's list is ``mm``, ``addmm`` and
``linear``, each casting the HPU tensors of the call to ``torch.get_autocast_dtype("hpu")``. A
registration that fails (another library holds the key's fallback) raises at ``install``, as the
bridge's import would.
"""

from __future__ import annotations

import collections
import functools
import importlib.machinery
import sys
import types
from typing import List, Optional

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx
from torch.library import Library, fallthrough_kernel

_native_autocast_enabled = torch._C.is_autocast_enabled  # the C++ state, as the bridge's _hpu_C reads it


class Bridge:
    def __init__(self, available: bool, lazy: bool) -> None:
        self.available = available
        self.lazy = lazy
        self.calls: List[tuple] = []

    def names(self) -> List[str]:
        return [c[0] for c in self.calls]


def _module(name: str, package: bool = True) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        m.__path__ = []  # a package whose unknown submodules fail to import
    return m


# -- the bridge's graph key (hpu/graphs.py, input_hash) ---------------------------------------

def is_autocast_hpu_enabled() -> bool:
    return _native_autocast_enabled("hpu")


def _view_hash(t: torch.Tensor) -> int:
    # The bridge hashes the chain of lazy views a tensor was made by (0 for a tensor that is not
    # a view); strides and offset tell the CPU's views apart the same way.
    return hash((tuple(t.stride()), t.storage_offset())) if t._is_view() else 0


def input_hash(obj) -> int:
    if isinstance(obj, dict):
        return input_hash(tuple(obj.items()))
    elif isinstance(obj, list) or (isinstance(obj, tuple) and not isinstance(obj, torch.Size)):
        return hash((tuple(input_hash(el) for el in obj), is_autocast_hpu_enabled()))
    elif torch.is_tensor(obj):
        return hash(tuple([obj.shape, _view_hash(obj), is_autocast_hpu_enabled()]))
    elif isinstance(obj, collections.UserDict):
        return hash(tuple((k, tuple(v)) for k, v in obj.items()))
    else:
        return hash((obj, is_autocast_hpu_enabled()))


# -- capture and replay --------------------------------------------------------------------------

_AUTOCAST_KEYS = functools.reduce(
    lambda a, b: a | b,
    (torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, name))
     for name in dir(torch._C.DispatchKey) if name.startswith("Autocast")))


class _Graph:
    """One capture: the ATen graph of a forward on the call's tensors, and its static outputs."""

    def __init__(self, forward, args: tuple, kwargs: dict) -> None:
        leaves, self.spec = pytree.tree_flatten((args, kwargs))
        self.slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        self.leaves = leaves
        self.dtypes = [leaves[i].dtype for i in self.slots]

        def run(*tensors):
            a, k = self._rebuild(tensors)
            return forward(*a, **k)

        self.gm = make_fx(run)(*[leaves[i] for i in self.slots])
        self.outputs = self._run([leaves[i] for i in self.slots])

    def _rebuild(self, tensors):
        leaves = list(self.leaves)
        for i, t in zip(self.slots, tensors):
            leaves[i] = t
        return pytree.tree_unflatten(leaves, self.spec)

    def _run(self, tensors: list):
        with torch.no_grad(), torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return self.gm(*tensors)

    def replay(self, args: tuple, kwargs: dict):
        """The bridge's replay: the call's tensors are copied into the capture's own (its static
        inputs, the tensors the capture ran on, which keep their dtypes), the captured graph runs
        on those, and its results are written into the capture's outputs, which are returned."""
        leaves = pytree.tree_leaves((args, kwargs))
        with torch.no_grad():
            for i in self.slots:
                if self.leaves[i] is not leaves[i]:
                    self.leaves[i].copy_(leaves[i])
        fresh = self._run([self.leaves[i] for i in self.slots])
        with torch.no_grad():
            for static, new in zip(pytree.tree_leaves(self.outputs), pytree.tree_leaves(fresh)):
                if isinstance(static, torch.Tensor):
                    static.copy_(new)
        return self.outputs


# -- AutocastHPU, as the bridge's import registers it --------------------------------------------

_registered: Optional[List[Library]] = None


def _hpu_autocast_kernel(op):
    below = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.AutocastHPU)

    def kernel(keyset, *args, **kwargs):
        dtype = torch.get_autocast_dtype("hpu")

        def cast(x):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == "hpu":
                return x.to(dtype)
            return x

        return op.redispatch(keyset & below, *[cast(a) for a in args], **kwargs)

    return kernel


def _register_autocast_hpu() -> None:
    global _registered
    if _registered is not None:
        return
    fallback = Library("_", "IMPL", "AutocastHPU")
    if hasattr(fallback, "fallback"):
        fallback.fallback(fallthrough_kernel, "AutocastHPU")
    else:  # torch < 2.5
        fallback.m.fallback_fallthrough()
    kernels = Library("aten", "IMPL")
    for name in ("mm.default", "addmm.default", "linear.default"):
        packet, overload = name.split(".")
        kernel = _hpu_autocast_kernel(getattr(getattr(torch.ops.aten, packet), overload))
        qualified = packet if overload == "default" else name
        try:
            kernels.impl(qualified, kernel, "AutocastHPU", with_keyset=True)
        except RuntimeError as e:
            # torch < 2.5's torch.library refuses a second Python kernel for an op and key (the
            # engine's observing kernels sit there); the bridge registers in C++, which that
            # bookkeeping never sees: register as it does, through the dispatcher's own library.
            if "already a kernel registered from python" not in str(e):
                raise
            kernels.m.impl(qualified, "AutocastHPU", kernel, True)
    _registered = [fallback, kernels]


# -- install ---------------------------------------------------------------------------------

def install(monkeypatch, *, available: bool = True, lazy: bool = True,
            with_is_lazy: bool = True, device_name: str = "GAUDI") -> Bridge:
    bridge = Bridge(available, lazy)
    bridge.device_name = device_name
    _register_autocast_hpu()

    root, ht = _module("habana_frameworks"), _module("habana_frameworks.torch")
    core, hpu = _module("habana_frameworks.torch.core"), _module("habana_frameworks.torch.hpu")

    def mark_step(device_str: str = "", sync: bool = False) -> None:
        bridge.calls.append(("mark_step", device_str, sync))

    def wrap_in_hpu_graph(module, asynchronous=False, disable_tensor_cache=False, dry_run=False,
                          max_graphs: Optional[int] = None):
        bridge.calls.append(("wrap", type(module).__name__,
                             dict(asynchronous=asynchronous, disable_tensor_cache=disable_tensor_cache)))
        cache = {}
        numbers = {}
        orig_fwd = module.forward

        @functools.wraps(orig_fwd)
        def forward(*args, **kwargs):
            if kwargs.pop("bypass_hpu_graphs", False):
                bridge.calls.append(("bypass",))
                return orig_fwd(*args, **kwargs)
            h = input_hash((args, kwargs))
            graph = cache.get(h)
            if graph is None:
                if max_graphs is not None and len(cache) == max_graphs:
                    bridge.calls.append(("uncached",))
                    return orig_fwd(*args, **kwargs)
                graph = cache[h] = _Graph(orig_fwd, args, kwargs)
                numbers[h] = len(numbers)
                bridge.calls.append(("capture", numbers[h]))
                return graph.outputs
            bridge.calls.append(("replay", numbers[h]))
            return graph.replay(args, kwargs)

        module.forward = forward  # the real one also patches forward in place and returns module
        module.clear_cache = cache.clear
        return module

    core.mark_step = mark_step
    hpu.is_available = lambda: bridge.available
    hpu.get_device_name = lambda device=None: bridge.device_name if bridge.available else ""
    hpu.is_autocast_hpu_enabled = is_autocast_hpu_enabled
    if lazy:  # bridge 1.19 exports the HPU graph API in lazy mode only
        hpu.wrap_in_hpu_graph = wrap_in_hpu_graph
    root.torch, ht.core, ht.hpu = ht, core, hpu
    modules = {m.__name__: m for m in (root, ht, core, hpu)}
    if with_is_lazy:
        utils = _module("habana_frameworks.torch.utils")
        internal = _module("habana_frameworks.torch.utils.internal")
        internal.is_lazy = lambda: bridge.lazy
        ht.utils, utils.internal = utils, internal
        modules.update({utils.__name__: utils, internal.__name__: internal})

    for name, m in modules.items():
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setattr(torch, "hpu", hpu, raising=False)  # what importing core does
    return bridge

"""A stand-in for Intel Gaudi's PyTorch bridge (``habana_frameworks.torch``), for testing the glue.

``install(monkeypatch)`` puts into ``sys.modules`` the modules ``hpu_autocast.hpu`` uses, with the
names and signatures of the real ones, and registers ``torch.hpu`` as importing
``habana_frameworks.torch.core`` does. Every call is appended to the returned ``Bridge.calls``.
There is no device: tensors stay on the CPU; what is tested is the glue, not Gaudi. The
monkeypatch removes everything when the test ends.

    core.mark_step(device_str="", sync=False)   -> ("mark_step", device_str, sync)
    hpu.is_available()                          -> Bridge.available
    hpu.wrap_in_hpu_graph(module, ...)          -> ("wrap", type name, kwargs); then per call of
        module.forward: ("capture", n) for the first call with inputs of these shapes and
        dtypes, ("replay", n) after; it runs the original forward either way
    utils.internal.is_lazy()                    -> Bridge.lazy (module absent when with_is_lazy=False)
"""

from __future__ import annotations

import functools
import importlib.machinery
import sys
import types
from typing import List, Optional

import torch


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


def _input_key(args, kwargs) -> tuple:
    # What the real wrapper hashes: tensors by shape, dtype and device, anything else by value.
    def key(x):
        return (tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor) else x
    return tuple(map(key, args)) + tuple((k, key(v)) for k, v in sorted(kwargs.items()))


def install(monkeypatch, *, available: bool = True, lazy: bool = True,
            with_is_lazy: bool = True) -> Bridge:
    bridge = Bridge(available, lazy)

    root, ht = _module("habana_frameworks"), _module("habana_frameworks.torch")
    core, hpu = _module("habana_frameworks.torch.core"), _module("habana_frameworks.torch.hpu")

    def mark_step(device_str: str = "", sync: bool = False) -> None:
        bridge.calls.append(("mark_step", device_str, sync))

    def wrap_in_hpu_graph(module, asynchronous=False, disable_tensor_cache=False, dry_run=False,
                          max_graphs: Optional[int] = None):
        bridge.calls.append(("wrap", type(module).__name__,
                             dict(asynchronous=asynchronous, disable_tensor_cache=disable_tensor_cache)))
        captured = {}
        orig_fwd = module.forward

        @functools.wraps(orig_fwd)
        def forward(*args, **kwargs):
            k = _input_key(args, kwargs)
            if k not in captured:
                captured[k] = len(captured)
                bridge.calls.append(("capture", captured[k]))
            else:
                bridge.calls.append(("replay", captured[k]))
            return orig_fwd(*args, **kwargs)

        module.forward = forward  # the real one also patches forward in place and returns module
        return module

    core.mark_step = mark_step
    hpu.is_available = lambda: bridge.available
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

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
``habana_frameworks.torch`` registers:

* on the ``AutocastHPU`` dispatch key, a fallthrough backend fallback and the kernels of
  ``Hpu_KERNEL`` (``hpu_ops/autocast_helpers.h``) for its default lists (``bridge_table``: the
  ``hpu`` preset's data, which are the header's): ``lower_precision_fp``, ``fp32``, ``promote``
  and ``lower_first_arg`` (the norms), each as ``Hpu_WrapFunction_`` does it: AutocastHPU
  excluded, the region's dtype from ``torch.get_autocast_dtype("hpu")``, every eligible tensor
  argument cast (floating, on an HPU, not float64; no cache), whatever the other arguments say,
  an explicit ``dtype=`` included, and the op called again. ``torch.autocast("hpu")`` (or
  ``torch.set_autocast_enabled("hpu", True)``) turns them on, as on Gaudi. A registration that
  fails (another library holds the key's fallback) raises at ``install``, as the bridge's import
  would;
* ``hpu::fp8_gemm_v2`` (``hpu_ops/fp8_ops.cpp``'s schema), the bridge's fp8 GEMM that fp8 regions
  run on HPU tensors: a meta kernel for fake HPU tensors and a CPU one, each call recorded as
  ``("fp8_gemm_v2", A dtype, B dtype, out_dtype)``;
* ``torch.compile``'s ``hpu_backend`` (``dynamo/compile_backend/backends.py``): AOTAutograd with
  compilers for the forward, backward and inference graphs that run the bridge's tensor-info
  propagation (``passes.py``: the graph on fake tensors with ``torch.autocast`` off for ``hpu``
  and ``cpu``, since the trace already holds the casts; a node whose dtype that changes raises
  here), record ``("compile", kind, casts in the graph)``, and run the graph as a recipe runs,
  every autocast key excluded.

``fake_hpu(t)`` makes fake HPU tensors (``FakeTensor`` on ``hpu:0``, meta kernels) so that
native HPU autocast and a region are tested on HPU-keyed tensors. Where the insides of a
composite ask the HPU backend for a tensor with no tensor argument to dispatch on (batch norm's
``empty``, SDPA's backend choice), the stand-in answers with a fake HPU tensor (the math SDPA)
on a CPU build. ``install`` skips the calling test where Gaudi's own bridge is loaded (on a
Gaudi, ``import torch`` loads it): the stand-in cannot register beside it.
"""

from __future__ import annotations

import collections
import functools
import importlib.machinery
import sys
import types
import warnings
from typing import Dict, List, Optional

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
    (
        torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, name))
        for name in dir(torch._C.DispatchKey)
        if name.startswith("Autocast")
    ),
)


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


# -- AutocastHPU, as the bridge's import registers it (hpu_ops/autocast_helpers.h) ---------------

#: Hpu_CastPolicy, one per Hpu_WrapFunction_ specialisation.
LOWER, FP32, PROMOTE, LOWER_FIRST = "lower_precision_fp", "fp32", "promote", "lower_first_arg"
_AUTOCAST_HPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastHPU)
_registered: Optional[List[Library]] = None


def bridge_table() -> Dict[torch._ops.OpOverload, str]:
    """``{overload: Hpu_CastPolicy}`` as ``Hpu_KERNEL`` registers the default lists (the ``hpu``
    preset's data, which are the header's): an ATen function named on the lower list is
    ``lower_first_arg`` if it is one of ``lower_first_ops`` (the norms), else
    ``lower_precision_fp``; else ``fp32`` if on the FP32 list; else ``promote``. Every overload of
    the function is registered except those that write an argument (gen_op.py registers no
    in-place or out= function); a Python name (``iadd``, ``truediv``) names no ATen function."""
    from hpu_autocast.policies.presets import gaudi_autocast as lists

    table: Dict[torch._ops.OpOverload, str] = {}
    for names, kind in ((lists.LOWER, LOWER), (lists.FP32, FP32), (lists.PROMOTE, PROMOTE)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            for overload in packet.overloads() if packet is not None else ():
                op = getattr(packet, overload)
                if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                    continue
                table.setdefault(op, LOWER_FIRST if kind == LOWER and name in lists.INPUT_ONLY else kind)
    return table


def _eligible(x) -> bool:
    # ATen's is_eligible for DeviceType::HPU: defined, floating, on an HPU, not float64.
    return isinstance(x, torch.Tensor) and x.device.type == "hpu" and x.is_floating_point() and x.dtype != torch.float64


def _cast(to_type: torch.dtype, arg):
    """The bridge's ``cast``: an eligible tensor not already ``to_type`` is converted (no cache:
    "cached casts are permanently disabled from autocast on HPU"); a TensorList element-wise;
    anything else, an explicit ``dtype`` included, is passed as it is."""
    if isinstance(arg, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in arg):
        return type(arg)(_cast(to_type, x) for x in arg)
    return arg.to(to_type) if _eligible(arg) and arg.dtype != to_type else arg


def _promote_type(lower: torch.dtype, args) -> torch.dtype:
    """ATen's promote_type over the call's eligible tensors, from the region's dtype: float32
    wins; float64 is ignored; another lower dtype than the region's is an error, as in ATen."""
    to_type = lower
    for x in pytree.tree_leaves(args):
        if _eligible(x):
            if to_type == torch.float32 or x.dtype == torch.float32:
                to_type = torch.float32
            elif x.dtype != lower:
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize()")
    return to_type


def _hpu_autocast_kernel(op, kind: str):
    """``Hpu_WrapFunction_<kind>::call``: AutocastHPU excluded for the call, the region's dtype
    from ``get_autocast_dtype(at::kHPU)``, every argument cast (or the first alone), and the op
    called again from the top (``at::FUNC``)."""

    def kernel(*args, **kwargs):
        lower = torch.get_autocast_dtype("hpu")
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_HPU):
            if kind == LOWER_FIRST:
                return op(_cast(lower, args[0]), *args[1:], **kwargs)
            to_type = {LOWER: lower, FP32: torch.float32}.get(kind) or _promote_type(lower, (args, kwargs))
            return op(*[_cast(to_type, a) for a in args], **{k: _cast(to_type, v) for k, v in kwargs.items()})

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
    for op, kind in bridge_table().items():
        kernel = _hpu_autocast_kernel(op, kind)
        name = op._schema.name.split("::")[1] + ("" if op._overloadname == "default" else "." + op._overloadname)
        try:
            with warnings.catch_warnings():  # the bridge's kernel replaces the engine's there, as on Gaudi
                warnings.filterwarnings("ignore", "Warning only once for all operators", UserWarning)
                kernels.impl(name, kernel, "AutocastHPU")
        except RuntimeError as e:
            # torch < 2.5's torch.library refuses a second Python kernel for an op and key (the
            # engine's observing kernels sit there); the bridge registers in C++, which that
            # bookkeeping never sees: register as it does, through the dispatcher's own library.
            if "already a kernel registered from python" not in str(e):
                raise
            kernels.m.impl(name, "AutocastHPU", kernel, False)
    _registered = [fallback, kernels]


_fake_mode = None  # the one FakeTensorMode of fake HPU tensors (two modes' tensors do not mix)
_hpu_factories: Optional[Library] = None


def fake_hpu(t: torch.Tensor) -> torch.Tensor:
    """A fake HPU tensor of ``t``'s dtype, shape and strides: HPU-keyed (``AutocastHPU`` among its
    keys), so native HPU autocast and a region with ``device_type="hpu"`` both see an HPU tensor;
    ops on it run as meta kernels. Never with ``requires_grad``: autograd asks for HPU's device
    guard, which a CPU build lacks (it aborts the process)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    global _fake_mode
    if _fake_mode is None:
        _fake_mode = FakeTensorMode()
        if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "HPU"):
            _register_hpu_factories()
    return FakeTensor(_fake_mode, t.detach().to("meta"), torch.device("hpu:0"))


_fp8_gemm: Optional[Library] = None


def _register_fp8_gemm() -> None:
    """``hpu::fp8_gemm_v2`` (``hpu_ops/fp8_ops.cpp``'s schema): ``op(A) @ op(B)`` of two fp8
    matrices times their inverse scales, in ``out_dtype`` (+ bias), ``op`` a transpose where
    ``trans_*``. Each call is recorded as ``("fp8_gemm_v2", A dtype, B dtype, out_dtype)``. Meta
    kernel: fake HPU tensors. CPU kernel: the product on dequantized float32 operands."""
    global _fp8_gemm
    if _fp8_gemm is not None:
        return
    lib = Library("hpu", "DEF")
    lib.define(
        "fp8_gemm_v2(Tensor A, bool trans_A, Tensor B, bool trans_B, Tensor? D, ScalarType out_dtype, "
        "Tensor? A_scale_inv=None, Tensor? B_scale_inv=None, Tensor? bias=None, bool accumulate=False) "
        "-> Tensor"
    )

    def operands(A, trans_A, B, trans_B):
        return (A.t() if trans_A else A), (B.t() if trans_B else B)

    def meta(A, trans_A, B, trans_B, D, out_dtype, A_scale_inv=None, B_scale_inv=None, bias=None, accumulate=False):
        a, b = operands(A, trans_A, B, trans_B)
        if _active is not None:
            _active.calls.append(("fp8_gemm_v2", A.dtype, B.dtype, out_dtype))
        return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)

    def cpu(A, trans_A, B, trans_B, D, out_dtype, A_scale_inv=None, B_scale_inv=None, bias=None, accumulate=False):
        a, b = operands(A.float(), trans_A, B.float(), trans_B)
        out = (a * (1 if A_scale_inv is None else A_scale_inv)) @ (b * (1 if B_scale_inv is None else B_scale_inv))
        if _active is not None:
            _active.calls.append(("fp8_gemm_v2", A.dtype, B.dtype, out_dtype))
        return (out if bias is None else out + bias.float()).to(out_dtype)

    lib.impl("fp8_gemm_v2", meta, "Meta")
    lib.impl("fp8_gemm_v2", cpu, "CPU")
    _fp8_gemm = lib


def _register_hpu_factories() -> None:
    """What a composite's insides ask of the HPU backend with no tensor to dispatch on (batch
    norm's ``empty``, SDPA's backend choice): fake HPU tensors, and the math SDPA. On a CPU
    build only; Gaudi's bridge registers its own."""
    global _hpu_factories

    def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        meta = torch.empty(size, dtype=dtype, device="meta", memory_format=memory_format)
        return fake_hpu(meta)

    _hpu_factories = Library("aten", "IMPL")
    _hpu_factories.impl("empty.memory_format", empty, "HPU")
    _hpu_factories.impl("_fused_sdp_choice", lambda *a, **k: 0, "HPU")  # SDPBackend.math


# -- torch.compile(backend="hpu_backend") (dynamo/compile_backend: backends.py, passes.py) -----

_backend_registered = False


def _propagated_dtypes(gm: torch.fx.GraphModule, example_inputs) -> Dict[str, torch.dtype]:
    """The bridge's tensor-info propagation pass: the graph runs on fake tensors with autocast
    off for ``hpu`` and ``cpu`` ("autocasting has been already done and all dtypes has been
    already deduced"); ``{node name: dtype}`` of its tensor results. (AOTAutograd also calls
    the compilers, and runs their graphs, with every autocast key excluded while any is on,
    ``torch._C._DisableAutocast``, the engine's borrowed keys included: torch 2.13 does here
    what the bridge's pass makes sure of.)"""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    inputs = [
        mode.from_tensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, torch._subclasses.FakeTensor) else x
        for x in example_inputs
    ]
    seen: Dict[str, torch.dtype] = {}

    class Propagation(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            if isinstance(result, torch.Tensor):
                seen[node.name] = result.dtype
            return result

    with torch.autocast(enabled=False, device_type="hpu"), torch.autocast(enabled=False, device_type="cpu"):
        with mode:
            Propagation(gm).run(*inputs)
    return seen


def _hpu_compiler(kind: str):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        traced = {n.name: n.meta["val"].dtype for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
        propagated = _propagated_dtypes(gm, example_inputs)
        differ = sorted(n for n in traced if propagated.get(n, traced[n]) != traced[n])
        if differ:  # the recipe would be built for other dtypes than the graph computes in
            raise RuntimeError(f"hpu_backend stand-in: propagation changed the dtypes of {differ}")
        casts = sum(
            1
            for n in gm.graph.nodes
            if n.target in (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)
        )
        if _active is not None:
            _active.calls.append(("compile", kind, casts))

        def run(args):
            # The device runs the graph's recipe: nothing dispatches, so no autocast runs.
            with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
                return gm(*args)

        run._boxed_call = True
        return run

    return compile_graph


def _register_hpu_backend() -> None:
    """``hpu_backend``, as importing ``habana_frameworks.torch.core`` registers it: AOTAutograd
    with the bridge's compilers (forward, backward, inference), once per process."""
    global _backend_registered
    if _backend_registered:
        return
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.registry import register_backend

    def hpu_backend(graph_module, example_inputs, **kwargs):
        return aot_autograd(
            fw_compiler=_hpu_compiler("forward"),
            bw_compiler=_hpu_compiler("backward"),
            inference_compiler=_hpu_compiler("inference"),
        )(graph_module, example_inputs)

    register_backend(hpu_backend, name="hpu_backend")
    _backend_registered = True


_active: Optional[Bridge] = None  # the installed stand-in, which the backend records into


# -- install ---------------------------------------------------------------------------------


def real_bridge_loaded() -> bool:
    """Gaudi's own bridge is imported in this process (on a Gaudi, ``import torch`` loads it)."""
    loaded = sys.modules.get("habana_frameworks.torch")
    return loaded is not None and not getattr(loaded, "STAND_IN", False)


def _skip_under_a_real_bridge() -> None:
    # The real bridge holds AutocastHPU's fallback and kernels: the stand-in cannot register
    # beside it, and a test of the glue against the stand-in says nothing about the real one.
    if real_bridge_loaded():
        import pytest

        pytest.skip("Gaudi's bridge is loaded: this test runs against the stand-in, not against it")


def install(
    monkeypatch, *, available: bool = True, lazy: bool = True, with_is_lazy: bool = True, device_name: str = "GAUDI"
) -> Bridge:
    _skip_under_a_real_bridge()
    bridge = Bridge(available, lazy)
    bridge.device_name = device_name
    _register_autocast_hpu()
    _register_hpu_backend()
    _register_fp8_gemm()
    monkeypatch.setattr(sys.modules[__name__], "_active", bridge)

    root, ht = _module("habana_frameworks"), _module("habana_frameworks.torch")
    core, hpu = _module("habana_frameworks.torch.core"), _module("habana_frameworks.torch.hpu")

    def mark_step(device_str: str = "", sync: bool = False) -> None:
        bridge.calls.append(("mark_step", device_str, sync))

    def wrap_in_hpu_graph(
        module, asynchronous=False, disable_tensor_cache=False, dry_run=False, max_graphs: Optional[int] = None
    ):
        bridge.calls.append(
            ("wrap", type(module).__name__, dict(asynchronous=asynchronous, disable_tensor_cache=disable_tensor_cache))
        )
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
    hpu.is_initialized = lambda: bridge.available  # FakeTensor asks these of torch.hpu
    hpu.current_device = lambda: 0
    if lazy:  # bridge 1.19 exports the HPU graph API in lazy mode only
        hpu.wrap_in_hpu_graph = wrap_in_hpu_graph
    ht.__version__ = "0.0+stand-in"
    root.torch, ht.core, ht.hpu = ht, core, hpu
    modules = {m.__name__: m for m in (root, ht, core, hpu)}
    for m in modules.values():
        m.STAND_IN = True
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

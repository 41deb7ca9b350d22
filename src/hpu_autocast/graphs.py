"""Capture a function run under the mode as an FX graph whose casts are explicit nodes.

    >>> gm = hpu_autocast.trace(model, x, dtype=torch.bfloat16, policy="torch-cpu")
    >>> print(gm.code)                        # _to_copy(..., dtype=torch.bfloat16) before addmm
    >>> y = gm(x)                             # no mode: plain ATen calls, native speed
    >>> fast = torch.compile(gm)              # an ordinary GraphModule for any backend

The graph is what ``make_fx`` records for one run of ``fn`` under ``HpuAutocastMode``: the ATen
ops, each with the dtypes the policy chose, and every cast as an ``aten._to_copy`` node. Running
it needs no mode, so it costs what the same ops cost without one, and it gives the same values as
the eager run under the mode, bit for bit (the tests compare them).

[Note: where the tracer sits]
``make_fx``'s tracer is a ``TorchDispatchMode``: it sees ATen calls below autograd, after the
engine's kernels (which sit where native autocast's do, above autograd) have cast their inputs.
Each cast reaches the tracer as an ``aten._to_copy`` call and is recorded, followed by the op on
the cast values, for policy ops called from Python and from C++ inside composites (``bmm`` in
``einsum``) alike. ``pre_dispatch=True`` is not used: it records above the engine, so the graph
would hold the uncast ops.

[Note: parameters]
The graph is traced with real tensors (``tracing_mode="real"``). Tensors ``fn`` reaches other
than through its arguments (a module's parameters and buffers, captured tensors) become
attributes of the graph module *by reference*: the graph reads the module's own ``Parameter``
objects, so gradients flow to them and an optimizer's in-place updates are seen by the next call.
When ``fn`` is an ``nn.Module`` they are renamed after the module's names, as ``torch.export``
does (parameter ``fc1.weight`` -> ``p_fc1_weight``, buffer ``bn.running_mean`` ->
``b_bn_running_mean``); in-place updates of buffers are graph nodes too. Tracing runs ``fn``
once for real, so its side effects (BatchNorm's running statistics) also happen once during
``trace``. To pass parameters as inputs instead (to trace a whole training step with
``torch.autograd.grad``), trace a function of ``(params, *inputs)`` that calls
``torch.func.functional_call(model, params, inputs)``.

A trace records one run: Python control flow and input shapes are fixed at the example inputs,
as with any ``make_fx`` trace. Call the graph outside regions: it already holds its casts.
"""

from __future__ import annotations

import copy
import functools
import itertools
import inspect
import types
from typing import Any, Callable, Dict, List

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from . import _torch
from .mode import HpuAutocastMode

__all__ = ["trace", "cast_nodes"]

#: ATen calls that change a tensor's dtype, as the tracer records them.
_CASTS = frozenset(
    {
        _torch.TO_COPY,
        torch.ops.aten.to.dtype,
        torch.ops.prims.convert_element_type.default,
    }
)


def trace(
    fn: Callable,
    *example_inputs: Any,
    dtype: torch.dtype = torch.bfloat16,
    policy="hpu",
    tracing_mode: str = "real",
    **mode_kwargs: Any,
) -> torch.fx.GraphModule:
    """Trace ``fn(*example_inputs)`` under ``HpuAutocastMode(dtype, policy=policy, **mode_kwargs)``
    into a ``torch.fx.GraphModule`` whose casts are explicit ``aten._to_copy`` nodes.

    The result runs without the mode, gives the eager-under-the-mode values, prints with
    ``print(gm.code)``, and can be handed to ``torch.compile``. ``fn`` may compute gradients
    (``torch.autograd.grad``): the backward ops and their casts are recorded too. Inside another
    region, the trace's own region is the innermost and decides.

    ``tracing_mode`` is ``make_fx``'s: ``"symbolic"`` gives a graph for any input shape, but
    needs every tensor to be an input (a module's parameters passed through
    ``torch.func.functional_call``), since ``make_fx`` cannot mix real and fake tensors.
    """
    # Build the mode now, so a bad dtype or policy fails here and not inside make_fx.
    mode = HpuAutocastMode(dtype, policy=policy, **mode_kwargs)

    def traced(*args):
        with copy.copy(mode):
            return fn(*args)

    if _plain_signature(fn, len(example_inputs)):
        # The graph's placeholders take the names of fn's parameters (x_1, not args_0).
        traced = functools.wraps(fn)(traced)
    gm = make_fx(traced, tracing_mode=tracing_mode)(*example_inputs)
    if isinstance(fn, torch.nn.Module):
        _drop_leftover_proxies(fn)
        _name_module_tensors(gm, fn)
    return gm


def _drop_leftover_proxies(module: torch.nn.Module) -> None:
    # torch 2.4's make_fx leaves its FX proxy in the __dict__ of a real tensor it updated in place
    # (BatchNorm's num_batches_tracked.add_), which copy.deepcopy cannot copy; later torch leaves none.
    for t in itertools.chain(module.parameters(), module.buffers()):
        if isinstance(t.__dict__.get("proxy"), torch.fx.Proxy):
            del t.__dict__["proxy"]


def _plain_signature(fn: Callable, n: int) -> bool:
    # make_fx names placeholders from the code object, which must then take exactly n arguments.
    code = getattr(fn, "__code__", None)
    return (
        isinstance(fn, types.FunctionType)
        and code.co_argcount == n
        and not code.co_kwonlyargcount
        and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    )


def cast_nodes(gm: torch.fx.GraphModule) -> List[torch.fx.Node]:
    """The nodes of ``gm`` that change a floating tensor's dtype, in graph order.

    ``[f"{n.args[0]} -> {n.meta['val'].dtype}" for n in cast_nodes(gm)]`` lists them readably."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _CASTS:
            continue
        src = node.args[0] if node.args else None
        before = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        after = node.meta.get("val")
        if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor):
            if before.dtype != after.dtype:
                found.append(node)
        elif "dtype" in node.kwargs or len(node.args) > 1:
            found.append(node)
    return found


def _name_module_tensors(gm: torch.fx.GraphModule, module: torch.nn.Module) -> None:
    """Rename make_fx's ``_param_constant0`` attributes after the module's own names."""
    names: Dict[int, str] = {}
    for prefix, named in (("p_", module.named_parameters()), ("b_", module.named_buffers())):
        for qualname, t in named:
            names.setdefault(id(t), prefix + qualname.replace(".", "_"))
    taken = {n.name for n in gm.graph.nodes} | set(dict(gm.named_children()))
    changed = False
    for node in gm.graph.nodes:
        if node.op != "get_attr" or "." in node.target:
            continue
        value = getattr(gm, node.target, None)
        name = names.get(id(value)) if isinstance(value, torch.Tensor) else None
        if name is None or name in taken or hasattr(gm, name):
            continue
        old = node.target
        if isinstance(value, torch.nn.Parameter):
            gm.register_parameter(name, value)
        elif old in dict(gm.named_buffers()):
            gm.register_buffer(name, value)
        else:
            setattr(gm, name, value)
        delattr(gm, old)
        node.target = name
        _torch.rename_node(node, name)
        taken.add(name)
        changed = True
    if changed:
        gm.recompile()

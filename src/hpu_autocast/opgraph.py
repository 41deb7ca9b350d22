"""The op graph of one forward pass with the casts marked, as Graphviz DOT text.

HMP's advice (seed 001) was to draw the autograd graph with torchviz and look for the
``CopyBackwards`` nodes. This draws what actually ran instead: every ATen op below the
engine, including the ``_to_copy`` casts the engine inserted (filled red) and the ops that
computed in a lower-precision dtype (filled blue). Render with ``dot -Tsvg graph.dot``.

[Note: where the graph mode sits] ``_GraphMode`` is a ``TorchDispatchMode``: it sees ATen calls
below autograd, after the engine's kernels (on an autocast dispatch key, above autograd) have
cast their inputs, so each cast arrives as an ``aten._to_copy`` call in front of the op that uses
it, and composites arrive decomposed (``linear`` as ``t`` and ``addmm``).
"""

from __future__ import annotations

from typing import Callable, Dict, List

import torch

from . import _torch
from ._torch import TorchDispatchMode, tree_flatten
from .events import short_dtype

__all__ = ["op_graph"]

#: Autograd bookkeeping, not computation: drawn as the tensor they pass through.
_PASS_THROUGH = {torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default}
_CAST = _torch.TO_COPY
_LOWER = (torch.bfloat16, torch.float16)


def _desc(t: torch.Tensor) -> str:
    return f"{short_dtype(t.dtype)}{list(t.shape)}"


class _GraphMode(TorchDispatchMode):
    def __init__(self, names: Dict[int, str]) -> None:
        super().__init__()
        self.names = names
        self.lines: List[str] = []
        self.producer: Dict[int, str] = {}
        self.keep: List[torch.Tensor] = []  # keeps ids unique while the graph is built
        self.count = 0
        self.tensors = 0

    def _source(self, t: torch.Tensor) -> str:
        node = self.producer.get(id(t))
        if node is None:
            node = self.producer[id(t)] = f"t{self.tensors}"
            self.tensors += 1
            self.keep.append(t)
            name = self.names.get(id(t), "tensor")
            self.lines.append(f'  {node} [label="{name}\\n{_desc(t)}", shape=ellipse];')
        return node

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if func in _PASS_THROUGH and ins and outs:
            self.producer[id(outs[0])] = self._source(ins[0])
            self.keep.append(outs[0])
            return out
        sources = [self._source(t) for t in ins]
        node = f"n{self.count}"
        self.count += 1
        result = ", ".join(_desc(o) for o in outs)
        if func is _CAST and ins and outs and ins[0].dtype != outs[0].dtype:
            label = f"cast {short_dtype(ins[0].dtype)} -> {short_dtype(outs[0].dtype)}"
            style = ', style=filled, fillcolor="#f4a6a6"'
        else:
            label = str(func).replace("aten.", "", 1)
            low = outs and all(o.dtype in _LOWER for o in outs)
            style = ', style=filled, fillcolor="#a6c8f4"' if low else ""
        self.lines.append(f'  {node} [label="{label}\\n{result}"{style}];')
        for s in dict.fromkeys(sources):
            self.lines.append(f"  {s} -> {node};")
        for o in outs:
            self.producer[id(o)] = node
            self.keep.append(o)
        return out


def op_graph(fn: Callable, *inputs, **mode_kwargs) -> str:
    """Run ``fn(*inputs)`` under ``HpuAutocastMode(**mode_kwargs)`` and return the DOT text of
    the ATen ops it ran, casts marked. Parameters of ``fn`` (when it is a module) and the
    inputs are named in the graph (``weight``, ``input0``)."""
    from .mode import HpuAutocastMode

    names: Dict[int, str] = {}
    if isinstance(fn, torch.nn.Module):
        names.update((id(p), n) for n, p in fn.named_parameters())
        names.update((id(b), n) for n, b in fn.named_buffers())
    names.update((id(t), f"input{i}") for i, t in enumerate(inputs) if isinstance(t, torch.Tensor))
    graph = _GraphMode(names)
    with graph, HpuAutocastMode(**mode_kwargs):
        fn(*inputs)
    body = "\n".join(graph.lines)
    return f'digraph ops {{\n  node [shape=box, fontname="monospace"];\n{body}\n}}\n'

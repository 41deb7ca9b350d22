"""The autograd bridge for casts made below autograd (by the dispatch mode).

[Note: the autograd bridge]
When the dispatch mode casts ``mm(a, b)`` to ``mm(a.bf16, b.bf16)``, autograd has already
built ``MmBackward`` and saved the *uncast* ``a`` and ``b``. Its backward would then multiply
a bfloat16 gradient by a float32 tensor and fail, or compute in the wrong dtype. So, once the
node is attached to the op's outputs (autograd does that after the dispatch mode returns, so
the engine queues the op and registers at its next call or at region exit), each saved
tensor that the op saw as a cast copy gets saved-tensor hooks whose unpack casts it again.
The node's backward then computes in the dtype its forward computed in, as under native
autocast. Native autocast also rounds each input gradient through the copy's dtype: autograd
casts the node's gradient to the dtype of the input it saw (the bfloat16 copy), then
``ToCopyBackward`` casts it to float32. Some kernels return float32 gradients for bfloat16
inputs (oneDNN's ``mkldnn_rnn_layer_backward`` on CPUs without AMX), so a post-hook on the
node makes that round trip for each cast input; where the kernel already returned the low
dtype the round trip is exact. Casting at unpack (rather than keeping the copy) keeps
memory at what autograd saves anyway and, under ``create_graph=True``, records the cast so
double backward reaches the original.
"""

from __future__ import annotations

import functools
import warnings
from typing import Dict, List, Sequence, Tuple

import torch

__all__ = ["Pending", "attach"]

#: (outputs of the op, {id(original input): (original input, dtype it was cast to)})
Pending = Tuple[Sequence[torch.Tensor], Dict[int, Tuple[torch.Tensor, torch.dtype]]]


@functools.lru_cache(maxsize=None)
def _saved_names(node_type: type) -> Tuple[str, ...]:
    # One dir() per node type; "_raw_saved_self" -> "self".
    return tuple(n[len("_raw_saved_"):] for n in dir(node_type) if n.startswith("_raw_saved_"))


def _pack(t: torch.Tensor) -> torch.Tensor:
    return t


def _unpack(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype)


_UNPACKERS: Dict[torch.dtype, object] = {}


def _unpacker(dtype: torch.dtype):
    fn = _UNPACKERS.get(dtype)
    if fn is None:
        fn = _UNPACKERS[dtype] = functools.partial(_unpack, dtype=dtype)
    return fn


def _input_positions(node, subs: Dict[int, Tuple[torch.Tensor, torch.dtype]]) -> List[Tuple[int, torch.dtype]]:
    """``(index into the node's gradients, cast dtype)`` for each input of ``node`` that was cast."""
    found = []
    for i, (fn, nr) in enumerate(node.next_functions):
        if fn is None:
            continue
        for orig, dtype in subs.values():
            if orig.grad_fn is not None:
                feeds = orig.grad_fn is fn and orig.output_nr == nr
            else:  # a leaf: the edge is its AccumulateGrad
                feeds = getattr(fn, "variable", None) is orig
            if feeds:
                if dtype != orig.dtype:
                    found.append((i, dtype))
                break
    return found


def _round_grads(positions: List[Tuple[int, torch.dtype]], grad_inputs: tuple, grad_outputs: tuple) -> tuple:
    grads = list(grad_inputs)
    for i, dtype in positions:
        g = grads[i]
        if g is not None and g.dtype != dtype:
            grads[i] = g.to(dtype).to(g.dtype)
    return tuple(grads)


def attach(pending: List[Pending]) -> None:
    """Register the bridge hooks for every queued op whose autograd node now exists."""
    for outputs, subs in pending:
        node = None
        for o in outputs:
            node = o.grad_fn
            if node is not None:
                break
        if node is None:
            continue
        positions = _input_positions(node, subs)
        if positions:
            node.register_hook(functools.partial(_round_grads, positions))
        for name in _saved_names(type(node)):
            try:
                value = getattr(node, "_saved_" + name)
            except (RuntimeError, AttributeError):
                # Freed, or a Python node (autograd.Function) whose ctx holds its own tensors.
                continue
            if isinstance(value, torch.Tensor):
                pairs = ((value, getattr(node, "_raw_saved_" + name)),)
            elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
                pairs = zip(value, getattr(node, "_raw_saved_" + name))
            else:
                continue
            for tensor, raw in pairs:
                sub = subs.get(id(tensor))
                if sub is None or sub[0] is not tensor:
                    continue
                try:
                    raw.register_hooks(_pack, _unpacker(sub[1]))
                except RuntimeError:
                    warnings.warn(
                        f"hpu_autocast: cannot bridge {type(node).__name__}: its saved tensors "
                        "already carry saved-tensor hooks; its backward may run in the wrong dtype. "
                        "Call the op through a Python-visible function so it is cast above autograd.",
                        RuntimeWarning, stacklevel=2,
                    )
                    return

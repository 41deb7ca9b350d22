"""The autograd bridge for casts made below autograd (by the dispatch mode).

[Note: the autograd bridge]
When the dispatch mode casts ``mm(a, b)`` to ``mm(a.bf16, b.bf16)``, autograd has already
built ``MmBackward`` and saved the *uncast* ``a`` and ``b``. Its backward would then multiply
a bfloat16 gradient by a float32 tensor and fail, or compute in the wrong dtype. So, once the
node is attached to the op's outputs (autograd does that after the dispatch mode returns, so
the engine queues the op and registers at its next call or at region exit), each saved
tensor that the op saw as a cast copy gets saved-tensor hooks whose unpack casts it again.
The node's backward then computes in the dtype its forward computed in, as under native
autocast; the engine casts each input gradient back to its input's dtype, as native
autocast's ``ToCopyBackward`` does. Casting at unpack (rather than keeping the copy) keeps
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
        for name in _saved_names(type(node)):
            try:
                value = getattr(node, "_saved_" + name)
            except RuntimeError:
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

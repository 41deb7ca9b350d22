"""In-place and ``out=`` overloads a policy names: computed into copies in the rule's dtype and
written back into the caller's tensors (the Note on ``into``)."""

from __future__ import annotations

import torch

from .. import _torch
from .compiled import OpRule

__all__ = ["into", "write_back"]

_Tensor = torch.Tensor


def into(rule: OpRule, args, kwargs: dict, target: torch.dtype, eligible) -> tuple:
    """Point the tensors an in-place or ``out=`` overload writes and returns at copies in the
    dtype it computes in, where theirs differs: ``(args, kwargs, [(tensor, copy), ...])``.

    [Note: named in-place and out= overloads] A policy that names ``addmm_`` or ``mm.out`` asks
    for the computation in its dtype; the caller's tensor keeps its own. So the op computes
    into a copy in that dtype (an in-place op's ``self`` is also an input: the copy holds its
    values), and the result is written back into the caller's tensor, rounded to its dtype: a
    float32 ``c`` after ``torch.mm(a, b, out=c)`` under a LOWER rule holds
    ``torch.mm(a.bfloat16(), b.bfloat16()).float()``. A write is never lost to a copy, and the
    caller gets its own tensor back. Float64 and non-floating outputs are left as they are."""
    written = []
    new_args = args
    for i, a in enumerate(_torch.schema(rule.op).arguments):
        if a.name not in rule.into:
            continue
        if a.kwarg_only:
            t = kwargs.get(a.name)
        else:
            t = args[i] if i < len(args) else None
        if not (isinstance(t, _Tensor) and t.dtype is not target and eligible(t)):
            continue
        copy = t.to(target)
        written.append((t, copy))
        if a.kwarg_only:
            kwargs = dict(kwargs)
            kwargs[a.name] = copy
        else:
            new_args = list(new_args)
            new_args[i] = copy
    return new_args, kwargs, written


def write_back(written: list, out):
    """Copy each computed ``copy`` into its caller's tensor and return what the op would have
    returned with the caller's tensors (see ``into``)."""
    swap = {}
    for t, copy in written:
        if t.shape != copy.shape:
            t.resize_(copy.shape)  # out= tensors are resized to the result, as the op would
        t.copy_(copy)
        swap[id(copy)] = t
    if isinstance(out, _Tensor):
        return swap.get(id(out), out)
    if isinstance(out, (tuple, list)):
        return type(out)(swap.get(id(o), o) if isinstance(o, _Tensor) else o for o in out)
    return out

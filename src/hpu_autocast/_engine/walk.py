"""The one walk over a call's arguments (``_walk``), which every cast policy shares (Note: the
rule, per cast policy, in ``_kernels``): where the tensors a rule looks at are (the schema's
positions, ``OpRule.walk``, else found per call), which of them the region may cast, and their
casts, last to first, through the cast cache."""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch

from .cast_cache import CAST, cached_cast, cast_to
from .regions import Frame
from .._torch import autocast_cache_enabled as _cache_on
from .._facts.devices import tensor_on
from .compiled import OpRule
from ..events import Cast

__all__ = ["cast_inputs", "inputs", "positions", "reached"]

_Tensor = torch.Tensor


def inputs(
    rule: OpRule, args: tuple, kwargs: dict, device_type: str
) -> Iterator[Tuple[object, Optional[int], torch.Tensor]]:
    """The tensors a rule looks at (``positions``), in argument order, as ``(position, index in a
    list or None, tensor)``."""
    for i in positions(rule, args, kwargs, device_type):
        a = kwargs[i] if type(i) is str else args[i]
        if isinstance(a, _Tensor):
            yield i, None, a
        elif type(a) is list or type(a) is tuple:
            yield from ((i, j, t) for j, t in enumerate(a) if isinstance(t, _Tensor))


def cast_inputs(
    frame: Frame, rule: OpRule, args: tuple, kwargs: dict, target: Optional[torch.dtype], observe: bool
) -> Tuple[int, list, dict, Tuple[Cast, ...]]:
    """The one walk: cast the call's eligible inputs to ``target`` (``None``: none; through the
    cast cache); returns how many were eligible, the arguments with the casts in place, and, when
    ``observe``, the casts made, in argument order (else ``()``). An argument the op writes is
    never replaced by a copy (its write would be lost); it still counts."""
    region = frame.region
    is_eligible = region.eligible
    if target is None:  # nothing to cast (the dtype policies; PROMOTE with no input eligible)
        eligible = sum(1 for _, _, t in inputs(rule, args, kwargs, region.device_type) if is_eligible(t))
        return eligible, args, kwargs, ()
    walk, slots, names = rule.walk, list(args), ()
    if walk is not None and len(args) < len(walk):  # positions(), its lookup written out: the cast op's path
        where = walk[len(args)]
    else:  # a keyword tensor is a slot after the positional ones, at a negative index (none is written)
        where = positions(rule, args, kwargs, region.device_type)
        names = [i for i in where if type(i) is str]
        where = [i for i in where if type(i) is int] + list(range(-len(names), 0))
        slots += [kwargs[n] for n in names]
    cast, protected, eligible = CAST.get(target) or cast_to(target), rule.protected, 0
    made: Optional[list] = [] if observe else None  # the casts, in the walk's order (reversed at the end)
    # Note [the order of casts]: native casts an op's arguments last to first (they are the
    # arguments of one C++ call, which GCC, torch's Linux compiler, evaluates right to left), so
    # the last argument's ToCopyBackward comes first and autograd runs it last; where one tensor
    # is cast for several arguments, its gradient's float32 sums follow that order. So the
    # arguments are cast last to first too (a list's items in order, as native's loop casts
    # them), and the events list the casts in argument order (``made``, reversed).
    for i in reversed(where):
        a = slots[i]
        if isinstance(a, _Tensor):
            if not is_eligible(a):
                continue
            eligible += 1
            if a.dtype is not target and not (protected and i in protected):
                if a.requires_grad or observe:  # cached_cast's first test: else no entry, no report
                    a = _cached(frame, a, target, made, rule.arg_names[i] if i >= 0 else names[i])
                else:
                    a = cast(a)
                slots[i] = a
        elif type(a) is list or type(a) is tuple:
            eligible += _cast_list(
                frame, slots, i, rule.arg_names[i] if i >= 0 else names[i], i in protected, target, made
            )
    casts = tuple(reversed(made)) if made else ()
    if names:
        return eligible, slots[: len(args)], {**kwargs, **dict(zip(names, slots[len(args) :]))}, casts
    return eligible, slots, kwargs, casts


def _cached(frame: Frame, t: torch.Tensor, target: torch.dtype, made: Optional[list], arg: str) -> torch.Tensor:
    """``t`` cast through the region's cast cache (``cached_cast``: casts to its lower dtype only,
    while torch's cache flag is on), its cast recorded in ``made`` when observed."""
    copy, hit = cached_cast(t, target, frame.open.cache if target is frame.lower and _cache_on() else None)
    if made is not None:
        made.append(Cast(arg, t.dtype, target, copy.numel() * target.itemsize, hit, t))
    return copy


def _cast_list(
    frame: Frame, slots: list, i: int, name: str, written: bool, target: torch.dtype, made: Optional[list]
) -> int:
    """``cast_inputs`` for a list argument ``name`` (``cat``'s tensors), its items in order:
    ``slots[i]`` becomes a list of the same type with the eligible items cast (none where the op
    writes it); returns how many were eligible."""
    is_eligible, items = frame.region.eligible, slots[i]
    copies, eligible = None, 0
    for j, t in enumerate(items):
        if not (isinstance(t, _Tensor) and is_eligible(t)):
            continue
        eligible += 1
        if t.dtype is target or written:
            continue
        copies = copies or list(items)
        copies[j] = _cached(frame, t, target, made, f"{name}[{j}]")
    if copies is not None:
        slots[i] = type(items)(copies)
    return eligible


def positions(rule: OpRule, args: list, kwargs: dict, device_type: str) -> list:
    """Where the tensors a rule looks at are, in argument order (a keyword argument's position is
    its name): a tensor or a list of them; an input-only rule stops at its first tensor, and what
    the op writes by keyword (``out=``) is not an input (``_inplace.into``). Where the schema
    says (``OpRule.walk``: no list of tensors, no keyword tensor), looked up, not found: the
    positions typed ``Tensor`` (one may hold ``None`` or a wrapped scalar's number)."""
    walk = rule.walk
    if walk is not None and len(args) < len(walk):  # (more: not a call as the dispatcher makes it)
        return walk[len(args)]
    input_only, out = rule.input_only and rule.casts_input_only(device_type), []
    for i, a in enumerate(args):
        if isinstance(a, _Tensor) or type(a) is list or type(a) is tuple:
            out.append(i)
            if input_only and isinstance(a, _Tensor):
                return out
    if not input_only:
        out += [n for n, v in kwargs.items() if isinstance(v, _Tensor) and n not in rule.written_names]
    return out


def reached(region, rule: OpRule, args: tuple, kwargs: dict) -> bool:
    """Whether the call has a floating tensor of the region's device (float64 included): else native
    autocast's kernel would not have been reached."""
    on_device = tensor_on(region.device_type)
    return any(t.is_floating_point() and on_device(t) for _, _, t in inputs(rule, args, kwargs, region.device_type))

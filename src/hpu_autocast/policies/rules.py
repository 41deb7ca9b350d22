"""The dtype rules, as pure functions: which tensors autocast may cast, and the dtype an op of a
given ``CastPolicy`` computes in. The engine's kernels call them (``eligibility``'s predicate for
every tensor the one walk looks at, ``_engine.walk``); the tests check them with hypothesis.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable, Optional

import torch

from .._facts.devices import tensor_on
from .policy import CastPolicy

__all__ = ["is_eligible", "eligibility", "compute_dtype", "has_explicit_dtype", "PromoteError"]

_FLOAT32 = torch.float32
_FLOAT64 = torch.float64
#: The floating dtypes but float64: a set, as one lookup is cheaper than two tests of a dtype.
_CASTABLE = frozenset(
    d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point and d is not _FLOAT64
)


class PromoteError(RuntimeError):
    """A PROMOTE op met a floating dtype autocast cannot promote: neither float32 nor the region's
    lower-precision dtype (a bfloat16 tensor in a float16 region). Native autocast raises too."""


@functools.lru_cache(maxsize=None)
def eligibility(device_type: str) -> Callable[[torch.Tensor], bool]:
    """The eligibility rule for one device type, as the predicate a region's kernels ask of each
    tensor argument: a tensor autocast may cast is floating point, not float64 (seeds 002 and
    003), and on the region's device, as ``torch.autocast`` casts only tensors of its own device.
    (One predicate per device type, built once: the walk asks it of every tensor.)"""
    on_device = tensor_on(device_type)

    def eligible(t: torch.Tensor) -> bool:
        return t.dtype in _CASTABLE and on_device(t)

    eligible.__qualname__ = f"eligibility({device_type!r})"
    return eligible


def is_eligible(t: object, device_type: str) -> bool:
    """Whether autocast may cast ``t`` in a region for ``device_type`` (``eligibility``'s rule)."""
    return isinstance(t, torch.Tensor) and eligibility(device_type)(t)


def compute_dtype(
    action: CastPolicy, dtypes: Iterable[torch.dtype], lower: torch.dtype, op: str = "op"
) -> Optional[torch.dtype]:
    """The dtype an op with ``action`` computes in, given its eligible inputs' ``dtypes`` in
    argument order.

    ``None`` means "cast nothing" (a PROMOTE or FIRST op with no eligible input). PROMOTE follows
    native autocast's ``prioritize``: float32 wins over the lower dtype; any other floating dtype
    met before a float32 raises ``PromoteError`` naming ``op``.
    """
    if action is CastPolicy.LOWER:
        return lower
    if action is CastPolicy.FP32:
        return _FLOAT32
    if action is CastPolicy.FIRST:
        return next(iter(dtypes), None)
    current = None
    for d in dtypes:
        if current is _FLOAT32 or d is _FLOAT32:
            current = _FLOAT32
        elif d is lower:
            current = lower
        else:
            short = str(lower).replace("torch.", "")
            raise PromoteError(
                f"{op}: cannot promote a {str(d).replace('torch.', '')} input in a {short} region: "
                f"autocast promotes float32 and {short} only (as torch.autocast does); cast that "
                f"input to float32 or {short} first"
            )
    return current


def has_explicit_dtype(args: tuple, kwargs: dict) -> bool:
    """True when a call passes ``dtype=`` (or any ``torch.dtype`` argument): such calls are not
    eligible and produce what the argument asks for (seed 003)."""
    for a in args:
        if isinstance(a, torch.dtype):
            return True
    for v in kwargs.values():
        if isinstance(v, torch.dtype):
            return True
    return False

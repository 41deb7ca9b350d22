"""The dtype rules, as pure functions: which tensors are eligible, and what dtype an op of a
given ``CastPolicy`` computes in. Shared by both levels of the engine and by the tests."""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from .policy import CastPolicy

__all__ = ["is_eligible", "compute_dtype", "has_explicit_dtype"]

_FLOAT64 = torch.float64


def is_eligible(t: object) -> bool:
    """A tensor autocast may cast: floating point and not float64 (seeds 002 and 003)."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype is not _FLOAT64


def compute_dtype(action: CastPolicy, dtypes: Iterable[torch.dtype], lower: torch.dtype) -> Optional[torch.dtype]:
    """The dtype an op with ``action`` computes in, given its eligible inputs' ``dtypes``.

    ``None`` means "cast nothing" (a PROMOTE or FIRST op with no eligible input).
    """
    if action is CastPolicy.LOWER:
        return lower
    if action is CastPolicy.FP32:
        return torch.float32
    widest = None
    for d in dtypes:
        if action is CastPolicy.FIRST:
            return d
        widest = d if widest is None else torch.promote_types(widest, d)
    return widest


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

"""The cast cache: native autocast's ``cached_cast``, entry for entry (its Note, on ``cached_cast``)."""

from __future__ import annotations

import functools
import weakref
from typing import Callable, Optional

import torch

from .. import _torch
from ..events import Cast

__all__ = ["cached_cast", "CAST"]

_FLOAT32 = torch.float32
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = _torch.set_grad_enabled
_inference_mode = torch.is_inference_mode_enabled

#: The plain cast to each dtype a region computes in (``Tensor.bfloat16`` and friends).
CAST = {torch.bfloat16: _Tensor.bfloat16, torch.float16: _Tensor.half, torch.float32: _Tensor.float}


def cached_cast(t: torch.Tensor, dt: torch.dtype, target: torch.dtype, cast: Callable, cache: Optional[dict],
          casts: Optional[list], arg: str, lower: bool) -> torch.Tensor:
    """``t`` (eligible, of dtype ``dt``) cast to ``target``, through the cast cache where it applies.

    [Note: the cast cache] The cache is native autocast's (``cached_cast`` in ATen's
    ``autocast_mode.cpp``), entry for entry: within the outermost region, a **float32 leaf that
    requires grad and is not a view** (a weight), cast **to the region's lower dtype**, is cast
    once and its copy reused, so its uses share one ``ToCopyBackward`` and their gradients meet
    in the lower dtype before the cast back, bit for bit as native. Under the conditions native
    asks at every use: torch's autocast cache flag is on (``torch.is_autocast_cache_enabled()``:
    the region sets it at entry, a nested ``torch.autocast(cache_enabled=False)`` clears it),
    the weight requires grad now (one frozen with ``requires_grad_(False)`` is cast afresh), and
    inference mode is off (a copy made there could never join a graph). A copy is made with grad
    enabled, also under ``no_grad``, so a later use with grad gets the ``ToCopyBackward`` it needs.
    As native, the copy serves until the outermost region exits, also after an in-place update
    of the weight (an optimizer step inside the region): a region's weights are its constants;
    ``torch.clear_autocast_cache()`` inside the region empties it, as native's (``_torch_autocast``).
    Nothing else is cached (inputs, masks, frozen weights are cast at each use): their values
    can change behind any version counter (``.data``, NumPy, DLPack), so no entry could be
    proved fresh. One safe difference from native: entries are keyed by the dtype too, so a
    nested ``torch.autocast`` of another dtype never receives a copy of the first.
    ``cache_enabled=False`` (always so on HPU) casts every time."""
    if (cache is not None and lower and dt is _FLOAT32 and t.requires_grad and t.is_leaf
            and not _torch.is_view(t) and not _inference_mode()):
        if type(cache) is not dict:  # the C++ core's, shared with its kernels (_core.new_cache)
            c, hit = cache.cast(t, target)
            if casts is not None:
                casts.append(Cast(arg, dt, target, c.numel() * target.itemsize, hit, t))
            return c
        key = (id(t), target)
        hit = cache.get(key)
        if hit is not None and hit[0]() is t:
            if casts is not None:
                casts.append(Cast(arg, dt, target, hit[1].numel() * target.itemsize, True, t))
            return hit[1]
        if _grad_enabled():
            c = cast(t)
        else:
            _set_grad_enabled(True)
            try:
                c = cast(t)
            finally:
                _set_grad_enabled(False)
        cache[key] = (weakref.ref(t, functools.partial(_evict, cache, key)), c)
    else:
        c = cast(t)
    if casts is not None:
        casts.append(Cast(arg, dt, target, c.numel() * target.itemsize, False, t))
    return c


def _evict(cache: dict, key: tuple, _ref) -> None:
    cache.pop(key, None)

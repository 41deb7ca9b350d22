"""The cast cache: native autocast's ``cached_cast``, entry for entry (its Note, on ``cached_cast``)."""

from __future__ import annotations

import functools
import weakref
from typing import Callable, Optional, Tuple

import torch

from .. import _torch

__all__ = ["cached_cast", "cast_to", "Cache", "CAST"]

_FLOAT32 = torch.float32
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = _torch.set_grad_enabled
_inference_mode = torch.is_inference_mode_enabled

#: The plain cast to each dtype a region computes in (``Tensor.bfloat16`` and friends).
CAST = {torch.bfloat16: _Tensor.bfloat16, torch.float16: _Tensor.half, torch.float32: _Tensor.float}


def cast_to(target: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """The plain cast to ``target``."""
    return CAST.get(target) or functools.partial(_Tensor.to, dtype=target)


class Cache:
    """A region's cast cache, in Python: the interface the C++ core's ``Cache`` has (``cast``,
    ``clear``), for the Python kernels where no core is built (``_core.new_cache`` chooses)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict = {}

    def cast(self, t: torch.Tensor, target: torch.dtype) -> Tuple[torch.Tensor, bool]:
        """``t`` (float32, an eligible leaf that requires grad and is no view) cast to ``target``:
        ``(the entry's copy, True)`` while ``t`` lives, else ``(a fresh copy, False)``, made with
        grad on (a later use with grad needs its ``ToCopyBackward``) and remembered."""
        key = (id(t), target)
        hit = self._entries.get(key)
        if hit is not None and hit[0]() is t:
            return hit[1], True
        if _grad_enabled():
            c = cast_to(target)(t)
        else:
            _set_grad_enabled(True)
            try:
                c = cast_to(target)(t)
            finally:
                _set_grad_enabled(False)
        self._entries[key] = (weakref.ref(t, functools.partial(_evict, self._entries, key)), c)
        return c, False

    def clear(self) -> None:
        self._entries.clear()


def cached_cast(t: torch.Tensor, target: torch.dtype, cache: Optional[Cache]) -> Tuple[torch.Tensor, bool]:
    """``t`` (eligible) cast to ``target``, through ``cache`` where an entry applies (``None``: the
    cache is off, or ``target`` is not the region's lower dtype); returns the copy and whether the
    cache served it.

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
    ``cache_enabled=False`` (always so on HPU) casts every time. The cache is the C++ core's
    (``Cache`` in csrc/core.cpp, shared with its kernels) or this module's ``Cache``: one interface."""
    if (
        cache is not None
        and t.dtype is _FLOAT32
        and t.requires_grad
        and t.is_leaf
        and not _torch.is_view(t)
        and not _inference_mode()
    ):
        return cache.cast(t, target)
    return cast_to(target)(t), False


def _evict(entries: dict, key: tuple, _ref) -> None:
    entries.pop(key, None)

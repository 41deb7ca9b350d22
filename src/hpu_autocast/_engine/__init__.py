"""The engine: regions (``_regions``) opened on the borrowed dispatch keys whose kernels are
``_kernels``' (which cast through ``_cast_cache``), with torch's autocast functions answering
for them while any is open (``_torch_autocast``). The rest of the package asks this module.

How one call goes, from the dispatcher to the cast, is ``_kernels``' docstring; what a region
and a frame are, ``_regions``' Note; what is patched while a region is open, and who counts the
open regions, ``_torch_autocast``'s; higher-order operators, ``_hops``'.
"""

from __future__ import annotations

from . import hops as _hops, kernels as _kernels, regions as _regions
from .._torch import autocast as _torch_autocast
from .kernels import keys_excluded
from .regions import (GUARD, OFF, Frame, Region, State, current, innermost, observing,
                       replace_innermost)

__all__ = ["Region", "Frame", "State", "OFF", "current", "observing", "innermost", "enter", "exit",
           "replace_innermost", "keys_excluded", "GUARD"]


def enter(region: Region) -> None:
    """Open ``region`` in the calling context: it becomes the innermost frame (``_regions.enter``),
    counted among the regions open in the process (``_torch_autocast.acquire``); higher-order
    operators made since the last region learn the borrowed keys (``_hops``)."""
    k = _kernels.keys()
    _regions.enter(region, k, _torch_autocast.acquire)
    try:
        _hops.cover(k)  # after the entry, which may move the observing key
    except BaseException:
        _regions.exit(region, _torch_autocast.release)
        raise


def exit(region: Region) -> None:
    """Close ``region`` (``_regions.exit``); the last open region's exit restores torch's own
    autocast functions (``_torch_autocast.release``)."""
    _regions.exit(region, _torch_autocast.release)

"""The engine: regions (``regions``, the frame stack) opened on the borrowed dispatch keys
(``dispatch``) whose kernels are ``kernels``' (which cast through ``cast_cache``, and hand calls
to the C++ core, ``core``, where it is built), with torch's autocast functions answering for them
while any is open (``torch_autocast``). A region's entry and exit are composed in one place,
``entry`` (its Note: register, the core's tables, the patches, the frame); ``enter`` adds the
higher-order operators (``hops``). The rest of the package asks this module.

How one call goes, from the dispatcher to the cast, is ``kernels``' docstring; what a region
and a frame are, ``regions``' Note; what is patched while a region is open, and who counts the
open regions, ``torch_autocast``'s; higher-order operators, ``hops``'.
"""

from __future__ import annotations

from . import entry as _entry, hops as _hops, kernels as _kernels
from . import torch_autocast as _torch_autocast
from .entry import Entered, replace_innermost
from .kernels import keys_excluded
from .regions import GUARD, OFF, Frame, Region, State, ask, current, innermost, observing

__all__ = [
    "Region",
    "ask",
    "Entered",
    "Frame",
    "State",
    "OFF",
    "current",
    "observing",
    "innermost",
    "enter",
    "exit",
    "replace_innermost",
    "keys_excluded",
    "GUARD",
]


def enter(region: Region) -> Entered:
    """Open ``region`` (``ask``'s) in the calling context (``entry.enter``: it becomes the innermost
    frame, counted among the regions open in the process by ``torch_autocast.acquire``);
    higher-order operators made since the last region learn the borrowed keys (``hops``).
    Returns what ``exit`` takes: what the entry took, to give back."""
    k = _kernels.keys()
    entered = _entry.enter(region, k, _torch_autocast.acquire, _torch_autocast.release)
    try:
        _hops.cover(k)  # after the entry, which may move the observing key
    except BaseException:
        _entry.exit(entered, _torch_autocast.release)
        raise
    return entered


def exit(entered: Entered) -> None:
    """Close the region ``enter`` opened (``entry.exit``); the last open region's exit restores
    torch's own autocast functions (``torch_autocast.release``)."""
    _entry.exit(entered, _torch_autocast.release)

"""The engine: regions (``_regions``) opened on the borrowed dispatch keys whose kernels are
``_kernels``' (which cast through ``_cast_cache``). The rest of the package asks this module.

How one call goes, from the dispatcher to the cast, is ``_kernels``' docstring; what a region
and a frame are, ``_regions``' Note.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from . import _kernels, _regions
from ._kernels import keys_excluded
from ._regions import (GUARD, OFF, REGION_HOOKS, Frame, Region, State, current, innermost, observing,
                       replace_innermost)
from ._table import compile_policy

__all__ = ["Region", "Frame", "State", "OFF", "current", "observing", "innermost", "enter", "exit", "entered",
           "replace_innermost", "keys_excluded", "REGION_HOOKS", "GUARD"]


def enter(region: Region) -> None:
    """Open ``region`` in the calling context: it becomes the innermost frame (``_regions.enter``)."""
    _regions.enter(region, _kernels.keys())


exit = _regions.exit


@contextlib.contextmanager
def entered(state: State) -> Iterator[None]:
    """A region reproducing ``state`` (a policy's, or off) for the body: what a recomputation
    in backward runs in (``torch.utils.checkpoint``; see ``_torch_autocast``)."""
    if state.enabled:
        region = Region(compile_policy(state.policy), state.dtype, state.device_type, True, state.cache_enabled)
    else:
        frame = innermost()
        region = Region(None, torch.bfloat16, frame.region.device_type if frame else "cpu", False, True)
    enter(region)
    try:
        yield
    finally:
        exit(region)

"""Differences between the torch versions we support (2.4 and newer)."""

from __future__ import annotations

import os

import torch
import torch.overrides

__all__ = ["HAS_REDISPATCH", "redispatch", "TORCH_VERSION"]

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

#: torch 2.13 added ``torch.overrides.redispatch_function``: a TorchFunctionMode can run a
#: Python-level function (``F.cross_entropy``) with itself still active, and so see the
#: builtins it calls. Older torch hides them; see ``_table.F_ALIASES`` for the fallback.
#: ``HPU_AUTOCAST_NO_REDISPATCH=1`` takes the older torch's path on any torch (to test it).
redispatch = None if os.environ.get("HPU_AUTOCAST_NO_REDISPATCH") == "1" else getattr(
    torch.overrides, "redispatch_function", None)
HAS_REDISPATCH = redispatch is not None

"""Differences between the torch versions we support (2.4 and newer)."""

from __future__ import annotations

import torch
import torch.overrides

__all__ = ["HAS_REDISPATCH", "redispatch", "TORCH_VERSION"]

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

#: torch 2.13 added ``torch.overrides.redispatch_function``: a TorchFunctionMode can run a
#: Python-level function (``F.cross_entropy``) with itself still active, and so see the
#: builtins it calls. Older torch hides them; see ``_table.F_ALIASES`` for the fallback.
redispatch = getattr(torch.overrides, "redispatch_function", None)
HAS_REDISPATCH = redispatch is not None

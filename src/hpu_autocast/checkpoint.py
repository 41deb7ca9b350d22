"""Activation checkpointing that recomputes under the forward's policy.

``torch.utils.checkpoint`` saves and restores ``torch.autocast``'s state for the recomputation
it runs in backward, but knows nothing of ``HpuAutocastMode``: when backward runs outside the
region (the usual training loop), the recomputation runs in float32, its saved tensors have
other dtypes than the forward's, and torch raises ``CheckpointError: Recomputed values for the
following tensors have different metadata``. Use instead::

    from hpu_autocast.checkpoint import checkpoint
    with HpuAutocastMode(torch.bfloat16):
        y = checkpoint(block, x)               # use_reentrant=False by default
    y.sum().backward()                         # recomputes block under the same policy

or, to keep calling torch's function, ``context_fn=hpu_autocast.checkpoint.context_fn``.

[Note: which calls are recomputations]
``checkpoint`` wraps the function: its first call is the forward, run as is in the caller's
region (so a recording/verbose region sees it once); every later call is a recomputation and
runs in a fresh region with the state captured at the forward (policy, dtype, cache setting,
or "off"), without the observer. This works for both ``use_reentrant`` settings.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch.utils.checkpoint as _torch_checkpoint

from .amp import current_state, region_for

__all__ = ["checkpoint", "context_fn"]


def checkpoint(function: Callable, *args: Any, use_reentrant: bool = False, **kwargs: Any):
    """``torch.utils.checkpoint.checkpoint`` whose recomputation in backward runs in the
    ``HpuAutocastMode`` state the forward ran in. Other keyword arguments (``context_fn``,
    ``preserve_rng_state``, ``determinism_check``, ...) are passed to torch's function."""
    state = current_state()
    calls = 0

    def run(*a, **kw):
        nonlocal calls
        calls += 1
        if calls == 1:
            return function(*a, **kw)
        with region_for(state):
            return function(*a, **kw)

    return _torch_checkpoint.checkpoint(run, *args, use_reentrant=use_reentrant, **kwargs)


def context_fn():
    """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``:
    torch calls it at the forward, and enters the second context around the recomputation."""
    return contextlib.nullcontext(), region_for(current_state())

"""Training helpers in the shape of ``torch.amp``: ``custom_fwd`` / ``custom_bwd`` for custom
autograd functions, and the snapshot of a context's casting state they use to run code later
"in the state the forward ran in".

Loss scaling needs nothing of ours: ``torch.amp.GradScaler`` works on the gradients, whatever
made them, so ``GradScaler("cpu")`` / ``("cuda")`` / ``("hpu")`` is used unchanged (see
``docs/migration.md``).

[Note: re-entering a forward's state]
``torch.amp.custom_bwd`` re-enters ``torch.autocast`` with the dtype and enabled flag that
``custom_fwd`` recorded on ``ctx``, because backward may run outside the region (after the
``with`` block, or on an autograd worker thread). Ours records the innermost enabled region's
policy, dtype and cache setting (or "off") and re-enters a public ``HpuAutocastMode`` with them.
The observer is *not* carried over: a decision log or report describes the forward pass,
and backward/recomputation would count its ops twice. (``torch.amp.custom_bwd`` works inside a
region too, but re-enters *native* ``torch.autocast`` in backward, with torch's own lists: the
same as ours under ``torch-cpu``/``torch-cuda``, not under Gaudi's. These decorators re-enter
the region's policy.)
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from ._engine import OFF, State, current
from .mode import HpuAutocastMode

__all__ = ["State", "current_state", "region_for", "custom_fwd", "custom_bwd"]


def current_state() -> State:
    """The calling context's casting state: the innermost enabled region's policy, dtype, device
    and cache setting, or off."""
    return current()


def region_for(state: State) -> HpuAutocastMode:
    """A fresh region that reproduces ``state`` (``enabled=False`` when it was off)."""
    if not state.enabled:
        return HpuAutocastMode(enabled=False)
    return HpuAutocastMode(
        state.dtype, policy=state.policy, device_type=state.device_type, cache_enabled=state.cache_enabled
    )


def _cast(value, dtype: torch.dtype):
    # As torch.amp.autocast_mode._cast: floating-point tensors (not float64) are cast,
    # containers are walked, everything else passes through.
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.dtype is not torch.float64:
            return value.to(dtype)
        return value
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, dict):
        return {_cast(k, dtype): _cast(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = (_cast(v, dtype) for v in value)
        return type(value)(out) if isinstance(value, list) else tuple(out)
    return value


def custom_fwd(fwd: Optional[Callable] = None, *, cast_inputs: Optional[torch.dtype] = None):
    """Decorate the ``forward`` of a ``torch.autograd.Function`` (``torch.amp.custom_fwd``).

    With ``cast_inputs=None`` forward's ops run in the caller's state, which is recorded on
    ``ctx`` for ``custom_bwd``. With ``cast_inputs=dtype``, inside an enabled region the
    floating-point tensor arguments are cast to ``dtype`` and forward runs with casting off
    (backward then runs with casting off too); outside a region it is a no-op.
    """
    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)
    if cast_inputs is not None and not (isinstance(cast_inputs, torch.dtype) and cast_inputs.is_floating_point):
        raise TypeError(f"custom_fwd: cast_inputs must be a floating-point torch.dtype or None, got {cast_inputs!r}")

    @functools.wraps(fwd)
    def decorate_fwd(ctx, *args, **kwargs):
        state = current_state()
        if cast_inputs is None:
            ctx._hpu_autocast_state = state
            return fwd(ctx, *args, **kwargs)
        ctx._hpu_autocast_state = OFF
        if not state.enabled:
            return fwd(ctx, *args, **kwargs)
        with HpuAutocastMode(enabled=False):
            return fwd(ctx, *_cast(args, cast_inputs), **_cast(kwargs, cast_inputs))

    return decorate_fwd


def custom_bwd(bwd: Callable):
    """Decorate the ``backward`` of a ``torch.autograd.Function`` (``torch.amp.custom_bwd``):
    it runs in the state its ``custom_fwd`` forward ran in, wherever backward is called."""

    @functools.wraps(bwd)
    def decorate_bwd(ctx, *args, **kwargs):
        state = getattr(ctx, "_hpu_autocast_state", None)
        if state is None:
            raise RuntimeError(
                f"custom_bwd: {bwd.__qualname__} has no recorded state; decorate the "
                "Function's forward with hpu_autocast.amp.custom_fwd"
            )
        with region_for(state):
            return bwd(ctx, *args, **kwargs)

    return decorate_bwd

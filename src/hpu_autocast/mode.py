"""The public context manager: ``with HpuAutocastMode(dtype=torch.bfloat16): ...``."""

from __future__ import annotations

import functools
from typing import Callable, Optional, Union

import torch

from . import _compile_hooks, hpu
from ._engine import Region, engine_for_thread
from ._table import compile_policy
from .builder import as_policy as _as_policy
from .policy import Policy

__all__ = ["HpuAutocastMode", "disable_casts", "is_enabled", "get_dtype", "get_policy"]


class HpuAutocastMode:
    """Run the enclosed code in mixed precision under an op-overload policy.

    Args:
        dtype: the lower-precision dtype (``torch.bfloat16`` or ``torch.float16``; the
            ``hpu`` policy accepts bfloat16 only).
        policy: a preset name (``"hpu"``, ``"torch-cpu"``, ...) or a ``Policy``.
        enabled: ``False`` turns casting off for the body, also inside an enabled region.
        cache_enabled: reuse casts of float32 leaves that require grad within the outermost
            region, as ``torch.autocast`` does. ``None`` means on, except on HPU where Gaudi's
            graph mode does this and autocast's cache is always off (seed 000).

    Usable as a context manager or a decorator. Regions nest (the innermost wins) and are
    per thread, like ``torch.autocast``.
    """

    def __init__(self, dtype: torch.dtype = torch.bfloat16, *, policy: Union[str, Policy] = "hpu",
                 enabled: bool = True, cache_enabled: Optional[bool] = None,
                 observer: Optional[Callable] = None, verbose: bool = False, record: bool = False) -> None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        self.policy = _as_policy(policy)
        if enabled:
            self.policy.check_dtype(dtype)
            hpu.check_dtype(dtype)
        self.dtype = dtype
        self.enabled = bool(enabled)
        self.cache_enabled = hpu.default_cache_enabled() if cache_enabled is None else bool(cache_enabled)
        if hpu.backend_loaded():
            self.cache_enabled = False
        self.observer = observer
        self.verbose = bool(verbose)
        self.record = bool(record)
        self._recorder = None
        self._region: Optional[Region] = None
        self._forced_eager = False  # see _compile_hooks: compiled code runs eagerly in a region

    def __enter__(self) -> "HpuAutocastMode":
        if self._region is not None:
            raise RuntimeError("this HpuAutocastMode is already entered; create a new one to nest")
        compiled = compile_policy(self.policy, self.dtype) if self.enabled else None
        observer = self.observer
        if self.verbose or self.record:
            from .log import combine_observers, make_log_observer
            from .report import Recorder

            if self.record:
                self._recorder = Recorder()
                self._recorder.policy, self._recorder.dtype = self.policy.name, self.dtype
            observer = combine_observers(observer, make_log_observer() if self.verbose else None, self._recorder)
        region = Region(compiled, self.dtype, self.enabled, self.cache_enabled, observer)
        engine_for_thread().push(region)
        self._region = region
        if region.owns_modes:
            self._forced_eager = _compile_hooks.region_entered()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        region = self._region
        if region is not None:
            # Note: pop first; if it refuses (an inner region still open), this mode stays
            # entered and can be exited once the inner one is.
            engine_for_thread().pop(region)
            self._region = None
            forced, self._forced_eager = self._forced_eager, False
            _compile_hooks.region_exited(forced)

    def __call__(self, fn: Callable) -> Callable:
        """Decorate ``fn`` so each call runs in a fresh region with these settings."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            clone = self._clone()
            try:
                with clone:
                    return fn(*args, **kwargs)
            finally:
                self._recorder = clone._recorder

        return wrapper

    def _clone(self) -> "HpuAutocastMode":
        return HpuAutocastMode(self.dtype, policy=self.policy, enabled=self.enabled,
                               cache_enabled=self.cache_enabled, observer=self.observer,
                               verbose=self.verbose, record=self.record)

    def report(self):
        """The ``PrecisionReport`` of this mode's last region (``record=True``): what ran in
        which dtype, the casts inserted, the matmul/conv FLOPs by dtype, and warnings."""
        if not self.record:
            raise RuntimeError("HpuAutocastMode.report() needs HpuAutocastMode(..., record=True): "
                               "recording costs time per call, so it is off unless asked for")
        if self._recorder is None:
            raise RuntimeError("HpuAutocastMode.report(): this mode has not been entered yet")
        return self._recorder.report()

    def __repr__(self) -> str:
        return (f"HpuAutocastMode(dtype={self.dtype}, policy={self.policy.name!r}, enabled={self.enabled}, "
                f"cache_enabled={self.cache_enabled})")


def disable_casts() -> HpuAutocastMode:
    """A region that turns casting off for its body (HMP's ``disable_casts``)."""
    return HpuAutocastMode(enabled=False)


def is_enabled() -> bool:
    """True when this thread is inside an enabled region."""
    from ._engine import current_engine

    engine = current_engine()
    return engine is not None and engine.region is not None


def get_dtype() -> Optional[torch.dtype]:
    """The innermost enabled region's lower-precision dtype, or ``None``."""
    from ._engine import current_engine

    engine = current_engine()
    return engine.region.dtype if engine is not None and engine.region is not None else None


def get_policy() -> Optional[Policy]:
    """The innermost enabled region's ``Policy``, or ``None``."""
    from ._engine import current_engine

    engine = current_engine()
    region = engine.region if engine is not None else None
    return region.compiled.policy if region is not None else None

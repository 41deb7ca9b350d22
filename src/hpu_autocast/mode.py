"""The public context manager: ``with HpuAutocastMode(dtype=torch.bfloat16): ...``."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import warnings
from typing import Callable, Dict, Iterator, Mapping, Optional, Union

import torch

from . import _engine, _explain, module_map as _module_map
from ._facts import devices as _devices
from ._engine.compiled import compile_policy
from .policies.builder import as_policy as _as_policy
from .events import Event
from .log import combine_observers, make_log_observer
from .policies.policy import Policy
from .policies.recipes import is_fp8
from .report import Recorder

__all__ = ["HpuAutocastMode", "disable_casts", "is_enabled", "get_dtype", "get_policy", "record", "default_device_type"]


def default_device_type(policy: Optional[Policy] = None) -> str:
    """The device type a region of ``policy`` casts for when given none: the policy's own
    (``cpu`` for ``torch-cpu``), else the device this process runs on (``hpu`` once Gaudi's bridge
    is loaded, ``cuda`` where available, else ``cpu``; ``_devices.default_device_type``)."""
    return _devices.default_device_type(getattr(policy, "device_type", None))


def _steps(mode: "HpuAutocastMode", it):
    """Drive the generator or coroutine ``it``, each step inside ``mode`` (Note: a region per step);
    what the consumer sends or throws in is passed on, and what ``it`` yields passed out."""
    send, throw = None, None
    while True:
        try:
            with mode:
                out = it.send(send) if throw is None else it.throw(throw)
        except StopIteration as stop:
            return stop.value
        send, throw = None, None
        try:
            send = yield out
        except GeneratorExit:
            with mode:
                it.close()
            raise
        except BaseException as e:  # thrown in by the consumer (or the event loop: a cancellation)
            throw = e


class _Steps:
    """An awaitable driving a coroutine through ``_steps``."""

    __slots__ = ("_gen",)

    def __init__(self, mode: "HpuAutocastMode", coroutine) -> None:
        self._gen = _steps(mode, coroutine)

    def __await__(self):
        return self._gen


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"HpuAutocastMode: {name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


class HpuAutocastMode:
    """Run the enclosed code in mixed precision under an op-overload policy.

    Args:
        dtype: the lower-precision dtype (``torch.bfloat16`` or ``torch.float16``; the
            ``hpu`` policy accepts bfloat16 only).
        policy: a preset name (``"hpu"``, ``"torch-cpu"``, ...) or a ``Policy``.
        device_type: the device whose tensors are cast, as ``torch.autocast``'s first argument:
            tensors on other devices pass through. Defaults to the policy's device (``cpu`` for
            ``torch-cpu``, ``cuda`` for ``torch-cuda``), and for ``hpu``/``hmp`` to the device this
            process runs on (``hpu`` on Gaudi, else ``cuda`` when available, else ``cpu``).
        enabled: ``False`` turns casting off for the body, also inside an enabled region.
        cache_enabled: reuse casts of float32 leaves that require grad within the outermost
            region, as ``torch.autocast`` does. ``None`` means on, except in a region on HPU
            (``device_type="hpu"``), where Gaudi's graph mode does this and autocast's cache is
            always off (seed 000).
        observer: called with an ``hpu_autocast.events.Event`` for each call the engine decides
            on (see ``events.py``); ``verbose=True`` logs them, ``record=True`` keeps a report.
        modules: per-module precision without editing the model (docs/modules.md): a mapping of
            ``fnmatch`` patterns over dotted module names, relative to the outermost module the
            region calls (the model, named ``""``), to ``torch.float32`` / ``"fp32"`` (casting
            off, the module's floating inputs of lower precision cast to float32 first), a
            lower dtype (this policy in that dtype), a preset name or ``Policy`` (that policy in
            this dtype), or ``None`` / ``"off"`` (casting off, inputs as they come). The
            selectors ``"<first>"`` / ``"<last>"`` name the first linear layer and the output
            head (``first_last()``). The innermost matched module wins; for one module, an exact
            name beats a glob, then the entry given last. A pattern matching no module warns
            once, at the exit.

    Usable as a context manager or a decorator. Regions nest (the innermost wins) and belong to
    the context that entered them: a thread, or an asyncio task. A mode copies and pickles as
    its settings: the copy is a new mode, not entered.
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.bfloat16,
        *,
        policy: Union[str, Policy] = "hpu",
        device_type: Optional[str] = None,
        enabled: bool = True,
        cache_enabled: Optional[bool] = None,
        observer: Optional[Callable[[Event], None]] = None,
        verbose: bool = False,
        record: bool = False,
        modules: Optional[Mapping[str, object]] = None,
    ) -> None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"HpuAutocastMode: dtype must be a torch.dtype, got {dtype!r}")
        if not (type(enabled) is bool and type(verbose) is bool and type(record) is bool):  # noqa: E721
            _check_flag("enabled", enabled)
            _check_flag("verbose", verbose)
            _check_flag("record", record)
        self.enabled = enabled
        self.verbose = verbose
        self.record = record
        if cache_enabled is not None:
            _check_flag("cache_enabled", cache_enabled)
        if observer is not None and not callable(observer):
            raise TypeError(
                f"HpuAutocastMode: observer must be callable (it is called with each "
                f"hpu_autocast.events.Event), got {observer!r}"
            )
        # Note: a disabled region reads no policy: turning casting off must never fail over a
        # policy (a missing PT_HPU_AUTOCAST_*_OPS_LIST file, say).
        self.policy: Optional[Policy] = _as_policy(policy) if self.enabled else None
        if self.enabled:
            self.policy.check_dtype(dtype)
        self._policy_arg = policy
        if device_type is None:
            device_type = default_device_type(self.policy) if self.enabled else None
        elif not isinstance(device_type, str) or device_type not in _devices.REGION_DEVICE_TYPES:
            raise ValueError(
                f"HpuAutocastMode: unknown device_type {device_type!r}; accepted: "
                f"{', '.join(_devices.REGION_DEVICE_TYPES)}"
            )
        self.device_type = device_type
        # Note: what a device forbids follows the region's device, not the process: with Gaudi's
        # bridge loaded, a CPU region still casts CPU tensors (float16 allowed, cache on), and an
        # HPU region never caches (seed 000) and refuses float16 on a first-generation Gaudi
        # (_devices.check_dtype).
        if self.enabled:
            _devices.check_dtype(dtype, device_type)
        if self.enabled and device_type == "cuda" and not _devices._cuda_available():
            # As torch.autocast("cuda") warns (and disables itself): no tensor here is on CUDA.
            warnings.warn(
                "hpu_autocast: a region for device 'cuda', but CUDA is not available: it casts nothing "
                "(for CPU tensors use device_type='cpu' or a CPU policy)",
                UserWarning,
                stacklevel=2,
            )
        self.dtype = dtype
        self.cache_enabled = _devices.default_cache_enabled(device_type) and cache_enabled is not False
        self.observer = observer
        #: record=True: every region's entries (``report()``), and the last region's alone.
        self._recorder: Optional[Recorder] = None
        self._last_recorder: Optional[Recorder] = None
        if modules is not None and not self.enabled:
            raise ValueError(
                "HpuAutocastMode(enabled=False, modules=...): a disabled region casts nothing, so it "
                "has no module map; give modules= to the enabled region around it"
            )
        #: The parsed ``modules=`` map (``module_map.ModuleMap``), or ``None``.
        self.modules = _module_map.parse_modules(modules, dtype)
        self._modules_arg = modules
        self._maps: Dict[int, object] = {}
        self._unmatched_warned: set = set()
        #: The open region of each thread that entered this mode (one mode may serve several
        #: threads at once, as a torch.autocast object does; a thread enters it once at a time).
        self._regions: Dict[int, _engine.Entered] = {}

    @property
    def policy_name(self) -> str:
        """The policy's name (for a disabled region, which reads no policy, the name it was given)."""
        if self.policy is not None:
            return self.policy.name
        arg = self._policy_arg
        return arg if isinstance(arg, str) else getattr(arg, "name", "?")

    def __enter__(self) -> "HpuAutocastMode":
        thread = threading.get_ident()
        if thread in self._regions:
            raise RuntimeError("this HpuAutocastMode is already entered in this thread; create a new one to nest")
        observer = self.observer
        if self.verbose or self.record:
            recorders = self._new_region_recorders() if self.record else (None, None)
            observer = combine_observers(observer, make_log_observer() if self.verbose else None, *recorders)
        if _watchers:  # hpu-autocast report SCRIPT: every region the script opens reports too
            observer = combine_observers(observer, *_watchers)
            _opened.append((self.policy_name, self.dtype))
        compiled = compile_policy(self.policy) if self.enabled else None
        device = self.device_type or _outer_device()
        # A disabled region given no device turns all casting off, torch.autocast's too (disable_casts).
        region = _engine.ask(
            compiled,
            self.dtype,
            device,
            self.enabled,
            self.cache_enabled,
            observer if self.enabled else None,
            every_device=self.device_type is None,
        )
        entered = self._regions[thread] = _engine.enter(region)
        if self.modules is not None:
            try:
                self._maps[thread] = _module_map.open_map(self, region.observer, self._recorder)
            except BaseException:
                self._regions.pop(thread)
                _engine.exit(entered)
                raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        entered = self._regions.pop(threading.get_ident(), None)
        if exc is not None and self.enabled:
            _explain.note(exc, self.policy, self.dtype)  # a dtype mismatch gets a note (its Note)
        if entered is not None:
            active = self._maps.pop(threading.get_ident(), None)
            try:
                if active is not None:
                    _module_map.close_map(active, self._unmatched_warned)
            finally:
                _engine.exit(entered)
        elif self._regions:
            # Refused, and nothing changes: the region stays open in its own thread, which exits
            # it (a thread's casting state is its own, as torch.autocast's is).
            raise RuntimeError(
                f"hpu_autocast: this HpuAutocastMode was entered in thread {', '.join(map(str, self._regions))} "
                f"and exited from thread {threading.get_ident()}; its region stays open there: exit a region "
                "in the thread that entered it"
            )

    def __call__(self, fn: Callable) -> Callable:
        """Decorate ``fn`` so each call runs in a fresh region with these settings."""
        if not callable(fn):
            # As torch.autocast()(3): a decorator given something else returned a wrapper that
            # failed only when called, far from the mistake.
            raise TypeError(
                f"HpuAutocastMode()(fn) decorates a callable, got {fn!r} ({type(fn).__name__}); "
                "to cast a block, use it as a context manager: with HpuAutocastMode(...): ..."
            )

        if inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"HpuAutocastMode()(fn): {fn.__qualname__} is an async generator, which a region cannot "
                "follow between its steps; enter the mode inside it: async with ... or with HpuAutocastMode(...)"
            )
        if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn):
            return self._decorate_steps(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            clone = self._clone()
            clone._recorder = self._recorder  # every call's region adds to this mode's report
            try:
                with clone:
                    return fn(*args, **kwargs)
            finally:
                self._recorder, self._last_recorder = clone._recorder, clone._last_recorder

        return wrapper

    def _decorate_steps(self, fn: Callable) -> Callable:
        """A generator function or ``async def`` whose every step (each resumption, up to its next
        ``yield`` or ``await`` that suspends) runs in a region with these settings.

        [Note: a region per step] A region is per context, and a generator's or coroutine's
        body runs in its caller's context, a step at a time: a region entered at the call
        (torch.autocast's decorator does so) closes before the first step runs, and one held open
        across a suspension would cast the caller's code, or another task's, in between. So each
        step runs in the region and it closes when the step suspends; the cast cache lasts one step."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def coroutine(*args, **kwargs):
                return await _Steps(self._clone(), fn(*args, **kwargs))

            return coroutine

        @functools.wraps(fn)
        def generator(*args, **kwargs):
            return (yield from _steps(self._clone(), fn(*args, **kwargs)))

        return generator

    def _recipe(self):
        """The scaling recipe a report shows beside the dtype: the policy's, in an fp8 region."""
        return self.policy.fp8 if is_fp8(self.dtype) else None

    def _settings(self) -> dict:
        """The keyword arguments that make a mode like this one (``dtype`` aside)."""
        return dict(
            policy=self.policy if self.enabled else self._policy_arg,
            device_type=self.device_type,
            enabled=self.enabled,
            cache_enabled=self.cache_enabled,
            observer=self.observer,
            verbose=self.verbose,
            record=self.record,
            modules=self._modules_arg,
        )

    def _clone(self) -> "HpuAutocastMode":
        return HpuAutocastMode(self.dtype, **self._settings())

    def __copy__(self) -> "HpuAutocastMode":
        return self._clone()

    def __deepcopy__(self, memo) -> "HpuAutocastMode":
        # A mode is settings plus, while entered, a region of this context's: a copy is a new,
        # not yet entered mode with the same settings (policies are values, shared).
        return self._clone()

    def __reduce__(self):
        # As a copy: settings only (a region belongs to this process's context; pickled, it
        # failed inside torch with a pybind11 message). The policy travels as a value; an
        # observer must be picklable itself.
        return (_mode_from_settings, (self.dtype, self._settings()))

    def _new_region_recorders(self):
        """``(every region's recorder, this region's)``: the first made at the first entry (or
        after ``reset_report``), the second at each."""
        if self._recorder is None:
            self._recorder = Recorder(self.policy_name, self.dtype, self._recipe())
        self._last_recorder = Recorder(self.policy_name, self.dtype, self._recipe())
        return self._recorder, self._last_recorder

    def report(self, *, last: bool = False):
        """The ``PrecisionReport`` of every region this mode opened (``record=True``), a training
        loop's steps together, since it was made or ``reset_report()``: what ran in which dtype, the
        casts inserted, the matmul/conv FLOPs by dtype, and warnings. ``last=True``: the last
        region's alone."""
        if not self.record:
            raise RuntimeError(
                "HpuAutocastMode.report() needs HpuAutocastMode(..., record=True): "
                "recording costs time per call, so it is off unless asked for"
            )
        recorder = self._last_recorder if last else self._recorder
        if recorder is None:
            raise RuntimeError("HpuAutocastMode.report(): this mode has not been entered yet")
        return recorder.report()

    def reset_report(self) -> None:
        """Forget what ``report()`` covers: the next region starts a new report."""
        self._recorder = self._last_recorder = None

    def __repr__(self) -> str:
        return (
            f"HpuAutocastMode(dtype={self.dtype}, policy={self.policy_name!r}, device_type={self.device_type!r}, "
            f"enabled={self.enabled}, cache_enabled={self.cache_enabled})"
        )


#: Observers every region entered reports to as well, and the (policy, dtype) of each region
#: entered meanwhile (``watch``).
_watchers: tuple = ()
_opened: list = []


@contextlib.contextmanager
def watch(observer: Callable[[Event], None]) -> Iterator[list]:
    """Make every region entered in the body report to ``observer`` too, its own observer kept,
    and yield the list of ``(policy name, dtype)`` of the regions entered (``hpu-autocast report
    SCRIPT``: the regions a script opens itself). Not nestable."""
    global _watchers, _opened
    if _watchers:
        raise RuntimeError("hpu_autocast.mode.watch is already active")
    _watchers, _opened = (observer,), []
    try:
        yield _opened
    finally:
        _watchers = ()


def _mode_from_settings(dtype: torch.dtype, settings: dict) -> HpuAutocastMode:
    """The inverse of ``HpuAutocastMode.__reduce__``."""
    return HpuAutocastMode(dtype, **settings)


def _outer_device() -> str:
    # A disabled region covers the device of the region it is nested in (what it turns off).
    return _engine.current().device_type or default_device_type()


def disable_casts() -> HpuAutocastMode:
    """A region that turns casting off for its body (HMP's ``disable_casts``)."""
    return HpuAutocastMode(enabled=False)


def is_enabled() -> bool:
    """True when the calling context is inside an enabled region."""
    return _engine.current().enabled


def get_dtype() -> Optional[torch.dtype]:
    """The innermost enabled region's lower-precision dtype, or ``None``."""
    return _engine.current().dtype


def get_policy() -> Optional[Policy]:
    """The innermost enabled region's ``Policy``, or ``None``."""
    return _engine.current().policy


@contextlib.contextmanager
def record(dtype: torch.dtype = torch.bfloat16, **mode_kwargs) -> Iterator[Recorder]:
    """Run the body under ``HpuAutocastMode(dtype, **mode_kwargs)`` with a fresh ``Recorder``
    (chained with any ``observer=`` given) and yield it; call ``.report()`` afterwards."""
    mode = HpuAutocastMode(dtype, **mode_kwargs)
    rec = Recorder(mode.policy_name, mode.dtype, mode._recipe())
    mode.observer = combine_observers(rec, mode.observer)
    with mode:
        yield rec

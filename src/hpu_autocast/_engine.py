"""The mechanism: regions and frames (what casting reads in the current context), the kernel and
fallback bodies that apply a rule to one call, and the cast cache.

Data flow of one call (docs/design.md has the long form)::

    torch.mm(a, b)       the thread's included key set has the ops key (a region is open), and
                         aten.mm.default has a kernel there, so the dispatcher calls it
    kernel(a, b)         the context's innermost frame; its rules[aten.mm.default]:
                           none -> call on, with the ops key excluded (as if it were not there)
                           LOWER -> exclude the keys, cast a and b (autograd records the casts),
                                    call aten.mm, restore the keys, tell the observer
    (C++) at::mm(x, y)   inside another composite (einsum -> bmm): the same, since the keys are
                         only excluded inside ops this engine handled

[Note: regions, frames, contexts]
A ``Region`` is one entry of an ``HpuAutocastMode``. A ``Frame`` is what casting reads in one
context: the innermost region and the on/off state and dtype that ``torch.autocast`` calls made
inside it. Frames are immutable and linked to their parent; the context variable ``_FRAME``
holds the innermost, so regions belong to the context that entered them: a thread, or an
asyncio task (each task runs in a copy of its creator's context). Exiting a region closes it;
frames of closed regions are skipped wherever they are still linked (another task's context, a
generator closed late, an exit out of order), so an exit never leaves casting on anywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import threading
import weakref
from operator import attrgetter
from contextvars import ContextVar
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch
from torch._ops import OpOverload

from . import _compile_guard, _dispatch, _ops
from ._table import CompiledPolicy, OpRule, compile_policy
from .events import Cast, Event, Level, Outcome
from .policy import CastPolicy
from .rules import compute_dtype, has_explicit_dtype

__all__ = ["Region", "Frame", "State", "current", "observing", "innermost", "enter", "exit", "replace_innermost",
           "GUARD"]

_FLOAT32 = torch.float32
_FLOAT64 = torch.float64
_LOWER = CastPolicy.LOWER
_FP32 = CastPolicy.FP32
_Tensor = torch.Tensor
_EMPTY: Dict[int, OpRule] = {}
_ON_DEVICE = {"cpu": attrgetter("is_cpu"), "cuda": attrgetter("is_cuda"), "meta": attrgetter("is_meta"),
              "xpu": attrgetter("is_xpu"), "mps": attrgetter("is_mps")}
_set_excluded = torch._C._dispatch_tls_set_dispatch_key_excluded
_is_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
_inference_mode = torch.is_inference_mode_enabled
_cache_on = torch._C.is_autocast_cache_enabled
_set_cache_on = torch._C.set_autocast_cache_enabled
_thread = threading.local()  # per thread: torch's cache flag before its first region (cache_was)


class Region:
    """One entry of an ``HpuAutocastMode``: what it asked for, and what it owns while open."""

    __slots__ = ("compiled", "rules", "dtype", "device_type", "on_device", "enabled", "cache_enabled",
                 "observer", "observes", "cache", "owns_cache", "closed", "switch", "thread", "native_was_on",
                 "eager", "every_device")

    def __init__(self, compiled: Optional[CompiledPolicy], dtype: torch.dtype, device_type: str,
                 enabled: bool, cache_enabled: bool, observer: Optional[Callable[[Event], None]] = None,
                 every_device: bool = False) -> None:
        self.compiled = compiled
        self.rules = compiled.by_id if enabled and compiled is not None else _EMPTY
        self.dtype = dtype
        self.device_type = device_type
        #: Whether a tensor is on ``device_type`` (``is_cpu`` costs a quarter of ``device.type``).
        self.on_device = _ON_DEVICE.get(device_type) or (lambda t: t.device.type == device_type)
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        self.observer = observer
        #: Whether the fallback must see this region's calls (to observe them, or for defaults).
        self.observes = enabled and (observer is not None or (compiled is not None and compiled.has_defaults))
        self.cache: dict = {}
        self.owns_cache = True
        self.closed = False
        self.switch: Optional[_dispatch.ThreadSwitch] = None
        self.thread = 0
        #: Whether a disabled region turns torch's own autocast off on every device (``disable_casts``),
        #: not only on ``device_type``.
        self.every_device = every_device
        #: The device types whose torch autocast was on at the entry (it is suspended meanwhile).
        self.native_was_on: Tuple[str, ...] = ()
        #: Whether this region holds compiled code to eager (it observes; see _compile_guard).
        self.eager = False


class Frame:
    """The casting state of one context (immutable: replaced, never changed)."""

    __slots__ = ("region", "parent", "enabled", "dtype", "rules")

    def __init__(self, region: Region, parent: Optional["Frame"], enabled: bool, dtype: torch.dtype) -> None:
        self.region = region
        self.parent = parent
        self.enabled = enabled
        self.dtype = dtype
        self.rules = region.rules if enabled else _EMPTY

    def __repr__(self) -> str:
        policy = self.region.compiled.policy.name if self.region.compiled is not None else None
        return f"Frame(policy={policy}, dtype={self.dtype}, device={self.region.device_type}, enabled={self.enabled})"


_FRAME: ContextVar[Optional[Frame]] = ContextVar("hpu_autocast_frame", default=None)
_get_frame = _FRAME.get
_dispatch_modes = torch._C._len_torch_dispatch_stack

# Autograd runs backward on worker threads of its own (CUDA), which start with an empty context
# but inherit the caller's thread-local state, torch's Python objects stashed there included
# (``ThreadLocalState``). The innermost frame is stashed there too, with the thread it belongs
# to, so a backward run inside a region casts there as it would in the region's thread.
_stash = getattr(torch._C, "_stash_obj_in_tls", None)
_stashed = getattr(torch._C, "_get_obj_in_tls", None)
_has_stash = getattr(torch._C, "_is_key_in_tls", None)
_STASH_KEY = "hpu_autocast.frame"


def _stash_steals() -> bool:
    """Whether ``_stash_obj_in_tls`` keeps the object without a reference of its own: torch before
    2.13 wraps the borrowed pointer in a ``SafePyObject``, which releases a reference when it is
    replaced or its thread ends, so each object stashed must be given one (else a stashed frame,
    or ``None``, is freed while still in use). Probed once, on a fresh object; the probe leaves
    ``None`` stashed in the importing thread, which reads as "nothing inherited"."""
    if _stash is None:
        return False
    probe = object()
    before = sys.getrefcount(probe)
    _stash(_STASH_KEY, probe)
    steals = sys.getrefcount(probe) == before
    if steals:
        _incref(probe)  # the reference the stash drops when None replaces the probe, below
        _incref(None)
    _stash(_STASH_KEY, None)
    return steals


def _incref(obj: object) -> None:
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


_STASH_STEALS = _stash_steals()


def _set_frame(frame: Optional[Frame]) -> None:
    _FRAME.set(frame)
    if _stash is not None:
        if _STASH_STEALS:
            _incref(frame)
        _stash(_STASH_KEY, frame)


def _open(frame: Optional[Frame]) -> Optional[Frame]:
    while frame is not None and frame.region.closed:
        frame = frame.parent
    return frame


def _inherited() -> Optional[Frame]:
    # Only in another thread than the frame's own: in its own thread, the context decides.
    if _has_stash is None or not _has_stash(_STASH_KEY):
        return None
    frame = _stashed(_STASH_KEY)
    return _open(frame) if frame is not None and frame.region.thread != threading.get_ident() else None


def innermost() -> Optional[Frame]:
    """The calling context's innermost frame of an open region, or ``None``. The one accessor of
    the engine's state: the mode's queries, ``amp``, ``testing`` and the torch-autocast
    interplay (checkpointing and optimizer steps included) all ask this, through ``current()``."""
    frame = _get_frame()
    if frame is None:
        return _inherited()
    if frame.region.thread != threading.get_ident():
        # A context copied into another thread (asyncio.to_thread, contextvars' run): the region's
        # keys are on in its own thread only, so it does not cast here, and its guards say so.
        return _inherited()
    return _open(frame) if frame.region.closed else frame


class State(NamedTuple):
    """The calling context's casting state, as the rest of the package sees it."""

    enabled: bool
    policy: object = None                 #: the innermost region's ``Policy`` (``None``: off)
    dtype: Optional[torch.dtype] = None
    device_type: Optional[str] = None
    cache_enabled: bool = True


OFF = State(False)


def current() -> State:
    """The innermost region's state in the calling context (``OFF`` outside any enabled one)."""
    frame = innermost()
    if frame is None or not frame.enabled:
        return OFF
    region = frame.region
    return State(True, region.compiled.policy, frame.dtype, region.device_type, region.cache_enabled)


def observing() -> bool:
    """Whether the calling context's innermost region has an observer (it then reports the calls
    it decides on, also in its ``torch.autocast(enabled=False)`` blocks)."""
    frame = innermost()
    return frame is not None and frame.region.observer is not None


# -- regions ----------------------------------------------------------------------------------
def _keys() -> _dispatch.Keys:
    return _dispatch.keys(_make_kernel, _make_fallback)


#: (on open, on close) pairs run around every region (``_torch_autocast`` installs its patches
#: of torch's autocast functions through this while any region is open).
REGION_HOOKS: List[Tuple[Callable[[], None], Callable[[], None]]] = []

_native_is_enabled = torch._C.is_autocast_enabled
_native_set_enabled = torch._C.set_autocast_enabled


def enter(region: Region) -> None:
    """Open ``region`` in the calling context: it becomes the innermost frame.

    A region with a policy owns autocast for its device type while it is open: torch's own
    autocast for that device, if on (an enclosing ``torch.autocast``), is suspended, so the
    innermost decides, and it is restored at the exit."""
    k = _dispatch._keys or _keys()
    if region.observes:
        k.observing_opened()  # first: it raises when no key is free for it
    for opened, _ in REGION_HOOKS:
        opened()
    compiled = region.compiled
    if compiled is not None and region.enabled:
        if not compiled.registered:
            k.register(compiled.rules)
            compiled.registered = True
        if compiled.policy.native is not None:
            native = compiled.native_ops()
            if native:
                k.register(native)
    parent = innermost()
    if parent is not None:
        # As torch.autocast: one cast cache for the outermost region and all nested in it.
        region.cache = parent.region.cache
        region.owns_cache = False
    region.switch = switch = _dispatch.thread_switch()
    region.thread = threading.get_ident()
    switch.ops += 1
    if region.observes:
        switch.all += 1
    switch.sync(k)
    if region.observer is not None:
        region.eager = _compile_guard.observing_opened()
    if switch.ops == 1:
        _thread.cache_was = _cache_on()  # the first region open in this thread: torch's flag before
    if compiled is not None:
        # As torch.autocast's entry: torch's cache flag says what this region caches (the kernels
        # read the flag, so a nested torch.autocast(cache_enabled=...) is obeyed too).
        _set_cache_on(region.cache_enabled)
    # A region owns autocast for its device: torch's own is suspended there, so the innermost
    # decides (a disabled one, disable_casts(), turns it off as torch.autocast(enabled=False)).
    if region.every_device and not region.enabled:
        region.native_was_on = _suspend(_native_devices(k))
    elif region.device_type != "meta" and _native_is_enabled(region.device_type):  # no meta autocast
        region.native_was_on = _suspend((region.device_type,))
    _set_frame(Frame(region, parent, region.enabled, region.dtype))


def _suspend(devices: Tuple[str, ...]) -> Tuple[str, ...]:
    """Turn torch's autocast off on ``devices`` where it is on; returns those (to turn back on)."""
    on = tuple(d for d in devices if _native_is_enabled(d))
    for d in on:
        _native_set_enabled(d, False)
    return on


#: The device types torch.autocast casts for natively (``meta`` has none).
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "mtia", "maia")


def _native_devices(k: "_dispatch.Keys") -> Tuple[str, ...]:
    """Devices whose torch autocast a ``disable_casts()`` turns off: all but those whose autocast
    keys this package borrowed (their state is the engine's own)."""
    return tuple(d for d in _AUTOCAST_DEVICES if d not in (k.ops_device, k.all_device))


def exit(region: Region) -> None:
    """Close ``region``. Out of order or from another context of its thread, it is closed all the
    same (frames of closed regions are skipped). From another thread, ``RuntimeError`` refuses
    it and nothing changes: a thread's dispatch keys are its own and only it can switch them off."""
    if region.closed:
        raise RuntimeError("this region was already exited")
    here = threading.get_ident()
    if region.thread != here:
        raise RuntimeError(
            f"hpu_autocast: a region entered in thread {region.thread} was exited from another thread "
            f"({here}); it stays open there: regions are per thread, like torch.autocast: exit a region "
            "in the thread that entered it")
    try:
        _close(region)
    finally:
        for _, closed in REGION_HOOKS:
            closed()


def _close(region: Region) -> None:
    region.closed = True
    switch = region.switch
    switch.ops -= 1
    if region.observes:
        switch.all -= 1
    if region.owns_cache:
        region.cache.clear()
    if region.eager:
        _compile_guard.observing_closed(True)
    switch.sync(_dispatch._keys)
    if region.observes:
        _dispatch._keys.observing_closed()  # after the sync: the key is off in this thread
    for d in region.native_was_on:
        _native_set_enabled(d, True)
    frame = _get_frame()
    if frame is not None and frame.region is region:
        _set_frame(_open(frame.parent))
    # torch's cache flag follows the innermost region still open (regions may exit out of
    # order: hmp.reset under a later region), else goes back to what it was before the first.
    if switch.ops == 0:
        _set_cache_on(_thread.cache_was)
    else:
        inner = innermost()
        if inner is not None and inner.region.compiled is not None:
            _set_cache_on(inner.region.cache_enabled)


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


@contextlib.contextmanager
def keys_excluded() -> Iterator[None]:
    """The body runs as if no region were open in this thread (the engine's keys excluded)."""
    k = _keys()
    before = _is_excluded(k.ops), _is_excluded(k.all)
    _set_excluded(k.ops, True)
    _set_excluded(k.all, True)
    try:
        yield
    finally:
        _set_excluded(k.ops, before[0])
        _set_excluded(k.all, before[1])


def replace_innermost(enabled: bool, dtype: torch.dtype) -> None:
    """Change the innermost frame's on/off state and dtype for the calling context (what
    ``torch.autocast`` inside a region does; see ``_torch_autocast``)."""
    frame = innermost()
    if frame is not None:
        _set_frame(Frame(frame.region, frame.parent, enabled, dtype))


class _GuardToken:
    """The innermost region's state as one string: what compiled frames are guarded on. Each
    part changes what the kernels put in a graph: the policy (its key names it exactly, every
    field of it; see ``_table.policy_serial``), the dtype, the device, on/off. (Not the cast
    cache: a traced graph casts a weight at each use under either setting, as native
    autocast's compiled graphs do; tests/test_compile.py checks both against native.)"""

    __slots__ = ()

    @property
    def token(self) -> str:
        frame = innermost()
        if frame is None:
            return ""
        region = frame.region
        key = region.compiled.key if region.compiled is not None else "-"
        return f"{key}|{frame.dtype}|{region.device_type}|{frame.enabled}"


GUARD = _GuardToken()


# -- one call ---------------------------------------------------------------------------------
def _make_kernel(op: OpOverload) -> Callable:
    """The kernel registered on the ops key for ``op``."""
    ops_key = _dispatch._keys.ops
    op_id = id(op)  # rules are keyed by id: an OpOverload's own hash is a Python method
    call = op._op

    tracing = _compile_guard.tracing
    below = torch._C._dispatch_keyset_full_after(ops_key)
    # Positional arguments typed Tensor: a Python kernel receives a wrapped scalar (the 3 of
    # x / 3) there as a Python number, which a boxed redispatch refuses.
    slots = tuple(i for i, a in enumerate(op._schema.arguments)
                  if not a.kwarg_only and isinstance(a.type, torch._C.TensorType))

    def kernel(keyset, *args, **kwargs):
        frame = _get_frame()
        if frame is None or frame.region.closed:
            frame = innermost()
        if _dispatch_modes() and tracing():  # tracing runs under a mode (fake tensors): eager skips the ask
            _compile_guard.install()
        if frame is not None:
            rule = frame.rules.get(op_id)
            if rule is not None:
                if rule.plain and not kwargs and not frame.region.observes:
                    return _apply_plain(frame, rule, call, args, ops_key)
                return _apply(frame, rule, op, args, kwargs, Level.KERNEL)
            if not frame.enabled and frame.region.observer is not None:
                # torch.autocast(enabled=False) inside an observing region: its ops are reported.
                rule = frame.region.compiled.by_id.get(op_id)
                if rule is not None:
                    return _unchanged(frame, rule, op, args, kwargs, Level.KERNEL, "disabled")
        # Not this region's op (another region's policy registered the kernel): on, as if this
        # key had no kernel for it, so the calls it makes from C++ still reach the kernels.
        for i in slots:
            if i < len(args) and not isinstance(args[i], _Tensor):
                return _pass_on(op, args, kwargs, ops_key)  # a wrapped scalar: an arithmetic op
        return op.redispatch(keyset & below, *args, **kwargs)

    kernel.__name__ = kernel.__qualname__ = f"hpu_autocast_kernel[{op}]"
    return kernel


def _make_fallback(op: OpOverload) -> Callable:
    """The fallback's kernel for ``op`` on the second key."""

    def fallback(*args, **kwargs):
        return _fallback(op, args, kwargs)

    fallback.__name__ = fallback.__qualname__ = f"hpu_autocast_fallback[{op}]"
    return fallback


def _fallback(op: OpOverload, args: tuple, kwargs: dict):
    """The fallback on the second key: ops no kernel handled, seen by observing regions and by
    policies with defaults for ops on no list. A composite is passed on below the engine's keys
    with nothing excluded: it decomposes, and its insides come back here, op by op, as they do
    to native autocast (a policy default applied at the composite would swallow the listed ops
    inside it, HMP's nll_loss inside nll_loss_nd)."""
    all_key = _dispatch._keys.all
    frame = innermost()
    if frame is not None and frame.region.compiled is not None and id(op) in frame.region.compiled.by_id:
        # This key sits above the ops key (_dispatch's Note: borrowing keys): an op of the
        # region's policy is the ops key's kernel's to cast, or to report as disabled.
        _set_excluded(all_key, True)
        try:
            return op._op(*args, **kwargs)
        finally:
            _set_excluded(all_key, False)
    if frame is not None and frame.enabled and not _ops.is_composite(op):
        region = frame.region
        compiled = region.compiled
        if compiled.has_defaults:
            rule = compiled.default_rule(op)
            if rule is not None:
                return _apply(frame, rule, op, args, kwargs, Level.FALLBACK)
        if region.observer is not None:
            # The op's own C++ calls are its insides: not reported (they still reach the kernels).
            _set_excluded(all_key, True)
            try:
                out = op._op(*args, **kwargs)
            finally:
                _set_excluded(all_key, False)
            inputs = _dtypes(args, kwargs)
            if any(d.is_floating_point for d in inputs) and not _ops.is_view(op):
                _notify(region.observer, Event(op, Level.FALLBACK, Outcome.UNLISTED, None, None, None, inputs,
                                               _first_floating(out), (), args, kwargs))
            return out
    return _pass_on(op, args, kwargs, all_key)


_NATIVE_AUTOCAST = tuple(getattr(torch._C.DispatchKey, name) for name in (
    "AutocastCPU", "AutocastCUDA", "AutocastXPU", "AutocastMPS", "AutocastHPU")
    if hasattr(torch._C.DispatchKey, name))


def _pass_on(op: OpOverload, args: tuple, kwargs: dict, *keys) -> object:
    """Run ``op`` as if ``keys`` had no kernel for it (as a fallthrough would).

    A composite decomposes right here, so its insides dispatch as usual and may reach the
    engine's kernels (HMP's nll_loss inside nll_loss_nd); any other op runs with ``keys``
    excluded. (Redispatching below the keys would do both, but a boxed redispatch refuses the
    Python numbers a kernel receives for wrapped scalars: ``x / 3``.) Where a native autocast
    key is on, a composite may have a kernel there, which decomposing would skip: then it runs
    with ``keys`` excluded too."""
    if _ops.is_composite(op) and all(_is_excluded(n) for n in _NATIVE_AUTOCAST if n not in keys):
        return op.decompose(*args, **kwargs)
    before = [_is_excluded(k) for k in keys]
    for k in keys:
        _set_excluded(k, True)
    try:
        return op._op(*args, **kwargs)
    finally:
        for k, was in zip(keys, before):
            _set_excluded(k, was)


def _notify(observer: Callable[[Event], None], event: Event) -> None:
    """Call the observer with the engine's keys off: its own torch calls are not the user's."""
    with keys_excluded():
        observer(event)


def _keys_off(k: "_dispatch.Keys") -> bool:
    """Exclude the engine's keys around a call it handles (the call's insides are its own, as
    native autocast excludes its key); returns whether the fallback's key was on, for ``_keys_on``."""
    all_on = not _is_excluded(k.all)
    _set_excluded(k.ops, True)
    if all_on:
        _set_excluded(k.all, True)
    return all_on


def _keys_on(k: "_dispatch.Keys", all_on: bool) -> None:
    """Undo ``_keys_off``."""
    _set_excluded(k.ops, False)
    if all_on:
        _set_excluded(k.all, False)


def _apply(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """Apply ``rule`` to one call: decide the dtype, cast, call, report.

    Note: the hot path of a policy op (one pass over the inputs for LOWER and FP32, which need no
    dtypes to decide; PROMOTE and FIRST look at the dtypes first)."""
    region = frame.region
    if rule.native is not None:
        return _to_native(frame, rule, op, args, kwargs)
    if rule.takes_dtype and has_explicit_dtype(args, kwargs):
        return _unchanged(frame, rule, op, args, kwargs, level, "explicit dtype")
    on_device = region.on_device
    input_only = rule.input_only and rule.casts_input_only(region.device_type)
    action = rule.action
    if action is _LOWER:
        target = frame.dtype
    elif action is _FP32:
        target = _FLOAT32
    else:
        dtypes = _eligible_dtypes(rule, args, kwargs, on_device, input_only)
        target = compute_dtype(action, dtypes, frame.dtype, rule.name) if dtypes else None
    k = _dispatch._keys
    all_on = _keys_off(k)
    try:
        cast = _CAST.get(target) or functools.partial(_Tensor.to, dtype=target)
        observer = region.observer
        casts = [] if observer is not None else None
        cache = region.cache if _cache_on() else None
        lower = target is frame.dtype
        protected = rule.protected
        on = eligible = 0
        new_args = None
        for i, a in enumerate(args):
            if isinstance(a, _Tensor):
                dt = a.dtype
                if dt.is_floating_point and on_device(a):
                    on += 1
                    if dt is not _FLOAT64:
                        eligible += 1
                        # An argument the op writes is never replaced by a copy (its write
                        # would be lost); it still counts (FIRST takes its dtype).
                        if dt is not target and target is not None and not (protected and i in protected):
                            if new_args is None:
                                new_args = list(args)
                            new_args[i] = _cast(a, dt, target, cast, cache, casts, rule.arg_names[i], lower)
                if input_only:
                    break
            elif type(a) is list or type(a) is tuple:
                items = None
                for j, t in enumerate(a):
                    if isinstance(t, _Tensor) and t.is_floating_point() and on_device(t):
                        on += 1
                        dt = t.dtype
                        if dt is not _FLOAT64:
                            eligible += 1
                            if dt is not target and target is not None and not (protected and i in protected):
                                if items is None:
                                    items = list(a)
                                items[j] = _cast(t, dt, target, cast, cache, casts, f"{rule.arg_names[i]}[{j}]", lower)
                if items is not None:
                    if new_args is None:
                        new_args = list(args)
                    new_args[i] = items if type(a) is list else tuple(items)
        new_kwargs = kwargs
        if kwargs and not input_only:
            new_kwargs = dict(kwargs)
            for n, v in kwargs.items():
                if n in rule.written_names:
                    continue  # out=: not an input (_into deals with it)
                if isinstance(v, _Tensor) and v.is_floating_point() and on_device(v):
                    on += 1
                    dt = v.dtype
                    if dt is not _FLOAT64:
                        eligible += 1
                        if dt is not target and target is not None:
                            new_kwargs[n] = _cast(v, dt, target, cast, cache, casts, n, lower)
        if not on:
            # No tensor of the region's device: native autocast's kernel would not have been
            # reached, so the call goes on as if the engine were not there (no event).
            _keys_on(k, all_on)
            all_on = None
            return _pass_on(op, args, kwargs, k.ops, k.all)
        if rule.banned is not None:
            raise RuntimeError(f"{rule.name}: {rule.banned}")
        if rule.into and target is not None:
            new_args, new_kwargs, written = _into(rule, args if new_args is None else new_args, new_kwargs, target,
                                                  on_device)
            out = op._op(*new_args, **new_kwargs)
            if written:
                out = _write_back(written, out)
        else:
            out = op._op(*(args if new_args is None else new_args), **new_kwargs)
        if observer is not None:
            if eligible:
                # What it ran in: the cast dtype, unless an input the rule leaves alone (float64)
                # promoted the result beyond it.
                event = Event(op, level, Outcome.CAST, action, rule.default, None, _dtypes(args, kwargs),
                              _first_floating(out) or target, tuple(casts), args, kwargs)
            else:  # every floating input on the device is float64
                event = Event(op, level, Outcome.INELIGIBLE, action, rule.default, "float64",
                              _dtypes(args, kwargs), _first_floating(out), (), args, kwargs)
            observer(event)
        return out
    finally:
        if all_on is not None:
            _keys_on(k, all_on)


def _apply_plain(frame: Frame, rule: OpRule, call: Callable, args: tuple, ops_key):
    """``_apply`` for the commonest call, specialised: a LOWER or FP32 rule with nothing else to
    consider (``OpRule.plain``), positional arguments, a region that does not observe (so the
    fallback's key needs no switching off). The same decisions, fewer steps: the cost of a cast
    op is this function."""
    lower = rule.action is _LOWER
    target = frame.dtype if lower else _FLOAT32
    cast = _CAST[target]
    region = frame.region
    on_device = region.on_device
    cache = region.cache if _cache_on() else None
    new_args = list(args)
    on = False
    i = 0
    for a in args:
        if isinstance(a, _Tensor):
            dt = a.dtype
            if dt.is_floating_point and on_device(a):
                on = True
                if dt is not target and dt is not _FLOAT64:
                    if cache is not None and a.requires_grad:  # _cast's first test, done here: the hot path
                        new_args[i] = _cast(a, dt, target, cast, cache, None, "", lower)
                    else:
                        new_args[i] = cast(a)
        elif type(a) is list or type(a) is tuple:
            return _apply(frame, rule, rule.op, args, {}, Level.KERNEL)  # cat's lists: the long way
        i += 1
    if not on:
        return _apply(frame, rule, rule.op, args, {}, Level.KERNEL)
    _set_excluded(ops_key, True)
    try:
        return call(*new_args)
    finally:
        _set_excluded(ops_key, False)


def _into(rule: OpRule, args, kwargs: dict, target: torch.dtype, on_device) -> tuple:
    """Point the tensors an in-place or ``out=`` overload writes and returns at copies in the
    dtype it computes in, where theirs differs: ``(args, kwargs, [(tensor, copy), ...])``.

    [Note: named in-place and out= overloads] A policy that names ``addmm_`` or ``mm.out`` asks
    for the computation in its dtype; the caller's tensor keeps its own. So the op computes
    into a copy in that dtype (an in-place op's ``self`` is also an input: the copy holds its
    values), and the result is written back into the caller's tensor, rounded to its dtype: a
    float32 ``c`` after ``torch.mm(a, b, out=c)`` under a LOWER rule holds
    ``torch.mm(a.bfloat16(), b.bfloat16()).float()``. A write is never lost to a copy, and the
    caller gets its own tensor back. Float64 and non-floating outputs are left as they are."""
    written = []
    new_args = args
    for i, a in enumerate(rule.op._schema.arguments):
        if a.name not in rule.into:
            continue
        if a.kwarg_only:
            t = kwargs.get(a.name)
        else:
            t = args[i] if i < len(args) else None
        if not (isinstance(t, _Tensor) and t.dtype is not target and t.is_floating_point()
                and t.dtype is not _FLOAT64 and on_device(t)):
            continue
        copy = t.to(target)
        written.append((t, copy))
        if a.kwarg_only:
            kwargs = dict(kwargs)
            kwargs[a.name] = copy
        else:
            new_args = list(new_args)
            new_args[i] = copy
    return new_args, kwargs, written


def _write_back(written: list, out):
    """Copy each computed ``copy`` into its caller's tensor and return what the op would have
    returned with the caller's tensors (see ``_into``)."""
    swap = {}
    for t, copy in written:
        if t.shape != copy.shape:
            t.resize_(copy.shape)  # out= tensors are resized to the result, as the op would
        t.copy_(copy)
        swap[id(copy)] = t
    if isinstance(out, _Tensor):
        return swap.get(id(out), out)
    if isinstance(out, (tuple, list)):
        return type(out)(swap.get(id(o), o) if isinstance(o, _Tensor) else o for o in out)
    return out


def _to_native(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict):
    """Leave the call to native autocast's kernel for the op (``Policy.native``): its key is
    switched on for this one call, with the region's dtype, and the engine's keys off."""
    k = _dispatch._keys
    native, device = rule.native, frame.region.device_type
    before = _is_excluded(k.ops), _is_excluded(k.all), _is_excluded(native), _native_get_dtype(device)
    _set_excluded(k.ops, True)
    _set_excluded(k.all, True)
    _set_excluded(native, False)
    _native_set_dtype(device, frame.dtype)
    try:
        out = op._op(*args, **kwargs)
    finally:
        _set_excluded(k.ops, before[0])
        _set_excluded(k.all, before[1])
        _set_excluded(native, before[2])
        _native_set_dtype(device, before[3])
    observer = frame.region.observer
    if observer is not None:
        _notify(observer, Event(op, Level.KERNEL, Outcome.NATIVE, None, None, None, _dtypes(args, kwargs),
                                _first_floating(out), (), args, kwargs))
    return out


_native_get_dtype = torch._C.get_autocast_dtype
_native_set_dtype = torch._C.set_autocast_dtype

_CAST = {torch.bfloat16: _Tensor.bfloat16, torch.float16: _Tensor.half, torch.float32: _Tensor.float}


def _eligible_dtypes(rule: OpRule, args: tuple, kwargs: dict, on_device, input_only: bool) -> list:
    """The eligible inputs' dtypes in argument order (PROMOTE and FIRST decide from them). An
    argument the op writes counts under FIRST: HPU's iadd keeps the dtype of its ``self``."""
    # An in-place op's self counts (it is an input too; FIRST takes its dtype), other written
    # arguments do not (running statistics, out=).
    protected = rule.protected if rule.action is not CastPolicy.FIRST else ()
    dtypes = []
    for i, a in enumerate(args):
        if i in protected and (i or "self" not in rule.into):
            continue
        if isinstance(a, _Tensor):
            if a.is_floating_point() and a.dtype is not _FLOAT64 and on_device(a):
                dtypes.append(a.dtype)
            if input_only:
                return dtypes
        elif type(a) is list or type(a) is tuple:
            dtypes.extend(t.dtype for t in a if isinstance(t, _Tensor) and t.is_floating_point()
                          and t.dtype is not _FLOAT64 and on_device(t))
    if not input_only:
        dtypes.extend(v.dtype for n, v in kwargs.items() if isinstance(v, _Tensor) and v.is_floating_point()
                      and v.dtype is not _FLOAT64 and on_device(v) and n not in rule.written_names)
    return dtypes


def _cast(t: torch.Tensor, dt: torch.dtype, target: torch.dtype, cast: Callable, cache: Optional[dict],
          casts: Optional[list], arg: str, lower: bool) -> torch.Tensor:
    """``t`` (eligible, of dtype ``dt``) cast to ``target``, through the cast cache where it applies.

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
    of the weight (an optimizer step inside the region): a region's weights are its constants.
    Nothing else is cached (inputs, masks, frozen weights are cast at each use): their values
    can change behind any version counter (``.data``, NumPy, DLPack), so no entry could be
    proved fresh. One safe difference from native: entries are keyed by the dtype too, so a
    nested ``torch.autocast`` of another dtype never receives a copy of the first.
    ``cache_enabled=False`` (always so on HPU) casts every time."""
    if (cache is not None and lower and dt is _FLOAT32 and t.requires_grad and t.is_leaf
            and not t._is_view() and not _inference_mode()):
        key = (id(t), target)
        hit = cache.get(key)
        if hit is not None and hit[0]() is t:
            if casts is not None:
                casts.append(Cast(arg, dt, target, hit[1].numel() * target.itemsize, True, t))
            return hit[1]
        if _grad_enabled():
            c = cast(t)
        else:
            _set_grad_enabled(True)
            try:
                c = cast(t)
            finally:
                _set_grad_enabled(False)
        cache[key] = (weakref.ref(t, functools.partial(_evict, cache, key)), c)
    else:
        c = cast(t)
    if casts is not None:
        casts.append(Cast(arg, dt, target, c.numel() * target.itemsize, False, t))
    return c


def _evict(cache: dict, key: tuple, _ref) -> None:
    cache.pop(key, None)


def _unchanged(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level,
               reason: str):
    """Run a call the rule does not apply to (``reason``), with the keys excluded: its insides are
    its own."""
    k = _dispatch._keys
    all_on = _keys_off(k)
    try:
        out = op._op(*args, **kwargs)
        observer = frame.region.observer
        if observer is not None:
            observer(Event(op, level, Outcome.INELIGIBLE, rule.action, rule.default, reason,
                           _dtypes(args, kwargs), _first_floating(out), (), args, kwargs))
        return out
    finally:
        _keys_on(k, all_on)


def _dtypes(args: tuple, kwargs: dict) -> tuple:
    """Tensor inputs' dtypes in argument order, lists flattened, ``out=`` excluded."""
    out = []
    for a in args:
        if isinstance(a, _Tensor):
            out.append(a.dtype)
        elif isinstance(a, (list, tuple)):
            out.extend(t.dtype for t in a if isinstance(t, _Tensor))
    for n, v in kwargs.items():
        if n != "out" and isinstance(v, _Tensor):
            out.append(v.dtype)
    return tuple(out)


def _first_floating(out) -> Optional[torch.dtype]:
    if isinstance(out, _Tensor):
        return out.dtype if out.is_floating_point() else None
    if isinstance(out, (list, tuple)):
        for o in out:
            d = _first_floating(o)
            if d is not None:
                return d
    return None

"""Regions and frames: what casting reads in the current context.

``enter`` / ``exit`` open and close a ``Region`` (one entry of an ``HpuAutocastMode``) in the
calling context; ``innermost`` / ``current`` / ``observing`` read the casting state there, and
``replace_innermost`` changes it (a ``torch.autocast`` inside a region). The kernels that apply it
are ``_kernels``'; ``_engine`` puts the two together.

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

import threading
from contextvars import ContextVar
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch

from . import core as _core, dispatch as _dispatch
from .. import _torch
from .._torch import compile_guard as _compile_guard
from ..policies._devices import NATIVE_AUTOCAST_HERE
from ..policies.rules import eligibility
from ..policies._table import CompiledPolicy, OpRule
from ..events import Event

__all__ = ["Region", "Frame", "State", "OFF", "current", "observing", "innermost", "enter", "exit",
           "replace_innermost", "native_devices", "keep_policy_off", "GUARD"]

_EMPTY: Dict[int, OpRule] = {}
_cache_on = _torch.autocast_cache_enabled
_set_cache_on = _torch.set_autocast_cache_enabled
_thread = threading.local()  # per thread: torch's cache flag before its first region (cache_was)


class Region:
    """One entry of an ``HpuAutocastMode``: what it asked for, and what it owns while open."""

    __slots__ = ("compiled", "rules", "dtype", "device_type", "enabled", "cache_enabled",
                 "observer", "observes", "eligible", "cache", "cache_was", "owns_cache", "closed", "switch", "thread",
                 "native_was_on", "eager", "every_device", "core")

    def __init__(self, compiled: Optional[CompiledPolicy], dtype: torch.dtype, device_type: str,
                 enabled: bool, cache_enabled: bool, observer: Optional[Callable[[Event], None]] = None,
                 every_device: bool = False) -> None:
        self.compiled = compiled
        self.rules = compiled.by_id if enabled and compiled is not None else _EMPTY
        self.dtype = dtype
        self.device_type = device_type
        #: Whether a tensor is one this region may cast (``rules.eligibility``: the one rule).
        self.eligible = eligibility(device_type)
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        self.observer = observer
        #: Whether the fallback must see this region's calls (to observe them, or for defaults).
        self.observes = enabled and (observer is not None or (compiled is not None and compiled.has_defaults))
        self.cache = None  # the outermost region's, or a new one (at the entry)
        self.owns_cache = True
        #: torch's cache flag at the entry (put back when this region exits innermost).
        self.cache_was = True
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
        #: The C++ core's state for this region while open (``None``: the Python kernels decide).
        self.core = None


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

# Autograd runs backward on worker threads of its own (CUDA), which start with an empty context
# but inherit the caller's thread-local state, torch's Python objects stashed there included
# (``ThreadLocalState``). So each thread stashes there a cell holding its innermost frame, and a
# backward run inside a region casts on the worker as it would in the region's thread.
# One cell for the thread's life, not a frame per change: every copy of that state (autograd's,
# and the one each gloo all-reduce keeps, DDP's backward) holds a reference to what is stashed,
# and the copy dropping the last one releases it on its own thread, taking the GIL; a gloo thread
# doing so while the interpreter shuts down aborts the process. The thread's own state keeps the
# cell, so no copy holds its last reference.
class _Inherited:
    __slots__ = ("frame",)

    def __init__(self) -> None:
        self.frame: Optional[Frame] = None


def _stashed_cell() -> _Inherited:
    """This thread's cell, stashed in its thread-local state if that does not hold it: at the
    thread's first region, and after a state saved before it was restored over it (autograd runs
    backward under the forward's state: a thread whose first region opened in backward)."""
    cell = _thread.__dict__.get("inherited")
    if cell is None:
        cell = _thread.inherited = _Inherited()
    if _torch.tls_stashed() is not cell:
        _torch.tls_stash(cell)
    return cell


def _set_frame(frame: Optional[Frame]) -> None:
    _FRAME.set(frame)
    try:
        _thread.inherited.frame = frame
    except AttributeError:  # a thread with no region of its own changing one it inherited
        _stashed_cell().frame = frame
    _core.set_frame(frame)


def _open(frame: Optional[Frame]) -> Optional[Frame]:
    while frame is not None and frame.region.closed:
        frame = frame.parent
    return frame


def _inherited() -> Optional[Frame]:
    # Only in another thread than the frame's own: in its own thread, the context decides.
    cell = _torch.tls_stashed()
    frame = cell.frame if cell is not None else None
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


_native_is_enabled = _torch.native_autocast_enabled
_native_set_enabled = _torch.set_native_autocast_enabled


def enter(region: Region, k: _dispatch.Keys, opened: Callable[[], None]) -> None:
    """Open ``region`` in the calling context, on the borrowed keys ``k``: it becomes the
    innermost frame. ``opened`` is called once the region is sure to open (the engine passes
    ``_torch_autocast.acquire``, which counts it among the process's open regions); ``exit``
    takes its counterpart.

    A region with a policy owns autocast for its device type while it is open: torch's own
    autocast for that device, if on (an enclosing ``torch.autocast``), is suspended, so the
    innermost decides, and it is restored at the exit."""
    if region.observes:
        k.observing_opened()  # first: it raises when no key is free for it
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
    if parent is None:
        _stashed_cell()
        region.cache = _core.new_cache()
    else:
        # As torch.autocast: one cast cache for the outermost region and all nested in it.
        region.cache = parent.region.cache
        region.owns_cache = False
        if region.compiled is None and not region.enabled:
            _opt_out_of(parent, region)
    region.core = _core.region_for(region, k)
    region.switch = switch = _dispatch.thread_switch()
    region.thread = threading.get_ident()
    switch.ops += 1
    if region.observes:
        switch.all += 1
    switch.sync(k)
    if region.observer is not None:
        region.eager = _compile_guard.observing_opened()
    region.cache_was = _cache_on()
    if switch.ops == 1:
        _thread.cache_was = region.cache_was  # the first region open in this thread: torch's flag before
    if compiled is not None:
        # As torch.autocast's entry: torch's cache flag says what this region caches (the kernels
        # read the flag, so a nested torch.autocast(cache_enabled=...) is obeyed too).
        _set_cache_on(region.cache_enabled)
    # A region owns autocast for its device: torch's own is suspended there, so the innermost
    # decides (a disabled one, disable_casts(), turns it off as torch.autocast(enabled=False)).
    if region.every_device and not region.enabled:
        region.native_was_on = _suspend(native_devices(k))
    elif region.device_type != "meta" and _native_is_enabled(region.device_type):  # no meta autocast
        region.native_was_on = _suspend((region.device_type,))
    _set_frame(Frame(region, parent, region.enabled, region.dtype))


def _opt_out_of(parent: Frame, region: Region) -> None:
    """A disabled region (``disable_casts()``) inside a region with a policy for its device is
    that region's opt-out, as a ``torch.autocast(enabled=False)`` inside it is: it keeps the
    region's policy, dtype and cache, switched off, so what native autocast keeps through an
    opt-out is kept too: a ``torch.autocast`` nested in it with no dtype takes the region's, turns
    the region's casting back on, and shares its cast cache; a checkpoint there recomputes under it."""
    outer = parent.region
    if outer.compiled is None or outer.device_type != region.device_type:
        return
    keep_policy_off(region, outer.compiled, parent.dtype, outer.cache_enabled)


def keep_policy_off(region: Region, compiled: CompiledPolicy, dtype: torch.dtype, cache_enabled: bool) -> None:
    """Make the disabled ``region`` an opt-out of ``compiled``: it holds the policy, its dtype and
    cache setting, switched off, and a ``torch.autocast`` inside it turns those rules back on
    (``_opt_out_of``; a checkpoint's recomputation in an opt-out, ``_torch_autocast``)."""
    region.compiled = compiled
    region.rules = compiled.by_id
    region.dtype = dtype
    region.cache_enabled = cache_enabled


def _suspend(devices: Tuple[str, ...]) -> Tuple[str, ...]:
    """Turn torch's autocast off on ``devices`` where it is on; returns those (to turn back on)."""
    on = tuple(d for d in devices if _native_is_enabled(d))
    for d in on:
        _native_set_enabled(d, False)
    return on


def native_devices(k: "_dispatch.Keys") -> Tuple[str, ...]:
    """Devices whose torch autocast a ``disable_casts()`` turns off: all but those whose autocast
    keys this package borrowed (their state is the engine's own)."""
    return tuple(d for d in NATIVE_AUTOCAST_HERE if d not in (k.ops_device, k.all_device))


def exit(region: Region, closed: Callable[[], None]) -> None:
    """Close ``region``, then call ``closed`` (``enter``'s ``opened``'s counterpart). Out of order
    or from another context of its thread, it is closed all the same (frames of closed regions
    are skipped). From another thread, ``RuntimeError`` refuses it and nothing changes (nor is
    ``closed`` called): a thread's dispatch keys are its own and only it can switch them off."""
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
        closed()


def _close(region: Region) -> None:
    region.closed = True
    if region.core is not None:
        region.core.close()
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
    innermost_exits = frame is not None and frame.region is region
    if innermost_exits:
        _set_frame(_open(frame.parent))
    # torch's cache flag: back to what it was at this region's entry when the innermost exits
    # (what a torch.autocast(cache_enabled=...) around it set included); a region exiting out of
    # order (hmp.reset under a later region) leaves the flag to the innermost; after the
    # thread's last region, what it was before its first.
    if switch.ops == 0:
        _set_cache_on(_thread.cache_was)
    elif innermost_exits:
        _set_cache_on(region.cache_was)



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

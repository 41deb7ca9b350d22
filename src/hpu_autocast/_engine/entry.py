"""A region's entry and exit, composed in one place.

[Note: a region's entry, in order]
``enter`` opens a region in four steps, each another part's, in this order:

1. *register*: the kernels of its policy (and the ops it leaves to native autocast) on the
   borrowed ops key, and the observing key taken first when it observes (``dispatch``; that step
   raises when no key is free for it, before anything changed);
2. *the core's tables*: the C++ core's state for the region, from its table for the policy and
   device type (``core.region_for``; ``None`` where the Python kernels decide);
3. *the patches*: ``acquire`` counts the region among those open in the process and installs
   torch's patches with the first (``torch_autocast``);
4. *the frame*: the region takes hold of its thread (its keys switched on, torch's cache flag and
   own autocast for its device as torch.autocast sets them) and its frame becomes the innermost
   (``regions.push``), the core told (its copy of the frame, Note [the frame in C++]).

What each step takes is kept on the entry's record (``Entered``: torch.autocast's ``prev_*``),
which ``enter`` returns and ``exit`` takes; the ``Region`` is what the mode asked, a value.

``exit`` undoes them in reverse, and so does an entry that fails on the way: what a step took
is given back before the error leaves ``enter``. The patches come in as ``acquire`` / ``release`` because they
open regions themselves (a checkpoint's recomputation, ``torch_autocast``), so they sit above
this module; ``_engine.enter`` hands the same two. The frame stack (``regions``) knows nothing of
the kernels, the core or the patches; every change of the innermost frame is mirrored to the core
here (``replace_innermost`` too).
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Tuple

import torch

from . import core as _core, dispatch as _dispatch, regions as _regions
from .. import _torch
from .._torch import compile_guard as _compile_guard
from .regions import Frame, Open, Region

__all__ = ["Entered", "enter", "exit", "replace_innermost", "core_of"]

_cache_on = _torch.autocast_cache_enabled
_set_cache_on = _torch.set_autocast_cache_enabled
_native_is_enabled = _torch.native_autocast_enabled
_native_set_enabled = _torch.set_native_autocast_enabled
_increment_nesting = _torch.increment_autocast_nesting
_decrement_nesting = _torch.decrement_autocast_nesting
_clear_native_cache = _torch.clear_native_autocast_cache
_thread = threading.local()  # per thread: torch's cache flag before its first region (cache_was), AOT's cache


class Entered(Open):
    """What one region's entry took, for its exit to give back (torch.autocast's ``prev_*``: its
    ``__enter__`` keeps what it changes on the context manager, its ``__exit__`` puts it back),
    with the region as it runs. It is the region's ``Open`` too, the part its frames share (the
    cast cache, the thread, whether it closed), which is all the frame stack reads of it. Filled by
    ``enter`` in its steps' order; read by ``exit`` (and the core's state by ``_tell_core``)."""

    __slots__ = ("region", "owns_cache", "core", "switch", "cache_was", "native_was_on", "eager")

    def __init__(self, region: Region, cache: object, owns_cache: bool) -> None:
        self.cache = cache  # Open's three, set here: one call per entry
        self.thread = threading.get_ident()
        self.closed = False
        self.region = region
        #: Whether this region made its cast cache (the outermost one: its exit clears it).
        self.owns_cache = owns_cache
        #: The C++ core's state for the region while open (``None``: the Python kernels decide).
        self.core: Optional[object] = None
        #: The thread's switch of the borrowed keys, once counted in it (``_hold``).
        self.switch: Optional[_dispatch.ThreadSwitch] = None
        #: torch's cache flag at the entry (put back when this region exits innermost).
        self.cache_was = True
        #: The device types whose torch autocast was on at the entry (it is suspended meanwhile).
        self.native_was_on: Tuple[str, ...] = ()
        #: Whether this region holds compiled code to eager (it observes; see _compile_guard).
        self.eager = False


def core_of(frame: Optional[Frame]) -> Optional[object]:
    """The C++ core's state for ``frame``'s region (``None``: the Python kernels decide its calls)."""
    return frame.open.core if frame is not None else None


def _tell_core(frame: Optional[Frame]) -> None:
    _core.set_frame(frame.open.core if frame is not None else None, frame)


def enter(region: Region, k: _dispatch.Keys, acquire: Callable[[], None], release: Callable[[], None]) -> Entered:
    """Open ``region`` in the calling context on the borrowed keys ``k``: register, the core's
    tables, the patches (``acquire``; ``release`` if what follows fails), the frame (the Note).
    Returns what ``exit`` takes.

    A region with a policy owns autocast for its device type while it is open: torch's own
    autocast for that device, if on (an enclosing ``torch.autocast``), is suspended, so the
    innermost decides, and it is restored at the exit."""
    _register(region, k)
    parent = _regions.innermost()
    try:
        if parent is None:
            entered = Entered(region, _core.new_cache(), True)
        else:  # as torch.autocast: one cast cache for the outermost region and all nested in it
            entered = Entered(_regions.nested(region, parent), parent.open.cache, False)
        region = entered.region
        entered.core = _core.region_for(region, entered.cache, k)
        acquire()
    except BaseException:
        if region.observes:
            k.observing_closed()
        raise
    try:
        _hold(entered, k)
        _core.set_frame(entered.core, _regions.push(region, entered, parent))
    except BaseException:  # what was taken is given back, as at an exit
        try:
            if entered.switch is not None:
                _close(entered, pushed=False)
        finally:
            release()
        raise
    return entered


def _register(region: Region, k: _dispatch.Keys) -> None:
    if region.observes:
        k.observing_opened()  # first: it raises when no key is free for it
    compiled = region.compiled
    if compiled is not None and region.enabled:
        if not compiled.registered:
            k.register(compiled.rules)
            compiled.registered = True
        if compiled.policy.native is not None:
            native = compiled.native_ops()
            if native:
                k.register(native)


def _hold(entered: Entered, k: _dispatch.Keys) -> None:
    """The region's hold on its thread: the borrowed keys on, compiled code run eagerly while it
    observes, torch's cache flag and its own autocast for the region's device as torch.autocast's
    entry sets them; what it changed kept on ``entered``."""
    region = entered.region
    entered.switch = switch = _dispatch.thread_switch()
    # As torch.autocast: a region counts in torch's autocast nesting, so a torch.autocast nested
    # in it does not clear the cast caches at its exit (it calls torch.clear_autocast_cache only
    # when it leaves the outermost autocast context, which the region then is).
    _increment_nesting()
    switch.ops += 1
    if region.observes:
        switch.all += 1
    switch.sync(k)
    if region.observer is not None:
        entered.eager = _compile_guard.observing_opened()
    entered.cache_was = _cache_on()
    if switch.ops == 1:  # the first region open in this thread
        _thread.cache_was = entered.cache_was  # torch's flag before
        _thread.aot_cache = _compile_guard.autograd_cache_off()  # Note [AOTAutograd's cache and a region]
    if region.compiled is not None:
        # As torch.autocast's entry: torch's cache flag says what this region caches (the kernels
        # read the flag, so a nested torch.autocast(cache_enabled=...) is obeyed too).
        _set_cache_on(region.cache_enabled)
    # A region owns autocast for its device: torch's own is suspended there, so the innermost
    # decides (a disabled one, disable_casts(), turns it off as torch.autocast(enabled=False)).
    if region.every_device and not region.enabled:
        entered.native_was_on = _suspend(_regions.native_devices(k))
    elif region.device_type != "meta" and _native_is_enabled(region.device_type):  # no meta autocast
        entered.native_was_on = _suspend((region.device_type,))


def _suspend(devices: Tuple[str, ...]) -> Tuple[str, ...]:
    """Turn torch's autocast off on ``devices`` where it is on; returns those (to turn back on)."""
    on = tuple(d for d in devices if _native_is_enabled(d))
    for d in on:
        _native_set_enabled(d, False)
    return on


def exit(entered: Entered, release: Callable[[], None]) -> None:
    """Close the region ``entered`` opened, then ``release`` (``enter``'s ``acquire``'s
    counterpart). Out of order or from another context of its thread, it is closed all the same
    (frames of closed regions are skipped). From another thread, ``RuntimeError`` refuses it and
    nothing changes (nor is ``release`` called): a thread's dispatch keys are its own and only it
    can switch them off."""
    if entered.closed:
        raise RuntimeError("this region was already exited")
    here = threading.get_ident()
    if entered.thread != here:
        raise RuntimeError(
            f"hpu_autocast: a region entered in thread {entered.thread} was exited from another thread "
            f"({here}); it stays open there: regions are per thread, like torch.autocast: exit a region "
            "in the thread that entered it"
        )
    try:
        _close(entered)
    finally:
        release()


def _close(entered: Entered, pushed: bool = True) -> None:
    """Undo ``_hold`` and take the frame off (``pushed``: else the entry failed before its frame,
    and torch's cache flag goes back as at the innermost's exit)."""
    region = entered.region
    _regions.close(entered)
    if entered.core is not None:
        entered.core.close()
    switch = entered.switch
    switch.ops -= 1
    if region.observes:
        switch.all -= 1
    if entered.owns_cache:
        entered.cache.clear()
    if _decrement_nesting() == 0:
        _clear_native_cache()  # as torch.autocast's exit from the outermost context
    if entered.eager:
        _compile_guard.observing_closed(True)
    switch.sync(_dispatch._keys)
    if region.observes:
        _dispatch._keys.observing_closed()  # after the sync: the key is off in this thread
    for d in entered.native_was_on:
        _native_set_enabled(d, True)
    innermost_exits = _regions.pop(entered) if pushed else True
    if innermost_exits:
        _tell_core(_regions.context_frame())
    # torch's cache flag: back to what it was at this region's entry when the innermost exits
    # (what a torch.autocast(cache_enabled=...) around it set included); a region exiting out of
    # order (hmp.reset under a later region) leaves the flag to the innermost; after the
    # thread's last region, what it was before its first.
    if switch.ops == 0:
        _set_cache_on(_thread.cache_was)
        restore, _thread.aot_cache = getattr(_thread, "aot_cache", None), None
        if restore is not None:
            restore()
    elif innermost_exits:
        _set_cache_on(entered.cache_was)


def replace_innermost(enabled: bool, dtype: torch.dtype) -> None:
    """Change the innermost frame's on/off state and dtype for the calling context (what
    ``torch.autocast`` inside a region does; see ``torch_autocast``), the core told."""
    frame: Optional[Frame] = _regions.replace_innermost(enabled, dtype)
    if frame is not None:
        _tell_core(frame)

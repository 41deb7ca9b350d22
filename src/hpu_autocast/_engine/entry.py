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
from .regions import Frame, Region

__all__ = ["enter", "exit", "replace_innermost"]

_cache_on = _torch.autocast_cache_enabled
_set_cache_on = _torch.set_autocast_cache_enabled
_native_is_enabled = _torch.native_autocast_enabled
_native_set_enabled = _torch.set_native_autocast_enabled
_increment_nesting = _torch.increment_autocast_nesting
_decrement_nesting = _torch.decrement_autocast_nesting
_clear_native_cache = _torch.clear_native_autocast_cache
_thread = threading.local()  # per thread: torch's cache flag before its first region (cache_was)


def enter(region: Region, k: _dispatch.Keys, acquire: Callable[[], None], release: Callable[[], None]) -> None:
    """Open ``region`` in the calling context on the borrowed keys ``k``: register, the core's
    tables, the patches (``acquire``; ``release`` if what follows fails), the frame (the Note).

    A region with a policy owns autocast for its device type while it is open: torch's own
    autocast for that device, if on (an enclosing ``torch.autocast``), is suspended, so the
    innermost decides, and it is restored at the exit."""
    _register(region, k)
    parent = _regions.innermost()
    try:
        if parent is None:
            region.cache = _core.new_cache()
        else:
            _regions.nest(region, parent)
        region.core = _core.region_for(region, k)
        acquire()
    except BaseException:
        if region.observes:
            k.observing_closed()
        raise
    try:
        _hold(region, k)
        _core.set_frame(_regions.push(region, parent))
    except BaseException:  # what was taken is given back, as at an exit
        try:
            if region.switch is not None:
                _close(region, pushed=False)
        finally:
            release()
        raise


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


def _hold(region: Region, k: _dispatch.Keys) -> None:
    """The region's hold on its thread: the borrowed keys on, compiled code run eagerly while it
    observes, torch's cache flag and its own autocast for the region's device as torch.autocast's
    entry sets them."""
    region.switch = switch = _dispatch.thread_switch()
    region.thread = switch.thread  # the calling thread's (a switch is per thread)
    # As torch.autocast: a region counts in torch's autocast nesting, so a torch.autocast nested
    # in it does not clear the cast caches at its exit (it calls torch.clear_autocast_cache only
    # when it leaves the outermost autocast context, which the region then is).
    _increment_nesting()
    switch.ops += 1
    if region.observes:
        switch.all += 1
    switch.sync(k)
    if region.observer is not None:
        region.eager = _compile_guard.observing_opened()
    region.cache_was = _cache_on()
    if switch.ops == 1:
        _thread.cache_was = region.cache_was  # the first region open in this thread: torch's flag before
    if region.compiled is not None:
        # As torch.autocast's entry: torch's cache flag says what this region caches (the kernels
        # read the flag, so a nested torch.autocast(cache_enabled=...) is obeyed too).
        _set_cache_on(region.cache_enabled)
    # A region owns autocast for its device: torch's own is suspended there, so the innermost
    # decides (a disabled one, disable_casts(), turns it off as torch.autocast(enabled=False)).
    if region.every_device and not region.enabled:
        region.native_was_on = _suspend(_regions.native_devices(k))
    elif region.device_type != "meta" and _native_is_enabled(region.device_type):  # no meta autocast
        region.native_was_on = _suspend((region.device_type,))


def _suspend(devices: Tuple[str, ...]) -> Tuple[str, ...]:
    """Turn torch's autocast off on ``devices`` where it is on; returns those (to turn back on)."""
    on = tuple(d for d in devices if _native_is_enabled(d))
    for d in on:
        _native_set_enabled(d, False)
    return on


def exit(region: Region, release: Callable[[], None]) -> None:
    """Close ``region``, then ``release`` (``enter``'s ``acquire``'s counterpart). Out of order
    or from another context of its thread, it is closed all the same (frames of closed regions
    are skipped). From another thread, ``RuntimeError`` refuses it and nothing changes (nor is
    ``release`` called): a thread's dispatch keys are its own and only it can switch them off."""
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
        release()


def _close(region: Region, pushed: bool = True) -> None:
    """Undo ``_hold`` and pop the frame (``pushed``: else the entry failed before its frame, and
    torch's cache flag goes back as at the innermost's exit)."""
    region.closed = True
    if region.core is not None:
        region.core.close()
    switch = region.switch
    switch.ops -= 1
    if region.observes:
        switch.all -= 1
    if region.owns_cache:
        region.cache.clear()
    if _decrement_nesting() == 0:
        _clear_native_cache()  # as torch.autocast's exit from the outermost context
    if region.eager:
        _compile_guard.observing_closed(True)
    switch.sync(_dispatch._keys)
    if region.observes:
        _dispatch._keys.observing_closed()  # after the sync: the key is off in this thread
    for d in region.native_was_on:
        _native_set_enabled(d, True)
    innermost_exits = _regions.pop(region) if pushed else True
    if innermost_exits:
        _core.set_frame(_regions.context_frame())
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
    ``torch.autocast`` inside a region does; see ``torch_autocast``), the core told."""
    frame: Optional[Frame] = _regions.replace_innermost(enabled, dtype)
    if frame is not None:
        _core.set_frame(frame)

"""Regions and frames: what casting reads in the current context, the frame stack.

A ``Region`` is what one entry of an ``HpuAutocastMode`` asked for, a value; its ``Open`` is what
its frames share while it is open. ``push`` / ``close`` make its frame the calling context's
innermost and (``close``, ``pop``) take it off, ``innermost`` / ``current`` /
``observing`` read the casting state there, and ``replace_innermost`` changes it (a
``torch.autocast`` inside a region). The stack knows nothing of the kernels, the C++ core or the
patches of torch: a region's entry and exit around it are ``entry``'s.

[Note: regions, frames, contexts]
A ``Region`` is what one entry of an ``HpuAutocastMode`` asked for (immutable), its ``Open`` the
region while open (its cast cache, its thread, whether it closed). A ``Frame`` is what casting
reads in one context: the innermost region and the on/off state and dtype that ``torch.autocast`` calls made
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

from . import dispatch as _dispatch
from .. import _torch
from .._facts.devices import NATIVE_AUTOCAST_HERE
from ..policies.recipes import cast_dtype
from ..policies.rules import eligibility
from .compiled import CompiledPolicy, OpRule
from ..events import Event

__all__ = [
    "Region",
    "ask",
    "Open",
    "Frame",
    "State",
    "OFF",
    "current",
    "observing",
    "innermost",
    "push",
    "nested",
    "close",
    "pop",
    "replace_innermost",
    "native_devices",
    "policy_off",
    "GUARD",
    "TAG",
]

_EMPTY: Dict[int, OpRule] = {}
_thread = threading.local()  # per thread: the cell stashed for autograd's threads (inherited)


class Region(NamedTuple):
    """What one entry of an ``HpuAutocastMode`` asked for, as the region runs it: an immutable
    value (``ask`` makes one; a disabled region nested in a policy's is that policy's opt-out,
    another value: ``nested``). What an open region shares with its frames is its ``Open``; what
    its entry took and its exit gives back is ``entry``'s record."""

    compiled: Optional[CompiledPolicy]
    #: The compiled policy's rules by ``id(op)`` when enabled (``_EMPTY`` otherwise).
    rules: Dict[int, OpRule]
    dtype: torch.dtype
    device_type: str
    enabled: bool
    cache_enabled: bool
    observer: Optional[Callable[[Event], None]]
    #: Whether the fallback must see this region's calls (to observe them, or for defaults).
    observes: bool
    #: Whether a tensor is one this region may cast (``rules.eligibility``: the one rule).
    eligible: Callable[[torch.Tensor], bool]
    #: Whether a disabled region turns torch's own autocast off on every device (``disable_casts``),
    #: not only on ``device_type``.
    every_device: bool


def ask(
    compiled: Optional[CompiledPolicy],
    dtype: torch.dtype,
    device_type: str,
    enabled: bool,
    cache_enabled: bool,
    observer: Optional[Callable[[Event], None]] = None,
    every_device: bool = False,
) -> Region:
    """The ``Region`` a mode asks for (the rules, observation and eligibility follow from the rest)."""
    return _new(
        Region,
        (
            compiled,
            compiled.by_id if enabled and compiled is not None else _EMPTY,
            dtype,
            device_type,
            enabled,
            cache_enabled,
            observer,
            enabled and (observer is not None or (compiled is not None and compiled.has_defaults)),
            eligibility(device_type),
            every_device,
        ),
    )


_new = tuple.__new__  # a NamedTuple's own __new__ is a Python function over this: once per region


class Open:
    """A region while it is open, as every frame of it shares it: the cast cache (the outermost
    region's, shared by every region nested in it, as torch.autocast's), the thread it opened in,
    and whether it has closed (frames of closed regions are skipped wherever they are linked).
    The one thing of the frame stack that changes: ``close`` sets ``closed``."""

    __slots__ = ("cache", "thread", "closed")

    def __init__(self, cache: object) -> None:
        self.cache = cache
        self.thread = threading.get_ident()
        self.closed = False


class Frame:
    """The casting state of one context (immutable: replaced, never changed)."""

    __slots__ = ("region", "open", "parent", "enabled", "dtype", "lower", "rules")

    def __init__(
        self, region: Region, open: Open, parent: Optional["Frame"], enabled: bool, dtype: torch.dtype
    ) -> None:
        self.region = region
        self.open = open
        self.parent = parent
        self.enabled = enabled
        self.dtype = dtype
        self.lower = cast_dtype(dtype)  # what its casts go to (bfloat16 in an fp8 region)
        self.rules = region.rules if enabled else _EMPTY

    def __repr__(self) -> str:
        policy = self.region.compiled.policy.name if self.region.compiled is not None else None
        return f"Frame(policy={policy}, dtype={self.dtype}, device={self.region.device_type}, enabled={self.enabled})"


_FRAME: ContextVar[Optional[Frame]] = ContextVar("hpu_autocast_frame", default=None)
_get_frame = _FRAME.get
#: The frame the calling context holds, as set (``innermost`` skips closed regions' and other threads').
context_frame = _FRAME.get


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


def _open(frame: Optional[Frame]) -> Optional[Frame]:
    while frame is not None and frame.open.closed:
        frame = frame.parent
    return frame


def _inherited() -> Optional[Frame]:
    # Only in another thread than the frame's own: in its own thread, the context decides.
    cell = _torch.tls_stashed()
    frame = cell.frame if cell is not None else None
    return _open(frame) if frame is not None and frame.open.thread != threading.get_ident() else None


def innermost() -> Optional[Frame]:
    """The calling context's innermost frame of an open region, or ``None``. The one accessor of
    the engine's state: the mode's queries, ``amp``, ``testing`` and the torch-autocast
    interplay (checkpointing and optimizer steps included) all ask this, through ``current()``."""
    frame = _get_frame()
    if frame is None:
        return _inherited()
    if frame.open.thread != threading.get_ident():
        # A context copied into another thread (asyncio.to_thread, contextvars' run): the region's
        # keys are on in its own thread only, so it does not cast here, and its guards say so.
        return _inherited()
    return _open(frame) if frame.open.closed else frame


class State(NamedTuple):
    """The calling context's casting state, as the rest of the package sees it."""

    enabled: bool
    policy: object = None  #: the innermost region's ``Policy`` (``None``: off)
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


def push(region: Region, open: Open, parent: Optional[Frame]) -> Frame:
    """Make the open ``region`` the calling context's innermost frame, nested in ``parent`` (the
    innermost before it, ``None`` for the thread's outermost, which stashes the thread's cell first)."""
    if parent is None:
        _stashed_cell()
    frame = Frame(region, open, parent, region.enabled, region.dtype)
    _set_frame(frame)
    return frame


def nested(region: Region, parent: Frame) -> Region:
    """``region`` as it runs opening inside ``parent``: a disabled one with no policy inside a
    region with a policy for its device is that region's opt-out, as a ``torch.autocast(enabled=False)``
    inside it is: it keeps the region's policy, dtype and cache setting, switched off, so what native
    autocast keeps through an opt-out is kept too: a ``torch.autocast`` nested in it with no dtype
    takes the region's, turns the region's casting back on, and shares its cast cache (as every
    nested region does: ``parent.open.cache``); a checkpoint there recomputes under it."""
    outer = parent.region
    if (
        region.compiled is not None
        or region.enabled
        or outer.compiled is None
        or outer.device_type != region.device_type
    ):
        return region
    return policy_off(region, outer.compiled, parent.dtype, outer.cache_enabled)


def policy_off(region: Region, compiled: CompiledPolicy, dtype: torch.dtype, cache_enabled: bool) -> Region:
    """The disabled ``region`` as an opt-out of ``compiled``: it holds the policy, its dtype and
    cache setting, switched off, and a ``torch.autocast`` inside it turns those rules back on
    (``nested``; a checkpoint's recomputation in an opt-out, ``_torch_autocast``)."""
    return region._replace(compiled=compiled, rules=compiled.by_id, dtype=dtype, cache_enabled=cache_enabled)


def native_devices(k: "_dispatch.Keys") -> Tuple[str, ...]:
    """Devices whose torch autocast a ``disable_casts()`` turns off: all but those whose autocast
    keys this package borrowed (their state is the engine's own)."""
    return tuple(d for d in NATIVE_AUTOCAST_HERE if d not in (k.ops_device, k.all_device))


def close(open: Open) -> None:
    """Close the region held by ``open``: its frames are skipped from now on, wherever they are linked."""
    open.closed = True


def pop(open: Open) -> bool:
    """Take the closed region's frame off the calling context if it is the innermost there (the
    next open frame below becomes it); whether it was. A region closed out of order leaves the
    context's frame: closed regions' frames are skipped wherever they are still linked."""
    frame = _get_frame()
    if frame is None or frame.open is not open:
        return False
    _set_frame(_open(frame.parent))
    return True


def replace_innermost(enabled: bool, dtype: torch.dtype) -> Optional[Frame]:
    """Replace the innermost frame by one with this on/off state and dtype in the calling context
    (what ``torch.autocast`` inside a region does); the new frame, ``None`` with no open region."""
    frame = innermost()
    if frame is None:
        return None
    frame = Frame(frame.region, frame.open, frame.parent, enabled, dtype)
    _set_frame(frame)
    return frame


#: A tag of the calling context that changes what compiled code does there and is part of the
#: guard token below (a module map's key, ``module_map``: its hooks open regions per module).
TAG: ContextVar[str] = ContextVar("hpu_autocast_tag", default="")


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
        return f"{key}|{frame.dtype}|{region.device_type}|{frame.enabled}|{TAG.get()}"


GUARD = _GuardToken()

"""Code written for ``torch.autocast`` inside a region: what it asks torch, and what it turns off;
and optimizer steps taken inside a region.

[Note: a region is torch's autocast for its device]
Code in the wild talks to autocast through torch's functions: it asks whether autocast is on
(``torch.is_autocast_enabled(device)``, ``torch._C._is_any_autocast_enabled()``) and takes an
autocast-only path, it turns autocast off for a numerically sensitive block
(``with torch.autocast(device, enabled=False)``, which sets and restores the state through
``torch.set_autocast_enabled`` and ``torch.set_autocast_dtype``), and ``torch.utils.checkpoint``
records that state at the forward to recompute under it. Inside a region, all of this concerns
the region: for the region's device type, the state functions read and write the calling
context's innermost frame (on/off and dtype), so a nested ``torch.autocast(device,
enabled=False)`` turns the region's casting off for its body and its exit turns it back on. For
other device types, and outside regions, they are torch's own.

torch offers no extension point for this: the state functions are C builtins that no torch
function mode sees, and native autocast's state *is* its dispatch key's exclusion, which would
also switch native casting on. So the package patches them (the last resort of the project's
rules), and only while a region is open anywhere in the process: the first region to open
installs the patches, the last to close restores torch's own objects, checked to be the ones
it replaced. The patched functions are thread-safe (they read the calling context's frame and
otherwise call torch's function unchanged), so a thread or task with no region sees torch's
own answers. ``tests/test_torch_autocast.py`` pins what is patched on the torch being run.

Checkpointing: ``torch.utils.checkpoint`` recomputes in backward, after the region has exited,
under ``torch.autocast`` contexts rebuilt from the recorded state, which know nothing of the
region's policy. So a checkpoint started inside a region runs its recomputation inside a new
region with the state the forward ran in (policy, dtype, device, cache; or off): the two module
functions ``checkpoint`` calls (``_checkpoint_without_reentrant_generator`` and
``CheckpointFunction``) are wrapped while regions are open. The recomputation's region comes
into force inside torch's autocast contexts and, as any region, suspends native autocast for its
device, so the recomputed ops see the forward's casts and the saved metadata matches.

Torch's own autocast for the devices the forward's region did not own is part of that state too:
a ``torch.autocast("cpu")`` inside ``disable_casts()`` (a disabled region owns no device) casts
the forward natively. torch's checkpoint records it, but the contexts it rebuilds from the record
do not reach the recomputation: the recomputation's region suspends torch's autocast for its
device, and a region open around the backward takes them as its own. So the recomputation also
records torch's autocast state (on/off and dtype) at the forward for every device whose autocast
torch keeps (``_native_state``), and runs under it inside its region. And a forward in an opt-out
of a region (``disable_casts()`` or ``torch.autocast(enabled=False)`` inside it) recomputes in
that opt-out, policy kept, so a ``torch.autocast`` in the function turns the same policy back on.

[Note: optimizer steps run with casting off]
Every source document keeps the optimizer step outside autocast: torch's AMP recipe and Gaudi's
autocast put it after the region, HMP asks for ``with hmp.disable_casts(): optimizer.step()``.
Yet steps land inside regions: a loop wrapped whole, ``hmp.convert`` (one region for the
process), the ``report`` command (one region for the script). Cast there, a step computes its
own arithmetic in the region's dtypes: under Gaudi's lists ``mul`` and ``mean`` are lowered and
``add`` promoted, so ``torch.optim.Adafactor`` fails in ``lerp_`` (a bfloat16 ``grad * grad``
into a float32 state), float16 parameters fail PROMOTE (``Adadelta``), and transformers'
Adafactor silently keeps its second-moment factor in bfloat16. Native autocast casts a step
inside a region too, by its lists; torch's elementwise optimizers call nothing on torch's lower
lists, so their float32 steps are the same cast or not, and only matrix optimizers differ
(``torch.optim.Adafactor``'s ``row_var @ col_var`` in bfloat16 under ``torch.autocast("cpu")``),
in a placement torch's AMP recipe never uses.

So while a region is open, torch's global optimizer step hooks turn casting off for the step,
as ``torch.autocast(device, enabled=False)`` would (the innermost frame's on/off state): a step
inside a region computes what it computes outside, fails where it fails outside, and raises no
warning for the package's own whole-script regions. A step's closure (``LBFGS``) is the user's
forward and runs in the region as it was. Observers see nothing of the step (it is not cast).
torch calls no hook after a step that raises: casting then stays off until the region exits,
which the exception usually does (no frame outlives its region), or until the next step, which
turns it back on with a warning (a loop that catches a failed step and goes on).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from contextvars import ContextVar
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.utils.checkpoint as _checkpoint

from .. import _torch
from .._torch import compile_guard as _compile_guard
from . import (
    dispatch as _dispatch,
    entry as _entry,
    kernels as _kernels,
    regions as _regions,
    torchscript as _torchscript,
)
from .compiled import compile_policy
from ..policies.recipes import cast_dtype

__all__ = ["PATCHED", "HOOKS", "acquire", "release", "recompute_in_region", "add_recompute_capture"]

_real: Dict[str, Callable] = {}


def _frame_for(device: Optional[str]) -> Optional[_regions.Frame]:
    """The calling context's innermost frame if it owns autocast for ``device``: a region with a
    policy (a disabled one, ``disable_casts``, owns nothing) whose device type it is."""
    if _compile_guard.tracing():
        # Dynamo runs the getters below as constants (see _compile_guard.assume_constant): the frame it
        # compiles depends on the region's state, so it is guarded on it.
        _compile_guard.install()
    frame = _regions.innermost()
    if frame is None or frame.region.compiled is None or frame.region.device_type != (device or "cuda"):
        return None
    return frame


def _device_of(args: tuple, kwargs: dict, n_without: int) -> Tuple[Optional[str], tuple]:
    """Split torch's two spellings: ``f(device_type, *rest)`` and the older ``f(*rest)`` (CUDA)."""
    if "device_type" in kwargs:
        kwargs = dict(kwargs)
        return kwargs.pop("device_type"), args + tuple(kwargs.values())
    if len(args) > n_without and isinstance(args[0], str):
        return args[0], args[1:]
    return None, args + tuple(kwargs.values())


def is_autocast_enabled(*args, **kwargs) -> bool:
    device, _ = _device_of(args, kwargs, 0)
    frame = _frame_for(device)
    if frame is not None:
        return frame.enabled
    # The device of a key the engine borrowed ("ipu"): torch's answer before the key was switched on.
    was = _dispatch.borrowed_was_enabled(device)
    return was if was is not None else _real["is_autocast_enabled"](*args, **kwargs)


def get_autocast_dtype(*args, **kwargs) -> torch.dtype:
    # An fp8 region answers bfloat16, the dtype its ops other than its GEMMs run in: code that
    # casts to the autocast dtype gets bfloat16, not raw fp8, and torch.utils.checkpoint's
    # recomputation rebuilds a torch.autocast it supports (fp8 made it warn "target dtype is not
    # supported"); set_autocast_dtype takes bfloat16 back as the fp8 region's own dtype.
    device, _ = _device_of(args, kwargs, 0)
    frame = _frame_for(device)
    return cast_dtype(frame.dtype) if frame is not None else _real["get_autocast_dtype"](*args, **kwargs)


def set_autocast_enabled(*args, **kwargs) -> None:
    device, rest = _device_of(args, kwargs, 1)
    frame = _frame_for(device)
    if frame is None:
        return _real["set_autocast_enabled"](*args, **kwargs)
    _entry.replace_innermost(bool(rest[0]), frame.dtype)


def set_autocast_dtype(*args, **kwargs) -> None:
    device, rest = _device_of(args, kwargs, 1)
    frame = _frame_for(device)
    if frame is None:
        return _real["set_autocast_dtype"](*args, **kwargs)
    dtype = rest[0]
    if dtype is cast_dtype(frame.dtype):  # an fp8 region's answer to get_autocast_dtype: its own dtype
        dtype = frame.dtype
    policy = frame.region.compiled.policy
    # (an fp8 region's own dtype is not in the dtypes of a policy that takes fp8 through its
    # bfloat16, torch-cuda's: Dynamo restores bfloat16 around every compilation)
    if dtype is not frame.dtype and dtype not in policy.dtypes:
        # As torch.autocast disables itself for a dtype its device does not support, with a warning.
        warnings.warn(
            f"hpu_autocast: torch.autocast asked for {dtype} inside a region of policy "
            f"{policy.name!r}, which supports {', '.join(map(str, policy.dtypes))}; the region "
            f"keeps {frame.dtype}",
            UserWarning,
            stacklevel=3,
        )
        return
    _entry.replace_innermost(frame.enabled, dtype)


def clear_autocast_cache() -> None:
    """torch's ``clear_autocast_cache``, which inside a region also clears the region's cast cache
    (shared by the outermost region and all nested in it), as native clears its own: a weight
    updated in place is then cast afresh at its next use (Note: the cast cache, ``_cast_cache``).
    A ``torch.autocast`` nested in a region does not reach here at its exit: the region counts in
    torch's autocast nesting (``_regions.enter``), so only an explicit call clears it."""
    frame = _regions.innermost()
    if frame is not None and frame.open.cache is not None:
        frame.open.cache.clear()
    _real["clear_autocast_cache"]()


def _is_any_autocast_enabled() -> bool:
    # The engine's own keys are autocast keys, and torch counts them: ask with them excluded,
    # then add the region's own state.
    frame = _regions.innermost()
    if frame is not None and frame.region.compiled is not None and frame.enabled:
        return True
    with _kernels.keys_excluded():
        return _real["_is_any_autocast_enabled"]()


# -- checkpointing -----------------------------------------------------------------------------
#: Functions called at a checkpointed forward, each returning ``None`` or a context manager
#: class whose instance the recomputation runs inside (a module map's hooks, ``module_map``).
_captures: list = []


def add_recompute_capture(capture: Callable[[], Optional[type]]) -> None:
    """Have every checkpoint's recomputation also run under what ``capture()`` returns at its forward."""
    _captures.append(capture)


def recompute_in_region(fn: Callable) -> Callable:
    """``fn`` to run, at the recomputation, under the calling context's state now (the forward's)."""
    state, opt_out, native = _regions.current(), _opt_out_here(), _native_state()
    contexts = [c for c in (capture() for capture in _captures) if c is not None]

    def recompute(*args, **kwargs):
        # A region reproducing ``state`` (a policy's, or off), opened as the engine opens one
        # (``_engine.entry``'s steps, which ``_engine.enter`` takes too; this module is below it):
        # backward runs after the forward's region exited, so this one may be the process's only
        # open region again.
        entered = _entry.enter(_region_of(state, opt_out), _kernels.keys(), acquire, release)
        try:
            was = _set_native(native)
            try:
                if contexts:
                    with contextlib.ExitStack() as stack:
                        for context in contexts:
                            stack.enter_context(context())
                        return fn(*args, **kwargs)
                return fn(*args, **kwargs)
            finally:
                _set_native(was)
        finally:
            _entry.exit(entered, release)

    return recompute


# torch's own functions (the patched ones are ``torch``'s attributes, not ``torch._C``'s).
_native_enabled = _torch.native_autocast_enabled
_native_dtype = _torch.native_autocast_dtype
_native_set_enabled = _torch.set_native_autocast_enabled
_native_set_dtype = _torch.set_native_autocast_dtype


def _native_state() -> Tuple[Tuple[str, bool, torch.dtype], ...]:
    """torch's own autocast state (device, on, dtype) in the calling context, for each device whose
    autocast is torch's (not a borrowed key's) and not the innermost region's (a region with a
    policy owns its device: torch's autocast there is suspended, and the region's state stands
    for it)."""
    frame = _regions.innermost()
    owned = frame.region.device_type if frame is not None and frame.region.compiled is not None else None
    return tuple(
        (d, _native_enabled(d), _native_dtype(d)) for d in _regions.native_devices(_kernels.keys()) if d != owned
    )


def _set_native(state: Tuple[Tuple[str, bool, torch.dtype], ...]) -> Tuple[Tuple[str, bool, torch.dtype], ...]:
    """Set torch's own autocast to ``state`` (``_native_state``'s); returns what it was."""
    was = tuple((d, _native_enabled(d), _native_dtype(d)) for d, _, _ in state)
    for d, enabled, dtype in state:
        _native_set_enabled(d, enabled)
        _native_set_dtype(d, dtype)
    return was


def _opt_out_here() -> Optional[tuple]:
    """The innermost region in the calling context if it holds a policy switched off (a region
    in a ``torch.autocast(enabled=False)``, or ``disable_casts()`` inside a region: an opt-out),
    as (compiled policy, dtype, device type, cache); else ``None``. A ``torch.autocast`` inside
    an opt-out turns that policy back on, in the recomputation too."""
    frame = _regions.innermost()
    if frame is None or frame.enabled or frame.region.compiled is None:
        return None
    region = frame.region
    # Its compiled policy itself, not the Policy: its kernels are registered (by the region
    # with the policy on that it opts out of).
    return region.compiled, frame.dtype, region.device_type, region.cache_enabled


def _region_of(state: _regions.State, opt_out: Optional[tuple] = None) -> _regions.Region:
    """A region reproducing ``state``: its policy, dtype, device and cache; or, for ``OFF``, the
    forward's opt-out (``_opt_out_here``) if it ran in one, else a disabled one for the device of
    the innermost region here (else ``cpu``)."""
    if state.enabled:
        return _regions.ask(compile_policy(state.policy), state.dtype, state.device_type, True, state.cache_enabled)
    if opt_out is not None:
        compiled, dtype, device_type, cache_enabled = opt_out
        return _regions.policy_off(
            _regions.ask(None, dtype, device_type, False, cache_enabled), compiled, dtype, cache_enabled
        )
    frame = _regions.innermost()
    return _regions.ask(None, torch.bfloat16, frame.region.device_type if frame else "cpu", False, True)


#: The generator non-reentrant ``checkpoint`` calls (its name changed in torch 2.14: ``_torch``).
_GENERATOR = _torch.CHECKPOINT_GENERATOR


def _checkpoint_without_reentrant_generator(fn, *args, **kwargs):
    # `checkpoint` calls the forward itself and hands `fn` to this generator for the
    # recomputation only.
    if _regions.innermost() is not None:
        fn = recompute_in_region(fn)
    return _real[_GENERATOR](fn, *args, **kwargs)


class _CheckpointFunction:
    """``CheckpointFunction`` whose ``apply`` runs the function's later calls (the recomputation)
    in a region with the forward's state; the first call is the forward, in the caller's region."""

    @staticmethod
    def apply(function, preserve_rng_state, *args):
        original = _real["CheckpointFunction"]
        if _regions.innermost() is None:
            return original.apply(function, preserve_rng_state, *args)
        recompute = recompute_in_region(function)
        calls = []

        def run(*a, **kw):
            if not calls:
                calls.append(1)
                return function(*a, **kw)
            return recompute(*a, **kw)

        return original.apply(run, preserve_rng_state, *args)

    def __getattr__(self, name):  # everything else is torch's class
        return getattr(_real["CheckpointFunction"], name)


for _getter in (is_autocast_enabled, get_autocast_dtype, _is_any_autocast_enabled):
    _compile_guard.assume_constant(_getter)  # the call installs the region guard

# The deprecated per-device spellings (torch.get_autocast_gpu_dtype(), is_autocast_cpu_enabled())
# keep torch's answers: torch.autocast, torch.utils.checkpoint, transformers and accelerate use
# the spellings above, and each patched name is a cost at every region's entry and exit.


# -- optimizer steps ---------------------------------------------------------------------------
class _Step:
    """One optimizer step in progress in this context: the torch frame running it (``caller``,
    the wrapper that calls the hooks), and, where it turned casting off, the innermost frame
    before (``on``) and after (``off``; replaced when a closure runs in between)."""

    __slots__ = ("caller", "on", "off")

    def __init__(self, caller, on: Optional[_regions.Frame] = None, off: Optional[_regions.Frame] = None) -> None:
        self.caller = caller
        self.on = on
        self.off = off

    def restore(self) -> bool:
        """Turn casting back on if this step's state is still the innermost; whether it was."""
        if self.off is not None and _regions.innermost() is self.off:
            _entry.replace_innermost(self.on.enabled, self.on.dtype)
            return True
        return False


#: The calling context's steps in progress, innermost last.
_STEPS: ContextVar[tuple] = ContextVar("hpu_autocast_steps", default=())


def _running(caller) -> bool:
    frame = _torch.caller_frame(2)
    while frame is not None:
        if frame is caller:
            return True
        frame = frame.f_back
    return False


def _step_pre_hook(optimizer, args: tuple, kwargs: dict):
    # A step still listed whose torch frame is gone raised (torch calls no hook after a failed
    # step): its casting comes back on now, if nothing has changed it since.
    steps = _STEPS.get()
    running = tuple(s for s in steps if _running(s.caller))
    if len(running) < len(steps):
        if any(s.restore() for s in reversed(steps) if s not in running):
            warnings.warn(
                "hpu_autocast: an optimizer step raised inside a region, and casting stayed off "
                "from it until this step (torch calls no hook after a step that raises); take "
                "optimizer steps outside the region",
                RuntimeWarning,
                stacklevel=3,
            )
    step = _Step(_torch.caller_frame(1))
    _STEPS.set(running + (step,))
    frame = _regions.innermost()
    if frame is None or not frame.enabled or frame.region.compiled is None:
        return None  # nothing to turn off: no region, disable_casts, or a step inside a step
    _entry.replace_innermost(False, frame.dtype)
    step.on, step.off = frame, _regions.innermost()
    # The closure (LBFGS's, any optimizer's `step(closure)`) is the user's forward: in the region.
    if callable(kwargs.get("closure")):
        return args, dict(kwargs, closure=_closure_in_region(kwargs["closure"], step))
    if len(args) > 1 and callable(args[1]):
        return (args[0], _closure_in_region(args[1], step), *args[2:]), kwargs
    return None


def _step_post_hook(optimizer, args: tuple, kwargs: dict) -> None:
    steps = _STEPS.get()
    caller = _torch.caller_frame(1)
    for i in range(len(steps) - 1, -1, -1):
        if steps[i].caller is caller:
            # Steps above it raised inside it (and it caught that): their state goes too.
            for step in reversed(steps[i:]):
                step.restore()
            _STEPS.set(steps[:i])
            return
    # Not listed: the hooks were installed while this step ran.


def _closure_in_region(closure: Callable, step: _Step) -> Callable:
    def closure_in_region(*args, **kwargs):
        if _regions.innermost() is not step.off:
            return closure(*args, **kwargs)
        step.restore()
        on = _regions.innermost()
        try:
            return closure(*args, **kwargs)
        finally:
            if _regions.innermost() is on:
                _entry.replace_innermost(False, on.dtype)
                step.off = _regions.innermost()

    return closure_in_region


#: (torch's dict of global hooks, hook) pairs installed while a region is open. The hooks go into
#: the dicts ``register_optimizer_step_pre_hook``/``post_hook`` fill, under a key of their own:
#: those functions build a ``RemovableHandle`` each time, a cost at every region.
HOOKS = [(_torch.OPTIMIZER_STEP_HOOKS[0], _step_pre_hook), (_torch.OPTIMIZER_STEP_HOOKS[1], _step_post_hook)]
_HOOK_KEY = "hpu_autocast"


# -- installing --------------------------------------------------------------------------------
#: (object, attribute, replacement): what is patched while a region is open.
PATCHED: Tuple[Tuple[object, str, object], ...] = (
    (torch, "is_autocast_enabled", is_autocast_enabled),
    (torch, "get_autocast_dtype", get_autocast_dtype),
    (torch, "set_autocast_enabled", set_autocast_enabled),
    (torch, "set_autocast_dtype", set_autocast_dtype),
    (*_torch.ANY_AUTOCAST_ENABLED, _is_any_autocast_enabled),
    (torch, "clear_autocast_cache", clear_autocast_cache),
    (_checkpoint, _GENERATOR, _checkpoint_without_reentrant_generator),
    (_checkpoint, "CheckpointFunction", _CheckpointFunction()),
)


#: ``PATCHED`` as (the owner's ``__dict__``, name, replacement): installing and restoring write
#: the dicts' items, one flat loop each (a region's entry and exit pay for the patches: a
#: ``setattr`` per name cost a third of a region, a ``dict.update`` per owner 0.3 us more than this).
_ITEMS = tuple((vars(owner), name, new) for owner, name, new in PATCHED)


def _getter_pairs() -> list:
    """(torch's function, ours) for each patched torch function."""
    return [
        (_real[name], new)
        for owner, name, new in PATCHED
        if owner is not _checkpoint and name != "clear_autocast_cache"
    ]
    # (clear_autocast_cache is left out: Dynamo puts torch's in the graph, and ours, a function of
    # a package Dynamo skips, then breaks the graph and runs eagerly, clearing the region's cache.)


# [Note: the count of open regions]
# This module owns the count of regions open in the process, all threads together: the patches
# above, and ``_torchscript``'s, are installed while it is above zero and restored when it falls
# to zero. The engine calls ``acquire`` at each region's entry and ``release`` at its exit
# (``_engine.enter``/``exit`` hand them to ``_regions``), and so does a checkpoint's
# recomputation here; nothing else opens a region. A region's dispatch keys are per thread
# (``_dispatch.ThreadSwitch``), but these patches are process-wide attributes of torch, hence
# one count under one lock.
_lock = threading.Lock()
_open = 0


def acquire() -> None:
    """A region opens: install the patches if it is the first open in the process."""
    global _open
    if not _compile_guard.skipped:
        _compile_guard.skip_package()
    with _lock:
        if _open == 0:
            for namespace, name, _ in _ITEMS:
                _real[name] = namespace[name]  # read each time: another library may patch too
            _compile_guard.settle_torch_rules(_getter_pairs)  # Note [Dynamo's tables and the patched getters]
            for namespace, name, new in _ITEMS:
                namespace[name] = new
            for hooks, hook in HOOKS:
                hooks[_HOOK_KEY] = hook
            _torchscript.install()
        _open += 1


def release() -> None:
    """A region closes: restore torch's own functions if it was the last open."""
    global _open
    with _lock:
        _open -= 1
        if _open:
            return
        _compile_guard.settle_torch_rules(_getter_pairs)  # Dynamo loaded inside the region
        for hooks, _ in HOOKS:
            hooks.pop(_HOOK_KEY, None)
        for namespace, name, new in _ITEMS:
            if namespace[name] is new:
                namespace[name] = _real[name]
            else:  # someone else replaced ours meanwhile: theirs stays, and it calls ours
                owner = namespace.get("__name__", namespace)
                warnings.warn(
                    f"hpu_autocast: {owner}.{name} was replaced while a region was open; leaving the "
                    "replacement in place",
                    RuntimeWarning,
                    stacklevel=4,
                )
        _torchscript.restore()

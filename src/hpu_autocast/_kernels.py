"""The kernels: the bodies that apply a rule to one call (the ops key's kernel per policy
overload, the observing key's fallback), passing a call on, the hand-off to native autocast, and
in-place / ``out=`` overloads computed into copies and written back.

Data flow of one call (docs/design.md has the long form)::

    torch.mm(a, b)       the thread's included key set has the ops key (a region is open), and
                         aten.mm.default has a kernel there, so the dispatcher calls it
    kernel(a, b)         the context's innermost frame; its rules[aten.mm.default]:
                           none -> redispatched below the ops key (as a fallthrough would go on)
                           LOWER -> exclude the keys, cast a and b (autograd records the casts),
                                    call aten.mm, restore the keys, tell the observer
    (C++) at::mm(x, y)   inside another composite (einsum -> bmm): the same, since the keys are
                         only excluded inside ops this engine handled
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, Optional

import torch
from torch._ops import OpOverload

from . import _compile_guard, _dispatch, _ops
from ._cast_cache import CAST, cached_cast
from ._regions import Frame, _get_frame, innermost
from ._table import OpRule
from .events import Event, Level, Outcome
from .policy import CastPolicy
from .rules import compute_dtype, has_explicit_dtype

__all__ = ["keys", "keys_excluded", "make_kernel", "make_fallback"]

_FLOAT32 = torch.float32
_FLOAT64 = torch.float64
_LOWER = CastPolicy.LOWER
_FP32 = CastPolicy.FP32
_Tensor = torch.Tensor
_set_excluded = torch._C._dispatch_tls_set_dispatch_key_excluded
_is_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_dispatch_modes = torch._C._len_torch_dispatch_stack
_cache_on = torch._C.is_autocast_cache_enabled


def keys() -> _dispatch.Keys:
    """The process's borrowed keys, whose kernels are this module's."""
    return _dispatch._keys or _dispatch.keys(make_kernel, make_fallback)


@contextlib.contextmanager
def keys_excluded() -> Iterator[None]:
    """The body runs as if no region were open in this thread (the engine's keys excluded)."""
    k = keys()
    before = _is_excluded(k.ops), _is_excluded(k.all)
    _set_excluded(k.ops, True)
    _set_excluded(k.all, True)
    try:
        yield
    finally:
        _set_excluded(k.ops, before[0])
        _set_excluded(k.all, before[1])


# -- one call ---------------------------------------------------------------------------------
def make_kernel(op: OpOverload) -> Callable:
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


def make_fallback(op: OpOverload) -> Callable:
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
        cast = CAST.get(target) or functools.partial(_Tensor.to, dtype=target)
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
                            new_args[i] = cached_cast(a, dt, target, cast, cache, casts, rule.arg_names[i], lower)
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
                                items[j] = cached_cast(t, dt, target, cast, cache, casts, f"{rule.arg_names[i]}[{j}]", lower)
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
                            new_kwargs[n] = cached_cast(v, dt, target, cast, cache, casts, n, lower)
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
    cast = CAST[target]
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
                        new_args[i] = cached_cast(a, dt, target, cast, cache, None, "", lower)
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

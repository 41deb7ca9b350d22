"""The kernels: the bodies that apply a rule to one call (the ops key's kernel per policy
overload, the observing key's fallback): one function per cast policy, passing a call on, the
hand-off to native autocast (casting goes through ``_cast_cache``, named in-place and ``out=``
overloads through ``_inplace``).

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

import functools
import itertools
from typing import Callable, Iterator, Optional, Tuple

import torch
from torch._ops import OpOverload

from . import _compile_guard, _dispatch, _ops, _torch
from ._cast_cache import CAST, cached_cast
from ._devices import native_autocast_keys, tensor_on
from ._dispatch import KeyGuard
from ._inplace import into, write_back
from ._regions import Frame, _get_frame, innermost
from ._table import OpRule
from .events import Event, Level, Outcome, first_floating, input_dtypes
from .policy import CastPolicy
from .rules import compute_dtype, has_explicit_dtype

__all__ = ["keys", "keys_excluded", "make_kernel", "make_fallback"]

_FLOAT32 = torch.float32
_FLOAT64 = torch.float64
_LOWER = CastPolicy.LOWER
_FP32 = CastPolicy.FP32
_Tensor = torch.Tensor
_set_excluded = _torch.set_excluded
_is_excluded = _torch.is_excluded
_dispatch_modes = _torch.dispatch_mode_depth
_cache_on = torch._C.is_autocast_cache_enabled


def keys() -> _dispatch.Keys:
    """The process's borrowed keys, whose kernels are this module's."""
    return _dispatch._keys or _dispatch.keys(make_kernel, make_fallback)


def keys_excluded() -> KeyGuard:
    """A guard: its body runs as if no region were open in this thread (the engine's keys excluded)."""
    k = keys()
    return KeyGuard((k.ops, k.all))


# -- one call ---------------------------------------------------------------------------------
def make_kernel(op: OpOverload) -> Callable:
    """The kernel registered on the ops key for ``op``."""
    ops_key = _dispatch._keys.ops
    op_id = id(op)  # rules are keyed by id: an OpOverload's own hash is a Python method
    call = op._op

    tracing = _compile_guard.tracing
    below = _torch.keyset_after(ops_key)
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
        with KeyGuard((all_key,)):
            return op._op(*args, **kwargs)
    if frame is not None and frame.enabled and not _ops.is_composite(op):
        region = frame.region
        compiled = region.compiled
        if compiled.has_defaults:
            rule = compiled.default_rule(op)
            if rule is not None:
                return _apply(frame, rule, op, args, kwargs, Level.FALLBACK)
        if region.observer is not None:
            # The op's own C++ calls are its insides: not reported (they still reach the kernels).
            with KeyGuard((all_key,)):
                out = op._op(*args, **kwargs)
            inputs = input_dtypes(args, kwargs)
            if any(d.is_floating_point for d in inputs) and not _ops.is_view(op):
                _notify(region.observer, Event(op, Level.FALLBACK, Outcome.UNLISTED, None, None, None, inputs,
                                               first_floating(out), (), args, kwargs))
            return out
    return _pass_on(op, args, kwargs, all_key)


_NATIVE_AUTOCAST = native_autocast_keys()


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
    with KeyGuard(keys):
        return op._op(*args, **kwargs)


def _notify(observer: Callable[[Event], None], event: Event) -> None:
    """Call the observer with the engine's keys off: its own torch calls are not the user's."""
    with keys_excluded():
        observer(event)


# -- one call under a rule: one function per cast policy ---------------------------------------
# [Note: the rule, per cast policy]
# As ATen's autocast_mode.cpp, which has one small wrapper per CastPolicy: ``_apply`` looks the
# rule's policy up in ``_BY_POLICY`` and its function decides the dtype the call computes in;
# ``_cast_and_call`` then does what every policy does alike (cast the eligible inputs, call with
# the engine's keys excluded, report). What may be cast is ``rules.eligibility``'s predicate (the
# region's ``eligible``), asked of each tensor ``_inputs`` yields, here and in the fast path
# (``_apply_plain``) alike.
def _apply(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """Apply ``rule`` to one call: its cast policy's function decides, casts, calls, reports. A
    call passing a ``torch.dtype`` is not eligible (seed 003), and is reported so where it has a
    floating tensor of the region's device (elsewhere it goes on unseen, as every call there does:
    a CUDA region's check_policy took a CPU ``cross_entropy`` for a deviation); a rule left to
    native autocast (``Policy.native``; its action is ``None``) hands the call over."""
    if (rule.takes_dtype and rule.native is None and has_explicit_dtype(args, kwargs)
            and _reached(frame.region, rule, args, kwargs)):
        return _unchanged(frame, rule, op, args, kwargs, level, "explicit dtype")
    return _BY_POLICY[rule.action](frame, rule, op, args, kwargs, level)


def _lower(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """LOWER: every eligible input cast to the region's dtype."""
    return _cast_and_call(frame, rule, op, args, kwargs, level, frame.dtype)


def _fp32(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """FP32: every eligible input cast to float32."""
    return _cast_and_call(frame, rule, op, args, kwargs, level, _FLOAT32)


def _promote(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """PROMOTE: every eligible input cast to the widest eligible dtype (``rules.compute_dtype``);
    with none eligible, nothing is cast."""
    return _cast_and_call(frame, rule, op, args, kwargs, level, _decided(CastPolicy.PROMOTE, frame, rule, args, kwargs))


def _first(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """FIRST: every eligible input cast to the first one's dtype (an in-place ``self``: HPU's iadd)."""
    return _cast_and_call(frame, rule, op, args, kwargs, level, _decided(CastPolicy.FIRST, frame, rule, args, kwargs))


def _decided(action: CastPolicy, frame: Frame, rule: OpRule, args: tuple, kwargs: dict) -> Optional[torch.dtype]:
    """The dtype PROMOTE or FIRST computes in, from the eligible inputs' dtypes in argument order
    (``None``: none eligible). An in-place op's ``self`` counts (it is an input too; FIRST takes its
    dtype); under PROMOTE, other arguments the op writes do not (running statistics)."""
    region = frame.region
    protected = rule.protected if action is not CastPolicy.FIRST else ()
    dtypes = [t.dtype for i, _, t in _inputs(rule, args, kwargs, _input_only(rule, region))
              if not (i in protected and (i or "self" not in rule.into)) and region.eligible(t)]
    return compute_dtype(action, dtypes, frame.dtype, rule.name) if dtypes else None


def _input_only(rule: OpRule, region) -> bool:
    return rule.input_only and rule.casts_input_only(region.device_type)


def _inputs(rule: OpRule, args: tuple, kwargs: dict, input_only: bool) -> Iterator[Tuple[object, Optional[int], torch.Tensor]]:
    """The tensors a rule looks at, in argument order, as ``(position, index in a list or None,
    tensor)`` (a keyword argument's position is its name): an input-only rule looks at its first
    tensor alone, and what the op writes by keyword (``out=``) is not an input (``_inplace.into``)."""
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            yield i, None, a
            if input_only:
                return
        elif type(a) is list or type(a) is tuple:
            for j, t in enumerate(a):
                if isinstance(t, _Tensor):
                    yield i, j, t
    if not input_only:
        for n, v in kwargs.items():
            if isinstance(v, _Tensor) and n not in rule.written_names:
                yield n, None, v


def _cast_inputs(region, rule: OpRule, args: tuple, kwargs: dict, target: Optional[torch.dtype], lower: bool,
                 casts: Optional[list]) -> Tuple[tuple, dict, int]:
    """The call's arguments with its eligible inputs cast to ``target`` (through the cast cache),
    and how many were eligible. An argument the op writes is never replaced by a copy (its write
    would be lost); it still counts."""
    is_eligible = region.eligible
    cache = region.cache if _cache_on() else None
    cast = CAST.get(target) or functools.partial(_Tensor.to, dtype=target)
    new_args, new_kwargs, eligible = list(args), dict(kwargs), 0
    # Note [the order of casts]: native casts an op's arguments last to first (they are the
    # arguments of one C++ call, which GCC, torch's Linux compiler, evaluates right to left), so
    # the last argument's ToCopyBackward comes first and autograd runs it last; where one tensor
    # is cast for several arguments, its gradient's float32 sums follow that order. So the
    # arguments are cast last to first too (a list's items in order, as native's loop casts
    # them), and the events list the casts in argument order.
    inputs = _inputs(rule, args, kwargs, _input_only(rule, region))
    for argument in reversed([list(g) for _, g in itertools.groupby(inputs, key=lambda e: e[0])]):
        mine = [] if casts is not None else None
        for i, j, t in argument:
            if not is_eligible(t):
                continue
            eligible += 1
            if target is None or t.dtype is target or i in rule.protected:
                continue
            if type(i) is str:
                new_kwargs[i] = cached_cast(t, t.dtype, target, cast, cache, mine, i, lower)
            elif j is None:
                new_args[i] = cached_cast(t, t.dtype, target, cast, cache, mine, rule.arg_names[i], lower)
            else:
                if new_args[i] is args[i]:
                    new_args[i] = list(args[i])
                new_args[i][j] = cached_cast(t, t.dtype, target, cast, cache, mine, f"{rule.arg_names[i]}[{j}]",
                                             lower)
        if mine:
            casts[0:0] = mine
    for i, a in enumerate(args):
        if type(a) is tuple and new_args[i] is not a:
            new_args[i] = tuple(new_args[i])
    return new_args, new_kwargs, eligible


def _reached(region, rule: OpRule, args: tuple, kwargs: dict) -> bool:
    """Whether the call has a floating tensor of the region's device (float64 included): else native
    autocast's kernel would not have been reached."""
    on_device = tensor_on(region.device_type)
    return any(t.is_floating_point() and on_device(t)
               for _, _, t in _inputs(rule, args, kwargs, _input_only(rule, region)))


def _cast_and_call(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level,
                   target: Optional[torch.dtype]):
    """What every cast policy does alike: with the engine's keys excluded (the call's insides are
    its own, as native autocast excludes its key), cast the eligible inputs to ``target`` (``None``:
    none), call, report. A call with no floating tensor of the region's device goes on as if the
    engine were not there (no event)."""
    region = frame.region
    casts = [] if region.observer is not None else None
    k = _dispatch._keys
    with KeyGuard((k.ops, k.all)):
        new_args, new_kwargs, eligible = _cast_inputs(region, rule, args, kwargs, target, target is frame.dtype, casts)
        if eligible or _reached(region, rule, args, kwargs):
            return _call(frame, rule, op, args, kwargs, level, target, new_args, new_kwargs, eligible, casts)
    return _pass_on(op, args, kwargs, k.ops, k.all)


def _call(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level,
          target: Optional[torch.dtype], new_args: list, new_kwargs: dict, eligible: int, casts: Optional[list]):
    """Call the op on its cast arguments (into copies for a named in-place or ``out=`` overload),
    and report (``_cast_and_call``, with the engine's keys excluded)."""
    if rule.banned is not None:
            raise RuntimeError(f"{rule.name}: {rule.banned}")
    if rule.into and target is not None:
        new_args, new_kwargs, written = into(rule, new_args, new_kwargs, target, frame.region.eligible)
        out = op._op(*new_args, **new_kwargs)
        if written:
            out = write_back(written, out)
    else:
        out = op._op(*new_args, **new_kwargs)
    observer = frame.region.observer
    if observer is not None:
        if eligible:
            # What it ran in: the cast dtype, unless an input the rule leaves alone (float64)
            # promoted the result beyond it.
            event = Event(op, level, Outcome.CAST, rule.action, rule.default, None, input_dtypes(args, kwargs),
                          first_floating(out) or target, tuple(casts), args, kwargs)
        else:  # every floating input on the device is float64
            event = Event(op, level, Outcome.INELIGIBLE, rule.action, rule.default, "float64",
                          input_dtypes(args, kwargs), first_floating(out), (), args, kwargs)
        observer(event)
    return out


def _apply_plain(frame: Frame, rule: OpRule, call: Callable, args: tuple, ops_key):
    """``_apply`` for the commonest call, specialised: a LOWER or FP32 rule with nothing else to
    consider (``OpRule.plain``), positional arguments, a region that does not observe (so the
    fallback's key needs no switching off). The same decisions, fewer steps: the cost of a cast
    op is this function. List arguments (``cat``) and calls with no eligible input go the long way."""
    lower = rule.action is _LOWER
    target = frame.dtype if lower else _FLOAT32
    cast = CAST[target]
    region = frame.region
    is_eligible = region.eligible
    cache = region.cache if _cache_on() else None
    new_args = list(args)
    eligible = False
    for i in range(len(args) - 1, -1, -1):  # last to first, as native (Note [the order of casts])
        a = args[i]
        if isinstance(a, _Tensor):
            if is_eligible(a):
                eligible = True
                dt = a.dtype
                if dt is not target:
                    if cache is not None and a.requires_grad:  # cached_cast's first test, done here: the hot path
                        new_args[i] = cached_cast(a, dt, target, cast, cache, None, "", lower)
                    else:
                        new_args[i] = cast(a)
        elif type(a) is list or type(a) is tuple:
            return _apply(frame, rule, rule.op, args, {}, Level.KERNEL)
    if not eligible:
        return _apply(frame, rule, rule.op, args, {}, Level.KERNEL)
    # Not a KeyGuard: its ~0.4 us would be 7% of a cast op; the one key is switched by hand and
    # reset, which restores it (Note: excluding keys around a call, in _dispatch).
    _set_excluded(ops_key, True)
    try:
        return call(*new_args)
    finally:
        _set_excluded(ops_key, False)


def _to_native(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """Leave the call to native autocast's kernel for the op (``Policy.native``): its key is
    switched on for this one call, with the region's dtype, and the engine's keys off."""
    k = _dispatch._keys
    device = frame.region.device_type
    dtype_was = _native_get_dtype(device)
    _native_set_dtype(device, frame.dtype)
    try:
        with KeyGuard((k.ops, k.all), unexclude=(rule.native,)):
            out = op._op(*args, **kwargs)
    finally:
        _native_set_dtype(device, dtype_was)
    observer = frame.region.observer
    if observer is not None:
        _notify(observer, Event(op, level, Outcome.NATIVE, None, None, None, input_dtypes(args, kwargs),
                                first_floating(out), (), args, kwargs))
    return out


_native_get_dtype = torch._C.get_autocast_dtype
_native_set_dtype = torch._C.set_autocast_dtype


def _unchanged(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level,
               reason: str):
    """Run a call the rule does not apply to (``reason``), with the keys excluded: its insides are
    its own."""
    k = _dispatch._keys
    with KeyGuard((k.ops, k.all)):
        out = op._op(*args, **kwargs)
        observer = frame.region.observer
        if observer is not None:
            observer(Event(op, level, Outcome.INELIGIBLE, rule.action, rule.default, reason,
                           input_dtypes(args, kwargs), first_floating(out), (), args, kwargs))
        return out


#: The function for each rule's cast policy (``None``: a rule left to native autocast).
_BY_POLICY = {CastPolicy.LOWER: _lower, CastPolicy.FP32: _fp32, CastPolicy.PROMOTE: _promote,
              CastPolicy.FIRST: _first, None: _to_native}

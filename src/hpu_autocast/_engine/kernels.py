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
from typing import Callable, Iterator, Optional, Tuple

import torch

from . import dispatch as _dispatch, fp8 as _fp8
from .. import _torch
from .._torch import OpOverload, compile_guard as _compile_guard
from ..policies import _ops
from .cast_cache import CAST, cached_cast
from ..policies._devices import native_autocast_keys, tensor_on
from .dispatch import KeyGuard
from .inplace import into, write_back
from .regions import Frame, _get_frame, innermost
from ..policies._table import OpRule
from ..events import Event, Level, Outcome, first_floating, input_dtypes
from ..policies.policy import CastPolicy
from ..policies.rules import compute_dtype, has_explicit_dtype

__all__ = ["keys", "keys_excluded", "make_kernel", "make_fallback"]

_FLOAT32 = torch.float32
_Tensor = torch.Tensor
_is_excluded = _torch.is_excluded
_set_excluded = _torch.set_excluded
_dispatch_modes = _torch.dispatch_mode_depth
_cache_on = _torch.autocast_cache_enabled
_native_get_dtype = _torch.native_autocast_dtype
_native_set_dtype = _torch.set_native_autocast_dtype
_NATIVE_AUTOCAST = native_autocast_keys()
_KERNEL = Level.KERNEL  # an Enum member read from its class is a Python lookup


def keys() -> _dispatch.Keys:
    """The process's borrowed keys, whose kernels are this module's."""
    return _dispatch._keys or _dispatch.keys(make_kernel, make_fallback)


def keys_excluded():
    """A guard: its body runs as if no region were open in this thread (the engine's keys excluded)."""
    return keys().excluded()


# -- one call ---------------------------------------------------------------------------------
def make_kernel(op: OpOverload) -> Callable:
    """The kernel registered on the ops key for ``op``."""
    ops_key = _dispatch._keys.ops
    op_id = id(op)  # rules are keyed by id: an OpOverload's own hash is a Python method

    tracing = _compile_guard.tracing
    below = _torch.keyset_after(ops_key)
    # Positional arguments typed Tensor: a Python kernel receives a wrapped scalar (the 3 of
    # x / 3) there as a Python number, which a boxed redispatch refuses.
    slots = tuple(i for i, a in enumerate(op._schema.arguments)
                  if not a.kwarg_only and isinstance(a.type, _torch.TensorType))

    def kernel(keyset, *args, **kwargs):
        frame = _get_frame()
        if frame is None or frame.region.closed:
            frame = innermost()
        if _dispatch_modes() and tracing():  # tracing runs under a mode (fake tensors): eager skips the ask
            _compile_guard.install()
        if frame is not None:
            rule = frame.rules.get(op_id)
            if rule is not None:
                return _apply(frame, rule, op, args, kwargs, _KERNEL)
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
# As ATen's autocast_mode.cpp, which has one small ``WrapFunction_::call`` per CastPolicy: each
# cast policy is a function (``_TARGET``) that names the dtype the call's eligible inputs are
# cast to (``None``: none), after changing the call's dtype arguments where the policy does
# (FP32_SET_OPT_DTYPE sets them, FP32_APPEND_DTYPE calls the overload that takes one); then one
# walk over the arguments (``_cast_inputs``) casts the eligible ones, and ``_apply`` does what
# every policy does alike: call with the engine's keys excluded, report. What may be
# cast is ``rules.eligibility``'s predicate (the region's ``eligible``). csrc/core.cpp has the
# same shape in C++, and tests/test_cast_policies.py runs the same cases against both.
class _Call:
    """One call under a rule, as a cast policy's function sees it: it may change ``op`` (the
    overload called), ``args`` and ``kwargs`` (the dtype arguments; the casts); ``compute`` and
    ``reason``, what the event says the
    call computed in and why, where the function knows better than the output (an fp8 GEMM)."""

    __slots__ = ("frame", "rule", "op", "args", "kwargs", "compute", "reason")

    def __init__(self, frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict) -> None:
        self.frame, self.rule, self.op, self.args, self.kwargs = frame, rule, op, args, kwargs
        self.compute = self.reason = None

    def first_eligible(self) -> bool:
        """ATen's ``firstarg_is_eligible``: the first argument is a tensor the region may cast."""
        return bool(self.args) and isinstance(self.args[0], _Tensor) and self.frame.region.eligible(self.args[0])


def _apply(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """Apply ``rule`` to one call: its cast policy's function names the target (``None``: none),
    then what every policy does alike: with the engine's keys excluded (its insides are its own,
    as native excludes its key), the walk casts, the op is called (into copies for a named
    in-place or ``out=`` overload), the observer told. A call with no floating tensor of the
    region's device goes on as made (no event), as does one passing a ``torch.dtype`` where the
    policy leaves those alone (seed 003; ``OpRule.leave_explicit``; reported); a rule left to
    native autocast (``Policy.native``; action ``None``) hands the call over."""
    region = frame.region
    if rule.action is None:
        return _to_native(frame, rule, op, args, kwargs, level)
    if rule.leave_explicit and has_explicit_dtype(args, kwargs) and _reached(region, rule, args, kwargs):
        return _unchanged(frame, rule, op, args, kwargs, level, "explicit dtype")
    call = _Call(frame, rule, op, args, kwargs)
    target = _TARGET[rule.action](call)
    casts = [] if region.observer is not None else None
    # KeyGuard((ops, all)) written out, its rule kept (each key back as it was): on the cast
    # op's path a guard object, even torch's C++ one, costs 0.6 us more than these calls.
    ops, all_ = _dispatch._keys.ops, _dispatch._keys.all
    was_ops, was_all = _is_excluded(ops), _is_excluded(all_)
    _set_excluded(ops, True)
    _set_excluded(all_, True)
    try:
        eligible = _cast_inputs(call, target, casts)
        if not (eligible or _reached(region, rule, args, kwargs)):
            return _pass_on(op, args, kwargs, ops, all_)
        if rule.banned is not None:
            raise RuntimeError(f"{rule.name}: {rule.banned}")
        out = _into(call, target) if rule.into and target is not None else call.op._op(*call.args, **call.kwargs)
        if region.observer is not None:
            region.observer(_event(call, op, level, target, args, kwargs, out, eligible, casts))
    finally:
        _set_excluded(ops, was_ops)
        _set_excluded(all_, was_all)
    return out


def _lower(call: _Call) -> torch.dtype:
    """LOWER: every eligible input cast to the region's dtype; in an fp8 region, to bfloat16, and a
    GEMM runs as a scaled fp8 product where it can (``_fp8.route``; its Note: fp8 regions)."""
    frame = call.frame
    return frame.lower if frame.lower is frame.dtype else _fp8.route(call)  # else fp8 (casts to bfloat16)


def _fp32(call: _Call) -> torch.dtype:
    """FP32: every eligible input cast to float32."""
    return _FLOAT32


def _set_opt_dtype(call: _Call) -> None:
    """FP32_SET_OPT_DTYPE: if the first argument is eligible, each dtype argument the call leaves
    unset becomes float32 (ATen's ``set_opt_dtype``); nothing is cast."""
    if call.first_eligible():
        args, kwargs, names = list(call.args), dict(call.kwargs), call.rule.arg_names
        for i in call.rule.dtype_args:
            if i < len(args):
                args[i] = _FLOAT32 if args[i] is None else args[i]
            elif kwargs.get(names[i]) is None:
                kwargs[names[i]] = _FLOAT32
        call.args, call.kwargs = tuple(args), kwargs
    return None


def _append_dtype(call: _Call) -> None:
    """FP32_APPEND_DTYPE: call the overload that takes a dtype (``OpRule.redispatch``) with
    float32 if the first argument is eligible, else the first argument's dtype (ATen's
    ``type_from_firstarg``); nothing is cast."""
    rule, args = call.rule, call.args
    dtype = _FLOAT32 if call.first_eligible() else args[0].dtype
    schema = rule.op._schema.arguments
    full = [args[i] if i < len(args) else call.kwargs.get(a.name, a.default_value) for i, a in enumerate(schema)]
    call.op = rule.redispatch
    call.args = tuple(v for v, a in zip(full, schema) if not a.kwarg_only)
    call.kwargs = {**{a.name: v for v, a in zip(full, schema) if a.kwarg_only},
                   rule.redispatch._schema.arguments[-1].name: dtype}
    return None


def _decided(action: CastPolicy, call: _Call) -> Optional[torch.dtype]:
    """PROMOTE (every eligible input cast to the widest eligible dtype) and FIRST (to the first
    one's: an in-place ``self``, HPU's iadd): the dtype from the eligible inputs' dtypes in argument
    order (``rules.compute_dtype``; ``None``: none eligible, nothing cast). An in-place op's
    ``self`` counts (it is an input too; FIRST takes its dtype); under PROMOTE, other arguments
    the op writes do not (running statistics)."""
    region, rule = call.frame.region, call.rule
    protected = rule.protected if action is not CastPolicy.FIRST else ()
    dtypes = [t.dtype for i, _, t in _inputs(rule, call.args, call.kwargs, region.device_type)
              if not (i in protected and (i or "self" not in rule.into)) and region.eligible(t)]
    return compute_dtype(action, dtypes, call.frame.lower, rule.name) if dtypes else None


#: Each cast policy's function (Note: the rule, per cast policy).
_TARGET = {CastPolicy.LOWER: _lower, CastPolicy.FP32: _fp32, CastPolicy.FP32_SET_OPT_DTYPE: _set_opt_dtype,
           CastPolicy.FP32_APPEND_DTYPE: _append_dtype, CastPolicy.PROMOTE: functools.partial(_decided, CastPolicy.PROMOTE),
           CastPolicy.FIRST: functools.partial(_decided, CastPolicy.FIRST)}


def _inputs(rule: OpRule, args: tuple, kwargs: dict, device_type: str) -> Iterator[Tuple[object, Optional[int], torch.Tensor]]:
    """The tensors a rule looks at (``_positions``), in argument order, as ``(position, index in a
    list or None, tensor)``."""
    for i in _positions(rule, args, kwargs, device_type):
        a = kwargs[i] if type(i) is str else args[i]
        if isinstance(a, _Tensor):
            yield i, None, a
        elif type(a) is list or type(a) is tuple:
            yield from ((i, j, t) for j, t in enumerate(a) if isinstance(t, _Tensor))


def _cast_inputs(call: _Call, target: Optional[torch.dtype], casts: Optional[list]) -> int:
    """The one walk: cast the call's eligible inputs to ``target`` (``None``: none; through the
    cast cache), in place of ``call.args``/``call.kwargs``, and return how many were eligible. An
    argument the op writes is never replaced by a copy (its write would be lost); it still counts."""
    region, rule = call.frame.region, call.rule
    is_eligible, protected = region.eligible, rule.protected
    cast = CAST.get(target) or functools.partial(_Tensor.to, dtype=target)
    args, kwargs, eligible = list(call.args), call.kwargs, 0
    # Note [the order of casts]: native casts an op's arguments last to first (they are the
    # arguments of one C++ call, which GCC, torch's Linux compiler, evaluates right to left), so
    # the last argument's ToCopyBackward comes first and autograd runs it last; where one tensor
    # is cast for several arguments, its gradient's float32 sums follow that order. So the
    # arguments are cast last to first too (a list's items in order, as native's loop casts
    # them), and the events list the casts in argument order.
    for i in reversed(_positions(rule, args, kwargs, region.device_type)):
        a = args[i] if type(i) is int else kwargs[i]
        if isinstance(a, _Tensor):
            if not is_eligible(a):
                continue
            eligible += 1
            if target is None or a.dtype is target or i in protected:
                continue
            if casts is None and not a.requires_grad:
                a = cast(a)  # no cache entry possible, nothing to report: cached_cast's first test
            else:
                a = _cached(call, a, target, cast, casts, i if type(i) is str else rule.arg_names[i])
            if type(i) is int:
                args[i] = a
            else:
                kwargs = dict(kwargs) if kwargs is call.kwargs else kwargs
                kwargs[i] = a
        elif type(a) is list or type(a) is tuple:
            eligible += _cast_list(call, args, i, target, cast, casts)
    call.args, call.kwargs = args, kwargs
    return eligible


def _cached(call: _Call, t: torch.Tensor, target: torch.dtype, cast: Callable, casts: Optional[list],
            arg: str) -> torch.Tensor:
    """``t`` cast through the cast cache (``cached_cast``), its cast put first in ``casts``."""
    frame = call.frame
    cache = frame.region.cache if _cache_on() else None
    mine = [] if casts is not None else None
    copy = cached_cast(t, t.dtype, target, cast, cache, mine, arg, target is frame.lower)
    if mine:
        casts[0:0] = mine
    return copy


def _cast_list(call: _Call, args: list, i: int, target: Optional[torch.dtype], cast: Callable,
               casts: Optional[list]) -> int:
    """``_cast_inputs`` for a list argument (``cat``'s tensors), its items in order: ``args[i]``
    becomes a list of the same type with the eligible items cast; returns how many were eligible."""
    rule, is_eligible, items = call.rule, call.frame.region.eligible, args[i]
    mine = [] if casts is not None else None
    copies, eligible = None, 0
    for j, t in enumerate(items):
        if not (isinstance(t, _Tensor) and is_eligible(t)):
            continue
        eligible += 1
        if target is None or t.dtype is target or i in rule.protected:
            continue
        copies = copies or list(items)
        copies[j] = _cached(call, t, target, cast, mine, f"{rule.arg_names[i]}[{j}]")
    if copies is not None:
        args[i] = type(items)(copies)
    if mine:
        casts[0:0] = mine
    return eligible


def _positions(rule: OpRule, args: list, kwargs: dict, device_type: str) -> list:
    """Where the tensors a rule looks at are, in argument order (a keyword argument's position is
    its name): a tensor or a list of them; an input-only rule stops at its first tensor, and what
    the op writes by keyword (``out=``) is not an input (``_inplace.into``). Where the schema
    says (``OpRule.walk``: no list of tensors, no keyword tensor), looked up, not found: the
    positions typed ``Tensor`` (one may hold ``None`` or a wrapped scalar's number)."""
    walk = rule.walk
    if walk is not None and len(args) < len(walk):  # (more: not a call as the dispatcher makes it)
        return walk[len(args)]
    input_only, out = rule.input_only and rule.casts_input_only(device_type), []
    for i, a in enumerate(args):
        if isinstance(a, _Tensor) or type(a) is list or type(a) is tuple:
            out.append(i)
            if input_only and isinstance(a, _Tensor):
                return out
    if not input_only:
        out += [n for n, v in kwargs.items() if isinstance(v, _Tensor) and n not in rule.written_names]
    return out


def _reached(region, rule: OpRule, args: tuple, kwargs: dict) -> bool:
    """Whether the call has a floating tensor of the region's device (float64 included): else native
    autocast's kernel would not have been reached."""
    on_device = tensor_on(region.device_type)
    return any(t.is_floating_point() and on_device(t)
               for _, _, t in _inputs(rule, args, kwargs, region.device_type))


def _into(call: _Call, target: torch.dtype):
    """Call a named in-place or ``out=`` overload: it computes into copies in ``target``, written
    back (``_inplace``)."""
    args, kwargs, written = into(call.rule, call.args, call.kwargs, target, call.frame.region.eligible)
    out = call.op._op(*args, **kwargs)
    return write_back(written, out) if written else out


def _event(call: _Call, op: OpOverload, level: Level, target: Optional[torch.dtype], args: tuple, kwargs: dict,
           out, eligible: int, casts: list) -> Event:
    """What the observer hears of a call a rule applied to (the user's ``args`` and ``kwargs``)."""
    rule = call.rule
    if eligible:  # what it ran in: the cast dtype, unless an input left alone (float64) promoted it
        return Event(op, level, Outcome.CAST, rule.action, rule.default, call.reason, input_dtypes(args, kwargs),
                     call.compute or first_floating(out) or target, tuple(casts), args, kwargs)
    # every floating input on the device is float64
    return Event(op, level, Outcome.INELIGIBLE, rule.action, rule.default, "float64",
                 input_dtypes(args, kwargs), first_floating(out), (), args, kwargs)


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


def _unchanged(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level,
               reason: str):
    """Run a call the rule does not apply to (``reason``), with the keys excluded: its insides are
    its own."""
    with _dispatch._keys.excluded():
        out = op._op(*args, **kwargs)
        observer = frame.region.observer
        if observer is not None:
            observer(Event(op, level, Outcome.INELIGIBLE, rule.action, rule.default, reason,
                           input_dtypes(args, kwargs), first_floating(out), (), args, kwargs))
        return out


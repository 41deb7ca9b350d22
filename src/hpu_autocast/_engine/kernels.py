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
from typing import Callable, NamedTuple, Optional

import torch

from . import dispatch as _dispatch, fp8 as _fp8
from .. import _torch
from .._torch import OpOverload, compile_guard as _compile_guard
from .._facts import ops as _ops
from .._facts.devices import native_autocast_keys
from .dispatch import KeyGuard
from .inplace import into, write_back
from .walk import cast_inputs, inputs, reached
from .regions import Frame, _get_frame, innermost
from .compiled import OpRule
from ..events import Event, Level, Outcome, first_floating, input_dtypes
from ..policies.policy import CastPolicy
from ..policies.rules import compute_dtype, has_explicit_dtype

__all__ = ["keys", "keys_excluded", "make_kernel", "make_fallback"]

_FLOAT32 = torch.float32
_Tensor = torch.Tensor
_is_excluded = _torch.is_excluded
_dispatch_modes = _torch.dispatch_mode_depth
_native_get_dtype = _torch.native_autocast_dtype
_native_set_dtype = _torch.set_native_autocast_dtype
_op_function = _torch.op_function
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
    slots = tuple(
        i
        for i, a in enumerate(_torch.schema(op).arguments)
        if not a.kwarg_only and isinstance(a.type, _torch.TensorType)
    )

    def kernel(keyset, *args, **kwargs):
        frame = _get_frame()
        if frame is None or frame.open.closed:
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
            return _op_function(op)(*args, **kwargs)
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
                out = _op_function(op)(*args, **kwargs)
            inputs = input_dtypes(args, kwargs)
            if any(d.is_floating_point for d in inputs) and not _ops.is_view(op):
                _notify(
                    region.observer,
                    Event(
                        op=op,
                        level=Level.FALLBACK,
                        outcome=Outcome.UNLISTED,
                        action=None,
                        default=None,
                        reason=None,
                        inputs=inputs,
                        compute=first_floating(out),
                        casts=(),
                        args=args,
                        kwargs=kwargs,
                    ),
                )
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
        return _op_function(op)(*args, **kwargs)


def _notify(observer: Callable[[Event], None], event: Event) -> None:
    """Call the observer with the engine's keys off: its own torch calls are not the user's."""
    with keys_excluded():
        observer(event)


# -- one call under a rule: one function per cast policy ---------------------------------------
# [Note: the rule, per cast policy]
# As ATen's autocast_mode.cpp, which has one small ``WrapFunction_::call`` per CastPolicy: each
# cast policy is a function of the call, ``(frame, rule, op, args, kwargs)``, that returns it as
# it will run (a ``_Plan``): the dtype its eligible inputs are cast to (``None``: none), the
# overload and the arguments called, changed where the policy changes them (FP32_SET_OPT_DTYPE
# sets the unset dtype arguments, FP32_APPEND_DTYPE calls the overload that takes one, an fp8
# region's LOWER replaces a GEMM's overload by its scaled product), and why it ran as it did
# where the function knows better than the output (an fp8 GEMM kept in bfloat16). Then one walk
# over the arguments (``_walk.cast_inputs``) casts the eligible ones, and ``_apply`` does what every
# policy does alike: call with the engine's keys excluded, report. What may be cast is
# ``rules.eligibility``'s predicate (the region's ``eligible``). csrc/core.cpp has the same shape
# in C++, and tests/test_cast_policies.py runs the same cases against both. The speed is the
# core's: these kernels are the readable reference (docs/performance.md has what that costs).
class Plan(NamedTuple):
    """A call as a cast policy's function says it will run."""

    target: Optional[torch.dtype]  #: the dtype its eligible inputs are cast to (``None``: none)
    call: object  #: the overload called (an fp8 region's GEMM: a ``_fp8.Gemm``)
    args: tuple  #: the positional arguments it is called with
    kwargs: dict  #: and the keyword ones
    why: Optional[str] = None  #: why it ran as it did, where the function knows better than the output


#: ``_new(Plan, (...))`` makes a plan: a NamedTuple's own ``__new__`` is a Python function over this,
#: and a plan is made per call.
_new = tuple.__new__


def _apply(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """Apply ``rule`` to one call: its cast policy's function plans it (``Plan``), then what
    every policy does alike: with the engine's keys excluded (its insides are its own, as native
    excludes its key), the walk casts, the op is called (into copies for a named in-place or
    ``out=`` overload), the observer told. A call with no floating tensor of the region's
    device goes on as made (no event), as does one passing a ``torch.dtype`` where the policy
    leaves those alone (seed 003; ``OpRule.leave_explicit``; reported); a rule left to native
    autocast (``Policy.native``; action ``None``) hands the call over."""
    region = frame.region
    if rule.action is None:
        return _to_native(frame, rule, op, args, kwargs, level)
    if rule.leave_explicit and has_explicit_dtype(args, kwargs) and reached(region, rule, args, kwargs):
        return _unchanged(frame, rule, op, args, kwargs, level, "explicit dtype")
    target, call, call_args, call_kwargs, why = _POLICY[rule.action](frame, rule, op, args, kwargs)
    observer = region.observer
    keys = _dispatch._keys
    with keys.excluded():  # the op's insides are its own, as native excludes its key
        eligible, call_args, call_kwargs, casts = cast_inputs(
            frame, rule, call_args, call_kwargs, target, observe=observer is not None
        )
        if not (eligible or reached(region, rule, args, kwargs)):
            return _pass_on(op, args, kwargs, keys.ops, keys.all)
        if rule.banned is not None:
            raise RuntimeError(f"{rule.name}: {rule.banned}")
        if rule.into and target is not None:
            out = _into(frame, rule, call, call_args, call_kwargs, target)
        else:
            out = _op_function(call)(*call_args, **call_kwargs) if call_kwargs else _op_function(call)(*call_args)
        if observer is not None:
            observer(_event(rule, op, level, target, args, kwargs, out, eligible, casts, call, why))
    return out


def _lower(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict) -> Plan:
    """LOWER: every eligible input cast to the region's dtype; in an fp8 region, to bfloat16, and a
    GEMM runs as a scaled fp8 product where it can (``_fp8.route``; its Note: fp8 regions)."""
    lower = frame.lower
    if lower is frame.dtype:
        return _new(Plan, (lower, op, args, kwargs, None))
    call, why = _fp8.route(frame, op, args, kwargs)
    # an fp8 product quantizes the inputs as passed (a float32 master weight directly): no cast
    return _new(Plan, (None if type(call) is _fp8.Gemm else lower, call, args, kwargs, why))


def _fp32(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict) -> Plan:
    """FP32: every eligible input cast to float32."""
    return _new(Plan, (_FLOAT32, op, args, kwargs, None))


def _set_opt_dtype(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict) -> Plan:
    """FP32_SET_OPT_DTYPE: if the first argument is eligible, each dtype argument the call leaves
    unset becomes float32 (ATen's ``set_opt_dtype``); nothing is cast."""
    if _first_eligible(frame, args):
        args, kwargs, names = list(args), dict(kwargs), rule.arg_names
        for i in rule.dtype_args:
            if i < len(args):
                args[i] = _FLOAT32 if args[i] is None else args[i]
            elif kwargs.get(names[i]) is None:
                kwargs[names[i]] = _FLOAT32
        args = tuple(args)
    return _new(Plan, (None, op, args, kwargs, None))


def _append_dtype(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict) -> Plan:
    """FP32_APPEND_DTYPE: call the overload that takes a dtype (``OpRule.redispatch``) with
    float32 if the first argument is eligible, else the first argument's dtype (ATen's
    ``type_from_firstarg``); nothing is cast."""
    dtype = _FLOAT32 if _first_eligible(frame, args) else args[0].dtype
    schema = _torch.schema(rule.op).arguments
    full = [args[i] if i < len(args) else kwargs.get(a.name, a.default_value) for i, a in enumerate(schema)]
    positional = tuple(v for v, a in zip(full, schema) if not a.kwarg_only)
    keywords = {
        **{a.name: v for v, a in zip(full, schema) if a.kwarg_only},
        _torch.schema(rule.redispatch).arguments[-1].name: dtype,
    }
    return _new(Plan, (None, rule.redispatch, positional, keywords, None))


def _decided(action: CastPolicy, frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict) -> Plan:
    """PROMOTE (every eligible input cast to the widest eligible dtype) and FIRST (to the first
    one's: an in-place ``self``, HPU's iadd): the dtype from the eligible inputs' dtypes in argument
    order (``rules.compute_dtype``; ``None``: none eligible, nothing cast). An in-place op's
    ``self`` counts (it is an input too; FIRST takes its dtype); under PROMOTE, other arguments
    the op writes do not (running statistics)."""
    region = frame.region
    protected = rule.protected if action is not CastPolicy.FIRST else ()
    dtypes = [
        t.dtype
        for i, _, t in inputs(rule, args, kwargs, region.device_type)
        if not (i in protected and (i or "self" not in rule.into)) and region.eligible(t)
    ]
    target = compute_dtype(action, dtypes, frame.lower, rule.name) if dtypes else None
    return _new(Plan, (target, op, args, kwargs, None))


def _first_eligible(frame: Frame, args: tuple) -> bool:
    """ATen's ``firstarg_is_eligible``: the first argument is a tensor the region may cast."""
    return bool(args) and isinstance(args[0], _Tensor) and frame.region.eligible(args[0])


#: Each cast policy's function (Note: the rule, per cast policy).
_POLICY = {
    CastPolicy.LOWER: _lower,
    CastPolicy.FP32: _fp32,
    CastPolicy.FP32_SET_OPT_DTYPE: _set_opt_dtype,
    CastPolicy.FP32_APPEND_DTYPE: _append_dtype,
    CastPolicy.PROMOTE: functools.partial(_decided, CastPolicy.PROMOTE),
    CastPolicy.FIRST: functools.partial(_decided, CastPolicy.FIRST),
}


def _into(frame: Frame, rule: OpRule, op, args: list, kwargs: dict, target: torch.dtype):
    """Call a named in-place or ``out=`` overload: it computes into copies in ``target``, written
    back (``_inplace``)."""
    args, kwargs, written = into(rule, args, kwargs, target, frame.region.eligible)
    out = _op_function(op)(*args, **kwargs)
    return write_back(written, out) if written else out


def _event(
    rule: OpRule,
    op: OpOverload,
    level: Level,
    target: Optional[torch.dtype],
    args: tuple,
    kwargs: dict,
    out,
    eligible: int,
    casts: tuple,
    called,
    why: Optional[str],
) -> Event:
    """What the observer hears of a call a rule applied to (the user's ``args`` and ``kwargs``;
    ``called``, what ran: an fp8 product says it computed in e4m3)."""
    if eligible:  # what it ran in: the cast dtype, unless an input left alone (float64) promoted it
        compute = _fp8.E4M3 if type(called) is _fp8.Gemm else first_floating(out) or target
        return Event(
            op=op,
            level=level,
            outcome=Outcome.CAST,
            action=rule.action,
            default=rule.default,
            reason=why,
            inputs=input_dtypes(args, kwargs),
            compute=compute,
            casts=casts,
            args=args,
            kwargs=kwargs,
        )
    # every floating input on the device is float64
    return Event(
        op=op,
        level=level,
        outcome=Outcome.INELIGIBLE,
        action=rule.action,
        default=rule.default,
        reason="float64",
        inputs=input_dtypes(args, kwargs),
        compute=first_floating(out),
        casts=(),
        args=args,
        kwargs=kwargs,
    )


def _to_native(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level):
    """Leave the call to native autocast's kernel for the op (``Policy.native``): its key is
    switched on for this one call, with the region's dtype, and the engine's keys off."""
    k = _dispatch._keys
    device = frame.region.device_type
    dtype_was = _native_get_dtype(device)
    _native_set_dtype(device, frame.dtype)
    try:
        with KeyGuard((k.ops, k.all), unexclude=(rule.native,)):
            out = _op_function(op)(*args, **kwargs)
    finally:
        _native_set_dtype(device, dtype_was)
    observer = frame.region.observer
    if observer is not None:
        _notify(
            observer,
            Event(
                op=op,
                level=level,
                outcome=Outcome.NATIVE,
                action=None,
                default=None,
                reason=None,
                inputs=input_dtypes(args, kwargs),
                compute=first_floating(out),
                casts=(),
                args=args,
                kwargs=kwargs,
            ),
        )
    return out


def _unchanged(frame: Frame, rule: OpRule, op: OpOverload, args: tuple, kwargs: dict, level: Level, reason: str):
    """Run a call the rule does not apply to (``reason``), with the keys excluded: its insides are
    its own."""
    with _dispatch._keys.excluded():
        out = _op_function(op)(*args, **kwargs)
        observer = frame.region.observer
        if observer is not None:
            observer(
                Event(
                    op=op,
                    level=level,
                    outcome=Outcome.INELIGIBLE,
                    action=rule.action,
                    default=rule.default,
                    reason=reason,
                    inputs=input_dtypes(args, kwargs),
                    compute=first_floating(out),
                    casts=(),
                    args=args,
                    kwargs=kwargs,
                )
            )
        return out

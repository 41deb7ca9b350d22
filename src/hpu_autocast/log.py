"""The decision log: one compact line per op the engine intercepted, through ``logging``.

    aten.linear.default  lower  f32,f32,f32 -> bf16
    aten.relu.default  not listed  bf16 -> bf16
    aten.cross_entropy_loss.default  fp32  bf16,i64 -> f32

Each line reads ``overload  action  input dtypes -> compute dtype``. The action is what
decided the call: the policy's ``lower``/``fp32``/``promote``/``first``, ``not listed``, or
``ineligible: <why>`` (``in-place``, ``out=``, ``explicit dtype``, ``float64``).

[Note: which calls are logged] The engine reports every call it intercepts; the log (and the
report, which shares ``classify``) keeps those where a precision decision exists: calls with
at least one floating tensor input, minus views of unlisted ops (``t``, ``detach``, ...),
which neither compute nor cast. A composite the function level handled (``linear``) is one
line; its insides run with the policy suppressed and are not reported. Function-level
reports of calls the policy leaves alone are dropped: the same call reaches the dispatch
level, which reports it by exact overload.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple, Optional, Tuple

import torch
from torch._ops import OpOverload

from . import _ops

__all__ = ["Decision", "classify", "format_line", "make_log_observer", "combine_observers", "short_dtype"]

#: The logger the decision lines go to, at DEBUG.
LOGGER_NAME = "hpu_autocast"

_SHORT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


def short_dtype(dtype: Optional[torch.dtype]) -> str:
    """``torch.bfloat16`` -> ``bf16`` (``-`` for ``None``)."""
    if dtype is None:
        return "-"
    return _SHORT.get(dtype) or str(dtype).replace("torch.", "")


class Decision(NamedTuple):
    """One intercepted call, as the log and the report see it."""

    op: str                            #: overload name, ``aten.mm.default``
    action: str                        #: ``lower``, ``not listed``, ``ineligible: in-place``, ...
    inputs: Tuple[torch.dtype, ...]    #: dtypes of the tensor inputs, in argument order
    compute: Optional[torch.dtype]     #: the dtype the op computes in
    level: str                         #: ``function`` or ``dispatch``

    def line(self) -> str:
        return format_line(self)


def format_line(d: Decision) -> str:
    ins = ",".join(short_dtype(t) for t in d.inputs)
    return f"{d.op}  {d.action}  {ins} -> {short_dtype(d.compute)}"


def _tensors(args: tuple, kwargs: dict):
    """Tensor inputs in argument order (lists such as ``cat``'s flattened); ``out=`` excluded."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for t in a:
                if isinstance(t, torch.Tensor):
                    yield t
    for k, v in kwargs.items():
        if k != "out" and isinstance(v, torch.Tensor):
            yield v


def _promoted(tensors) -> Optional[torch.dtype]:
    """The floating dtype torch's type promotion gives ``tensors``: dimensioned tensors win
    over zero-dimensional ones of the same category, as in ``torch.result_type``."""
    dims = [t.dtype for t in tensors if t.is_floating_point() and t.dim() > 0]
    if not dims:
        dims = [t.dtype for t in tensors if t.is_floating_point()]
    out = None
    for d in dims:
        out = d if out is None else torch.promote_types(out, d)
    return out


def _explicit_dtype(args: tuple, kwargs: dict) -> Optional[torch.dtype]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.dtype):
            return a
    return None


def classify(level: str, rule, func: Any, reason: str, args: tuple, kwargs: dict,
             target: Optional[torch.dtype], compiled=None) -> Optional[Decision]:
    """Turn one observer call into a ``Decision``; ``None`` for calls the log leaves out
    (see the note at the top of this module). With the region's compiled policy, a rule that
    comes from the policy's defaults for ops not in its table (HMP's "run in the dtype of the
    first input") is marked: ``first (unlisted)``, ``first (in-place)``."""
    if rule is None and level == "function":
        return None
    tensors = list(_tensors(args, kwargs))
    floating = [t for t in tensors if t.is_floating_point()]
    if not floating:
        return None
    inputs = tuple(t.dtype for t in tensors)
    if rule is not None:
        op = rule.name
        if reason == "explicit dtype":
            return Decision(op, "ineligible: explicit dtype", inputs, _explicit_dtype(args, kwargs), level)
        # The policy's action, unless no input was eligible because all are float64.
        written = rule.protected
        mine = [a for i, a in enumerate(args) if i not in written]
        mine_fl = [t for t in _tensors(tuple(mine), kwargs) if t.is_floating_point()]
        if mine_fl and all(t.dtype is torch.float64 for t in mine_fl):
            return Decision(op, "ineligible: float64", inputs, torch.float64, level)
        if compiled is not None and rule.op not in compiled.dispatch:
            reason = f"{reason} ({'in-place' if _ops.is_inplace(rule.op) else 'unlisted'})"
        return Decision(op, reason, inputs, target, level)
    # Dispatch level, not in the table: classify by the overload's schema.
    if not isinstance(func, OpOverload):
        return None
    if _ops.is_out(func):
        out = kwargs.get("out")
        compute = out.dtype if isinstance(out, torch.Tensor) else _promoted(floating)
        return Decision(str(func), "ineligible: out=", inputs, compute, level)
    if _ops.is_inplace(func):
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        compute = first.dtype if first is not None else _promoted(floating)
        return Decision(str(func), "ineligible: in-place", inputs, compute, level)
    if _is_view(func):
        return None
    return Decision(str(func), "not listed", inputs, _explicit_dtype(args, kwargs) or _promoted(floating), level)


def _compiled():
    from ._engine import current_engine

    engine = current_engine()
    region = engine.region if engine is not None else None
    return region.compiled if region is not None else None


def _is_view(op: OpOverload) -> bool:
    return any(r.alias_info is not None for r in op._schema.returns)


def make_log_observer(logger: Optional[logging.Logger] = None) -> Callable:
    """An engine observer writing one DEBUG line per decision to ``logger`` (default: the
    ``hpu_autocast`` logger). What ``HpuAutocastMode(verbose=True)`` installs.

    The lines are visible once that logger is enabled for DEBUG, e.g.
    ``logging.basicConfig(level=logging.DEBUG)``. When it is not, each call costs one
    ``isEnabledFor`` check; a region without ``verbose`` installs nothing.
    """
    log = logger if logger is not None else logging.getLogger(LOGGER_NAME)

    def observe(level, rule, func, reason, args, kwargs, target):
        if not log.isEnabledFor(logging.DEBUG):
            return
        d = classify(level, rule, func, reason, args, kwargs, target, _compiled())
        if d is not None:
            log.debug("%s", format_line(d))

    return observe


def combine_observers(*observers: Optional[Callable]) -> Optional[Callable]:
    """One observer calling each given one in order (``None`` entries skipped). A region has
    one observer slot; ``None`` when none is given, the observer itself when one is."""
    obs = tuple(o for o in observers if o is not None)
    if not obs:
        return None
    if len(obs) == 1:
        return obs[0]

    def observe(*event):
        for o in obs:
            o(*event)

    return observe

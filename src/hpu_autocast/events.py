"""What the engine tells an observer: one ``Event`` per op call it decided on.

    >>> seen = []
    >>> with HpuAutocastMode(torch.bfloat16, policy="torch-cpu", observer=seen.append):
    ...     torch.mm(a, b)
    >>> seen[0]
    Event(op=aten.mm.default, outcome=cast, action=lower, inputs=(f32, f32), compute=bf16, casts=2)

An event records what happened, not a second opinion: ``casts`` are the casts the engine made for
that call (``cached`` marks a copy served from the cast cache), ``compute`` the dtype it ran in.
The decision log (``log.py``), the precision report (``report.py``) and ``hpu_autocast.testing``
read events and derive nothing again.

[Note: which calls make events] Policy ops (the ops a region's table names) make an event for
every call the region decides on. A region with an observer also sees, through the fallback,
every other op that takes a floating tensor, as ``UNLISTED`` (or, under a policy with defaults
for such ops, HMP's, as ``CAST`` with ``default=True``); views of unlisted ops (``t``,
``detach``, ...) make no event, since they neither compute nor cast. An op the engine handled runs
its insides with the engine switched off, as under native autocast: ``F.cross_entropy`` is one
event, not its ``log_softmax`` and ``nll_loss``.
"""

from __future__ import annotations

import enum
from typing import NamedTuple, Optional, Tuple

import torch

from ._torch import OpOverload
from .policies.policy import CastPolicy

__all__ = ["Event", "Cast", "Outcome", "Level", "short_dtype", "input_dtypes", "first_floating"]


class Outcome(enum.Enum):
    """What the engine did with one call."""

    #: The policy's rule applied: eligible inputs were cast to ``compute`` (possibly none, when
    #: they already had that dtype).
    CAST = "cast"
    #: The op has a rule but this call is not eligible (``Event.reason``: ``explicit dtype``,
    #: ``float64``; ``disabled`` inside a ``torch.autocast(enabled=False)`` block of the region):
    #: it ran as its inputs are. A call with no floating tensor of the region's device makes no
    #: event (native autocast's kernel would not have been reached).
    INELIGIBLE = "ineligible"
    #: No rule: the op ran as its inputs are (reported to observing regions only).
    UNLISTED = "unlisted"
    #: Left to native autocast's kernel for the op (``Policy.native``: a custom op registered
    #: with ``torch.library.register_autocast``), which cast as it was registered to.
    NATIVE = "native"

    def __str__(self) -> str:
        return self.value


class Level(enum.Enum):
    """Where the engine met the call."""

    #: The kernel registered for a policy op (the overload is in the region's table).
    KERNEL = "kernel"
    #: The fallback, for ops no list names (seen when observing, or for a policy's defaults).
    FALLBACK = "fallback"

    def __str__(self) -> str:
        return self.value


class Cast(NamedTuple):
    """One input the engine cast."""

    arg: str  #: the schema's name of the argument (``self``, ``mat2``, ``tensors[1]``)
    from_dtype: torch.dtype  #: its dtype before
    to_dtype: torch.dtype  #: the dtype it was cast to
    nbytes: int  #: bytes the copy holds (``numel * to_dtype.itemsize``)
    cached: bool  #: served from the cast cache: no new copy was made for this call
    tensor: torch.Tensor  #: the input that was cast (the caller's tensor, not the copy)

    def __repr__(self) -> str:
        how = "cached" if self.cached else f"{self.nbytes} bytes"
        return f"Cast({self.arg}: {short_dtype(self.from_dtype)} -> {short_dtype(self.to_dtype)}, {how})"


class Event(NamedTuple):
    """One call the engine decided on (see the module's note for which calls make events)."""

    op: OpOverload  #: the overload, ``aten.mm.default``
    level: Level
    outcome: Outcome
    action: Optional[CastPolicy]  #: the rule's action; ``None`` when ``UNLISTED``
    default: Optional[str]  #: the policy default that made the rule: ``unlisted``/``in-place`` (HMP)
    reason: Optional[str]  #: why ``INELIGIBLE``; ``None`` otherwise
    inputs: Tuple[torch.dtype, ...]  #: tensor inputs' dtypes in argument order (lists flattened)
    compute: Optional[torch.dtype]  #: the dtype it ran in: its first floating output's (the cast dtype if none)
    casts: Tuple[Cast, ...]  #: the casts made for this call, in argument order
    args: tuple = ()  #: the call's positional inputs, as the caller passed them
    kwargs: dict = {}  #: its keyword-only inputs (keeping an event keeps these alive)
    module: Optional[str] = None  #: the innermost module a ``modules=`` map matched, in flight (``None``: none)

    @property
    def name(self) -> str:
        """``aten.mm.default``."""
        return str(self.op)

    @property
    def new_casts(self) -> int:
        """Casts that made a new copy (not served from the cache)."""
        return sum(1 for c in self.casts if not c.cached)

    @property
    def cast_bytes(self) -> int:
        """Bytes written by the new copies."""
        return sum(c.nbytes for c in self.casts if not c.cached)

    def __repr__(self) -> str:
        ins = ", ".join(short_dtype(d) for d in self.inputs)
        act = "" if self.action is None else f", action={self.action}"
        return (
            f"Event(op={self.op}, outcome={self.outcome}{act}, inputs=({ins}), "
            f"compute={short_dtype(self.compute)}, casts={len(self.casts)})"
        )


_SHORT = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
    torch.complex64: "c64",
    torch.complex128: "c128",
    torch.float8_e4m3fn: "f8e4m3",
    torch.float8_e5m2: "f8e5m2",
}


def short_dtype(dtype: Optional[torch.dtype]) -> str:
    """``torch.bfloat16`` -> ``bf16`` (``-`` for ``None``)."""
    if dtype is None:
        return "-"
    return _SHORT.get(dtype) or str(dtype).replace("torch.", "")


def input_dtypes(args: tuple, kwargs: dict) -> tuple:
    """Tensor inputs' dtypes in argument order, lists flattened, ``out=`` excluded."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a.dtype)
        elif isinstance(a, (list, tuple)):
            out.extend(t.dtype for t in a if isinstance(t, torch.Tensor))
    for n, v in kwargs.items():
        if n != "out" and isinstance(v, torch.Tensor):
            out.append(v.dtype)
    return tuple(out)


def first_floating(out) -> Optional[torch.dtype]:
    """The dtype of a call's first floating output (lists searched in order), or ``None``."""
    if isinstance(out, torch.Tensor):
        return out.dtype if out.is_floating_point() else None
    if isinstance(out, (list, tuple)):
        for o in out:
            d = first_floating(o)
            if d is not None:
                return d
    return None

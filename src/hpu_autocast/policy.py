"""Cast policies as plain, frozen data: a table from ``OpOverload`` to ``CastPolicy``.

A ``Policy`` knows nothing about how casting happens; the engine reads it. Presets build
policies from op names (see ``hpu_autocast.presets``); all name handling lives in
``hpu_autocast.names``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Iterable, Mapping, Optional

import torch
from torch._ops import OpOverload

__all__ = ["CastPolicy", "Policy"]


class CastPolicy(enum.Enum):
    """What happens to an eligible call of an op in the table.

    Eligible tensors are floating, not float64, and not written by the op; everything else
    (integer and bool tensors, float64 tensors, Python scalars) passes through unchanged.
    """

    #: Every eligible tensor input is cast to the region's lower-precision dtype; the op
    #: computes, and returns, that dtype.
    LOWER = "lower"
    #: Every eligible tensor input is cast to float32; the op computes in float32.
    FP32 = "fp32"
    #: Every eligible tensor input is cast to the widest floating dtype among them
    #: (``torch.promote_types``); if they already agree, nothing is cast.
    PROMOTE = "promote"
    #: Every eligible tensor input is cast to the dtype of the first eligible tensor input.
    #: Used for in-place ops a preset names (HPU's ``iadd``): their output is their first
    #: input, whose dtype cannot change.
    FIRST = "first"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Policy:
    """An immutable autocast policy.

    ``table`` maps op overloads to ``CastPolicy``. Ops not in the table run as their inputs
    are. ``input_only`` names overloads that cast only their first tensor argument (Gaudi's
    norms: weight, bias and running statistics keep their dtype). ``banned`` maps overloads
    to the error message a call raises inside an enabled region. ``dtypes`` are the
    lower-precision dtypes the policy accepts.
    """

    name: str
    table: Mapping[OpOverload, CastPolicy]
    input_only: frozenset = frozenset()
    banned: Mapping[OpOverload, str] = field(default_factory=dict)
    dtypes: tuple = (torch.bfloat16, torch.float16)
    #: Names from the source lists that this torch does not have (kept for the record).
    missing: tuple = ()
    #: Applied to functional ops not in the table (HMP: ``FIRST``, "run in the dtype of the
    #: first input"); ``None`` leaves them alone.
    unlisted: Optional[CastPolicy] = None
    #: Applied to in-place ops not in the table (HMP: ``FIRST``); ``None`` leaves them alone.
    inplace: Optional[CastPolicy] = None
    #: Every op of the promote list, also those a lower or FP32 entry overrides: when a user
    #: replaces the lower list, an op it no longer names falls back to promote.
    promoted: frozenset = frozenset()
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Note: frozen means frozen all the way down; callers may pass plain dicts.
        object.__setattr__(self, "table", MappingProxyType(dict(self.table)))
        object.__setattr__(self, "banned", MappingProxyType(dict(self.banned)))
        object.__setattr__(self, "input_only", frozenset(self.input_only))
        object.__setattr__(self, "promoted", frozenset(self.promoted))
        # Once: a region's entry looks the policy up in compile_policy's cache.
        object.__setattr__(self, "_hash", hash((self.name, tuple(sorted((str(k), v.value) for k, v in self.table.items())))))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Policy):
            return NotImplemented
        return (
            self.name == other.name
            and dict(self.table) == dict(other.table)
            and self.input_only == other.input_only
            and dict(self.banned) == dict(other.banned)
            and self.dtypes == other.dtypes
            and self.unlisted == other.unlisted
            and self.inplace == other.inplace
        )

    def action(self, op: OpOverload) -> Optional[CastPolicy]:
        """The ``CastPolicy`` for ``op``, or ``None`` if the policy leaves it alone."""
        return self.table.get(op)

    def ops(self, action: CastPolicy) -> list:
        """The overloads with ``action``, sorted by name."""
        return sorted((op for op, a in self.table.items() if a is action), key=str)

    def replace_table(self, table: Mapping[OpOverload, CastPolicy], *, name: Optional[str] = None,
                      input_only: Optional[Iterable[OpOverload]] = None) -> "Policy":
        """A new policy with another table (and optionally name and ``input_only``)."""
        return replace(
            self,
            table=table,
            name=self.name if name is None else name,
            input_only=self.input_only if input_only is None else frozenset(input_only),
        )

    def with_lists(self, *, lower: Optional[Iterable] = None, fp32: Optional[Iterable] = None,
                   promote: Optional[Iterable] = None, name: Optional[str] = None) -> "Policy":
        """A new policy whose lower, FP32 and/or promote lists are replaced by these op names
        (see ``hpu_autocast.overrides.with_lists``)."""
        from .overrides import with_lists

        return with_lists(self, lower=lower, fp32=fp32, promote=promote, name=name)

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Raise ``ValueError`` naming ``dtype`` if this policy cannot run in it."""
        if dtype not in self.dtypes:
            accepted = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
            raise ValueError(
                f"policy {self.name!r} does not support dtype={str(dtype).replace('torch.', '')}; "
                f"accepted: {accepted}"
            )

    def __str__(self) -> str:
        counts = ", ".join(f"{a}={len(self.ops(a))}" for a in CastPolicy if self.ops(a))
        return f"Policy({self.name}: {counts})"

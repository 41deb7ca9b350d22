"""Op names become a ``Policy``: one loop from names to overloads (``_overloads``, through
``names.resolve``), one place from overloads to a table (``_table``), and the two builders that
use them, ``build_policy`` and ``with_lists``. The presets build with this module;
``hpu_autocast.builder``, above the presets, re-exports both builders beside the functions that
start from a preset name (list files, Gaudi's environment variables and configuration).

The lower and FP32 lists take precedence over promote, an in-place overload on the promote list
keeps its first input's dtype, and an op on both the lower and the FP32 list is an error naming
both entries.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import torch

from .._torch import OpOverload
from . import _ops
from .names import PolicyError, Source, describe, is_python_name, resolve
from .policy import BuildRecord, CastPolicy, Policy

__all__ = ["build_policy", "with_lists", "check_no_conflict", "Entry"]

#: An op name and where it came from (``(file, line)`` or ``None``), for messages.
Entry = Tuple[str, Optional[Source]]


# --- names to overloads -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Rules:
    """How a list's names become overloads.

    ``tolerate_missing`` skips names this torch does not have (recorded in ``Policy.missing``);
    ``registered`` keeps only overloads with a kernel for that dispatch key (``"AutocastCPU"``
    makes a preset exactly what native autocast registers); ``keep_composites`` keeps
    composite entries too, whose insides native autocast casts; ``c_names_only`` applies a
    name only as Gaudi's bridge would (Note: what Gaudi's bridge applies).
    """

    tolerate_missing: bool = False
    registered: Optional[str] = None
    keep_composites: bool = False
    c_names_only: bool = False


@dataclasses.dataclass
class _Skipped:
    """The names of a build's lists that put nothing on its table."""

    #: Names this torch lacks (``Policy.missing``).
    missing: List[str] = dataclasses.field(default_factory=list)
    #: ``(name, source, list, why)`` of the names ``c_names_only`` does not apply.
    ignored: List[Tuple[str, Optional[Source], str, str]] = dataclasses.field(default_factory=list)


def _entries(names: Iterable, arg: str) -> List[Entry]:
    """A list argument as entries. A string is refused: it would be read letter by letter."""
    if isinstance(names, str):
        fix = "[" + ", ".join(f'"{n}"' for n in names.replace(",", " ").split()) + "]"
        letters = ", ".join(repr(c) for c in names[:3]) + (", ..." if len(names) > 3 else "")
        raise TypeError(f"{arg}= takes a list of op names, not a string: {names!r} would be read as the "
                        f"names {letters}; write {arg}={fix}")
    return [n if isinstance(n, tuple) else (n, None) for n in names]


def _overloads(entries: Iterable[Entry], rules: _Rules, skipped: _Skipped,
               list_name: str) -> Dict[OpOverload, Entry]:
    """The one loop from names to overloads: ``{overload: the entry that named it}``, in list
    order. Names ``rules`` lets go of are recorded in ``skipped``."""
    out: Dict[OpOverload, Entry] = {}
    for name, source in entries:
        try:
            ops = resolve(name, source)
        except PolicyError:
            if not rules.tolerate_missing:
                raise
            skipped.missing.append(name)
            continue
        if rules.registered is not None:
            # Composite entries are kept (native casts their insides; cross_entropy's
            # cross_entropy_loss, conv1d.padding), except for a name the list gives itself of
            # which this torch's key registers nothing: a name newer torch added (rms_norm for
            # AutocastCUDA before 2.10).
            registered = [op for op in ops if _ops.has_kernel(op, rules.registered)]
            ops = [op for op in ops if op in registered
                   or (rules.keep_composites and _ops.is_composite(op)
                       and (registered or _ops.op_base_name(op) != name))]
            if not ops:
                skipped.missing.append(name)
                continue
        if rules.c_names_only:
            ops, why = _as_gaudi_applies(name, ops)
            if why is not None:
                skipped.ignored.append((name.strip(), source, list_name, why))
                continue
        for op in ops:
            out.setdefault(op, (name, source))
    return out


# [Note: what Gaudi's bridge applies]
# Gaudi documents its lists as op names, but its bridge (gaudi-pytorch-bridge 1.19:
# hpu_ops/autocast_helpers.h, scripts/gen_op.py) registers autocast kernels for functional
# ATen functions only and matches a list's names against their C++ names. A Python name
# (iadd, truediv, __matmul__: names.is_python_name) or a name of in-place or out= overloads
# (add_, addmm.out) on a list therefore does nothing on Gaudi. Under c_names_only (the hpu
# preset, and what with_lists makes of it) such a name is not applied here either: it is
# recorded in Policy.ignored and, when a user gave it, warned about once per name.
_PYTHON_NAME = "a Python name, and Gaudi's bridge matches list names against C++ function names"
_NOT_FUNCTIONAL = "it names in-place or out= overloads only, and Gaudi's bridge registers no such function"


def _as_gaudi_applies(name: str, ops: List[OpOverload]) -> Tuple[List[OpOverload], Optional[str]]:
    """The overloads Gaudi's bridge would cast for ``name``, or why it casts none."""
    if is_python_name(name):
        return [], _PYTHON_NAME
    ops = [op for op in ops if not (_ops.is_inplace(op) or _ops.is_out(op))]
    return ops, None if ops else _NOT_FUNCTIONAL


def _cpp_hint(name: str, why: str) -> str:
    """For a Python name, the C++ function it stands for (and whether Gaudi could cast it)."""
    if why != _PYTHON_NAME:
        return ""
    ops = resolve(name)
    cpp = ", ".join(sorted({_ops.op_base_name(op) for op in ops}))
    if all(_ops.is_inplace(op) or _ops.is_out(op) for op in ops):
        return f"; its C++ function, {cpp}, is in-place, and Gaudi's bridge casts no in-place function"
    return f"; its C++ name is {cpp}"


_warned: set = set()


def _record_ignored(skipped: _Skipped, policy_name: str, warn: bool) -> Tuple[Tuple[str, str, str], ...]:
    """``Policy.ignored`` of a build; with ``warn``, a warning for each name not warned about yet."""
    for name, source, list_name, why in skipped.ignored:
        if warn and name not in _warned:
            _warned.add(name)
            warnings.warn(f"{describe(name, source)} on the {list_name} list has no effect under policy "
                          f"{policy_name!r}, as on Gaudi: {why}{_cpp_hint(name, why)}", UserWarning, stacklevel=3)
    return tuple((name, list_name, why) for name, _, list_name, why in skipped.ignored)


# [Note: a native registration the lists do not name]
# A preset built with `registered=KEY` reproduces native autocast: its lists hold every name
# torch registers for KEY, and the loop above drops the names an installed torch lacks (torch
# 2.14 removed aten::cholesky and aten::qr). A torch newer than the lists can also register an
# overload they do not name (torch 2.14 added linalg_matrix_sqrth, cast to float32): the lists
# cannot say which cast it gets, so the policy leaves it alone where native autocast casts it.
# That difference is made visible when the policy is built, as one warning naming the
# overloads; tests/internal/test_drift.py fails on it. Only aten counts: a custom op's
# registration (torch.library.register_autocast) is left to its native kernel (Policy.native).
_warned_unnamed: set = set()


def _warn_unnamed(policy_name: str, key: str, ops: List[OpOverload]) -> None:
    """One warning for the overloads ``key`` registers that the policy does not name (Note: a
    native registration the lists do not name), once per policy name and overload."""
    new = [op for op in ops if (policy_name, op) not in _warned_unnamed]
    if not new:
        return
    _warned_unnamed.update((policy_name, op) for op in new)
    names = ", ".join(map(str, new[:8])) + (f" and {len(new) - 8} more" if len(new) > 8 else "")
    many = len(new) > 1
    it, they = ("them", "they") if many else ("it", "it")
    warnings.warn(f"torch {torch.__version__} registers for {key} {len(new)} overload{'s' if many else ''} "
                  f"that policy {policy_name!r} does not name, {names}: native autocast casts {it}, this policy "
                  f"leaves {it} alone, so results can differ from native autocast's where {they} "
                  f"run{'' if many else 's'}", UserWarning, stacklevel=3)


# --- overloads to a table -----------------------------------------------------------------------

def check_no_conflict(low: Mapping[OpOverload, Entry], f32: Mapping[OpOverload, Entry]) -> None:
    """Raise ``PolicyError`` naming the first op (in lower-list order) that is on both lists,
    with the entries that put it there, and how many more there are."""
    both = [op for op in low if op in f32]
    if both:
        op = both[0]
        more = f" (and {len(both) - 1} more: {', '.join(str(o) for o in both[1:4])}{', ...' if len(both) > 4 else ''})" \
            if len(both) > 1 else ""
        raise PolicyError(f"{op} is on both the lower-precision list, as {describe(*low[op])}, "
                          f"and the FP32 list, as {describe(*f32[op])}; remove it from one{more}")


def _table(low: Mapping[OpOverload, Entry], f32: Mapping[OpOverload, Entry],
           pro: Iterable[OpOverload]) -> Dict[OpOverload, CastPolicy]:
    """The one table assembly. The lower and FP32 lists take precedence over promote; an
    in-place overload on the promote list keeps its first input's dtype (``FIRST``)."""
    check_no_conflict(low, f32)
    table = {op: CastPolicy.FIRST if _ops.is_inplace(op) else CastPolicy.PROMOTE for op in pro}
    table.update(dict.fromkeys(low, CastPolicy.LOWER))
    table.update(dict.fromkeys(f32, CastPolicy.FP32))
    return table


def build_policy(
    name: str,
    *,
    lower: Iterable = (),
    fp32: Iterable = (),
    promote: Iterable = (),
    input_only: Iterable = (),
    banned: Optional[Mapping[str, str]] = None,
    dtypes: tuple = (torch.bfloat16, torch.float16),
    unlisted: Optional[CastPolicy] = None,
    inplace: Optional[CastPolicy] = None,
    device_type: Optional[str] = None,
    c_names_only: bool = False,
    warn_ignored: bool = True,
    tolerate_missing: bool = False,
    registered: Optional[str] = None,
    keep_composites: bool = False,
) -> Policy:
    """Build a ``Policy`` from op names.

    Each list holds names (see ``hpu_autocast.names``) or ``(name, (file, line))`` pairs,
    which error messages then cite. ``input_only`` and ``banned`` (name -> the error a call
    raises) name ops of the lists; ``unlisted`` and ``inplace`` are the rules for ops on no
    list (HMP's first-input rule); ``device_type`` is ``Policy.device_type``. ``c_names_only``
    applies names as Gaudi's bridge does (Note: what Gaudi's bridge applies); the names it
    lets go of are warned about once each unless ``warn_ignored`` is false (the ``hpu``
    preset's own lists). ``tolerate_missing``, ``registered`` and ``keep_composites`` are the
    presets' version rules (see ``_Rules``); a policy built from what ``registered`` registers
    reproduces that native autocast, so it is also ``Policy.native``, and an aten overload
    registered there that the lists do not name is warned about (Note: a native registration
    the lists do not name).
    """
    rules = _Rules(tolerate_missing, registered, keep_composites, c_names_only)
    skipped = _Skipped()
    low = _overloads(_entries(lower, "lower"), rules, skipped, "lower")
    f32 = _overloads(_entries(fp32, "fp32"), rules, skipped, "fp32")
    pro = _overloads(_entries(promote, "promote"), rules, skipped, "promote")
    table = _table(low, f32, pro)
    only = {op for op in _overloads(_entries(input_only, "input_only"), _Rules(), _Skipped(), "input_only")
            if op in table}
    banned = dict(banned or {})
    ban = {op: banned[n] for op, (n, _) in _overloads(_entries(banned, "banned"), _Rules(), _Skipped(), "banned").items()}
    if registered is not None:
        unnamed = [op for op in _ops.registered_for(registered) if op not in table and op not in ban]
        _warn_unnamed(name, registered, unnamed)
    record = BuildRecord(missing=tuple(dict.fromkeys(skipped.missing)),
                         ignored=_record_ignored(skipped, name, warn_ignored))
    return Policy(name=name, table=table, input_only=frozenset(only), banned=ban, dtypes=tuple(dtypes),
                  unlisted=unlisted, inplace=inplace, promoted=frozenset(pro), device_type=device_type,
                  c_names_only=c_names_only, native=registered, record=record)


def with_lists(policy: Policy, *, lower: Optional[Iterable] = None, fp32: Optional[Iterable] = None,
               promote: Optional[Iterable] = None, name: Optional[str] = None) -> Policy:
    """A new policy whose lower, FP32 and/or promote lists are replaced by these names.

    Each list holds op names or ``(name, (file, line))`` entries, every one of which must
    resolve; a list left ``None`` keeps the policy's own. An op on both a given lower list and
    a given FP32 list is an error naming both entries; an op a given list names leaves the
    kept default list of the other kind. A policy with ``c_names_only`` (``hpu``) applies the
    given names as Gaudi's bridge does, and warns once about each it does not apply.
    """
    rules = _Rules(c_names_only=policy.c_names_only)
    skipped = _Skipped()

    def kept(*actions: CastPolicy) -> Dict[OpOverload, Entry]:
        return {op: (str(op), None) for op, a in policy.table.items() if a in actions}

    def given(names: Iterable, arg: str) -> Dict[OpOverload, Entry]:
        return _overloads(_entries(names, arg), rules, skipped, arg)

    low = given(lower, "lower") if lower is not None else kept(CastPolicy.LOWER)
    f32 = given(fp32, "fp32") if fp32 is not None else kept(CastPolicy.FP32)
    if promote is not None:
        pro = given(promote, "promote")
    else:
        pro = {**kept(CastPolicy.PROMOTE, CastPolicy.FIRST), **{op: (str(op), None) for op in policy.promoted}}
    # A user's list wins over a kept default list; two user lists naming one op conflict.
    if lower is not None and fp32 is None:
        f32 = {op: e for op, e in f32.items() if op not in low}
    elif fp32 is not None and lower is None:
        low = {op: e for op, e in low.items() if op not in f32}
    table = _table(low, f32, pro)
    input_only = {op for op in policy.input_only if table.get(op) is CastPolicy.LOWER}
    replaced = {arg for arg, names in (("lower", lower), ("fp32", fp32), ("promote", promote)) if names is not None}
    ignored = tuple(i for i in policy.ignored if i[1] not in replaced) + _record_ignored(skipped, policy.name, True)
    record = dataclasses.replace(policy.record, ignored=ignored)
    return dataclasses.replace(policy, table=table, name=name or f"{policy.name}+lists",
                               input_only=input_only, promoted=frozenset(pro), record=record)

"""Op names become a ``Policy``: one loop from names to overloads (``_overloads``, through
``names.resolve``), one place from overloads to a table (``_table``), and the two builders that
use them, ``build_policy`` and ``with_lists``. The presets build with this module;
``hpu_autocast.builder``, above the presets, re-exports both builders beside the functions that
start from a preset name (list files, Gaudi's environment variables and configuration).

The lower, FP32, fp32_set_opt_dtype and fp32_append_dtype lists take precedence over promote, an
in-place overload on the promote list keeps its first input's dtype, and an op on two of the
first four lists is an error naming both entries.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import torch

from .. import _torch
from .._torch import OpOverload
from .._facts import ops as _ops
from .names import PolicyError, Source, describe, is_python_name, resolve
from .policy import BuildRecord, CastPolicy, Policy, takes

__all__ = ["build_policy", "with_lists", "edit_policy", "user_stacklevel", "EDIT_KINDS", "check_no_conflict", "Entry"]

#: An op name and where it came from (``(file, line)`` or ``None``), for messages.
Entry = Tuple[str, Optional[Source]]


# --- names to overloads -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Rules:
    """How a list's names become overloads.

    ``tolerate_missing`` skips names this torch does not have (recorded in ``Policy.missing``);
    ``registered`` keeps only overloads with a kernel for that dispatch key (``"AutocastCPU"``
    makes a preset exactly what native autocast registers: a composite with no kernel there,
    ``cross_entropy_loss`` under CUDA, decomposes, and native casts its insides);
    ``c_names_only`` applies a name only as Gaudi's bridge would (Note: what Gaudi's bridge
    applies).
    """

    tolerate_missing: bool = False
    registered: Optional[str] = None
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
            # A name of which this torch's key registers nothing is missing here: one newer
            # torch added (rms_norm for AutocastCUDA before 2.10), or one whose composite
            # decomposes to registered ops (cross_entropy).
            ops = [op for op in ops if _ops.has_kernel(op, rules.registered)]
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
    if not ops:
        return ops, _NOT_FUNCTIONAL
    why = never_registered(_ops.op_base_name(ops[0]))
    return ([], why) if why else (ops, None)


# [Note: the names Gaudi's bridge never registers]
# gen_op.py's generate_autocast_ops (gaudi-pytorch-bridge, scripts/gen_op.py) writes one
# Hpu_KERNEL registration per ATen function, skipping a function whose C++ name ends in "_out"
# or "_", or contains "_.", "cuda", "cudn" or "backward", an op of its AUTOCAST_BLOCKLIST
# (constants.py), and an op whose native_functions.yaml variants lack "function" (method-only).
# Hpu_KERNEL then casts a function only if its name is on a list; a list name of a skipped
# function therefore has no effect on Gaudi (gelu_backward on the lower list casts nothing).
_SKIPPED_PARTS = ("_.", "cuda", "cudn", "backward")
#: AUTOCAST_BLOCKLIST's functions (its sym_size.int and sym_stride.int by C++ name).
AUTOCAST_BLOCKLIST = frozenset({
    "_cummax_helper", "_cummin_helper", "fused_moving_avg_obs_fake_quant", "_fused_moving_avg_obs_fq_helper",
    "_native_batch_norm_legit", "sym_size", "sym_numel", "sym_stride", "sym_storage_offset",
    "_scaled_dot_product_flash_attention", "_efficient_attention_forward", "_batch_norm_with_update",
    "_scaled_dot_product_fused_attention_overrideable"})
#: Where torch exposes ATen's function variants (a name in none of them is a method-only op).
_FUNCTION_NAMESPACES = ("_VariableFunctions", "_nn", "_linalg", "_special", "_fft", "_nested", "_sparse")


def never_registered(function: str) -> Optional[str]:
    """Why Gaudi's bridge registers no autocast kernel for the ATen function ``function`` (its
    C++ name), or ``None`` when it registers one (Note: the names Gaudi's bridge never registers)."""
    if function.endswith(("_out", "_")):
        return "Gaudi's bridge registers no autocast kernel for an in-place or out= function (a name ending in _ or _out)"
    part = next((p for p in _SKIPPED_PARTS if p in function), None)
    if part is not None:
        return f"Gaudi's bridge registers no autocast kernel for a function whose name contains {part!r}"
    if function in AUTOCAST_BLOCKLIST:
        return "Gaudi's bridge registers no autocast kernel for it (gen_op.py's AUTOCAST_BLOCKLIST)"
    if hasattr(_torch.TensorBase, function) and not any(
            hasattr(_torch.c_function_namespace(ns), function) for ns in _FUNCTION_NAMESPACES):
        return "a Tensor method with no function variant, for which Gaudi's bridge registers no autocast kernel"
    return None


def _cpp_hint(name: str, why: str) -> str:
    """For a Python name, the C++ function it stands for (and whether Gaudi could cast it)."""
    if why != _PYTHON_NAME:
        return ""
    ops = resolve(name)
    cpp = ", ".join(sorted({_ops.op_base_name(op) for op in ops}))
    if all(_ops.is_inplace(op) or _ops.is_out(op) for op in ops):
        return f"; its C++ function, {cpp}, is in-place, and Gaudi's bridge casts no in-place function"
    return f"; its C++ name is {cpp}"


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` called by the caller of this function
    point at the first frame outside this package: the user's line, however deep the package's
    own calls go (Python 3.12's ``skip_file_prefixes``, for every Python this package runs on)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = _torch.caller_frame(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


_warned: set = set()


def _record_ignored(skipped: _Skipped, policy_name: str, warn: bool) -> Tuple[Tuple[str, str, str], ...]:
    """``Policy.ignored`` of a build; with ``warn``, a warning for each name not warned about yet."""
    for name, source, list_name, why in skipped.ignored:
        key = (name, source[0] if source else None)  # once per name and file
        if warn and key not in _warned:
            _warned.add(key)
            warnings.warn(f"{describe(name, source)} on the {list_name} list has no effect under policy "
                          f"{policy_name!r}, as on Gaudi: {why}{_cpp_hint(name, why)}", UserWarning,
                          stacklevel=user_stacklevel())
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
                  f"run{'' if many else 's'}", UserWarning, stacklevel=user_stacklevel())


# --- overloads to a table -----------------------------------------------------------------------

#: The lists that give an op one cast policy each (an op on two of them is an error), with how
#: messages name them, in the order messages report conflicts.
_EXCLUSIVE = ((CastPolicy.LOWER, "lower", "the lower-precision list"), (CastPolicy.FP32, "fp32", "the FP32 list"),
              (CastPolicy.FP32_SET_OPT_DTYPE, "fp32_set_opt_dtype", "the fp32_set_opt_dtype list"),
              (CastPolicy.FP32_APPEND_DTYPE, "fp32_append_dtype", "the fp32_append_dtype list"))
_LABEL = {action: label for action, _, label in _EXCLUSIVE}


def _taking(action: CastPolicy, ops: Dict[OpOverload, Entry]) -> Dict[OpOverload, Entry]:
    """Of the overloads a name resolved to, those that can take ``action`` (``policy.takes``:
    ``norm`` on the fp32_append_dtype list is ``norm.Scalar`` and ``norm.ScalarOpt_dim``). A
    name none of whose overloads can is kept whole, for ``Policy`` to refuse by name."""
    by_name: Dict[str, List[OpOverload]] = {}
    for op, (name, _) in ops.items():
        by_name.setdefault(name, []).append(op)
    keep = set()
    for group in by_name.values():
        keep.update([op for op in group if takes(op, action)] or group)
    return {op: e for op, e in ops.items() if op in keep}


def check_no_conflict(low: Mapping[OpOverload, Entry], f32: Mapping[OpOverload, Entry],
                      **others: Mapping[OpOverload, Entry]) -> None:
    """Raise ``PolicyError`` naming the first op (in list order) that is on two of the lists
    (lower, FP32, and by keyword ``fp32_set_opt_dtype``, ``fp32_append_dtype``), with the
    entries that put it there, and how many more there are."""
    lists = [(_LABEL[CastPolicy.LOWER], low), (_LABEL[CastPolicy.FP32], f32)]
    lists += [(_LABEL[CastPolicy(k)], v) for k, v in others.items()]
    for n, (label_a, a) in enumerate(lists):
        for label_b, b in lists[n + 1:]:
            both = [op for op in a if op in b]
            if both:
                op = both[0]
                more = (f" (and {len(both) - 1} more: {', '.join(str(o) for o in both[1:4])}"
                        f"{', ...' if len(both) > 4 else ''})") if len(both) > 1 else ""
                raise PolicyError(f"{op} is on both {label_a}, as {describe(*a[op])}, "
                                  f"and {label_b}, as {describe(*b[op])}; remove it from one{more}")


def _table(lists: Mapping[CastPolicy, Mapping[OpOverload, Entry]], pro: Iterable[OpOverload]) -> Dict[OpOverload, CastPolicy]:
    """The one table assembly. The lower, FP32 and the two float32 dtype lists (which may not
    share an op) take precedence over promote; an in-place overload on the promote list keeps its
    first input's dtype (``FIRST``)."""
    check_no_conflict(lists.get(CastPolicy.LOWER, {}), lists.get(CastPolicy.FP32, {}),
                      **{a.value: ops for a, ops in lists.items() if a not in (CastPolicy.LOWER, CastPolicy.FP32)})
    table = {op: CastPolicy.FIRST if _ops.is_inplace(op) else CastPolicy.PROMOTE for op in pro}
    for action, ops in lists.items():
        table.update(dict.fromkeys(ops, action))
    return table


def build_policy(
    name: str,
    *,
    lower: Iterable = (),
    fp32: Iterable = (),
    promote: Iterable = (),
    fp32_set_opt_dtype: Iterable = (),
    fp32_append_dtype: Iterable = (),
    input_only: Iterable = (),
    banned: Optional[Mapping[str, str]] = None,
    dtypes: tuple = (torch.bfloat16, torch.float16),
    unlisted: Optional[CastPolicy] = None,
    inplace: Optional[CastPolicy] = None,
    device_type: Optional[str] = None,
    explicit_dtype: str = "leave",
    c_names_only: bool = False,
    warn_ignored: bool = True,
    tolerate_missing: bool = False,
    registered: Optional[str] = None,
) -> Policy:
    """Build a ``Policy`` from op names.

    Each list holds names (see ``hpu_autocast.policies.names``) or ``(name, (file, line))`` pairs,
    which error messages then cite: ``lower``, ``fp32``, ``promote`` and ATen's two float32
    dtype policies, ``fp32_set_opt_dtype`` (softmax, sum: an unset dtype argument becomes
    float32) and ``fp32_append_dtype`` (norm: the overload with a dtype argument is called);
    ``CastPolicy`` says what each does. ``input_only`` and ``banned`` (name -> the error a call
    raises) name ops of the lists; ``unlisted`` and ``inplace`` are the rules for ops on no
    list (HMP's first-input rule); ``device_type`` and ``explicit_dtype`` are ``Policy``'s.
    ``c_names_only`` applies names as Gaudi's bridge does (Note: what Gaudi's bridge applies);
    the names it lets go of are warned about once each unless ``warn_ignored`` is false (the
    ``hpu`` preset's own lists). ``tolerate_missing`` and ``registered`` are the presets'
    version rules (see ``_Rules``); a policy built from what ``registered`` registers reproduces
    that native autocast, so it is also ``Policy.native``, and an aten overload registered there
    that the lists do not name is warned about (Note: a native registration the lists do not name).
    """
    rules = _Rules(tolerate_missing, registered, c_names_only)
    skipped = _Skipped()
    given = dict(zip((a for a, _, _ in _EXCLUSIVE), (lower, fp32, fp32_set_opt_dtype, fp32_append_dtype)))
    lists = {a: _taking(a, _overloads(_entries(names, arg), rules, skipped, arg))
             for (a, arg, _), names in zip(_EXCLUSIVE, given.values())}
    pro = _overloads(_entries(promote, "promote"), rules, skipped, "promote")
    table = _table(lists, pro)
    only = {op for op in _overloads(_entries(input_only, "input_only"), _Rules(), _Skipped(), "input_only")
            if op in table}
    banned = dict(banned or {})
    ban = {op: banned[n] for op, (n, _) in _overloads(_entries(banned, "banned"), _Rules(), _Skipped(), "banned").items()}
    if registered is not None:
        unnamed = [op for op in _ops.registered_for(registered) if op not in table and op not in ban]
        _warn_unnamed(name, registered, unnamed)
    record = BuildRecord(missing=tuple(dict.fromkeys(skipped.missing)),
                         ignored=_record_ignored(skipped, name, warn_ignored), promoted=frozenset(pro),
                         c_names_only=c_names_only)
    return Policy(name=name, table=table, input_only=frozenset(only), banned=ban, dtypes=tuple(dtypes),
                  unlisted=unlisted, inplace=inplace, device_type=device_type, explicit_dtype=explicit_dtype,
                  native=registered, record=record)


def with_lists(policy: Policy, *, lower: Optional[Iterable] = None, fp32: Optional[Iterable] = None,
               promote: Optional[Iterable] = None, fp32_set_opt_dtype: Optional[Iterable] = None,
               fp32_append_dtype: Optional[Iterable] = None, name: Optional[str] = None,
               lower_first: bool = False) -> Policy:
    """A new policy whose lower, FP32, promote, fp32_set_opt_dtype and/or fp32_append_dtype lists
    are REPLACED by these names, as Gaudi's list files replace theirs: every op of a replaced list
    that the new one does not name leaves it (``lower=["gelu"]`` takes linear off the ``hpu`` lower
    list; ``BuildRecord.dropped`` records such ops, and a region of the policy warns of them once).
    To move a few ops and keep the rest, use ``Policy.edit``.

    Each list holds op names or ``(name, (file, line))`` entries, every one of which must
    resolve; a list left ``None`` keeps the policy's own. An op on two given lists (say lower
    and FP32) is an error naming both entries; an op a given list names leaves the kept default
    lists of the other kinds. A policy with ``c_names_only`` (``hpu``) applies the given names as
    Gaudi's bridge does, and warns once about each it does not apply.

    ``lower_first`` is Gaudi's list-file rule instead (``builder.policy_from_bridge_files``): an op
    on the lower list, given or kept, is lower precision whatever the other lists say, as the
    bridge's ``Hpu_KERNEL`` tries the lower list, then FP32, then promote; nothing conflicts.
    """
    rules = _Rules(c_names_only=policy.record.c_names_only)
    skipped = _Skipped()
    asked = dict(zip((a for a, _, _ in _EXCLUSIVE), (lower, fp32, fp32_set_opt_dtype, fp32_append_dtype)))
    lists = {a: _taking(a, _overloads(_entries(asked[a], arg), rules, skipped, arg)) for a, arg, _ in _EXCLUSIVE
             if asked[a] is not None}
    named = {op for ops in lists.values() for op in ops}
    for action, _, _ in _EXCLUSIVE:  # a kept list loses what a given list names (a user's list wins)
        if action not in lists:
            lists[action] = {op: (str(op), None) for op, a in policy.table.items()
                             if a is action and (lower_first or op not in named)}
    if lower_first:  # the bridge's order: what the lower list names, no other list keeps
        low = lists[CastPolicy.LOWER]
        lists = {a: ops if a is CastPolicy.LOWER else {op: e for op, e in ops.items() if op not in low}
                 for a, ops in lists.items()}
    if promote is not None:
        pro = _overloads(_entries(promote, "promote"), rules, skipped, "promote")
    else:
        pro = {op: (str(op), None) for op, a in policy.table.items() if a in (CastPolicy.PROMOTE, CastPolicy.FIRST)}
        pro.update({op: (str(op), None) for op in policy.record.promoted})
    table = _table(lists, pro)
    input_only = {op for op in policy.input_only if table.get(op) is CastPolicy.LOWER}
    replaced = {arg for (_, arg, _), names in zip(_EXCLUSIVE, asked.values()) if names is not None}
    replaced |= {"promote"} if promote is not None else set()
    ignored = tuple(i for i in policy.ignored if i[1] not in replaced) + _record_ignored(skipped, policy.name, True)
    dropped = tuple((str(op), a.value) for op, a in policy.table.items() if op not in table)
    record = dataclasses.replace(policy.record, ignored=ignored, dropped=dropped, promoted=frozenset(pro))
    return dataclasses.replace(policy, table=table, name=name or f"{policy.name}+lists",
                               input_only=input_only, record=record)


# --- edits that keep the rest -------------------------------------------------------------------

# [Note: an edit moves ops, a list replaces lists]
# with_lists (and Gaudi's list files) *replace* a kind's list: every op of the policy's list that
# the new one does not name leaves it (linear leaves the hpu lower list when lower=["gelu"]). An
# edit moves only the ops it names and keeps every other op where it was, which is what a user
# asking for "gelu in bfloat16 too" means. Names resolve as the policy's build resolved its own
# (c_names_only: as Gaudi's bridge applies them), an op named under two kinds of one call is an
# error naming both entries, and a kind an op cannot take (takes()) is an error naming the op.
# "unlisted" takes ops off the table (then the policy's rule for ops on no list applies to them,
# HMP's FIRST). An edited op leaves `banned` (the user said what it does now); one edited to
# anything but promote leaves `promoted` only when unlisted (so a later with_lists does not put it
# back on promote), as an op the lower list takes from promote stays promoted by with_lists' rule.

#: The kinds ``edit`` moves ops to, as keyword -> the action (None: off the table).
EDIT_KINDS: Dict[str, Optional[CastPolicy]] = {
    "lower": CastPolicy.LOWER, "fp32": CastPolicy.FP32, "fp32_set_opt_dtype": CastPolicy.FP32_SET_OPT_DTYPE,
    "fp32_append_dtype": CastPolicy.FP32_APPEND_DTYPE, "promote": CastPolicy.PROMOTE, "first": CastPolicy.FIRST,
    "unlisted": None,
}


def _edit_suffix(name: str) -> str:
    return name if name.endswith("+edit") else f"{name}+edit"


def edit_policy(policy: Policy, name: Optional[str] = None, **kinds: Optional[Iterable]) -> Policy:
    """``policy`` with the named ops moved to the given kinds and every other op kept where it
    was (Note: an edit moves ops, a list replaces lists); see ``Policy.edit``."""
    unknown = [k for k in kinds if k not in EDIT_KINDS]
    if unknown:
        raise TypeError(f"Policy.edit() got an unexpected keyword {unknown[0]!r}; the kinds it moves ops to: "
                        f"{', '.join(EDIT_KINDS)} (and name=)")
    rules = _Rules(c_names_only=policy.record.c_names_only)
    skipped = _Skipped()
    moved: Dict[str, Dict[OpOverload, Entry]] = {}
    for kind, names in kinds.items():
        if names is None:
            continue
        action = EDIT_KINDS[kind]
        ops = _overloads(_entries(names, kind), rules, skipped, kind)
        if action is not None:
            ops = _taking(action, ops)
            for op, entry in ops.items():
                if not takes(op, action):
                    raise PolicyError(f"{describe(*entry)} cannot be moved to {kind}: {op} cannot take that cast "
                                      f"policy ({_needs(action)}); the kinds it can take: "
                                      f"{', '.join(k for k, a in EDIT_KINDS.items() if a is None or takes(op, a))}")
        moved[kind] = ops
    seen: Dict[OpOverload, Tuple[str, Entry]] = {}
    for kind, ops in moved.items():
        for op, entry in ops.items():
            if op in seen and seen[op][0] != kind:
                first_kind, first_entry = seen[op]
                raise PolicyError(f"{op} is named under two kinds of one edit: {first_kind}, as "
                                  f"{describe(*first_entry)}, and {kind}, as {describe(*entry)}; name it once")
            seen.setdefault(op, (kind, entry))
    table = dict(policy.table)
    promoted = set(policy.record.promoted)
    for op, (kind, _) in seen.items():
        action = EDIT_KINDS[kind]
        if action is None:
            table.pop(op, None)
            promoted.discard(op)
            continue
        if action is CastPolicy.PROMOTE:
            promoted.add(op)
            action = CastPolicy.FIRST if _ops.is_inplace(op) else CastPolicy.PROMOTE  # as _table
        table[op] = action
    input_only = {op for op in policy.input_only if table.get(op) is CastPolicy.LOWER}
    banned = {op: m for op, m in policy.banned.items() if op not in seen}
    ignored = policy.ignored + _record_ignored(skipped, policy.name, True)
    kept = {str(op) for op in table}
    dropped = tuple(d for d in policy.record.dropped if d[0] not in kept)  # an op edited back is no longer dropped
    record = dataclasses.replace(policy.record, ignored=ignored, dropped=dropped, promoted=frozenset(promoted))
    return dataclasses.replace(policy, name=name or _edit_suffix(policy.name), table=table, input_only=input_only,
                               banned=banned, record=record)


def _needs(action: CastPolicy) -> str:
    if action is CastPolicy.FP32_SET_OPT_DTYPE:
        return "it needs a functional overload with a first Tensor argument and an optional dtype argument"
    return f"it needs an entry in ATen's redispatch table, one of: {', '.join(sorted(_ops.APPEND_DTYPE))}"

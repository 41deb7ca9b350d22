"""The builder: op names become a ``Policy``, and preset names the policy a region runs.

    build_policy(name, lower=[...], fp32=[...], promote=[...])   a policy from op names
    policy.edit(lower=[...], fp32=[...])                          a policy with ops moved, the rest kept
    with_lists(policy, lower=[...])                               a policy with whole lists REPLACED
    get_preset(name)                                              a preset (``presets.PRESETS``), built
    as_policy(preset_or_policy)                                   the policy a region runs
    policy_from_files(preset, lower=path, fp32=path)              Gaudi's and HMP's list files
    policy_from_bridge_files(preset, lower=path, fp32=path)       the files as Gaudi's bridge reads them
    policy_from_env()                                             Gaudi's environment variables
    policy_from_gaudi_config(path_or_dict)                        optimum-habana's gaudi_config.json

One loop from names to overloads (``_overloads``, through ``names.resolve``), one place from
overloads to a table (``_table``). The lower, FP32, fp32_set_opt_dtype and fp32_append_dtype lists
take precedence over promote, an in-place overload on the promote list keeps its first input's
dtype, and an op on two of the first four lists is an error naming both entries. How Gaudi's
bridge reads names, list files, its variables and ``gaudi_config.json`` is ``gaudi``'s; the
policies made from what it reads are built here. The presets are data (``presets.PRESETS``: the
options each is built with); ``get_preset`` builds them. ``hpu_autocast.builder`` is the
documented path of this module's and ``gaudi``'s public names.

A list *replaces* the policy's list of that kind, as seed 000 says of Gaudi's override files; the
promote list stays unless one is given.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch

from .._facts import ops as _ops
from .._torch import OpOverload
from . import gaudi
from .gaudi import DEFAULT_PRESET, PathLike, read_list
from .names import Entry, PolicyError, Source, describe, resolve, user_stacklevel
from .policy import BuildRecord, CastPolicy, Policy, takes
from .presets import PRESETS, preset_names

__all__ = [
    "build_policy",
    "with_lists",
    "policy_from_files",
    "policy_from_bridge_files",
    "warn_dropped",
    "policy_from_env",
    "policy_from_gaudi_config",
    "as_policy",
    "check_no_conflict",
]


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
        raise TypeError(
            f"{arg}= takes a list of op names, not a string: {names!r} would be read as the "
            f"names {letters}; write {arg}={fix}"
        )
    return [n if isinstance(n, tuple) else (n, None) for n in names]


def _overloads(entries: Iterable[Entry], rules: _Rules, skipped: _Skipped, list_name: str) -> Dict[OpOverload, Entry]:
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
            ops, why = gaudi.bridge_applies(name, ops)
            if why is not None:
                skipped.ignored.append((name.strip(), source, list_name, why))
                continue
        for op in ops:
            out.setdefault(op, (name, source))
    return out


_warned: set = set()


def _record_ignored(skipped: _Skipped, policy_name: str, warn: bool) -> Tuple[Tuple[str, str, str], ...]:
    """``Policy.ignored`` of a build; with ``warn``, a warning for each name not warned about yet."""
    for name, source, list_name, why in skipped.ignored:
        key = (name, source[0] if source else None)  # once per name and file
        if warn and key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"{describe(name, source)} on the {list_name} list has no effect under policy "
                f"{policy_name!r}, as on Gaudi: {why}{gaudi.cpp_hint(name, why)}",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
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
    warnings.warn(
        f"torch {torch.__version__} registers for {key} {len(new)} overload{'s' if many else ''} "
        f"that policy {policy_name!r} does not name, {names}: native autocast casts {it}, this policy "
        f"leaves {it} alone, so results can differ from native autocast's where {they} "
        f"run{'' if many else 's'}",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


# --- overloads to a table -----------------------------------------------------------------------

#: The lists that give an op one cast policy each (an op on two of them is an error), with how
#: messages name them, in the order messages report conflicts.
_EXCLUSIVE = (
    (CastPolicy.LOWER, "lower", "the lower-precision list"),
    (CastPolicy.FP32, "fp32", "the FP32 list"),
    (CastPolicy.FP32_SET_OPT_DTYPE, "fp32_set_opt_dtype", "the fp32_set_opt_dtype list"),
    (CastPolicy.FP32_APPEND_DTYPE, "fp32_append_dtype", "the fp32_append_dtype list"),
)
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


def check_no_conflict(
    low: Mapping[OpOverload, Entry], f32: Mapping[OpOverload, Entry], **others: Mapping[OpOverload, Entry]
) -> None:
    """Raise ``PolicyError`` naming the first op (in list order) that is on two of the lists
    (lower, FP32, and by keyword ``fp32_set_opt_dtype``, ``fp32_append_dtype``), with the
    entries that put it there, and how many more there are."""
    lists = [(_LABEL[CastPolicy.LOWER], low), (_LABEL[CastPolicy.FP32], f32)]
    lists += [(_LABEL[CastPolicy(k)], v) for k, v in others.items()]
    for n, (label_a, a) in enumerate(lists):
        for label_b, b in lists[n + 1 :]:
            both = [op for op in a if op in b]
            if both:
                op = both[0]
                more = (
                    (
                        f" (and {len(both) - 1} more: {', '.join(str(o) for o in both[1:4])}"
                        f"{', ...' if len(both) > 4 else ''})"
                    )
                    if len(both) > 1
                    else ""
                )
                raise PolicyError(
                    f"{op} is on both {label_a}, as {describe(*a[op])}, "
                    f"and {label_b}, as {describe(*b[op])}; remove it from one{more}"
                )


def _table(
    lists: Mapping[CastPolicy, Mapping[OpOverload, Entry]], pro: Iterable[OpOverload]
) -> Dict[OpOverload, CastPolicy]:
    """The one table assembly. The lower, FP32 and the two float32 dtype lists (which may not
    share an op) take precedence over promote; an in-place overload on the promote list keeps its
    first input's dtype (``FIRST``)."""
    check_no_conflict(
        lists.get(CastPolicy.LOWER, {}),
        lists.get(CastPolicy.FP32, {}),
        **{a.value: ops for a, ops in lists.items() if a not in (CastPolicy.LOWER, CastPolicy.FP32)},
    )
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
    lists = {
        a: _taking(a, _overloads(_entries(names, arg), rules, skipped, arg))
        for (a, arg, _), names in zip(_EXCLUSIVE, given.values())
    }
    pro = _overloads(_entries(promote, "promote"), rules, skipped, "promote")
    table = _table(lists, pro)
    only = {
        op for op in _overloads(_entries(input_only, "input_only"), _Rules(), _Skipped(), "input_only") if op in table
    }
    banned = dict(banned or {})
    ban = {
        op: banned[n] for op, (n, _) in _overloads(_entries(banned, "banned"), _Rules(), _Skipped(), "banned").items()
    }
    if registered is not None:
        unnamed = [op for op in _ops.registered_for(registered) if op not in table and op not in ban]
        _warn_unnamed(name, registered, unnamed)
    record = BuildRecord(
        missing=tuple(dict.fromkeys(skipped.missing)),
        ignored=_record_ignored(skipped, name, warn_ignored),
        promoted=frozenset(pro),
        c_names_only=c_names_only,
    )
    return Policy(
        name=name,
        table=table,
        input_only=frozenset(only),
        banned=ban,
        dtypes=tuple(dtypes),
        unlisted=unlisted,
        inplace=inplace,
        device_type=device_type,
        explicit_dtype=explicit_dtype,
        native=registered,
        record=record,
    )


def with_lists(
    policy: Policy,
    *,
    lower: Optional[Iterable] = None,
    fp32: Optional[Iterable] = None,
    promote: Optional[Iterable] = None,
    fp32_set_opt_dtype: Optional[Iterable] = None,
    fp32_append_dtype: Optional[Iterable] = None,
    name: Optional[str] = None,
    lower_first: bool = False,
) -> Policy:
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
    lists = {
        a: _taking(a, _overloads(_entries(asked[a], arg), rules, skipped, arg))
        for a, arg, _ in _EXCLUSIVE
        if asked[a] is not None
    }
    named = {op for ops in lists.values() for op in ops}
    for action, _, _ in _EXCLUSIVE:  # a kept list loses what a given list names (a user's list wins)
        if action not in lists:
            lists[action] = {
                op: (str(op), None)
                for op, a in policy.table.items()
                if a is action and (lower_first or op not in named)
            }
    if lower_first:  # the bridge's order: what the lower list names, no other list keeps
        low = lists[CastPolicy.LOWER]
        lists = {
            a: ops if a is CastPolicy.LOWER else {op: e for op, e in ops.items() if op not in low}
            for a, ops in lists.items()
        }
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
    return dataclasses.replace(
        policy, table=table, name=name or f"{policy.name}+lists", input_only=input_only, record=record
    )


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
    "lower": CastPolicy.LOWER,
    "fp32": CastPolicy.FP32,
    "fp32_set_opt_dtype": CastPolicy.FP32_SET_OPT_DTYPE,
    "fp32_append_dtype": CastPolicy.FP32_APPEND_DTYPE,
    "promote": CastPolicy.PROMOTE,
    "first": CastPolicy.FIRST,
    "unlisted": None,
}


def _edit_suffix(name: str) -> str:
    return name if name.endswith("+edit") else f"{name}+edit"


def edit_policy(policy: Policy, name: Optional[str] = None, **kinds: Optional[Iterable]) -> Policy:
    """``policy`` with the named ops moved to the given kinds and every other op kept where it
    was (Note: an edit moves ops, a list replaces lists); see ``Policy.edit``."""
    unknown = [k for k in kinds if k not in EDIT_KINDS]
    if unknown:
        raise TypeError(
            f"Policy.edit() got an unexpected keyword {unknown[0]!r}; the kinds it moves ops to: "
            f"{', '.join(EDIT_KINDS)} (and name=)"
        )
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
                    raise PolicyError(
                        f"{describe(*entry)} cannot be moved to {kind}: {op} cannot take that cast "
                        f"policy ({_needs(action)}); the kinds it can take: "
                        f"{', '.join(k for k, a in EDIT_KINDS.items() if a is None or takes(op, a))}"
                    )
        moved[kind] = ops
    seen: Dict[OpOverload, Tuple[str, Entry]] = {}
    for kind, ops in moved.items():
        for op, entry in ops.items():
            if op in seen and seen[op][0] != kind:
                first_kind, first_entry = seen[op]
                raise PolicyError(
                    f"{op} is named under two kinds of one edit: {first_kind}, as "
                    f"{describe(*first_entry)}, and {kind}, as {describe(*entry)}; name it once"
                )
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
    return dataclasses.replace(
        policy, name=name or _edit_suffix(policy.name), table=table, input_only=input_only, banned=banned, record=record
    )


def _needs(action: CastPolicy) -> str:
    if action is CastPolicy.FP32_SET_OPT_DTYPE:
        return "it needs a functional overload with a first Tensor argument and an optional dtype argument"
    return f"it needs an entry in ATen's redispatch table, one of: {', '.join(sorted(_ops.APPEND_DTYPE))}"


# --- preset names ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def get_preset(name: str) -> Policy:
    """The preset policy called ``name``; ``ValueError`` naming the valid presets otherwise."""
    try:
        options = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown policy preset {name!r}; valid presets: {', '.join(preset_names())}") from None
    return build_policy(name, **options)


def as_policy(policy: Union[str, Policy], *, env: bool = True) -> Policy:
    """The policy a region runs for ``policy``: a ``Policy`` as it is, or the preset of that
    name. The default preset, ``"hpu"``, takes the lists named by Gaudi's environment
    variables (``policy_from_env``) unless ``env=False``, whether it is given by name, as
    ``get_preset("hpu")`` or by default; another ``Policy`` runs as it is, with a warning once
    when the variables name list files (Note: one effective policy)."""
    if isinstance(policy, Policy):
        out = _env_for(policy) if env and gaudi.env_set() else policy
    elif isinstance(policy, str):
        out = policy_from_env(policy) if env and policy == DEFAULT_PRESET else get_preset(policy)
    else:
        raise TypeError(f"policy must be a preset name or a Policy, got {type(policy).__name__}")
    if env and out.record.dropped:
        warn_dropped(out)
    return out


_warned_dropped: set = set()


def warn_dropped(policy: Policy) -> None:
    """Warn once per policy name and dropped set of the ops its lists left on no list
    (``BuildRecord.dropped``): a replaced list says what it replaced, and how to keep it."""
    key = (policy.name, policy.record.dropped)
    if key in _warned_dropped:
        return
    _warned_dropped.add(key)
    names = list(dict.fromkeys(op.split(".")[1] for op, _ in policy.record.dropped))
    kinds = sorted({kind for _, kind in policy.record.dropped})
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    warnings.warn(
        f"policy {policy.name!r}: its lists replace the ones it was made from, and {len(names)} op"
        f"{'s' if len(names) != 1 else ''} of those ({', '.join(kinds)}) are on no list now and run as "
        f"their inputs are: {shown}. A list file or with_lists replaces a whole list, as Gaudi's files do; "
        f"to change some ops and keep the rest, use policy.edit(lower=[...], fp32=[...]) "
        f"(hpu-autocast policy shows the table)",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


# [Note: one effective policy]
# Gaudi's PT_HPU_AUTOCAST_*_OPS_LIST variables change the hpu preset for the whole process. A
# region of the default policy, of policy="hpu" and of policy=get_preset("hpu") (equal to the
# preset: a copy or a pickle of it too) all run the preset with those lists (policy_from_env), as
# the user expected of three spellings of one policy. get_preset itself stays the
# pristine preset: it is data, which the docs, `hpu-autocast diff`, the builders and the tests read
# as the source documents say. A Policy of one's own (an edit, a with_lists, a build) is what its
# maker asked for and runs as it is: the variables are then set and unused, which warns once per
# policy name, naming the way to combine both (policy_from_env().edit(...)). Asked only when a
# variable is set (gaudi.env_set: a few dict lookups), so a region's entry costs nothing otherwise.
_warned_unused: set = set()


def _env_for(policy: Policy) -> Policy:
    """``policy`` as a region runs it while a list-file variable is set (Note: one effective policy)."""
    lower, fp32 = gaudi.env_files()
    if not lower and not fp32:
        return policy
    pristine = get_preset(DEFAULT_PRESET)
    if policy is pristine or policy == pristine:
        return policy_from_env(DEFAULT_PRESET)
    if policy.name not in _warned_unused and policy != policy_from_env(DEFAULT_PRESET):
        _warned_unused.add(policy.name)
        files = ", ".join(f"{n}={p}" for n, p in ((gaudi.ENV_LOWER, lower), (gaudi.ENV_FP32, fp32)) if p)
        warnings.warn(
            f"{files} set, but unused: the region runs policy {policy.name!r} as it is; the variables "
            f"change the {DEFAULT_PRESET!r} preset (by name, get_preset({DEFAULT_PRESET!r}) or the default). "
            f"To edit the policy they make, start from hpu_autocast.builder.policy_from_env().edit(...)",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    return policy


# --- policies from list files, Gaudi's variables and configuration ---------------------------------


def policy_from_bridge_files(
    preset: Union[str, Policy], *, lower: Optional[PathLike] = None, fp32: Optional[PathLike] = None
) -> Policy:
    """``preset`` with the list files read as Gaudi's bridge reads its
    ``PT_HPU_AUTOCAST_*_OPS_LIST`` files (``gaudi``'s Note: list files as Gaudi's bridge reads
    them): each file replaces its own list only, an op on both lists is lower precision, and what
    Gaudi drops or refuses is dropped with a warning naming the file, the line and what Gaudi does;
    so is an FP32 entry that the lower file or the kept default lower list keeps in lower precision
    (``gaudi.bridge_lists``)."""
    base = as_policy(preset, env=False)
    lists = gaudi.bridge_lists(base, lower, fp32)
    if all(v is None for v in lists.values()):
        return base
    return with_lists(base, **lists, lower_first=True)


def policy_from_files(
    preset: Union[str, Policy], *, lower: Optional[PathLike] = None, fp32: Optional[PathLike] = None
) -> Policy:
    """``preset`` (a name or a ``Policy``) with its lower and/or FP32 list replaced by the
    contents of list files. An empty path (HMP scripts pass ``""``) or ``None`` keeps that list.
    """
    base = as_policy(preset, env=False)
    lower_entries = read_list(lower) if lower else None
    fp32_entries = read_list(fp32) if fp32 else None
    if lower_entries is None and fp32_entries is None:
        return base
    return with_lists(base, lower=lower_entries, fp32=fp32_entries)


#: preset -> (the stamps of the list files it was last read with, the policy read). One entry a
#: preset, replaced when a file changes: a process that rewrites its list files keeps only the
#: policy of the files as they are now (an earlier version kept every version ever read).
_last_read: Dict[str, Tuple[tuple, Policy]] = {}


def policy_from_env(preset: str = DEFAULT_PRESET) -> Policy:
    """``preset`` with the lists named by Gaudi's environment variables, if any are set.

    Files are read again only when their path, modification time or size changes, so
    creating many modes stays cheap: with no variable set, a call costs a few dict lookups
    (``gaudi``'s Note: asking the environment cheaply); with list files, two ``os.stat``.
    """
    if not gaudi.env_set():
        return as_policy(preset, env=False)
    lower, fp32 = gaudi.env_files()
    if not lower and not fp32:
        return as_policy(preset, env=False)
    stamps = (gaudi.stamp(lower), gaudi.stamp(fp32))
    last = _last_read.get(preset)
    if last is not None and last[0] == stamps:
        return last[1]
    policy = policy_from_bridge_files(preset, lower=lower, fp32=fp32)
    _last_read[preset] = (stamps, policy)
    return policy


def policy_from_gaudi_config(config: Union[PathLike, Mapping[str, object]]) -> Policy:
    """The policy that optimum-habana's Gaudi configuration sets up on Gaudi.

    ``config`` is the path of a ``gaudi_config.json`` (or of the directory holding one, as for
    ``GaudiConfig.from_pretrained``) or its contents as a dict. Its ``autocast_bf16_ops`` and
    ``autocast_fp32_ops`` replace the ``hpu`` preset's lower and FP32 lists: the result equals
    ``policy_from_files("hpu", lower=..., fp32=...)`` of the list files optimum-habana writes from
    them (``gaudi``'s Note: a Gaudi configuration as optimum-habana applies it). A configuration
    with neither list gives the ``hpu`` preset; one with only one of them also, with a warning, as
    optimum-habana then sets no list. Gaudi's ``PT_HPU_AUTOCAST_*`` variables are not read.

    An older configuration with ``use_habana_mixed_precision: true`` gives the HMP policy its
    ``hmp.convert`` ran: the ``hmp`` preset with ``hmp_bf16_ops`` and ``hmp_fp32_ops`` as its lists
    (optimum-habana's BERT lists where absent), or ``hmp-O2`` for ``hmp_opt_level: "O2"``.
    ``use_torch_autocast: false`` (without HMP) gives a policy that casts nothing: mixed precision
    is off. A key no ``GaudiConfig`` reads warns, naming the nearest known key.

    Raises ``PolicyError`` naming the file for a missing, unreadable or malformed file, naming the
    key for a list that is not a list of strings, and naming the op and its key
    (``'mmm' (gaudi_config.json, key autocast_bf16_ops[3])``, or ``(dict key ...)`` for a dict)
    for an op this torch does not have.
    """
    preset, lists = gaudi.read_gaudi_config(config)
    if preset is None:  # use_torch_autocast: false, without HMP
        return build_policy("gaudi-config (use_torch_autocast: false)", lower=(), fp32=())
    base = get_preset(preset)
    return with_lists(base, **lists) if lists else base

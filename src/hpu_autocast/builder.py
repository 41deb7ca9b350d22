"""The one policy builder: op names become a ``Policy`` here, for the presets, for
``with_lists`` and for list files.

    build_policy(name, lower=[...], fp32=[...], promote=[...])   a policy from op names
    with_lists(policy, lower=[...])                               a policy with lists replaced
    read_list(path)                                               a list file's names, with lines
    policy_from_files(preset, lower=path, fp32=path)              Gaudi's and HMP's list files
    policy_from_env()                                             Gaudi's environment variables
    policy_from_gaudi_config(path_or_dict)                        optimum-habana's gaudi_config.json
    as_policy(preset_or_policy)                                   the policy a region runs

Names become overloads in one loop (``_overloads``, through ``names.resolve``) and overloads
become a table in one place (``_table``): the lower and FP32 lists take precedence over
promote, an in-place overload on the promote list keeps its first input's dtype, and an op on
both the lower and the FP32 list is an error naming both entries.

A list file holds one op name per line; blank lines and ``#`` comments are allowed. A list
*replaces* the policy's list of that kind, as seed 000 says of Gaudi's override files; the
promote list stays unless one is given.

    PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=/path/lower.txt   (deprecated: LOWER_LIST)
    PT_HPU_AUTOCAST_FP32_OPS_LIST=/path/fp32.txt               (deprecated: FP32_LIST)

are read when a mode with the default policy (``"hpu"``) is created. optimum-habana writes its
``GaudiConfig``'s ``autocast_bf16_ops`` and ``autocast_fp32_ops`` to two such files and sets these
variables; ``policy_from_gaudi_config`` reads the configuration itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch
from torch._ops import OpOverload

from . import _ops
from .names import PolicyError, Source, describe, is_python_name, resolve
from .policy import BuildRecord, CastPolicy, Policy

__all__ = ["build_policy", "with_lists", "read_list", "policy_from_files", "policy_from_env",
           "policy_from_gaudi_config", "as_policy", "check_no_conflict", "ENV_LOWER", "ENV_FP32"]

ENV_LOWER = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
ENV_FP32 = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
#: Deprecated variable -> the variable that replaces it.
DEPRECATED_ENV = {"LOWER_LIST": ENV_LOWER, "FP32_LIST": ENV_FP32}
#: The preset a mode runs when it is given none; the environment's list files apply to it.
DEFAULT_PRESET = "hpu"

PathLike = Union[str, "os.PathLike[str]"]
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


# --- preset names ----------------------------------------------------------------------------------

# [Note: the registry hands in its lookup]
# hpu_autocast.presets builds its policies with this module, so this module may not import it
# back, not even inside a function (tests/internal/test_import_graph.py keeps the package free of
# cycles). A preset *name* given here is looked up with the function the registry installs
# when it is imported; `import hpu_autocast` imports it before anything can be called.
_preset_lookup: Optional[Callable[[str], Policy]] = None


def set_preset_lookup(lookup: Callable[[str], Policy]) -> None:
    """Called once by ``hpu_autocast.presets`` with its ``get_preset``."""
    global _preset_lookup
    _preset_lookup = lookup


def as_policy(policy: Union[str, Policy], *, env: bool = True) -> Policy:
    """The policy a region runs for ``policy``: a ``Policy`` as it is, or the preset of that
    name. The default preset, ``"hpu"``, takes the lists named by Gaudi's environment
    variables (``policy_from_env``) unless ``env=False``."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        if env and policy == DEFAULT_PRESET:
            return policy_from_env(policy)
        return _preset_lookup(policy)
    raise TypeError(f"policy must be a preset name or a Policy, got {type(policy).__name__}")


# --- list files ------------------------------------------------------------------------------------

def _read_text(path: str, what: str) -> str:
    """A text file's contents; ``PolicyError`` naming ``what`` and the file when it is missing,
    unreadable or not UTF-8 text."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise PolicyError(f"{what} {path!r} does not exist") from None
    except IsADirectoryError:
        raise PolicyError(f"{what} {path!r} is a directory, not a file") from None
    except OSError as e:
        raise PolicyError(f"{what} {path!r} cannot be read: {e.strerror}") from None
    if b"\0" in data:
        raise PolicyError(f"{what} {path!r} is not a text file (it contains NUL bytes)")
    try:
        return data.decode("utf-8-sig")  # Windows editors start UTF-8 files with a byte-order mark
    except UnicodeDecodeError as e:
        raise PolicyError(f"{what} {path!r} is not UTF-8 text (bad byte at offset {e.start})") from None


def read_list(path: PathLike) -> List[Entry]:
    """The op names of a list file, each with its ``(file, line)``.

    Raises ``PolicyError`` naming the file when it is missing, unreadable or not text.
    """
    path = os.fspath(path)
    text = _read_text(path, "op list file")
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if name:
            entries.append((name, (path, number)))
    return entries


def policy_from_files(preset: Union[str, Policy], *, lower: Optional[PathLike] = None,
                      fp32: Optional[PathLike] = None) -> Policy:
    """``preset`` (a name or a ``Policy``) with its lower and/or FP32 list replaced by the
    contents of list files. An empty path (HMP scripts pass ``""``) or ``None`` keeps that list.
    """
    base = as_policy(preset, env=False)
    lower_entries = read_list(lower) if lower else None
    fp32_entries = read_list(fp32) if fp32 else None
    if lower_entries is None and fp32_entries is None:
        return base
    return with_lists(base, lower=lower_entries, fp32=fp32_entries)


#: Every variable policy_from_env reads: the two of today, then the deprecated ones.
_ENV_NAMES = (ENV_LOWER, ENV_FP32, *DEPRECATED_ENV)

# [Note: asking the environment cheaply]
# policy_from_env runs for every region entered with the default policy, and usually none of
# its four variables is set. os.environ.get of a missing name raises and catches a KeyError
# inside, about 1 us each. CPython's os.environ keeps the variables in a dict, `_data`, under
# `encodekey(name)`; asking that dict is a few hash lookups. Where either is missing (another
# Python), os.environ itself is asked. Only the "is any of them set?" question goes this way.
try:
    _ENV_KEYS: Optional[tuple] = tuple(os.environ.encodekey(n) for n in _ENV_NAMES)
except AttributeError:  # pragma: no cover - not CPython
    _ENV_KEYS = None


def _env_set() -> bool:
    """Whether any of the list-file variables is set (perhaps to "")."""
    data = getattr(os.environ, "_data", None)
    if data is None or _ENV_KEYS is None:  # pragma: no cover - not CPython
        return any(os.environ.get(n) is not None for n in _ENV_NAMES)
    return not data.keys().isdisjoint(_ENV_KEYS)


def _env_path(new: str) -> Optional[str]:
    value = os.environ.get(new)
    if value:
        return value
    for old, replacement in DEPRECATED_ENV.items():
        if replacement == new and os.environ.get(old):
            warnings.warn(f"{old} is deprecated; set {new} instead", DeprecationWarning, stacklevel=4)
            return os.environ[old]
    return None


#: preset -> (the stamps of the list files it was last read with, the policy read). One entry a
#: preset, replaced when a file changes: a process that rewrites its list files keeps only the
#: policy of the files as they are now (an earlier version kept every version ever read).
_last_read: Dict[str, Tuple[tuple, Policy]] = {}


def _stamp(path: Optional[str]) -> Optional[tuple]:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)  # read_list reports it
    return (path, st.st_mtime_ns, st.st_size)


def policy_from_env(preset: str = DEFAULT_PRESET) -> Policy:
    """``preset`` with the lists named by Gaudi's environment variables, if any are set.

    Files are read again only when their path, modification time or size changes, so
    creating many modes stays cheap: with no variable set, a call costs a few dict lookups
    (Note: asking the environment cheaply); with list files, two ``os.stat``.
    """
    if not _env_set():
        return as_policy(preset, env=False)
    lower, fp32 = _env_path(ENV_LOWER), _env_path(ENV_FP32)
    if not lower and not fp32:
        return as_policy(preset, env=False)
    stamps = (_stamp(lower), _stamp(fp32))
    last = _last_read.get(preset)
    if last is not None and last[0] == stamps:
        return last[1]
    policy = policy_from_files(preset, lower=lower, fp32=fp32)
    _last_read[preset] = (stamps, policy)
    return policy


# --- optimum-habana's Gaudi configuration ----------------------------------------------------------

#: The file name optimum-habana's ``GaudiConfig.from_pretrained(directory)`` reads.
GAUDI_CONFIG_NAME = "gaudi_config.json"
#: ``GaudiConfig``'s keys for autocast's lists, and the list of ours each replaces.
GAUDI_CONFIG_LISTS = (("autocast_bf16_ops", "lower"), ("autocast_fp32_ops", "fp32"))


# [Note: a Gaudi configuration as optimum-habana applies it]
# optimum-habana (optimum/habana/transformers/gaudi_configuration.py, 1.x) reads gaudi_config.json
# into a GaudiConfig whose autocast_bf16_ops and autocast_fp32_ops default to None. Its
# declare_autocast_bf16_fp32_ops, called by GaudiTrainer and GaudiTrainingArguments when autocast
# is on and PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST is not set already, writes the two lists one
# op a line to /tmp/lower_list.txt and /tmp/fp32_list.txt and points PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST
# and PT_HPU_AUTOCAST_FP32_OPS_LIST at them, and only when *both* are given: a configuration with one
# list changes nothing on Gaudi. policy_from_gaudi_config gives what that route gives here (the
# files read by policy_from_env): both lists replace the hpu preset's, and one list alone is
# warned about and left out. use_torch_autocast says whether autocast runs at all, not which
# policy, so it is not read. (The module's DEFAULT_BF16_OPS and DEFAULT_FP32_OPS, BERT's lists
# from the HMP days, are no longer any field's default.)

def _gaudi_config(config: Union[PathLike, Mapping[str, Any]]) -> Tuple[Optional[str], Mapping[str, Any]]:
    """``(path or None, the configuration as a dict)``; errors name the file."""
    if isinstance(config, Mapping):
        return None, config
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"policy_from_gaudi_config takes the path of a {GAUDI_CONFIG_NAME} (or of the directory "
                        f"holding one) or its contents as a dict, got {type(config).__name__}")
    path = os.fspath(config)
    if os.path.isdir(path):
        path = os.path.join(path, GAUDI_CONFIG_NAME)
    text = _read_text(path, "Gaudi configuration")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PolicyError(f"Gaudi configuration {path!r} is not valid JSON: {e.msg} "
                          f"(line {e.lineno}, column {e.colno})") from None
    if not isinstance(data, dict):
        raise PolicyError(f"Gaudi configuration {path!r} holds a JSON {type(data).__name__}, not an object "
                          f'such as {{"autocast_bf16_ops": [...], "autocast_fp32_ops": [...]}}')
    return path, data


def _gaudi_config_list(data: Mapping[str, Any], key: str, path: Optional[str]) -> Optional[List[Entry]]:
    """The entries of one list key, each citing ``(path, "key[i]")``; ``None`` when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    where = f"Gaudi configuration {path!r}" if path is not None else "Gaudi configuration dict"
    if not isinstance(value, (list, tuple)):
        raise PolicyError(f"{where}: {key} must be a list of op names (or null), got {value!r} "
                          f"({type(value).__name__})")
    for i, name in enumerate(value):
        if not isinstance(name, str):
            raise PolicyError(f"{where}: {key}[{i}] is {name!r} ({type(name).__name__}), not an op name")
    return [(name, (path, f"{key}[{i}]")) for i, name in enumerate(value)]


def policy_from_gaudi_config(config: Union[PathLike, Mapping[str, Any]]) -> Policy:
    """The policy that optimum-habana's Gaudi configuration sets up on Gaudi.

    ``config`` is the path of a ``gaudi_config.json`` (or of the directory holding one, as for
    ``GaudiConfig.from_pretrained``) or its contents as a dict. Its ``autocast_bf16_ops`` and
    ``autocast_fp32_ops`` replace the ``hpu`` preset's lower and FP32 lists: the result equals
    ``policy_from_files("hpu", lower=..., fp32=...)`` of the list files optimum-habana writes from
    them (Note: a Gaudi configuration as optimum-habana applies it). A configuration with neither
    list gives the ``hpu`` preset; one with only one of them also, with a warning, as optimum-habana
    then sets no list. Gaudi's ``PT_HPU_AUTOCAST_*`` variables are not read.

    Raises ``PolicyError`` naming the file for a missing, unreadable or malformed file, naming the
    key for a list that is not a list of strings, and naming the op and its key
    (``'mmm' (gaudi_config.json, key autocast_bf16_ops[3])``, or ``(dict key ...)`` for a dict)
    for an op this torch does not have.
    """
    path, data = _gaudi_config(config)
    lists = {arg: _gaudi_config_list(data, key, path) for key, arg in GAUDI_CONFIG_LISTS}
    base = as_policy(DEFAULT_PRESET, env=False)
    given = [key for key, arg in GAUDI_CONFIG_LISTS if lists[arg] is not None]
    if len(given) == 1:
        missing = next(key for key, _ in GAUDI_CONFIG_LISTS if key not in given)
        where = repr(path) if path is not None else "dict"
        warnings.warn(f"Gaudi configuration {where} gives {given[0]} but not {missing}; optimum-habana sets "
                      f"autocast's lists only when both are given, so neither applies and the policy is the "
                      f"{DEFAULT_PRESET!r} preset's. Give both lists (to keep one of the preset's, copy its names: "
                      f"hpu-autocast policy --preset {DEFAULT_PRESET}).",
                      UserWarning, stacklevel=2)
    if len(given) < len(GAUDI_CONFIG_LISTS):
        return base
    return with_lists(base, **lists)

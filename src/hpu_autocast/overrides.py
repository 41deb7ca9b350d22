"""User overrides of a policy's lists: list files (Gaudi's environment variables, HMP's
``bf16_file_path``/``fp32_file_path``) and programmatic lists.

A list file holds one op name per line; blank lines and ``#`` comments are allowed. A list
*replaces* the policy's list of that kind, as seed 000 says of Gaudi's override files; the
promote list stays unless one is given, and the lower and FP32 lists take precedence over it.

    PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=/path/lower.txt   (deprecated: LOWER_LIST)
    PT_HPU_AUTOCAST_FP32_OPS_LIST=/path/fp32.txt               (deprecated: FP32_LIST)

are read when a mode with the default policy (``"hpu"``) is created.
"""

from __future__ import annotations

import os
import warnings
from typing import Dict, Iterable, List, Optional, Tuple, Union

from torch._ops import OpOverload

from .policy import CastPolicy, Policy
from .presets import check_no_conflict
from .names import PolicyError, Source, resolve

__all__ = ["read_list", "with_lists", "policy_from_files", "policy_from_env", "ENV_LOWER", "ENV_FP32"]

ENV_LOWER = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
ENV_FP32 = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
#: Deprecated variable -> the variable that replaces it.
DEPRECATED_ENV = {"LOWER_LIST": ENV_LOWER, "FP32_LIST": ENV_FP32}

PathLike = Union[str, "os.PathLike[str]"]
Entry = Tuple[str, Source]


def read_list(path: PathLike) -> List[Entry]:
    """The op names of a list file, each with its ``(file, line)``.

    Raises ``PolicyError`` naming the file when it is missing, unreadable or not text.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise PolicyError(f"op list file {path!r} does not exist") from None
    except IsADirectoryError:
        raise PolicyError(f"op list file {path!r} is a directory, not a file") from None
    except OSError as e:
        raise PolicyError(f"op list file {path!r} cannot be read: {e.strerror}") from None
    if b"\0" in data:
        raise PolicyError(f"op list file {path!r} is not a text file (it contains NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyError(f"op list file {path!r} is not UTF-8 text (bad byte at offset {e.start})") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if name:
            entries.append((name, (path, number)))
    return entries


def _resolve_entries(entries: Iterable) -> Dict[OpOverload, Entry]:
    out: Dict[OpOverload, Entry] = {}
    for e in entries:
        name, source = e if isinstance(e, tuple) else (e, None)
        for op in resolve(name, source):
            out.setdefault(op, (name, source))
    return out


def with_lists(policy: Policy, *, lower: Optional[Iterable] = None, fp32: Optional[Iterable] = None,
               promote: Optional[Iterable] = None, name: Optional[str] = None) -> Policy:
    """A new policy whose lower, FP32 and/or promote lists are replaced by these names.

    Each list holds op names or ``(name, (file, line))`` entries; a list left ``None`` keeps the
    policy's own. An op on both a given lower list and a given FP32 list is an error naming
    both entries; an op a given list names leaves the kept default list of the other kind.
    """
    from . import _ops

    def current(*kinds: CastPolicy) -> Dict[OpOverload, Entry]:
        return {op: (str(op), None) for op, a in policy.table.items() if a in kinds}

    low = _resolve_entries(lower) if lower is not None else current(CastPolicy.LOWER)
    f32 = _resolve_entries(fp32) if fp32 is not None else current(CastPolicy.FP32)
    if promote is not None:
        pro = _resolve_entries(promote)
    else:
        pro = {**current(CastPolicy.PROMOTE, CastPolicy.FIRST), **{op: (str(op), None) for op in policy.promoted}}
    # A user's list wins over a kept default list; two user lists naming one op conflict.
    if lower is not None and fp32 is None:
        f32 = {op: e for op, e in f32.items() if op not in low}
    elif fp32 is not None and lower is None:
        low = {op: e for op, e in low.items() if op not in f32}
    check_no_conflict(low, f32)
    table: Dict[OpOverload, CastPolicy] = {
        op: CastPolicy.FIRST if _ops.is_inplace(op) else CastPolicy.PROMOTE for op in pro}
    # The lower and FP32 lists take precedence over promote.
    table.update({op: CastPolicy.LOWER for op in low})
    table.update({op: CastPolicy.FP32 for op in f32})
    input_only = {op for op in policy.input_only if table.get(op) is CastPolicy.LOWER}
    import dataclasses

    return dataclasses.replace(policy, table=table, name=name or f"{policy.name}+lists",
                               input_only=input_only, promoted=frozenset(pro))


def _as_policy(preset: Union[str, Policy]) -> Policy:
    if isinstance(preset, Policy):
        return preset
    from .presets import get_preset

    return get_preset(preset)


def policy_from_files(preset: Union[str, Policy], *, lower: Optional[PathLike] = None,
                      fp32: Optional[PathLike] = None) -> Policy:
    """``preset`` with its lower and/or FP32 list replaced by the contents of list files.

    An empty path (HMP scripts pass ``""``) or ``None`` keeps that list.
    """
    base = _as_policy(preset)
    lower_entries = read_list(lower) if lower else None
    fp32_entries = read_list(fp32) if fp32 else None
    if lower_entries is None and fp32_entries is None:
        return base
    return with_lists(base, lower=lower_entries, fp32=fp32_entries)


def _env_path(new: str) -> Optional[str]:
    value = os.environ.get(new)
    if value:
        return value
    for old, replacement in DEPRECATED_ENV.items():
        if replacement == new and os.environ.get(old):
            warnings.warn(f"{old} is deprecated; set {new} instead", DeprecationWarning, stacklevel=4)
            return os.environ[old]
    return None


_cache: Dict[tuple, Policy] = {}


def _stamp(path: Optional[str]) -> Optional[tuple]:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)  # read_list reports it
    return (path, st.st_mtime_ns, st.st_size)


def policy_from_env(preset: str = "hpu") -> Policy:
    """``preset`` with the lists named by Gaudi's environment variables, if any are set.

    Files are read again only when their path, modification time or size changes, so
    creating many modes stays cheap.
    """
    lower, fp32 = _env_path(ENV_LOWER), _env_path(ENV_FP32)
    if not lower and not fp32:
        return _as_policy(preset)
    key = (preset, _stamp(lower), _stamp(fp32))
    policy = _cache.get(key)
    if policy is None:
        policy = _cache[key] = policy_from_files(preset, lower=lower, fp32=fp32)
    return policy

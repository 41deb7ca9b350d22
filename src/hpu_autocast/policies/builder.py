"""Policies from op names, list files and configurations: what a user builds, and the policy a
region runs for a preset name.

    build_policy(name, lower=[...], fp32=[...], promote=[...])   a policy from op names
    with_lists(policy, lower=[...])                               a policy with lists replaced
    read_list(path)                                               a list file's names, with lines
    policy_from_files(preset, lower=path, fp32=path)              Gaudi's and HMP's list files
    policy_from_env()                                             Gaudi's environment variables
    policy_from_gaudi_config(path_or_dict)                        optimum-habana's gaudi_config.json
    as_policy(preset_or_policy)                                   the policy a region runs

``build_policy`` and ``with_lists`` are ``_build``'s (names become overloads, and overloads a
table, there; the presets build with it); this module is above the presets, so a preset name
given here is looked up in the registry directly (``presets.get_preset``).

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

import json
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ._build import Entry, build_policy, check_no_conflict, with_lists
from .names import PolicyError
from .policy import Policy
from .presets import get_preset

__all__ = ["build_policy", "with_lists", "read_list", "policy_from_files", "policy_from_env",
           "policy_from_gaudi_config", "as_policy", "check_no_conflict", "ENV_LOWER", "ENV_FP32"]

ENV_LOWER = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
ENV_FP32 = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
#: Deprecated variable -> the variable that replaces it.
DEPRECATED_ENV = {"LOWER_LIST": ENV_LOWER, "FP32_LIST": ENV_FP32}
#: The preset a mode runs when it is given none; the environment's list files apply to it.
DEFAULT_PRESET = "hpu"

PathLike = Union[str, "os.PathLike[str]"]


# --- preset names ----------------------------------------------------------------------------------

def as_policy(policy: Union[str, Policy], *, env: bool = True) -> Policy:
    """The policy a region runs for ``policy``: a ``Policy`` as it is, or the preset of that
    name. The default preset, ``"hpu"``, takes the lists named by Gaudi's environment
    variables (``policy_from_env``) unless ``env=False``."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        if env and policy == DEFAULT_PRESET:
            return policy_from_env(policy)
        return get_preset(policy)
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

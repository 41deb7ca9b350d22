"""How Gaudi's bridge reads what configures its autocast: the op names of its lists (which it
applies: C++ function names of functional ATen ops it registers a kernel for), its list files,
the two ``PT_HPU_AUTOCAST_*_OPS_LIST`` variables naming them, and optimum-habana's
``gaudi_config.json``. This module reads, and says what Gaudi does with what it reads (a name
applied or ignored, a file line kept or dropped, a configuration's lists applied or not);
``hpu_autocast.policies.builder`` builds the policies (``policy_from_env``,
``policy_from_bridge_files``, ``policy_from_gaudi_config``) from what it reads.

A list file holds one op name per line; blank lines and ``#`` comments are allowed (``read_list``;
HMP's list files are read so too). The bridge reads its two variables' files more strictly
(``bridge_findings``: Note: list files as Gaudi's bridge reads them).

    PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=/path/lower.txt   (deprecated: LOWER_LIST)
    PT_HPU_AUTOCAST_FP32_OPS_LIST=/path/fp32.txt               (deprecated: FP32_LIST)

are read when a region of the default policy (``"hpu"``) is entered. optimum-habana writes its
``GaudiConfig``'s ``autocast_bf16_ops`` and ``autocast_fp32_ops`` to two such files and sets these
variables; ``read_gaudi_config`` reads the configuration itself.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from .. import _torch
from .._facts import ops as _ops
from .._torch import OpOverload
from .names import Entry, PolicyError, is_python_name, resolve, user_stacklevel
from .policy import CastPolicy, Policy

__all__ = ["read_list", "bridge_findings", "check_findings", "pair_findings", "Finding", "ENV_LOWER", "ENV_FP32"]

ENV_LOWER = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
ENV_FP32 = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
#: Deprecated variable -> the variable that replaces it.
DEPRECATED_ENV = {"LOWER_LIST": ENV_LOWER, "FP32_LIST": ENV_FP32}
#: The preset a region runs when it is given none; the variables' list files apply to it.
DEFAULT_PRESET = "hpu"

PathLike = Union[str, "os.PathLike[str]"]


# --- the names Gaudi's bridge applies ----------------------------------------------------------------

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


def bridge_applies(name: str, ops: List[OpOverload]) -> Tuple[List[OpOverload], Optional[str]]:
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
AUTOCAST_BLOCKLIST = frozenset(
    {
        "_cummax_helper",
        "_cummin_helper",
        "fused_moving_avg_obs_fake_quant",
        "_fused_moving_avg_obs_fq_helper",
        "_native_batch_norm_legit",
        "sym_size",
        "sym_numel",
        "sym_stride",
        "sym_storage_offset",
        "_scaled_dot_product_flash_attention",
        "_efficient_attention_forward",
        "_batch_norm_with_update",
        "_scaled_dot_product_fused_attention_overrideable",
    }
)
#: Where torch exposes ATen's function variants (a name in none of them is a method-only op).
_FUNCTION_NAMESPACES = ("_VariableFunctions", "_nn", "_linalg", "_special", "_fft", "_nested", "_sparse")


def never_registered(function: str) -> Optional[str]:
    """Why Gaudi's bridge registers no autocast kernel for the ATen function ``function`` (its
    C++ name), or ``None`` when it registers one (Note: the names Gaudi's bridge never registers)."""
    if function.endswith(("_out", "_")):
        return (
            "Gaudi's bridge registers no autocast kernel for an in-place or out= function (a name ending in _ or _out)"
        )
    part = next((p for p in _SKIPPED_PARTS if p in function), None)
    if part is not None:
        return f"Gaudi's bridge registers no autocast kernel for a function whose name contains {part!r}"
    if function in AUTOCAST_BLOCKLIST:
        return "Gaudi's bridge registers no autocast kernel for it (gen_op.py's AUTOCAST_BLOCKLIST)"
    if hasattr(_torch.TensorBase, function) and not any(
        hasattr(_torch.c_function_namespace(ns), function) for ns in _FUNCTION_NAMESPACES
    ):
        return "a Tensor method with no function variant, for which Gaudi's bridge registers no autocast kernel"
    return None


def cpp_hint(name: str, why: str) -> str:
    """For a Python name, the C++ function it stands for (and whether Gaudi could cast it)."""
    if why != _PYTHON_NAME:
        return ""
    ops = resolve(name)
    cpp = ", ".join(sorted({_ops.op_base_name(op) for op in ops}))
    if all(_ops.is_inplace(op) or _ops.is_out(op) for op in ops):
        return f"; its C++ function, {cpp}, is in-place, and Gaudi's bridge casts no in-place function"
    return f"; its C++ name is {cpp}"


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


# --- list files as Gaudi's bridge reads them -------------------------------------------------------

# [Note: list files as Gaudi's bridge reads them]
# Gaudi's bridge (gaudi-pytorch-bridge, hpu_ops/autocast_helpers.h and, newest,
# hpu_ops/backend/autocast_helpers.cpp's load_ops_list) loads each of its two variables on its own:
# a variable that is unset, or whose file is missing, a directory, or under a system folder
# (validate_ops_list_path: /bin /etc /usr /var /boot /dev /lib /lost+found /proc /run /sbin /srv
# /sys /root, after resolving links), leaves that list at its default, with a warning. A file's
# lines are read whole (getline: no trimming, no comments) and each is kept only if it is the
# name of an ATen operator ("Discarded unregistered op at line: N" otherwise). Hpu_KERNEL then
# tries the lower list, then FP32, then promote, so an FP32 file alone keeps the default lower
# list (mm, listed in it, stays lower), and an op on both lists is lower precision. Here the
# variables are read so (policy_from_bridge_files): whatever Gaudi drops or ignores is dropped
# or ignored, with one warning per file and name saying what Gaudi does with it; `hpu-autocast
# check --gaudi` reports the same findings as errors. Blank and "#" lines, which Gaudi discards
# too, are skipped quietly (Gaudi's discarding them changes nothing).

#: Top-level folders under which the bridge refuses a list file (validate_ops_list_path).
SYSTEM_FOLDERS = (
    "/bin",
    "/etc",
    "/usr",
    "/var",
    "/boot",
    "/dev",
    "/lib",
    "/lost+found",
    "/proc",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/root",
)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing Gaudi's bridge does with a list file other than what its text says: the file
    (``line`` ``None``: the whole file is refused) or one line, with what Gaudi does with it."""

    path: str
    line: Optional[int]
    name: str
    what: str

    def __str__(self) -> str:
        where = f"{self.path}, line {self.line}" if self.line is not None else self.path
        return f"{where}: {self.what}"


def _path_problem(path: str) -> Optional[str]:
    """Why the bridge would refuse to read ``path`` (then it keeps the default list), or None."""
    if not os.path.exists(path):
        return "does not exist"
    if os.path.isdir(path):
        return "is a directory"
    parts = os.path.realpath(path).split(os.sep)
    top = os.sep + parts[1] if len(parts) > 1 else os.sep
    if top in SYSTEM_FOLDERS:
        return f"is under the system folder {top}, where Gaudi's bridge reads no list file"
    if not os.access(path, os.R_OK):
        return "cannot be read"
    return None


def _line_problem(raw: str, name: str) -> Optional[str]:
    """Why Gaudi's bridge, which compares whole lines, would not match ``raw`` although this
    package reads ``name`` from it; None when the line is the name."""
    if raw == name:
        return None
    if raw.endswith("\r"):
        return (
            "the line ends in a carriage return (a Windows line end), which Gaudi's bridge keeps as "
            "part of the name, so it matches no op; save the file with Unix line ends"
        )
    if raw.startswith("\ufeff"):
        return "the file starts with a byte-order mark, which Gaudi's bridge reads as part of the first name"
    if "#" in raw:
        return "Gaudi's bridge reads comments as part of the name; put the comment on a line of its own"
    return "Gaudi's bridge keeps the spaces around the name, so it matches no op"


def _unregistered(name: str) -> Optional[str]:
    """Why ``name`` is no ATen operator name to the bridge (its list keeps only those), or None."""
    try:
        ops = resolve(name)
    except PolicyError as e:
        hint = f" ({e})"
    else:
        if "." not in name and ":" not in name and _ops.find_packet("aten", name) is not None:
            return None
        base = sorted({_ops.op_base_name(op) for op in ops})
        hint = f"; Gaudi's list files take ATen function names only: write {' or '.join(base)}"
    return f'not an ATen op name, and Gaudi\'s bridge keeps only those ("Discarded unregistered op at line"){hint}'


def bridge_findings(path: PathLike) -> Tuple[Optional[List[Entry]], List[Finding]]:
    """``(entries, findings)`` of a list file read as Gaudi's bridge reads it (Note: list files as
    Gaudi's bridge reads them): ``entries`` the names Gaudi keeps, each with ``(file, line)``, or
    ``None`` when Gaudi refuses the file and keeps the default list; ``findings`` what Gaudi
    does otherwise than the text says. Names Gaudi keeps but never registers a kernel for (an
    in-place name, gelu_backward) are among the entries; the hpu policy ignores them
    (``never_registered``), and ``check --gaudi`` reports them."""
    path = os.fspath(path)
    problem = _path_problem(path)
    if problem is not None:
        return None, [Finding(path, None, "", f"{problem}; Gaudi's bridge warns and keeps the default list")]
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # getline reads no line after the last newline
    entries, findings = [], []
    for number, raw in enumerate(lines, 1):
        name = raw.lstrip("\ufeff").split("#", 1)[0].strip()
        if not name:
            continue
        why = _line_problem(raw, name) or _unregistered(name)
        if why is not None:
            findings.append(Finding(path, number, name, f"{name!r} is dropped, as on Gaudi: {why}"))
            continue
        entries.append((name, (path, number)))
    return entries, findings


def _never_registered_findings(entries: List[Entry]) -> List[Finding]:
    """The entries Gaudi keeps but never casts (Note: the names Gaudi's bridge never registers)."""
    out = []
    for name, (path, line) in entries:
        why = never_registered(name)
        if why is not None:
            out.append(Finding(path, line, name, f"{name!r} has no effect, as on Gaudi: {why}"))
    return out


def check_findings(path: PathLike) -> List[Finding]:
    """Everything Gaudi's bridge would do with the list file at ``path`` other than what its text
    says (what ``hpu-autocast check --gaudi`` reports)."""
    entries, findings = bridge_findings(path)
    return findings + _never_registered_findings(entries or [])


_warned_findings: set = set()


def _warn(findings: List[Finding]) -> None:
    """One warning per finding's file and name (line-independent), the first time it is seen."""
    for f in findings:
        key = (f.path, f.name)
        if key not in _warned_findings:
            _warned_findings.add(key)
            warnings.warn(str(f), UserWarning, stacklevel=user_stacklevel())


def _ops_of(name: str) -> set:
    try:
        return set(resolve(name))
    except PolicyError:
        return set()


def pair_findings(
    base: Policy, lower: Optional[List[Entry]], fp32: Optional[List[Entry]], lower_path: Optional[str] = None
) -> List[Finding]:
    """What Gaudi's bridge does with an FP32 file's entries otherwise than the file says, given the
    lower file's entries (``None``: no lower file, so ``base``'s lower list stays): an entry also
    on the lower file, and one the kept default lower list shadows, both run in lower precision
    (the bridge tries the lower list first; Note: list files as Gaudi's bridge reads them)."""
    out: List[Finding] = []
    low: Dict[Any, Entry] = {}
    for name, source in lower or ():
        for op in _ops_of(name):
            low.setdefault(op, (name, source))
    for name, (path, line) in fp32 or ():
        ops = _ops_of(name)
        if lower is not None:
            hit = next((low[op] for op in sorted(ops, key=str) if op in low), None)
            if hit is not None:
                lname, (lpath, lline) = hit
                out.append(
                    Finding(
                        path,
                        line,
                        name,
                        f"{name!r} is also on the lower file ({lpath}, line {lline}, as "
                        f"{lname!r}): it runs in lower precision, as on Gaudi, whose bridge tries the lower "
                        "list first; remove it from one file",
                    )
                )
        else:
            shadowed = sorted((str(op) for op in ops if base.table.get(op) is CastPolicy.LOWER))
            if shadowed:
                out.append(
                    Finding(
                        path,
                        line,
                        name,
                        f"{name!r} stays in lower precision: it is on the default lower "
                        f"list ({', '.join(shadowed)}), which stays when only the FP32 file is given, and "
                        "Gaudi's bridge tries the lower list first; give a lower file without it too, or "
                        f"use get_preset({base.name!r}).edit(fp32=[{name!r}])",
                    )
                )
    return out


def bridge_lists(
    base: Policy, lower: Optional[PathLike] = None, fp32: Optional[PathLike] = None
) -> Dict[str, Optional[List[Entry]]]:
    """The lists Gaudi's bridge reads from its list files, for a policy made from ``base``:
    ``{"lower": entries, "fp32": entries}`` for each path given (entries ``None`` where the bridge
    refuses the file and keeps ``base``'s list). What Gaudi drops or refuses is warned about
    once per file and name, and so is an FP32 entry that the lower file or ``base``'s kept lower
    list keeps in lower precision (``pair_findings``; Note: list files as Gaudi's bridge reads them)."""
    lists: Dict[str, Optional[List[Entry]]] = {}
    for arg, path in (("lower", lower), ("fp32", fp32)):
        if path:
            entries, findings = bridge_findings(path)
            _warn(findings)
            lists[arg] = entries
    if lists.get("fp32"):
        _warn(pair_findings(base, lists.get("lower"), lists["fp32"]))
    return lists


# --- the environment ---------------------------------------------------------------------------------

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


def env_set() -> bool:
    """Whether any of the list-file variables is set (perhaps to "")."""
    data = getattr(os.environ, "_data", None)
    if data is None or _ENV_KEYS is None:  # pragma: no cover - not CPython
        return any(os.environ.get(n) is not None for n in _ENV_NAMES)
    return not data.keys().isdisjoint(_ENV_KEYS)


def env_path(new: str) -> Optional[str]:
    value = os.environ.get(new)
    if value:
        return value
    for old, replacement in DEPRECATED_ENV.items():
        if replacement == new and os.environ.get(old):
            warnings.warn(f"{old} is deprecated; set {new} instead", DeprecationWarning, stacklevel=user_stacklevel())
            return os.environ[old]
    return None


#: preset -> (the stamps of the list files it was last read with, the policy read). One entry a


def env_files() -> Tuple[Optional[str], Optional[str]]:
    """The lower and FP32 list files the variables name (``None`` for one unset or empty)."""
    return env_path(ENV_LOWER), env_path(ENV_FP32)


def stamp(path: Optional[str]) -> Optional[tuple]:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)  # read_list reports it
    return (path, st.st_mtime_ns, st.st_size)


# --- optimum-habana's Gaudi configuration ----------------------------------------------------------

#: The file name optimum-habana's ``GaudiConfig.from_pretrained(directory)`` reads.
GAUDI_CONFIG_NAME = "gaudi_config.json"
#: ``GaudiConfig``'s keys for autocast's lists, and the list of ours each replaces.
GAUDI_CONFIG_LISTS = (("autocast_bf16_ops", "lower"), ("autocast_fp32_ops", "fp32"))
#: The older configurations' keys for HMP's lists (``use_habana_mixed_precision``), likewise.
GAUDI_CONFIG_HMP_LISTS = (("hmp_bf16_ops", "lower"), ("hmp_fp32_ops", "fp32"))
#: optimum-habana's DEFAULT_BF16_OPS and DEFAULT_FP32_OPS (BERT's): what an older GaudiConfig
#: gave HMP when hmp_bf16_ops or hmp_fp32_ops was absent.
GAUDI_CONFIG_HMP_DEFAULTS = {
    "lower": [
        "add",
        "addmm",
        "bmm",
        "div",
        "dropout",
        "gelu",
        "iadd",
        "linear",
        "layer_norm",
        "matmul",
        "mm",
        "rsub",
        "softmax",
        "truediv",
    ],
    "fp32": ["embedding", "nll_loss", "log_softmax"],
}
#: Every key a GaudiConfig of optimum-habana 1.x reads or writes (``optimum_version`` and
#: ``transformers_version``: the metadata its save_pretrained adds).
GAUDI_CONFIG_KEYS = frozenset(
    {
        "use_torch_autocast",
        "autocast_bf16_ops",
        "autocast_fp32_ops",
        "use_habana_mixed_precision",
        "hmp_bf16_ops",
        "hmp_fp32_ops",
        "hmp_is_verbose",
        "hmp_opt_level",
        "use_fused_adam",
        "use_fused_clip_norm",
        "use_dynamic_shapes",
        "optimum_version",
        "transformers_version",
    }
)


# [Note: a Gaudi configuration as optimum-habana applies it]
# optimum-habana (optimum/habana/transformers/gaudi_configuration.py, 1.x) reads gaudi_config.json
# into a GaudiConfig whose autocast_bf16_ops and autocast_fp32_ops default to None. Its
# declare_autocast_bf16_fp32_ops, called by GaudiTrainer and GaudiTrainingArguments when autocast
# is on and PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST is not set already, writes the two lists one
# op a line to /tmp/lower_list.txt and /tmp/fp32_list.txt and points PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST
# and PT_HPU_AUTOCAST_FP32_OPS_LIST at them, and only when *both* are given: a configuration with one
# list changes nothing on Gaudi. policy_from_gaudi_config gives what that route gives here (the
# files read by policy_from_env): both lists replace the hpu preset's, and one list alone is
# warned about and left out. (The module's DEFAULT_BF16_OPS and DEFAULT_FP32_OPS, BERT's lists
# from the HMP days, are no longer the autocast fields' default.)
#
# Older configurations (optimum-habana up to 1.5) ran Habana Mixed Precision instead:
# use_habana_mixed_precision true made GaudiTrainer write hmp_bf16_ops and hmp_fp32_ops (absent:
# DEFAULT_BF16_OPS and DEFAULT_FP32_OPS) to two files and call hmp.convert(opt_level=hmp_opt_level
# ("O1" if absent), bf16_file_path=..., fp32_file_path=...): the result is hmp.convert's policy,
# the hmp preset with both lists replaced (hmp-O2 for "O2", which ignores the lists). GaudiConfig
# refused use_habana_mixed_precision together with use_torch_autocast (a ValueError): so does this.
# use_torch_autocast: false, explicitly, with no HMP, turns mixed precision off: the policy casts
# nothing (an absent key is read as the presence of lists says, since newer optimum-habana turns
# autocast on from the trainer's --bf16 too). GaudiConfig keeps a key it does not know as an
# attribute, silently (BaseConfig); here such a key warns, naming the nearest known key, since a
# misspelt list key (autocast_bf16_op) would otherwise leave Gaudi's default lists in force.


def _gaudi_config(config: Union[PathLike, Mapping[str, Any]]) -> Tuple[Optional[str], Mapping[str, Any]]:
    """``(path or None, the configuration as a dict)``; errors name the file."""
    if isinstance(config, Mapping):
        return None, config
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(
            f"policy_from_gaudi_config takes the path of a {GAUDI_CONFIG_NAME} (or of the directory "
            f"holding one) or its contents as a dict, got {type(config).__name__}"
        )
    path = os.fspath(config)
    if os.path.isdir(path):
        path = os.path.join(path, GAUDI_CONFIG_NAME)
    text = _read_text(path, "Gaudi configuration")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PolicyError(
            f"Gaudi configuration {path!r} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        ) from None
    if not isinstance(data, dict):
        raise PolicyError(
            f"Gaudi configuration {path!r} holds a JSON {type(data).__name__}, not an object "
            f'such as {{"autocast_bf16_ops": [...], "autocast_fp32_ops": [...]}}'
        )
    return path, data


def _gaudi_config_list(data: Mapping[str, Any], key: str, path: Optional[str]) -> Optional[List[Entry]]:
    """The entries of one list key, each citing ``(path, "key[i]")``; ``None`` when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    where = f"Gaudi configuration {path!r}" if path is not None else "Gaudi configuration dict"
    if not isinstance(value, (list, tuple)):
        raise PolicyError(
            f"{where}: {key} must be a list of op names (or null), got {value!r} ({type(value).__name__})"
        )
    for i, name in enumerate(value):
        if not isinstance(name, str):
            raise PolicyError(f"{where}: {key}[{i}] is {name!r} ({type(name).__name__}), not an op name")
    return [(name, (path, f"{key}[{i}]")) for i, name in enumerate(value)]


def _gaudi_where(path: Optional[str]) -> str:
    return f"Gaudi configuration {path!r}" if path is not None else "Gaudi configuration dict"


def _warn_unknown_gaudi_keys(data: Mapping[str, Any], path: Optional[str]) -> None:
    """Warn of each key no GaudiConfig reads, with the nearest known one (Note: a Gaudi configuration)."""
    for key in data:
        if key in GAUDI_CONFIG_KEYS or (isinstance(key, str) and key.startswith("_")):
            continue
        near = difflib.get_close_matches(str(key), sorted(GAUDI_CONFIG_KEYS), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        warnings.warn(
            f"{_gaudi_where(path)}: unknown key {key!r}, ignored (optimum-habana keeps it unread); "
            f"{hint}the keys read are {', '.join(sorted(GAUDI_CONFIG_KEYS))}",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def read_gaudi_config(config: Union[PathLike, Mapping[str, Any]]) -> Tuple[Optional[str], Dict[str, List[Entry]]]:
    """What optimum-habana's Gaudi configuration sets up on Gaudi, as ``(preset, lists)``: the
    preset it starts from (``None``: mixed precision off, a policy that casts nothing) and the
    lists that replace the preset's (empty: the preset as it is) (Note: a Gaudi configuration as
    optimum-habana applies it). ``config`` is a ``gaudi_config.json``'s path, its directory's, or
    its contents as a dict. A key no ``GaudiConfig`` reads, and one autocast list given without
    the other, warn; a malformed file or list raises ``PolicyError`` naming it."""
    path, data = _gaudi_config(config)
    _warn_unknown_gaudi_keys(data, path)
    hmp_on, autocast = data.get("use_habana_mixed_precision"), data.get("use_torch_autocast")
    if hmp_on and autocast:
        raise PolicyError(
            f"{_gaudi_where(path)}: use_habana_mixed_precision and use_torch_autocast are both true; "
            "optimum-habana refuses that (one mixed-precision mode or the other): set one to false"
        )
    if hmp_on:  # an older configuration's HMP policy: what its hmp.convert call ran
        level = data.get("hmp_opt_level") or "O1"
        if level not in ("O1", "O2"):
            raise PolicyError(f'{_gaudi_where(path)}: hmp_opt_level must be "O1" or "O2", got {level!r}')
        if level == "O2":
            return "hmp-O2", {}
        lists = {arg: _gaudi_config_list(data, key, path) for key, arg in GAUDI_CONFIG_HMP_LISTS}
        return "hmp", {
            arg: GAUDI_CONFIG_HMP_DEFAULTS[arg] if entries is None else entries for arg, entries in lists.items()
        }
    if autocast is False:
        return None, {}
    lists = {arg: _gaudi_config_list(data, key, path) for key, arg in GAUDI_CONFIG_LISTS}
    given = [key for key, arg in GAUDI_CONFIG_LISTS if lists[arg] is not None]
    if len(given) == 1:
        missing = next(key for key, _ in GAUDI_CONFIG_LISTS if key not in given)
        where = repr(path) if path is not None else "dict"
        warnings.warn(
            f"Gaudi configuration {where} gives {given[0]} but not {missing}; optimum-habana sets "
            f"autocast's lists only when both are given, so neither applies and the policy is the "
            f"{DEFAULT_PRESET!r} preset's. Give both lists (to keep one of the preset's, copy its names: "
            f"hpu-autocast policy --preset {DEFAULT_PRESET}).",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    if len(given) < len(GAUDI_CONFIG_LISTS):
        return DEFAULT_PRESET, {}
    return DEFAULT_PRESET, lists

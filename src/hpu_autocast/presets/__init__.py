"""Presets: one data module per source document, and the loader that turns their op names
into ``Policy`` tables. Version quirks (names a torch build lacks, overloads it registers)
live here, never in the data modules."""

from __future__ import annotations

import functools
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch._ops import OpOverload

from .. import _ops
from ..policy import CastPolicy, Policy
from ..names import PolicyError, Source, resolve
import dataclasses

from . import hmp as _hmp
from . import hpu as _hpu
from . import torch_cpu as _torch_cpu
from . import torch_cuda as _torch_cuda
from . import xpu as _xpu

__all__ = ["PRESETS", "get_preset", "build_policy", "preset_names"]

Entry = Tuple[str, Optional[Source]]


def _entries(names: Iterable, file: Optional[str] = None) -> List[Entry]:
    out = []
    for i, n in enumerate(names):
        if isinstance(n, tuple):
            out.append(n)
        else:
            out.append((n, (file, i + 1) if file else None))
    return out


def _resolve_all(entries: Sequence[Entry], *, tolerate_missing: bool, registered: Optional[str],
                 missing: List[str], keep_composites: bool = False) -> Dict[OpOverload, Entry]:
    """Resolve entries to ``{overload: the entry that named it}``."""
    out: Dict[OpOverload, Entry] = {}
    for name, source in entries:
        try:
            ops = resolve(name, source)
        except PolicyError:
            if not tolerate_missing:
                raise
            missing.append(name)
            continue
        if registered is not None:
            ops = [op for op in ops if _ops.has_kernel(op, registered) or (keep_composites and _ops.is_composite(op))]
            if not ops:
                missing.append(name)
                continue
        for op in ops:
            out.setdefault(op, (name, source))
    return out


def _describe(entry: Entry) -> str:
    name, source = entry
    if source and source[0]:
        return f"{name!r} ({source[0]}, line {source[1]})" if source[1] else f"{name!r} ({source[0]})"
    return repr(name)


def check_no_conflict(low: Mapping[OpOverload, Entry], f32: Mapping[OpOverload, Entry]) -> None:
    """Raise ``PolicyError`` naming the first op (in lower-list order) that is on both lists,
    with the entries that put it there, and how many more there are."""
    both = [op for op in low if op in f32]
    if both:
        op = both[0]
        more = f" (and {len(both) - 1} more: {', '.join(str(o) for o in both[1:4])}{', ...' if len(both) > 4 else ''})" \
            if len(both) > 1 else ""
        raise PolicyError(f"{op} is on both the lower-precision list, as {_describe(low[op])}, "
                          f"and the FP32 list, as {_describe(f32[op])}; remove it from one{more}")


def build_policy(
    name: str,
    *,
    lower: Iterable = (),
    fp32: Iterable = (),
    promote: Iterable = (),
    input_only: Iterable = (),
    banned: Optional[Mapping[str, str]] = None,
    dtypes: tuple = (torch.bfloat16, torch.float16),
    tolerate_missing: bool = False,
    registered: Optional[str] = None,
    keep_composites: bool = False,
) -> Policy:
    """Build a ``Policy`` from op names.

    Each list holds names (see ``hpu_autocast.names``) or ``(name, (file, line))`` pairs,
    which error messages then cite. An overload on both the lower and the FP32 list is an
    error naming both entries. The lower and FP32 lists take precedence over promote. An
    in-place overload on the promote list keeps its first input's dtype (``CastPolicy.FIRST``).

    ``tolerate_missing`` skips names this torch does not have (recorded in
    ``Policy.missing``); ``registered`` keeps only overloads with a kernel for that dispatch
    key (``"AutocastCPU"`` makes a preset exactly what native autocast registers);
    ``keep_composites`` keeps composite entries too, whose insides native autocast casts.
    """
    missing: List[str] = []
    kw = dict(tolerate_missing=tolerate_missing, registered=registered, missing=missing,
              keep_composites=keep_composites)
    low = _resolve_all(_entries(lower), **kw)
    f32 = _resolve_all(_entries(fp32), **kw)
    pro = _resolve_all(_entries(promote), **kw)
    check_no_conflict(low, f32)
    table: Dict[OpOverload, CastPolicy] = {}
    for op in pro:
        table[op] = CastPolicy.FIRST if _ops.is_inplace(op) else CastPolicy.PROMOTE
    table.update({op: CastPolicy.LOWER for op in low})
    table.update({op: CastPolicy.FP32 for op in f32})
    only = set()
    for n in input_only:
        only.update(op for op in resolve(n) if op in table)
    ban = {}
    for n, message in (banned or {}).items():
        for op in resolve(n):
            ban[op] = message
    return Policy(name=name, table=table, input_only=frozenset(only), banned=ban, dtypes=dtypes,
                  missing=tuple(dict.fromkeys(missing)), promoted=frozenset(pro))


def _build_hpu() -> Policy:
    return build_policy(
        "hpu", lower=_hpu.LOWER, fp32=_hpu.FP32, promote=_hpu.PROMOTE,
        input_only=_hpu.INPUT_ONLY, dtypes=(torch.bfloat16,), tolerate_missing=True,
    )


def _build_torch_cpu() -> Policy:
    return build_policy(
        "torch-cpu", lower=_torch_cpu.LOWER, fp32=_torch_cpu.FP32, promote=_torch_cpu.PROMOTE,
        tolerate_missing=True, registered="AutocastCPU",
    )


def _build_hmp(opt_level: str = "O1") -> Policy:
    if opt_level == "O2":
        # GEMMs and convolutions in bfloat16, everything else float32 (no first-input rule).
        policy = build_policy("hmp-O2", lower=_hmp.O2_BF16, dtypes=(torch.bfloat16,))
        return dataclasses.replace(policy, unlisted=CastPolicy.FP32)
    policy = build_policy(
        "hmp", lower=_hmp.BF16, fp32=_hmp.FP32, promote=_hmp.PROMOTE, input_only=_hmp.INPUT_ONLY,
        dtypes=(torch.bfloat16,), tolerate_missing=True,
    )
    return dataclasses.replace(policy, unlisted=CastPolicy.FIRST, inplace=CastPolicy.FIRST)


def _build_xpu() -> Policy:
    return build_policy("xpu", lower=_xpu.LOWER, fp32=_xpu.FP32, promote=_xpu.PROMOTE, tolerate_missing=True)


def _build_torch_cuda() -> Policy:
    return build_policy(
        "torch-cuda", lower=_torch_cuda.LOWER + _torch_cuda.REGISTERED_LOWER,
        fp32=_torch_cuda.FP32 + _torch_cuda.REGISTERED_FP32,
        promote=_torch_cuda.PROMOTE + _torch_cuda.REGISTERED_PROMOTE,
        banned=_torch_cuda.BANNED, tolerate_missing=True, registered="AutocastCUDA", keep_composites=True,
    )


#: Preset name -> zero-argument builder.
PRESETS: Dict[str, Callable[[], Policy]] = {
    "hpu": _build_hpu,
    "hmp": _build_hmp,
    "hmp-O2": lambda: _build_hmp("O2"),
    "xpu": _build_xpu,
    "torch-cuda": _build_torch_cuda,
    "torch-cpu": _build_torch_cpu,
}


def preset_names() -> List[str]:
    return sorted(PRESETS)


@functools.lru_cache(maxsize=None)
def get_preset(name: str) -> Policy:
    """The preset policy called ``name``; ``ValueError`` naming the valid presets otherwise."""
    try:
        builder = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown policy preset {name!r}; valid presets: {', '.join(preset_names())}") from None
    return builder()

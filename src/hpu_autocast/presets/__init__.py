"""Presets: one data module per source document, and the registry of how each preset is
built from it (``hpu_autocast.builder.build_policy`` with the rules its document states).
Version quirks (names a torch build lacks, overloads it registers) are options here, never
part of the data modules."""

from __future__ import annotations

import functools
from typing import Callable, Dict, List

import torch

from .. import builder
from ..builder import build_policy
from ..policy import CastPolicy, Policy
from . import hmp as _hmp
from . import hpu as _hpu
from . import torch_cpu as _torch_cpu
from . import torch_cuda as _torch_cuda
from . import xpu as _xpu

__all__ = ["PRESETS", "get_preset", "preset_names"]


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
        return build_policy("hmp-O2", lower=_hmp.O2_BF16, dtypes=(torch.bfloat16,), unlisted=CastPolicy.FP32)
    return build_policy(
        "hmp", lower=_hmp.BF16, fp32=_hmp.FP32, promote=_hmp.PROMOTE, input_only=_hmp.INPUT_ONLY,
        dtypes=(torch.bfloat16,), tolerate_missing=True, unlisted=CastPolicy.FIRST, inplace=CastPolicy.FIRST,
    )


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
        build = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown policy preset {name!r}; valid presets: {', '.join(preset_names())}") from None
    return build()


builder.set_preset_lookup(get_preset)  # see builder's [Note: the registry hands in its lookup]

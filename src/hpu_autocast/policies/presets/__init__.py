"""The preset registry, as data: each preset is a data module, holding the op names of one source
document, and the options ``build_policy`` builds it with (``PRESETS``; ``builder.get_preset``
builds a preset by name). The rules a
document states and the quirks of torch versions (names a build lacks, overloads it registers
for an autocast dispatch key) are options here, never part of the data modules.

    preset        data module       source document (tests/seeds)
    hpu           gaudi_autocast    000  Intel Gaudi, Mixed Precision Training with PyTorch Autocast
    hmp, hmp-O2   gaudi_hmp         001  Habana Mixed Precision
    xpu           xpu_amp           002  torch.xpu.amp, Auto Mixed Precision
    torch-cpu     torch_amp_cpu     003  torch.amp, the CPU lists
    torch-cuda    torch_amp_cuda    003  torch.amp, the CUDA lists
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import torch

from ..policy import CastPolicy
from . import gaudi_autocast, gaudi_hmp, torch_amp_cpu, torch_amp_cuda, xpu_amp

__all__ = ["PRESETS", "preset_names"]

#: Gaudi's dtypes. Seed 000 (and seed 001 for HMP) says float16 is not supported; Gaudi's bridge
#: takes a region's dtype from torch.get_autocast_dtype("hpu") whatever it is, and Gaudi 2 and
#: later run float16: so float16 is accepted here, and refused for a region that casts HPU tensors
#: on a first-generation Gaudi (the device's rule, _devices.check_dtype; docs/hpu.md).
GAUDI_DTYPES = (torch.bfloat16, torch.float16)
#: Gaudi 2/3 multiply fp8: ``hpu`` regions may run their GEMMs in fp8
#: (``HpuAutocastMode(torch.float8_e4m3fn)``; docs/fp8.md). HMP and the presets that reproduce a
#: native autocast (which has no fp8) do not; a ``Policy`` of one's own may (``dtypes``).
FP8_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


def _less(names: List[str], others: List[str]) -> List[str]:
    """``names`` without ``others``: a document's float32 list less the ops torch registers with
    another float32 cast policy (each op is on one list)."""
    return [n for n in names if n not in others]


#: Preset name -> the arguments of ``build_policy`` that make it. ``tolerate_missing``: the
#: names a torch build lacks are recorded in ``Policy.missing`` rather than refused.
PRESETS: Dict[str, Mapping[str, Any]] = {
    "hpu": dict(
        lower=gaudi_autocast.LOWER,
        fp32=gaudi_autocast.FP32,
        promote=gaudi_autocast.PROMOTE,
        input_only=gaudi_autocast.INPUT_ONLY,
        dtypes=FP8_DTYPES,
        tolerate_missing=True,
        # What Gaudi's bridge does with its lists: C++ names of functional ops only, so the
        # document's iadd and truediv do nothing (gaudi's Note: what Gaudi's bridge applies).
        c_names_only=True,
        warn_ignored=False,
        # The bridge's Hpu_WrapFunction_ (hpu_ops/autocast_helpers.h) casts every eligible tensor
        # of a listed op whatever its other arguments: softmax(x, dtype=float32) reads x in bfloat16.
        explicit_dtype="cast",
    ),
    "hmp": dict(
        lower=gaudi_hmp.BF16,
        fp32=gaudi_hmp.FP32,
        promote=gaudi_hmp.PROMOTE,
        input_only=gaudi_hmp.INPUT_ONLY,
        dtypes=GAUDI_DTYPES,
        tolerate_missing=True,
        unlisted=CastPolicy.FIRST,  # "Any OPs not in the above two lists will run with precision type of its 1st input"
        inplace=CastPolicy.FIRST,  # "For in-place OPs ... cast all inputs to precision type of 1st input"
    ),
    "hmp-O2": dict(
        lower=gaudi_hmp.O2_BF16,
        dtypes=GAUDI_DTYPES,
        unlisted=CastPolicy.FP32,  # GEMMs and convolutions in bfloat16, everything else float32
    ),
    "xpu": dict(
        lower=xpu_amp.LOWER,
        fp32=xpu_amp.FP32,
        promote=xpu_amp.PROMOTE,
        device_type="xpu",
        tolerate_missing=True,
        # The XPU kernels (IPEX's csrc/gpu/aten/amp/autocast_mode.cpp, and torch's AutocastXPU
        # in ATen/autocast_mode.cpp since) are ATen's WrapFunction<CastPolicy, DeviceType::XPU>:
        # they cast every eligible tensor whatever dtype= says, as the CPU and CUDA ones do; the
        # document's "explicit dtype= is not eligible" is torch.amp's prose, not what runs.
        explicit_dtype="cast",
    ),
    "torch-cpu": dict(
        lower=torch_amp_cpu.LOWER,
        fp32=torch_amp_cpu.FP32,
        promote=torch_amp_cpu.PROMOTE,
        device_type="cpu",
        tolerate_missing=True,
        registered="AutocastCPU",  # exactly the overloads torch.autocast("cpu") casts
        explicit_dtype="cast",  # ATen's fp32 kernel (prod) casts whatever dtype= the call passes
    ),
    "torch-cuda": dict(
        lower=torch_amp_cuda.LOWER + torch_amp_cuda.REGISTERED_LOWER,
        fp32=_less(
            torch_amp_cuda.FP32 + torch_amp_cuda.REGISTERED_FP32,
            torch_amp_cuda.FP32_SET_OPT_DTYPE + torch_amp_cuda.FP32_APPEND_DTYPE,
        ),
        fp32_set_opt_dtype=torch_amp_cuda.FP32_SET_OPT_DTYPE,
        fp32_append_dtype=torch_amp_cuda.FP32_APPEND_DTYPE,
        promote=torch_amp_cuda.PROMOTE + torch_amp_cuda.REGISTERED_PROMOTE,
        banned=torch_amp_cuda.BANNED,
        device_type="cuda",
        tolerate_missing=True,
        registered="AutocastCUDA",  # exactly the overloads torch.autocast("cuda") casts
        explicit_dtype="cast",  # as ATen's kernels (its dtype-taking ops are fp32_set_opt_dtype)
    ),
}


def preset_names() -> List[str]:
    """The names ``get_preset`` and ``HpuAutocastMode(policy=...)`` accept, sorted."""
    return sorted(PRESETS)

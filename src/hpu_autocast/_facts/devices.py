"""What a device is, to this package: the one place that says it.

A region casts the tensors of one device type (``torch.autocast``'s first argument). For each
device this module says whether a region may name it, how a tensor is asked whether it is on it,
whether torch has a native autocast there (and its dispatch key), the device's own rules (HPU:
no float16 on a first-generation Gaudi, no cast cache), whether its norms take parameters of
another dtype than the input, and which device a region defaults to. Adding a device is a row
in the tables below (and, for a device with a dispatch key of its own, ``_dispatch``'s
candidates).
"""

from __future__ import annotations

import os
import sys
from operator import attrgetter
from typing import Callable, Optional, Tuple

import torch

from .. import _torch

__all__ = [
    "REGION_DEVICE_TYPES",
    "NATIVE_AUTOCAST_DEVICES",
    "NATIVE_AUTOCAST_HERE",
    "MIXED_PARAMS_DEVICES",
    "tensor_on",
    "native_autocast_keys",
    "check_dtype",
    "hpu_device_name",
    "default_cache_enabled",
    "default_device_type",
]

#: The device types a region may cast for (``torch.autocast``'s, and ``meta`` for shape work).
REGION_DEVICE_TYPES = ("cpu", "cuda", "hpu", "xpu", "mps", "xla", "mtia", "maia", "meta")

#: The device types torch.autocast casts for natively (``meta`` has none): those whose autocast a
#: ``disable_casts()`` suspends (less those whose autocast keys this package borrowed).
NATIVE_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "mtia", "maia")


def _has_native_autocast(device: str) -> bool:
    try:
        _torch.native_autocast_enabled(device)
    except RuntimeError:  # torch 2.4 knows no mps, mtia or maia autocast
        return False
    return True


#: ``NATIVE_AUTOCAST_DEVICES`` that the installed torch has an autocast state for.
NATIVE_AUTOCAST_HERE = tuple(d for d in NATIVE_AUTOCAST_DEVICES if _has_native_autocast(d))

#: The native autocast dispatch keys, by name, whose kernels a composite may have (``_pass_on``).
_NATIVE_AUTOCAST_KEYS = ("AutocastCPU", "AutocastCUDA", "AutocastXPU", "AutocastMPS", "AutocastHPU")

#: Devices whose norm kernels take an input of the lower dtype with float32 weight and bias (what
#: Gaudi's bridge does for input-only norms); elsewhere (CUDA) they want the input's dtype.
MIXED_PARAMS_DEVICES = frozenset({"cpu", "hpu", "meta"})

#: Whether a tensor is on a device type, by the tensor's own flag (``is_cpu`` costs a quarter of
#: ``device.type``; the cast walk asks it of every argument).
_TENSOR_ON = {
    "cpu": attrgetter("is_cpu"),
    "cuda": attrgetter("is_cuda"),
    "meta": attrgetter("is_meta"),
    "xpu": attrgetter("is_xpu"),
    "mps": attrgetter("is_mps"),
}


def tensor_on(device_type: str) -> Callable[[torch.Tensor], bool]:
    """The predicate "this tensor is on ``device_type``" (what a region asks of each input)."""
    return _TENSOR_ON.get(device_type) or (lambda t: t.device.type == device_type)


def native_autocast_keys() -> Tuple[object, ...]:
    """The native autocast dispatch keys this torch has."""
    return tuple(k for k in map(_torch.dispatch_key, _NATIVE_AUTOCAST_KEYS) if k is not None)


#: What ``habana_frameworks.torch.hpu.get_device_name()`` returns on a first-generation Gaudi
#: (the bridge's own tests: ``is_gaudi1()`` is ``get_device_name() == "GAUDI"``; Gaudi 2 and 3
#: are ``"GAUDI2"`` and ``"GAUDI3"``).
FIRST_GAUDI = "GAUDI"


def hpu_device_name() -> Optional[str]:
    """The Gaudi generation this process runs on, as the loaded bridge names it
    (``"GAUDI"``, ``"GAUDI2"``, ...); ``None`` without a loaded bridge or an available device.
    Never imports the bridge."""
    bridge = sys.modules.get("habana_frameworks.torch.hpu")
    if bridge is None or not getattr(bridge, "is_available", lambda: False)():
        return None
    name = getattr(bridge, "get_device_name", None)
    return name() if name is not None else None


def check_dtype(dtype: torch.dtype, device_type: str) -> None:
    """A region casting ``device_type`` tensors to ``dtype``: on a first-generation Gaudi, float16
    is not supported. Off Gaudi (no bridge loaded) and on Gaudi 2 and later it is (docs/hpu.md,
    "float16": seed 000 says it is not; the bridge and Gaudi 2 say otherwise). The rule is the
    device's, not the process's: a CPU region in a process that loaded Gaudi's bridge casts CPU
    tensors and may use float16 on any Gaudi."""
    if device_type == "hpu" and dtype == torch.float16 and hpu_device_name() == FIRST_GAUDI:
        raise ValueError(
            f"dtype=float16 is not supported on a first-generation Gaudi (torch.hpu.get_device_name() "
            f"is {FIRST_GAUDI!r}); use dtype=torch.bfloat16 there (Gaudi 2 and later take float16)"
        )


def default_cache_enabled(device_type: str) -> bool:
    """Autocast's cast cache for a region casting ``device_type`` tensors: on, except on HPU,
    where graph mode deduplicates casts and the cache is always off (seed 000)."""
    return device_type != "hpu"


_cuda: Optional[bool] = None

#: [Note: the test suite's GPU emulation] The suite's ``--as-if-cuda`` (tests/conftest.py) runs it
#: as if on a machine with a GPU: in its own process it sets ``_cuda``; for the fresh interpreters
#: its tests start (a CLI command, a script) it sets this environment variable, which
#: ``_cuda_available`` reads, so that they resolve a region's default device type to ``cuda``
#: too. For the suite only: it makes no tensor a CUDA one.
AS_IF_CUDA_ENV = "HPU_AUTOCAST_TEST_AS_IF_CUDA"


def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked once (it costs ~1 us, a sixth of a region's entry);
    true also under the suite's GPU emulation (Note: the test suite's GPU emulation)."""
    global _cuda
    if _cuda is None:
        _cuda = torch.cuda.is_available() or os.environ.get(AS_IF_CUDA_ENV) == "1"
    return _cuda


def default_device_type(policy_device: Optional[str] = None) -> str:
    """The device type a region casts for when given none: its policy's (``policy_device``), else
    the device this process runs on: ``hpu`` once Gaudi's bridge is loaded, ``cuda`` where
    available, else ``cpu`` (Gaudi's lists work as a stand-in on CPU and CUDA)."""
    if policy_device is not None:
        return policy_device
    if "habana_frameworks.torch" in sys.modules:  # hpu.backend_loaded(), without importing hpu
        return "hpu"
    return "cuda" if _cuda_available() else "cpu"

"""What a device is, to this package: the one place that says it."""

from __future__ import annotations

from operator import attrgetter
from typing import Callable

import torch

__all__ = ["tensor_on"]

#: Whether a tensor is on a device type, by the tensor's own flag (``is_cpu`` costs a quarter of
#: ``device.type``).
_TENSOR_ON = {"cpu": attrgetter("is_cpu"), "cuda": attrgetter("is_cuda"), "meta": attrgetter("is_meta"),
              "xpu": attrgetter("is_xpu"), "mps": attrgetter("is_mps")}


def tensor_on(device_type: str) -> Callable[[torch.Tensor], bool]:
    """The predicate "this tensor is on ``device_type``" (what a region asks of each input)."""
    return _TENSOR_ON.get(device_type) or (lambda t: t.device.type == device_type)

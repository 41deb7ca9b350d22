"""hpu_autocast: mixed precision for PyTorch as a dispatch mode over an inspectable policy table.

    >>> import torch, hpu_autocast
    >>> with hpu_autocast.HpuAutocastMode(dtype=torch.bfloat16):
    ...     y = torch.mm(torch.randn(2, 2), torch.randn(2, 2))
    >>> y.dtype
    torch.bfloat16
"""

from .mode import HpuAutocastMode, disable_casts, get_dtype, is_enabled
from .policy import CastPolicy, Policy
from .presets import build_policy, get_preset, preset_names
from .resolve import PolicyError, resolve

__all__ = [
    "HpuAutocastMode",
    "CastPolicy",
    "Policy",
    "PolicyError",
    "build_policy",
    "disable_casts",
    "get_dtype",
    "get_preset",
    "is_enabled",
    "preset_names",
    "resolve",
]

__version__ = "0.1.0"

"""hpu_autocast: mixed precision for PyTorch as a dispatch mode over an inspectable policy table.

    >>> import torch, hpu_autocast
    >>> with hpu_autocast.HpuAutocastMode(dtype=torch.bfloat16):
    ...     y = torch.mm(torch.randn(2, 2), torch.randn(2, 2))
    >>> y.dtype
    torch.bfloat16
"""

from . import hpu, report
from .compare import Comparison, compare
from .mode import HpuAutocastMode, disable_casts, get_dtype, is_enabled
from .policy import CastPolicy, Policy
from .presets import build_policy, get_preset, preset_names
from .report import PrecisionReport, Recorder, op_graph, record
from .resolve import PolicyError, resolve
from .trace import trace

__all__ = [
    "HpuAutocastMode",
    "CastPolicy",
    "Comparison",
    "PrecisionReport",
    "Recorder",
    "Policy",
    "PolicyError",
    "build_policy",
    "compare",
    "disable_casts",
    "get_dtype",
    "get_preset",
    "is_enabled",
    "op_graph",
    "preset_names",
    "record",
    "resolve",
    "trace",
]

__version__ = "0.1.0"

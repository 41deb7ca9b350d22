"""hpu_autocast: mixed precision for PyTorch as a dispatch mode over an inspectable policy table.

    >>> import torch, hpu_autocast
    >>> with hpu_autocast.HpuAutocastMode(dtype=torch.bfloat16):
    ...     y = torch.mm(torch.randn(2, 2), torch.randn(2, 2))
    >>> y.dtype
    torch.bfloat16
"""

from . import amp, checkpoint, hmp, hpu, report
from .amp import custom_bwd, custom_fwd
from .compare import Comparison, compare
from .mode import HpuAutocastMode, disable_casts, get_dtype, get_policy, is_enabled
from .builder import build_policy, with_lists
from .policy import CastPolicy, Policy
from .presets import get_preset, preset_names
from .report import PrecisionReport, Recorder, op_graph, record
from .names import PolicyError, resolve
from .trace import cast_nodes, trace

__all__ = [
    "HpuAutocastMode",
    "CastPolicy",
    "Comparison",
    "PrecisionReport",
    "Recorder",
    "Policy",
    "PolicyError",
    "amp",
    "build_policy",
    "cast_nodes",
    "checkpoint",
    "compare",
    "custom_bwd",
    "custom_fwd",
    "disable_casts",
    "get_dtype",
    "get_policy",
    "get_preset",
    "hmp",
    "hpu",
    "is_enabled",
    "op_graph",
    "preset_names",
    "record",
    "report",
    "resolve",
    "trace",
    "with_lists",
]

__version__ = "0.1.0"

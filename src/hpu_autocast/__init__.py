"""hpu_autocast: mixed precision for PyTorch over an inspectable op-overload policy table.

    >>> import torch, hpu_autocast
    >>> with hpu_autocast.HpuAutocastMode(dtype=torch.bfloat16):
    ...     y = torch.mm(torch.randn(2, 2), torch.randn(2, 2))
    >>> y.dtype
    torch.bfloat16
"""

from . import amp, events, hmp, hpu, report
from .amp import custom_bwd, custom_fwd
from .builder import build_policy, with_lists
from .events import Event
from .graphs import cast_nodes, trace
from .mode import HpuAutocastMode, disable_casts, get_dtype, get_policy, is_enabled, record
from .names import PolicyError, resolve
from .numerics import Comparison, compare
from .opgraph import op_graph
from .policy import CastPolicy, Policy
from .presets import get_preset, preset_names
from .report import PrecisionReport, Recorder

__all__ = [
    "HpuAutocastMode",
    "CastPolicy",
    "Comparison",
    "Event",
    "PrecisionReport",
    "Recorder",
    "Policy",
    "PolicyError",
    "amp",
    "build_policy",
    "cast_nodes",
    "compare",
    "custom_bwd",
    "custom_fwd",
    "disable_casts",
    "events",
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

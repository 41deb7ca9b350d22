"""hpu_autocast: mixed precision for PyTorch over an inspectable op-overload policy table.

    >>> import torch, hpu_autocast
    >>> with hpu_autocast.HpuAutocastMode(dtype=torch.bfloat16):
    ...     y = torch.mm(torch.randn(2, 2), torch.randn(2, 2))
    >>> y.dtype
    torch.bfloat16

The public names (``__all__``), by what they are for:

* the region: ``HpuAutocastMode``, ``disable_casts``; inside one, ``is_enabled``, ``get_dtype``,
  ``get_policy``;
* policies: ``Policy``, ``CastPolicy``, ``get_preset``, ``preset_names``, ``build_policy``,
  ``with_lists``, ``policy_from_gaudi_config``, ``resolve``, ``PolicyError``;
* what ran: ``record``, ``Recorder``, ``PrecisionReport``, ``Event`` (and the ``events`` module),
  ``op_graph``, ``compare``, ``Comparison``, ``trace``, ``cast_nodes``;
* tuning a policy: ``tune``, ``TuneResult`` (``docs/tuning.md``);
* training: ``custom_fwd``, ``custom_bwd`` (the ``amp`` module);
* the modules ``hmp`` (a drop-in for Habana Mixed Precision), ``hpu`` (Gaudi glue) and
  ``report``;
* ``ENGINE``: which engine runs the kernels in this process, ``"c++"`` (the C++ core, built by
  ``hpu-autocast build-core``) or ``"python"`` (``hpu-autocast info`` says why).

``hpu_autocast.testing`` (checking a model against its policy), ``hpu_autocast.cli`` (the
``hpu-autocast`` command) and ``hpu_autocast.builder`` (policies from list files and Gaudi's
variables; the public names of ``policies/builder.py`` and ``policies/gaudi.py``) are imported on their own. The layers are packages:
``policies`` (what a region casts, as data), ``_engine`` (regions and kernels), ``_torch``
(torch's private surface and every patch of torch); ``docs/design.md`` has the map. No name here is also the name of a submodule
unless it is that submodule (``tests/test_public_api.py``).
"""

import sys as _sys
import warnings as _warnings

if "torch" not in _sys.modules:
    # Note: torch's own import asks for NumPy (its FunctionalTensor class body converts a tensor
    # device) and, where NumPy is not installed, prints "UserWarning: Failed to initialize
    # NumPy" from C++. This package never uses NumPy, and torch runs without it, so the first
    # import of torch made here (every `hpu-autocast` command, a script that imports this
    # package first) hides that one message, and nothing else. A process that imported torch
    # before has seen it already.
    with _warnings.catch_warnings():
        _warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
        __import__("torch")

from . import amp, events, hmp, hpu, report
from .amp import custom_bwd, custom_fwd
from ._engine.core import ENGINE
from .policies.builder import build_policy, get_preset, policy_from_gaudi_config, with_lists
from .events import Event
from .graphs import cast_nodes, trace
from .mode import HpuAutocastMode, disable_casts, get_dtype, get_policy, is_enabled, record
from .module_map import first_last
from .policies.names import PolicyError, resolve
from .numerics import Comparison, compare
from .opgraph import op_graph
from .policies.policy import CastPolicy, Policy
from .policies.presets import preset_names
from .report import PrecisionReport, Recorder
from .tuning import TuneResult, tune

__all__ = [
    # the region
    "HpuAutocastMode",
    "disable_casts",
    "is_enabled",
    "get_dtype",
    "get_policy",
    "first_last",
    # policies
    "Policy",
    "CastPolicy",
    "get_preset",
    "preset_names",
    "build_policy",
    "with_lists",
    "policy_from_gaudi_config",
    "resolve",
    "PolicyError",
    # what ran
    "record",
    "Recorder",
    "PrecisionReport",
    "Event",
    "events",
    "op_graph",
    "compare",
    "Comparison",
    "trace",
    "cast_nodes",
    # tuning a policy
    "tune",
    "TuneResult",
    # training
    "custom_fwd",
    "custom_bwd",
    "amp",
    # drop-ins and device glue
    "hmp",
    "hpu",
    "report",
    # the engine
    "ENGINE",
]

__version__ = "0.1.0"

from . import builder  # noqa: E402, F401  (the documented path of the policies' builder: builder.py)
from ._torch.compile_guard import skip_package as _skip_package  # noqa: E402

_skip_package()  # a process that already uses Dynamo: the kernels are not traced

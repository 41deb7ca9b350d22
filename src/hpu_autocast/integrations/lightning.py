"""A PyTorch Lightning precision plugin whose autocast is ``HpuAutocastMode``.

    from hpu_autocast.integrations.lightning import HpuAutocastPrecision

    trainer = Trainer(plugins=[HpuAutocastPrecision(torch.bfloat16, policy="hpu")])

Needs ``pytorch-lightning`` (``pip install -c constraints.txt -e ".[lightning]"``); importing
this module without it raises an ``ImportError`` that says so. Nothing else in the package
imports this module.

[Note: the plugin is Lightning's MixedPrecision with another region]
``Trainer(precision="bf16-mixed"/"16-mixed")`` is Lightning's ``MixedPrecision`` plugin: its
``forward_context`` enters ``autocast_context_manager()`` (a ``torch.autocast``) around the
forward of each training, validation, test and predict step (``Precision.*_step_context``), and
it owns the float16 loss scaling: ``pre_backward`` scales the loss, ``optimizer_step`` unscales
before clipping and steps and updates the ``torch.amp.GradScaler``, ``clip_gradients`` refuses
optimizers that unscale themselves, ``state_dict``/``load_state_dict`` carry the scaler in
checkpoints. This plugin *is* that class with one method replaced: ``autocast_context_manager``
returns a fresh ``HpuAutocastMode`` (a mode is entered once; Lightning nests step contexts, as
in the model summary's forward). Everything else is inherited, so it is Lightning's own code
that scales, steps and checkpoints, and Lightning's checks of ``isinstance(plugin,
MixedPrecision)`` (old checkpoints' scaler state, ``ThroughputMonitor``'s dtype) hold.

Like ``MixedPrecision``, the region runs with its cast cache off (``cache_enabled=False``) unless
``cache_enabled=`` is given: a step under manual optimization runs forward, backward, the
optimizer step and perhaps another forward in one step context, and a cached cast of a weight
would outlive the optimizer's update of it.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

try:
    from pytorch_lightning.plugins.precision import MixedPrecision
except ImportError as e:
    if e.name is None or e.name.partition(".")[0] != "pytorch_lightning":
        raise  # Lightning is there but broken: its own error says more
    raise ImportError("hpu_autocast.integrations.lightning needs PyTorch Lightning, which is not installed: "
                      "pip install \"pytorch-lightning>=2.6\" (hpu_autocast's lightning extra; in a clone, "
                      "pip install -c constraints.txt -e \".[lightning]\" keeps the installed torch)") from None

from ..mode import HpuAutocastMode
from ..policies.policy import Policy

__all__ = ["HpuAutocastPrecision"]

_PRECISION = {torch.bfloat16: "bf16-mixed", torch.float16: "16-mixed"}


class HpuAutocastPrecision(MixedPrecision):
    """Lightning's mixed precision with ``HpuAutocastMode`` as its autocast.

    ``Trainer(plugins=[HpuAutocastPrecision(dtype, policy=...)])`` runs the forward of each
    training, validation, test and predict step in ``HpuAutocastMode(dtype, policy=policy,
    **mode_kwargs)``; backward and the optimizer step run outside it. Under ``policy="torch-cpu"``
    on CPU it trains bit for bit as ``Trainer(precision="bf16-mixed")``.

    Args:
        dtype: ``torch.bfloat16`` (``trainer.precision`` is ``"bf16-mixed"``) or ``torch.float16``
            (``"16-mixed"``: the loss is scaled by a ``torch.amp.GradScaler``, as Lightning's own
            ``precision="16-mixed"``; the ``hpu`` and ``hmp`` policies are bfloat16 only).
        policy: a preset name or a ``Policy``, as for ``HpuAutocastMode``. The default preset,
            ``"hpu"``, reads Gaudi's ``PT_HPU_AUTOCAST_*_OPS_LIST`` variables when each step's
            region is created.
        scaler: the ``torch.amp.GradScaler`` for float16 (default: a new one for the region's
            device type); bfloat16 takes none.
        **mode_kwargs: the other arguments of ``HpuAutocastMode`` (``device_type``,
            ``cache_enabled``, ``observer``, ``verbose``, ``record``, ``enabled``). The cast cache
            is off unless ``cache_enabled=True`` is given, as in ``MixedPrecision`` (the module's
            Note).

    Bad arguments fail here, not at the first step: the settings are tried by creating one mode.
    """

    def __init__(self, dtype: torch.dtype = torch.bfloat16, policy: Union[str, Policy] = "hpu", *,
                 scaler: Optional[torch.amp.GradScaler] = None, **mode_kwargs: Any) -> None:
        if dtype not in _PRECISION:
            raise ValueError(f"HpuAutocastPrecision: dtype must be torch.bfloat16 or torch.float16, got {dtype!r}")
        mode_kwargs.setdefault("cache_enabled", False)
        if "record" in mode_kwargs:
            # Each step is a region of its own; the report of the last one alone is rarely what is
            # wanted, and the plugin keeps no mode to ask. An observer sees every step's calls.
            raise TypeError("HpuAutocastPrecision does not take record=: pass observer=hpu_autocast.Recorder(...) "
                            "to collect every step's calls, then call its report()")
        probe = HpuAutocastMode(dtype, policy=policy, **mode_kwargs)  # bad settings fail here
        self.dtype = dtype
        self.policy = policy
        self.mode_kwargs = mode_kwargs
        super().__init__(_PRECISION[dtype], device=probe.device_type or "cpu", scaler=scaler)

    def autocast_context_manager(self) -> HpuAutocastMode:  # type: ignore[override]
        """A new region for one step's forward (``MixedPrecision.forward_context`` enters it)."""
        return HpuAutocastMode(self.dtype, policy=self.policy, **self.mode_kwargs)

    def __repr__(self) -> str:
        policy = self.policy if isinstance(self.policy, str) else self.policy.name
        return f"{type(self).__name__}(dtype={self.dtype}, policy={policy!r})"

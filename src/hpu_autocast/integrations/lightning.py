"""PyTorch Lightning precision plugins whose autocast is ``HpuAutocastMode``: one for the
``Trainer``, one for Fabric.

    from hpu_autocast.integrations.lightning import HpuAutocastFabricPrecision, HpuAutocastPrecision

    trainer = Trainer(plugins=[HpuAutocastPrecision("bf16-mixed", policy="hpu")])
    fabric = Fabric(plugins=[HpuAutocastFabricPrecision("bf16-mixed", policy="hpu")])

The precision is Lightning's string (``"bf16-mixed"``, ``"16-mixed"``; the older ``"bf16"``,
``"16"`` and ``16`` read as Lightning reads them) or the dtype, positional or as ``precision=``
(lightning-habana's ``HPUPrecisionPlugin(precision="bf16-mixed")`` spelling).

Needs Lightning: the ``lightning`` package (``lightning.pytorch``, ``lightning.fabric``) where it
is installed, else ``pytorch-lightning`` (``pytorch_lightning``, ``lightning_fabric``), as
lightning-habana chooses; a ``Trainer`` takes only the plugins of its own package. Importing this
module without either raises an ``ImportError`` that says so. Nothing else in the package imports
this module.

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

Fabric's plugin is Fabric's ``MixedPrecision`` the same way: its ``forward_context`` (entered
around each forward of a module set up with ``fabric.setup``) returns the region; Fabric's own
code converts the inputs to the lower dtype and the outputs back, and scales float16 losses.

Like ``MixedPrecision``, the region runs with its cast cache off (``cache_enabled=False``) unless
``cache_enabled=`` is given: a step under manual optimization runs forward, backward, the
optimizer step and perhaps another forward in one step context, and a cached cast of a weight
would outlive the optimizer's update of it.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch


def _import_lightning() -> Tuple[type, type, str]:
    """(the Trainer's ``MixedPrecision``, Fabric's, the package's name): ``lightning``'s where it
    is installed, else ``pytorch_lightning``'s (the module's docstring)."""
    try:
        from lightning.fabric.plugins.precision import MixedPrecision as FabricMixedPrecision
        from lightning.pytorch.plugins.precision import MixedPrecision

        return MixedPrecision, FabricMixedPrecision, "lightning"
    except ImportError as e:
        if e.name is None or e.name.partition(".")[0] != "lightning":
            raise  # Lightning is there but broken: its own error says more
    try:
        from lightning_fabric.plugins.precision import MixedPrecision as FabricMixedPrecision
        from pytorch_lightning.plugins.precision import MixedPrecision

        return MixedPrecision, FabricMixedPrecision, "pytorch_lightning"
    except ImportError as e:
        if e.name is None or e.name.partition(".")[0] not in ("pytorch_lightning", "lightning_fabric"):
            raise
    raise ImportError(
        "hpu_autocast.integrations.lightning needs PyTorch Lightning, which is not installed: "
        'pip install "pytorch-lightning>=2.6" (hpu_autocast\'s lightning extra; in a clone, '
        'pip install -c constraints.txt -e ".[lightning]" keeps the installed torch), or '
        "pip install lightning"
    )


MixedPrecision, FabricMixedPrecision, LIGHTNING = _import_lightning()

from ..mode import HpuAutocastMode  # noqa: E402
from ..policies.policy import Policy  # noqa: E402

__all__ = ["HpuAutocastPrecision", "HpuAutocastFabricPrecision", "LIGHTNING"]

_PRECISION = {torch.bfloat16: "bf16-mixed", torch.float16: "16-mixed"}
#: Lightning's precision values for mixed precision, the older ones as Lightning reads them.
_DTYPE_OF = {
    "bf16-mixed": torch.bfloat16,
    "16-mixed": torch.float16,
    "bf16": torch.bfloat16,
    "16": torch.float16,
    16: torch.float16,
    torch.bfloat16: torch.bfloat16,
    torch.float16: torch.float16,
}


def _dtype_of(who: str, dtype, precision) -> torch.dtype:
    """The region's dtype from the plugin's ``dtype`` and/or ``precision`` argument."""
    got = []
    for value in (dtype, precision):
        if value is None:
            continue
        found = _DTYPE_OF.get(value) if isinstance(value, (str, int, torch.dtype)) and type(value) is not bool else None
        if found is None:
            raise ValueError(
                f"{who}: dtype must be torch.bfloat16 or torch.float16, or Lightning's precision "
                f'"bf16-mixed" or "16-mixed" (older spellings: "bf16", "16", 16), got {value!r}'
            )
        got.append(found)
    if len(got) == 2 and got[0] != got[1]:
        raise TypeError(f"{who}: dtype={dtype!r} and precision={precision!r} disagree; give one")
    return got[0] if got else torch.bfloat16


class _Region:
    """What both plugins keep and make: the settings of one step's region."""

    def _settings(self, dtype, precision, policy, mode_kwargs: dict) -> Tuple[str, str]:
        """Check and keep the settings; returns (Lightning's precision string, the device type)."""
        who = type(self).__name__
        self.dtype = _dtype_of(who, dtype, precision)
        mode_kwargs.setdefault("cache_enabled", False)
        if "record" in mode_kwargs:
            # Each step is a region of its own; the report of the last one alone is rarely what is
            # wanted, and the plugin keeps no mode to ask. An observer sees every step's calls.
            raise TypeError(
                f"{who} does not take record=: pass observer=hpu_autocast.Recorder(...) "
                "to collect every step's calls, then call its report()"
            )
        probe = HpuAutocastMode(self.dtype, policy=policy, **mode_kwargs)  # bad settings fail here
        self.policy = policy
        self.mode_kwargs = mode_kwargs
        return _PRECISION[self.dtype], probe.device_type or "cpu"

    def _region(self) -> HpuAutocastMode:
        return HpuAutocastMode(self.dtype, policy=self.policy, **self.mode_kwargs)

    def __repr__(self) -> str:
        policy = self.policy if isinstance(self.policy, str) else self.policy.name
        return f"{type(self).__name__}(dtype={self.dtype}, policy={policy!r})"


class HpuAutocastPrecision(_Region, MixedPrecision):
    """Lightning's mixed precision with ``HpuAutocastMode`` as its autocast.

    ``Trainer(plugins=[HpuAutocastPrecision("bf16-mixed", policy=...)])`` runs the forward of each
    training, validation, test and predict step in ``HpuAutocastMode(dtype, policy=policy,
    **mode_kwargs)``; backward and the optimizer step run outside it. Under ``policy="torch-cpu"``
    on CPU it trains bit for bit as ``Trainer(precision="bf16-mixed")``.

    Args:
        dtype: ``"bf16-mixed"`` or ``torch.bfloat16`` (``trainer.precision`` is ``"bf16-mixed"``),
            ``"16-mixed"`` or ``torch.float16`` (the loss is scaled by a ``torch.amp.GradScaler``, as
            Lightning's own ``precision="16-mixed"``; the ``hpu`` and ``hmp`` policies are bfloat16
            only); default bfloat16.
        policy: a preset name or a ``Policy``, as for ``HpuAutocastMode``. The default preset,
            ``"hpu"``, reads Gaudi's ``PT_HPU_AUTOCAST_*_OPS_LIST`` variables when each step's
            region is created.
        precision: the same as ``dtype``, by lightning-habana's name for it.
        scaler: the ``torch.amp.GradScaler`` for float16 (default: a new one for the region's
            device type); bfloat16 takes none.
        **mode_kwargs: the other arguments of ``HpuAutocastMode`` (``device_type``,
            ``cache_enabled``, ``observer``, ``verbose``, ``enabled``). The cast cache is off
            unless ``cache_enabled=True`` is given, as in ``MixedPrecision`` (the module's Note).

    Bad arguments fail here, not at the first step: the settings are tried by creating one mode.
    """

    def __init__(
        self,
        dtype: Union[torch.dtype, str, int, None] = None,
        policy: Union[str, Policy] = "hpu",
        *,
        precision: Union[str, int, torch.dtype, None] = None,
        scaler: Optional[torch.amp.GradScaler] = None,
        **mode_kwargs: Any,
    ) -> None:
        name, device = self._settings(dtype, precision, policy, mode_kwargs)
        super().__init__(name, device=device, scaler=scaler)

    def autocast_context_manager(self) -> HpuAutocastMode:  # type: ignore[override]
        """A new region for one step's forward (``MixedPrecision.forward_context`` enters it)."""
        return self._region()


class HpuAutocastFabricPrecision(_Region, FabricMixedPrecision):
    """Fabric's mixed precision with ``HpuAutocastMode`` as its autocast:
    ``Fabric(plugins=[HpuAutocastFabricPrecision("bf16-mixed", policy=...)])`` runs each forward
    of a module set up with ``fabric.setup`` (and ``fabric.autocast()`` blocks) in a new region;
    under ``policy="torch-cpu"`` on CPU it is bit for bit ``Fabric(precision="bf16-mixed")``.
    Takes the arguments of ``HpuAutocastPrecision``."""

    def __init__(
        self,
        dtype: Union[torch.dtype, str, int, None] = None,
        policy: Union[str, Policy] = "hpu",
        *,
        precision: Union[str, int, torch.dtype, None] = None,
        scaler: Optional[torch.amp.GradScaler] = None,
        **mode_kwargs: Any,
    ) -> None:
        name, device = self._settings(dtype, precision, policy, mode_kwargs)
        super().__init__(name, device=device, scaler=scaler)

    def forward_context(self) -> HpuAutocastMode:  # type: ignore[override]
        """A new region for one forward."""
        return self._region()

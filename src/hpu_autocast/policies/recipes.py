"""FP8 scaling recipes, as plain frozen data: how an fp8 region chooses the scales (per tensor or
per row) of the operands it quantizes (the engine's ``_engine/fp8.py`` applies them; docs/fp8.md).

A recipe is part of a policy's value (``Policy.fp8``): equal policies have equal recipes, so the
compiled key the compile guard checks, the pickle and the report all carry it.

* ``Tensorwise()``, the default: stateless, dynamic. Each operand's scale is
  ``finfo(fp8).max / amax(operand)`` at the call, divided in float64 and rounded to float32 as
  torchao's ``amax_to_scale`` does (torchao's float8 training, "tensorwise").
* ``Delayed(history, margin, amax_compute)``: Transformer Engine's ``DelayedScaling``. The scale
  comes from the amaxes seen at earlier calls (a history of ``history`` values per weight and
  call site): ``finfo(fp8).max / amax / 2**margin``, with ``amax`` the history's maximum
  (``"max"``) or its last value (``"most_recent"``); the call's own amax then enters the history.
* ``Rowwise(weight_grad)``: torchao's "rowwise": dynamic, one scale per row of each operand
  along the GEMM's contraction dimension (a linear's input per row, its weight per output row),
  floored to a power of 2; e4m3 for every operand, the gradient too. ``weight_grad="high"`` is
  torchao's "rowwise_with_gw_hp": the weight-gradient GEMM in high precision, the weight
  scaled tensorwise for the input gradient.

Each recipe also says how the quantized operands are multiplied (``emulate``): ``None`` (the
default) multiplies them as dequantized float32 matrices on a CPU (torchao's ``emulate=True``:
torch's CPU ``torch._scaled_mm`` with per-tensor scales is about 3000x slower than a bfloat16
``mm``, with per-row scales 4x slower than the emulation's float32 ``mm``) and where
``torch._scaled_mm`` has no kernel for the device, by ``torch._scaled_mm`` (or Gaudi's
``fp8_gemm_v2``) elsewhere; ``True`` always emulates, ``False`` never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

__all__ = [
    "FP8_DTYPES",
    "Tensorwise",
    "Delayed",
    "Rowwise",
    "Recipe",
    "RECIPES",
    "is_fp8",
    "cast_dtype",
    "supports",
    "emulates",
]

#: The region dtypes that mean "GEMMs in fp8": the forward's operands in e4m3; the gradient in
#: e5m2 (Transformer Engine's "hybrid" format); everything else the policy lowers in bfloat16.
FP8_DTYPES = (torch.float8_e4m3fn,)

#: The amax a ``Delayed`` recipe takes from its history.
AMAX_COMPUTE = ("max", "most_recent")

#: How a ``Rowwise`` recipe runs a linear's weight-gradient GEMM: ``"e4m3"`` (torchao's
#: "rowwise") or ``"high"`` (torchao's "rowwise_with_gw_hp": the operands as they arrive).
WEIGHT_GRAD = ("e4m3", "high")


def is_fp8(dtype: object) -> bool:
    """Whether a region of ``dtype`` runs its GEMMs in fp8 (the one test of it)."""
    return dtype in FP8_DTYPES


def cast_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a region of ``dtype`` casts to (LOWER, and PROMOTE's lower dtype): its own, but
    bfloat16 for an fp8 region, whose fp8 GEMMs quantize their bfloat16 inputs themselves."""
    return torch.bfloat16 if dtype in FP8_DTYPES else dtype


def supports(dtypes: tuple, dtype: torch.dtype) -> bool:
    """Whether a policy of ``dtypes`` runs regions of ``dtype``: one of them, or an fp8 dtype where
    the policy runs bfloat16 (its GEMMs then run in fp8, its other lower ops in bfloat16)."""
    return dtype in dtypes or (dtype in FP8_DTYPES and cast_dtype(dtype) in dtypes)


@dataclass(frozen=True)
class Tensorwise:
    """Dynamic per-tensor scaling: each operand's scale from its own amax at the call."""

    #: How the quantized operands are multiplied (module docstring): ``None``, emulated on a
    #: CPU; ``True``, always emulated; ``False``, ``torch._scaled_mm`` always.
    emulate: Optional[bool] = None

    def __post_init__(self) -> None:
        _check_emulate(self)

    def __str__(self) -> str:
        return "tensorwise" + _emulate_str(self)


@dataclass(frozen=True)
class Delayed:
    """Delayed per-tensor scaling (Transformer Engine's ``DelayedScaling``): scales from an amax
    history kept per weight and call site."""

    #: How many amaxes the history keeps (Transformer Engine's ``amax_history_len``).
    history: int = 16
    #: The scale is divided by ``2**margin`` (headroom for values that grow between calls).
    margin: int = 0
    #: ``"max"``: the history's largest amax; ``"most_recent"``: its last.
    amax_compute: str = "max"
    #: As ``Tensorwise.emulate``.
    emulate: Optional[bool] = None

    def __post_init__(self) -> None:
        _check_emulate(self)
        if not (isinstance(self.history, int) and self.history >= 1):
            raise ValueError(f"Delayed: history = {self.history!r}; accepted: an int >= 1")
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"Delayed: margin = {self.margin!r}; accepted: an int >= 0")
        if self.amax_compute not in AMAX_COMPUTE:
            raise ValueError(
                f"Delayed: amax_compute = {self.amax_compute!r}; accepted: {' or '.join(map(repr, AMAX_COMPUTE))}"
            )

    def __str__(self) -> str:
        return (
            f"delayed(history={self.history}, margin={self.margin}, amax={self.amax_compute}"
            f"{_emulate_str(self)[1:-1] and ', ' + _emulate_str(self)[1:-1]})"
        )


@dataclass(frozen=True)
class Rowwise:
    """Dynamic per-row scaling (torchao's ``Float8LinearRecipeName.ROWWISE``): each operand of
    each of a linear's three GEMMs scaled per row along the GEMM's contraction dimension, from
    that row's amax, the scale floored to a power of 2 (torchao's ``round_scales_to_power_of_2``);
    e4m3 for all operands, the gradient too. As torchao, the backward quantizes the saved inputs
    anew along its GEMMs' axes (so it saves them in high precision, not in fp8)."""

    #: The weight-gradient GEMM: ``"e4m3"`` (torchao's ``ROWWISE``) or ``"high"`` (torchao's
    #: ``ROWWISE_WITH_GW_HP``: that GEMM unquantized, in the operands' dtype, bfloat16 for a
    #: region's activations; the input gradient's weight scaled tensorwise, to a power of 2).
    weight_grad: str = "e4m3"
    #: As ``Tensorwise.emulate``.
    emulate: Optional[bool] = None

    def __post_init__(self) -> None:
        _check_emulate(self)
        if self.weight_grad not in WEIGHT_GRAD:
            raise ValueError(
                f"Rowwise: weight_grad = {self.weight_grad!r}; accepted: {' or '.join(map(repr, WEIGHT_GRAD))}"
            )

    def __str__(self) -> str:
        parts = [f"weight_grad={self.weight_grad}"] if self.weight_grad != "e4m3" else []
        parts += [_emulate_str(self)[1:-1]] if self.emulate is not None else []
        return "rowwise" + (f"({', '.join(parts)})" if parts else "")


def _check_emulate(recipe) -> None:
    if recipe.emulate not in (None, True, False):
        raise ValueError(
            f"{type(recipe).__name__}: emulate = {recipe.emulate!r}; accepted: None (emulated on a CPU), True or False"
        )


def _emulate_str(recipe) -> str:
    return "" if recipe.emulate is None else f"({'emulated' if recipe.emulate else 'scaled_mm'})"


def emulates(recipe, device_type: str, scaled_mm_runs: bool) -> bool:
    """Whether ``recipe``'s GEMMs on ``device_type`` multiply dequantized float32 matrices rather
    than call ``torch._scaled_mm`` (which runs there where ``scaled_mm_runs``)."""
    if recipe.emulate is None:
        return device_type == "cpu" or not scaled_mm_runs
    return recipe.emulate


Recipe = Union[Tensorwise, Delayed, Rowwise]
#: Every recipe type (``Policy.fp8`` is one of them).
RECIPES = (Tensorwise, Delayed, Rowwise)

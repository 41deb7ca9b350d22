"""Numerics check: run a function in float32 and under the mode, and compare the outputs.

    >>> print(compare(model, x, dtype=torch.bfloat16, policy="hpu"))
    output  dtype  max abs err  max rel err  inf/nan
    out     bf16   3.906e-03    2.041e-03    no

The relative error is normwise, ``max|mixed - ref| / max|ref|``: an elementwise ratio is
dominated by reference values near zero. Both runs start from the same RNG state, so
dropout draws the same mask; a function that mutates state (batch norm's running statistics,
an optimizer step) runs twice, so pass one without such side effects (``model.eval()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List

import torch

from ._torch import keystr, tree_flatten_with_path
from .events import short_dtype

__all__ = ["compare", "compare_outputs", "Comparison", "OutputError"]


@dataclass
class OutputError:
    """How one floating output of the mixed run differs from the float32 run."""

    name: str  #: path in the output structure: ``out``, ``out[0]``, ``out['loss']``
    dtype: torch.dtype  #: dtype of the mixed-precision output
    max_abs: float
    max_rel: float
    nonfinite: bool  #: the mixed output has an inf or nan
    ref_nonfinite: bool  #: the float32 output has an inf or nan


class Comparison:
    """Per output errors of a mixed-precision run against a float32 run."""

    def __init__(self, outputs: List[OutputError]) -> None:
        self.outputs = outputs

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    @property
    def nonfinite(self) -> bool:
        """True when an output of the mixed run has an inf or nan the float32 run does not."""
        return any(o.nonfinite and not o.ref_nonfinite for o in self.outputs)

    def __getitem__(self, name: str) -> OutputError:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"no output named {name!r}; outputs: {', '.join(o.name for o in self.outputs)}")

    def __str__(self) -> str:
        head = ["output", "dtype", "max abs err", "max rel err", "inf/nan"]
        rows = [
            [
                o.name,
                short_dtype(o.dtype),
                f"{o.max_abs:.3e}",
                f"{o.max_rel:.3e}",
                ("yes" if o.nonfinite else "no") + (" (also in float32)" if o.ref_nonfinite else ""),
            ]
            for o in self.outputs
        ]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows])

    def __repr__(self) -> str:
        return f"Comparison(max_abs={self.max_abs:.3e}, max_rel={self.max_rel:.3e}, nonfinite={self.nonfinite})"


def _error(name: str, ref: torch.Tensor, out: torch.Tensor) -> OutputError:
    if ref.shape != out.shape:
        raise ValueError(f"output {name}: shape {list(out.shape)} under the mode, {list(ref.shape)} in float32")
    r = ref.detach().double()
    o = out.detach().double()
    finite = torch.isfinite(r) & torch.isfinite(o)
    diff = (o - r).abs()[finite]
    max_abs = diff.max().item() if diff.numel() else 0.0
    scale = r.abs()[finite].max().item() if diff.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return OutputError(
        name, out.dtype, max_abs, max_rel, not bool(torch.isfinite(o).all()), not bool(torch.isfinite(r).all())
    )


def compare_outputs(ref, out) -> Comparison:
    """The errors of ``out`` against ``ref``, two results of one function (any pytree of the same
    structure), per floating tensor of ``ref``. What ``compare`` measures, for callers that run
    the function themselves (``tune`` runs the float32 reference once for many candidates)."""
    ref_leaves, ref_spec = tree_flatten_with_path(ref)
    out_leaves, out_spec = tree_flatten_with_path(out)
    if ref_spec != out_spec:
        raise ValueError(
            f"fn returned differently structured outputs: {ref_spec} in float32, {out_spec} under the mode"
        )
    errors = []
    for (path, r), (_, o) in zip(ref_leaves, out_leaves):
        if isinstance(r, torch.Tensor) and isinstance(o, torch.Tensor) and r.is_floating_point():
            errors.append(_error("out" + keystr(path), r, o))
    if not errors:
        raise ValueError("fn returned no floating tensor to compare")
    return Comparison(errors)


def compare(fn: Callable, *inputs, dtype: torch.dtype = torch.bfloat16, policy="hpu", **mode_kwargs) -> Comparison:
    """Run ``fn(*inputs)`` as is (float32) and under ``HpuAutocastMode(dtype, policy=policy)``,
    and report, per floating tensor output, the max absolute and relative error and whether an
    inf or nan appeared. Errors are measured in float64 over the elements finite in both runs."""
    from .mode import HpuAutocastMode

    rng = torch.random.get_rng_state()
    ref = fn(*inputs)
    torch.random.set_rng_state(rng)
    with HpuAutocastMode(dtype, policy=policy, **mode_kwargs):
        out = fn(*inputs)
    return compare_outputs(ref, out)

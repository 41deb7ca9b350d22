"""FP8 GEMMs (``_fp8``): what a region of an fp8 dtype (``recipes.FP8_DTYPES``) does with the
GEMMs its policy lowers: both operands quantized to e4m3 with per-tensor scales (the policy's
recipe, ``Policy.fp8``), multiplied by ``torch._scaled_mm`` (through ``_torch.scaled_mm``) into
bfloat16 (+ bias); the backward's two GEMMs with the gradient in e5m2 and the saved operands in
e4m3 (Transformer Engine's "hybrid" format).

[Note: fp8 regions]
An fp8 region is a bfloat16 region whose GEMMs run in fp8. The kernels' LOWER function asks
``route`` (the one place): for a GEMM of ``_GEMMS`` whose shapes ``_scaled_mm`` takes (2-D
products with every dimension a positive multiple of 16; ``linear`` and ``matmul`` of N-D inputs
flattened to 2-D, ``bmm`` and ``baddbmm`` one product per batch), ``route`` replaces the call's
overload by a ``Gemm`` that does the above and says the call computed in e4m3; any other GEMM
runs in bfloat16 with the reason (``fp8 fallback: ...``) in its event, so the report names it;
every other lowered op runs in bfloat16. The walk casts the inputs to bfloat16 first (through
the cast cache, as any region's), so a float32 master weight is cast once per region, and its
gradient reaches it in float32 through the cast's own backward: master weights are untouched, and
no loss scaler is needed (e5m2's range is float16's). The C++ core decides no call of an fp8
region (``_core.region_for``).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import dispatch as _dispatch
from .. import _torch
from ..policies.recipes import Delayed, Recipe

__all__ = ["route", "Gemm", "E4M3", "E5M2"]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_BF16 = torch.bfloat16
_aten = torch.ops.aten


# -- quantization: a per-tensor scale, from the call's amax or a history ----------------------
class _History:
    """A Delayed recipe's amaxes for one operand of one weight's GEMM (Transformer Engine's
    ``amax_history``): a ring of ``recipe.history`` values, the scale from those of earlier calls."""

    __slots__ = ("recipe", "values", "filled", "at")

    def __init__(self, recipe: Delayed) -> None:
        self.recipe, self.values, self.filled, self.at = recipe, None, 0, 0

    def amax(self, current: torch.Tensor) -> torch.Tensor:
        """The amax to scale by (the call's own where the history is empty), then ``current`` kept."""
        if self.values is None:
            self.values = torch.zeros(self.recipe.history, dtype=torch.float32, device=current.device)
        if self.filled == 0:
            used = current
        elif self.recipe.amax_compute == "max":
            used = self.values[:self.filled].max()
        else:
            used = self.values[(self.at - 1) % self.recipe.history]
        self.values[self.at] = current
        self.at = (self.at + 1) % self.recipe.history
        self.filled = min(self.filled + 1, self.recipe.history)
        return used


def quantize(x: torch.Tensor, dtype: torch.dtype, history: Optional[_History] = None):
    """``x`` in fp8 ``dtype`` and its dequantization scale (``x ~ q * inverse``): scaled so that its
    amax (or the history's) meets the format's largest value, saturated beyond it."""
    big = torch.finfo(dtype).max
    amax = x.detach().abs().max().float()
    if history is not None:
        amax = history.amax(amax)
    margin = 2.0 ** history.recipe.margin if history is not None else 1.0
    scale = big / amax.clamp(min=1e-12) / margin
    q = (x.float() * scale).clamp(-big, big).to(dtype)
    return q, scale.reciprocal()


#: Delayed recipes' histories: weight -> {(op, operand, recipe): _History}. Keyed by the weight the
#: user passed (a float32 parameter lives across steps; its bfloat16 copy only for a region).
_HISTORIES = WeakIdKeyDictionary()


def _histories(recipe: Recipe, weight: Optional[torch.Tensor], site: str) -> tuple:
    """The three histories (input, weight, gradient) of one weight at one call site (its op), or
    ``(None,)*3`` for tensorwise scaling or a weight that does not persist (an activation)."""
    if not isinstance(recipe, Delayed) or weight is None or not weight.is_leaf:
        return (None, None, None)
    sites = _HISTORIES.setdefault(weight, {})
    return tuple(sites.setdefault((site, role, recipe), _History(recipe)) for role in ("input", "weight", "grad"))


# -- the product and its gradient -----------------------------------------------------------------
def _col(x: torch.Tensor) -> torch.Tensor:
    """``x`` column-major (``_scaled_mm``'s second operand)."""
    return x if x.stride(0) == 1 else x.t().contiguous().t()


def _row(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(1) == 1 else x.contiguous()


def _mm(a_q, b_q, a_inv, b_inv, bias=None) -> torch.Tensor:
    """The scaled fp8 product into bfloat16: on an HPU, Gaudi's bridge's ``hpu::fp8_gemm_v2`` where
    ``habana_frameworks`` registered it (its ``A_scale_inv``/``B_scale_inv`` are these inverses),
    else ``torch._scaled_mm``."""
    if a_q.device.type == "hpu" and hasattr(torch.ops.hpu, "fp8_gemm_v2"):
        return torch.ops.hpu.fp8_gemm_v2(a_q, False, b_q, False, None, _BF16, a_inv, b_inv, bias, False)
    return _torch.scaled_mm(_row(a_q), _col(b_q), a_inv, b_inv, bias=bias, out_dtype=_BF16)


class _ScaledMatmul(torch.autograd.Function):
    """``a @ b (+ bias)`` for 2-D ``a`` [m, k], ``b`` [k, n]: e4m3 operands, bfloat16 result; the
    backward's products with the gradient in e5m2 against the saved e4m3 operands."""

    @staticmethod
    def forward(ctx, a, b, bias, histories):
        k = _dispatch._keys
        with k.excluded():
            a_q, a_inv = quantize(a, E4M3, histories[0])
            b_q, b_inv = quantize(b, E4M3, histories[1])
            out = _mm(a_q, b_q, a_inv, b_inv, None if bias is None else bias.to(_BF16))
        ctx.save_for_backward(a_q, b_q, a_inv, b_inv)
        ctx.history, ctx.dtypes = histories[2], (a.dtype, b.dtype, None if bias is None else bias.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        a_q, b_q, a_inv, b_inv = ctx.saved_tensors
        need_a, need_b, need_bias, _ = ctx.needs_input_grad
        grad_a = grad_b = grad_bias = None
        k = _dispatch._keys
        with k.excluded():  # a backward run inside a region: its own ops are not cast
            g_q, g_inv = quantize(grad, E5M2, ctx.history)
            if need_a:
                grad_a = _mm(g_q, b_q.t(), g_inv, b_inv).to(ctx.dtypes[0])
            if need_b:
                grad_b = _mm(a_q.t(), g_q, a_inv, g_inv).to(ctx.dtypes[1])
            if need_bias:
                grad_bias = grad.sum(0).to(ctx.dtypes[2])
        return grad_a, grad_b, grad_bias, None


# -- the GEMMs: each flattened or looped to 2-D products ----------------------------------------
def _matmul2d(a, b, bias, histories):
    return _ScaledMatmul.apply(a, b, bias, histories)


def _linear(h, input, weight, bias=None):
    out = _matmul2d(input.reshape(-1, input.shape[-1]), weight.t(), bias, h)
    return out.reshape(*input.shape[:-1], weight.shape[0])


def _mm_call(h, self, mat2):
    return _matmul2d(self, mat2, None, h)


def _addmm(h, self, mat1, mat2, *, beta=1, alpha=1):
    if beta == 1 and alpha == 1 and self.dim() == 1:
        return _matmul2d(mat1, mat2, self, h)
    return beta * self + alpha * _matmul2d(mat1, mat2, None, h)


def _bmm(h, self, mat2):
    return torch.stack([_matmul2d(a, b, None, h) for a, b in zip(self.unbind(0), mat2.unbind(0))])


def _baddbmm(h, self, batch1, batch2, *, beta=1, alpha=1):
    return beta * self + alpha * _bmm(h, batch1, batch2)


def _matmul(h, self, other):
    if other.dim() == 2:
        out = _matmul2d(self.reshape(-1, self.shape[-1]), other, None, h)
        return out.reshape(*self.shape[:-1], other.shape[-1])
    batch = self.shape[:-2]  # N-D by N-D of one batch shape (attention's scores): one bmm
    out = _bmm(h, self.reshape(-1, *self.shape[-2:]), other.reshape(-1, *other.shape[-2:]))
    return out.reshape(*batch, *out.shape[-2:])


def _sides(dims) -> Optional[str]:
    """Why ``_scaled_mm`` cannot take products of these (m, k, n), or ``None``."""
    bad = [d for d in dims if d <= 0 or d % 16]
    return f"dims {tuple(dims)} are not all positive multiples of 16" if bad else None


def _shape_linear(input, weight, bias=None):
    if input.dim() < 1 or weight.dim() != 2:
        return f"linear of a {input.dim()}-D input and a {weight.dim()}-D weight"
    return _sides((input.numel() // max(input.shape[-1], 1), input.shape[-1], weight.shape[0]))


def _shape_mm(self, mat2):
    return _sides((self.shape[0], self.shape[1], mat2.shape[1]))


def _shape_addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _shape_mm(mat1, mat2)


def _shape_bmm(self, mat2):
    return _sides(self.shape[1:] + mat2.shape[2:])


def _shape_baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _shape_bmm(batch1, batch2)


def _shape_matmul(self, other):
    if self.dim() >= 2 and other.dim() == 2:
        return _sides((self.numel() // max(self.shape[-1], 1), self.shape[-1], other.shape[1]))
    if self.dim() == other.dim() >= 3 and self.shape[:-2] == other.shape[:-2]:
        return _sides((self.shape[-2], self.shape[-1], other.shape[-1]))
    return (f"matmul of {self.dim()}-D and {other.dim()}-D operands (N-D by 2-D, and N-D by N-D of one batch "
            "shape, only)")


#: The GEMMs an fp8 region runs in fp8: overload -> (the shape check, the product).
_GEMMS = {
    _aten.linear.default: (_shape_linear, _linear), _aten.mm.default: (_shape_mm, _mm_call),
    _aten.addmm.default: (_shape_addmm, _addmm), _aten.bmm.default: (_shape_bmm, _bmm),
    _aten.baddbmm.default: (_shape_baddbmm, _baddbmm), _aten.matmul.default: (_shape_matmul, _matmul),
}
#: Where each GEMM's weight (the operand whose Delayed histories are kept) is.
_WEIGHT = {_aten.linear.default: 1, _aten.mm.default: 1, _aten.addmm.default: 2, _aten.matmul.default: 1}


class Gemm:
    """The fp8 product that replaces a GEMM's overload in a call (``route``): called as the
    overload would be, on the call's arguments cast to bfloat16."""

    __slots__ = ("_product", "_histories")

    def __init__(self, product: Callable, histories: tuple) -> None:
        self._product, self._histories = product, histories

    def _op(self, *args, **kwargs):
        return self._product(self._histories, *args, **kwargs)


def route(frame, op, args: tuple, kwargs: dict) -> Tuple[object, Optional[str]]:
    """What runs a LOWER call in an fp8 region (Note: fp8 regions), on its inputs cast to
    bfloat16, and why: for a GEMM that ``_scaled_mm`` takes, its ``Gemm``; else ``op``, with the
    reason where ``op`` is a GEMM (``None`` for any other op)."""
    entry = _GEMMS.get(op)
    if entry is None:
        return op, None
    shape, product = entry
    region = frame.region
    policy = region.compiled.policy
    if op in policy.bf16_gemms:
        return op, "fp8: kept in bf16 by the policy (bf16_gemms)"
    if not all(t.is_floating_point() and region.eligible(t) for t in args if isinstance(t, torch.Tensor)):
        why = "an input the region does not cast (float64, another device)"
    elif not _torch.HAS_SCALED_MM:
        why = f"torch {torch.__version__} has no torch._scaled_mm"
    elif not _torch.scaled_mm_runs_on(region.device_type):
        why = f"torch {torch.__version__}'s torch._scaled_mm has no kernel for {region.device_type} tensors"
    else:
        try:
            why = shape(*args, **kwargs)
        except (TypeError, IndexError) as e:
            why = f"arguments the fp8 path does not take ({e})"
    if why is not None:
        return op, f"fp8 fallback: {why}"
    at = _WEIGHT.get(op)
    weight = args[at] if at is not None and at < len(args) else None
    return Gemm(product, _histories(policy.fp8, weight, str(op))), None

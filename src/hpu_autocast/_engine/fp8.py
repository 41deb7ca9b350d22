"""FP8 GEMMs (``_fp8``): what a region of an fp8 dtype (``recipes.FP8_DTYPES``) does with the
GEMMs its policy lowers: both operands quantized to e4m3 with per-tensor scales (the policy's
recipe, ``Policy.fp8``; per-row scales for ``Rowwise``, Note: rowwise scaling), multiplied by
``torch._scaled_mm`` (through ``_torch.scaled_mm``), or as dequantized float32 matrices
(emulated: the default on a CPU, ``recipes.emulates``), into bfloat16; the backward's two GEMMs
with the gradient in e5m2 and the saved operands in e4m3 (Transformer Engine's "hybrid" format).

[Note: fp8 regions]
An fp8 region is a bfloat16 region whose GEMMs run in fp8. The kernels' LOWER function asks
``route`` (the one place): for a GEMM of ``_GEMMS`` whose shapes ``_scaled_mm`` takes (2-D
products with every dimension a positive multiple of 16; ``linear`` and ``matmul`` of N-D inputs
flattened to 2-D, ``bmm`` and ``baddbmm`` one product per batch; the emulation takes the same
shapes, so a CPU run shows what a GPU's would), ``route`` replaces the call's overload by a
``Gemm`` that does the above and says the call computed in e4m3; any other GEMM runs in bfloat16
with the reason (``fp8 fallback: ...``) in its event, so the report names it; every other lowered
op runs in bfloat16. A ``Gemm`` takes its inputs uncast, as torchao's ``Float8Linear`` does: a
float32 master weight is quantized directly (no bfloat16 copy between, which moved 1-2% of the
codes), its scale is torchao's (``_scale``), a bias or ``addmm``'s ``self`` is added to the
float32 product (one rounding into bfloat16), and the gradients reach the inputs in their own
dtypes: master weights are untouched, and no loss scaler is needed (e5m2's range is float16's).
The C++ core decides no call of an fp8 region (``_core.region_for``).
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import dispatch as _dispatch
from .. import _torch
from ..policies.recipes import Delayed, Recipe, Rowwise, emulates

__all__ = ["route", "Gemm", "E4M3", "E5M2"]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_BF16 = torch.bfloat16
_aten = torch.ops.aten


# -- quantization: a per-tensor scale, from the call's amax or a history ----------------------
#: torchao's ``EPS``: the smallest amax a scale is computed from (an all-zero operand).
_EPS = 1e-12


class _History:
    """A Delayed recipe's amaxes for one operand of one weight's GEMM (Transformer Engine's
    ``amax_history``): a ring of ``recipe.history`` values, the scale from those of earlier calls;
    ``last``, the amax the last forward scaled by (a recomputation's, Note: fp8 recomputation)."""

    __slots__ = ("recipe", "values", "filled", "at", "last")

    def __init__(self, recipe: Delayed) -> None:
        self.recipe, self.values, self.filled, self.at, self.last = recipe, None, 0, 0, None

    def amax(self, current: torch.Tensor) -> torch.Tensor:
        """The amax to scale by (the call's own where the history is empty), then ``current`` kept;
        in a recomputation, the last forward's, and nothing kept."""
        if self.last is not None and _torch.in_backward():
            return self.last
        # Note: the ring is made and written outside inference mode (a tensor made under
        # torch.inference_mode() cannot be written after it: validate first, then train), and
        # with no autograd history (its values are statistics, not a graph).
        with torch.inference_mode(False), torch.no_grad():
            if self.values is None:
                self.values = torch.zeros(self.recipe.history, dtype=torch.float32, device=current.device)
            if self.filled == 0:
                used = current.clone()
            elif self.recipe.amax_compute == "max":
                used = self.values[: self.filled].max()
            else:
                used = self.values[(self.at - 1) % self.recipe.history].clone()
            self.values[self.at] = current
        self.at = (self.at + 1) % self.recipe.history
        self.filled = min(self.filled + 1, self.recipe.history)
        self.last = used
        return used


# [Note: fp8 recomputation]
# torch.utils.checkpoint runs a segment's forward again during the backward. A Delayed recipe's
# recomputed GEMM must quantize as the forward did (its saved operands are replaced by the
# recomputed ones, and the weight gradient is a product of those) and must not enter its amaxes a
# second time: Transformer Engine restores the forward's scaling state for the recomputation. A
# GEMM seen while a backward runs (``_torch.in_backward``) scales by the amax its history's last
# forward used, and keeps nothing. (A weight used twice in one checkpointed segment gets its last
# use's amax for both; a tensorwise recipe needs nothing: the recomputation sees the same values.)


def _scale(amax: torch.Tensor, dtype: torch.dtype, margin: int = 0, pow2: bool = False) -> torch.Tensor:
    """The quantization scale ``finfo(dtype).max / amax / 2**margin`` as torchao's
    ``amax_to_scale`` computes it: divided in float64, rounded to float32 (a float32 reciprocal
    times the max is one ulp high for about a quarter of amaxes, flipping codes on fp8 ties);
    ``pow2``: floored to a power of 2 (torchao's ``round_scales_to_power_of_2``, its ops)."""
    scale = (torch.finfo(dtype).max / amax.double().clamp(min=_EPS)).float()
    if pow2:
        return torch.exp2(torch.floor(torch.log2(scale)))
    return scale / 2.0**margin if margin else scale


def _amax(x: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """``max |x|`` in float32 (over ``dim``, kept, where given), from the two ends, with no
    temporary: over the whole tensor ``aminmax`` (12x faster than ``vector_norm(x, inf)`` on a
    CPU), along ``dim`` ``amax`` and ``amin`` (1.5x faster than torchao's ``abs().amax``, 5x than
    ``aminmax`` along a dimension); the same values, NaN too."""
    x = x.detach()
    if dim is not None:
        return torch.maximum(x.amin(dim=dim, keepdim=True).neg(), x.amax(dim=dim, keepdim=True)).float()
    lo, hi = torch.aminmax(x.t() if x.dim() == 2 and not x.is_contiguous() else x)  # (no copy of a weight.t())
    return torch.maximum(lo.neg(), hi).float()


def quantize(
    x: torch.Tensor,
    dtype: torch.dtype,
    history: Optional[_History] = None,
    dim: Optional[int] = None,
    pow2: bool = False,
):
    """``x`` in fp8 ``dtype`` and its quantization scale (``x ~ q / scale``): scaled so that its
    amax (or the history's; or each of its amaxes along ``dim``, a scale per row) meets the
    format's largest value, saturated beyond it; as torchao's ``hp_tensor_and_scale_to_float8``
    (the product in float32). ``pow2``: the scales floored to powers of 2 (``Rowwise``)."""
    big = torch.finfo(dtype).max
    amax = _amax(x, dim)
    if history is not None:
        amax = history.amax(amax)
    scale = _scale(amax, dtype, history.recipe.margin if history is not None else 0, pow2)
    scaled = x * scale if x.dtype == torch.float32 else x.float().mul_(scale)  # (one temporary)
    return scaled.clamp_(-big, big).to(dtype), scale


#: Each fp8 dtype's 256 codes as float32 values, per device (``_dequantize``).
_VALUES: dict = {}


def _values(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    table = _VALUES.get((dtype, device))
    if table is None:
        with torch.inference_mode(False), torch.no_grad():
            table = torch.arange(256, dtype=torch.uint8, device=device).view(dtype).float()
        _VALUES[(dtype, device)] = table
    return table


def _dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q.float() / scale`` (torchao's emulation), in ``q``'s layout. On a CPU, by looking the
    codes up in a table of their 256 values (divided by a per-tensor scale once): the same
    float32 values, 6x faster than the CPU's fp8 conversion (one element at a time); the layout
    kept, as the float32 ``mm`` after it may sum in another order for another layout."""
    if q.device.type != "cpu" or q.dim() != 2 or torch.compiler.is_compiling() or type(q) is not torch.Tensor:
        return q.float().div_(scale)
    if not q.is_contiguous():
        return _dequantize(q.t(), scale.t()).t() if q.t().is_contiguous() else q.float().div_(scale)
    table = _values(q.dtype, q.device)
    per_tensor = scale.numel() == 1
    if per_tensor:
        table = table / scale.reshape(())
    out = table.index_select(0, q.view(torch.uint8).reshape(-1).int()).view(q.shape)
    return out if per_tensor else out.div_(scale)


#: Delayed recipes' histories: weight -> {(op, operand, recipe): _History}. Keyed by the weight the
#: user passed (a float32 parameter lives across steps).
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


def _mm(a_q, b_q, a_s, b_s, out_dtype: torch.dtype, emulate: bool) -> torch.Tensor:
    """The fp8 product ``(a_q / a_s) @ (b_q / b_s)`` in ``out_dtype`` (float32 or bfloat16).
    Emulated: the dequantized operands multiplied as float32 matrices (torchao's ``emulate=True``,
    its division too), at float32 ``mm``'s speed. Else on an HPU, Gaudi's bridge's
    ``hpu::fp8_gemm_v2`` where ``habana_frameworks`` registered it (its ``A_scale_inv`` and
    ``B_scale_inv`` are the inverse scales), elsewhere ``torch._scaled_mm``. Scales are one per
    tensor or one per row of ``a`` [m, 1] and column of ``b`` [1, n] (``_scaled_mm``'s rowwise
    form, which takes no mix of the two: a per-tensor one is then expanded)."""
    if emulate:  # (an operand in float32 is one ``_dequantize`` gave already)
        a, b = (q if q.dtype == torch.float32 else _dequantize(q, s) for q, s in ((a_q, a_s), (b_q, b_s)))
        return torch.mm(a, b).to(out_dtype)
    a_inv, b_inv = a_s.reciprocal(), b_s.reciprocal()
    if (a_inv.numel() == 1) != (b_inv.numel() == 1):  # one side per row, the other per tensor
        a_inv = a_inv.reshape(1, 1).expand(a_q.shape[0], 1).contiguous() if a_inv.numel() == 1 else a_inv
        b_inv = b_inv.reshape(1, 1).expand(1, b_q.shape[1]).contiguous() if b_inv.numel() == 1 else b_inv
    if a_q.device.type == "hpu" and hasattr(torch.ops.hpu, "fp8_gemm_v2"):
        return torch.ops.hpu.fp8_gemm_v2(a_q, False, b_q, False, None, out_dtype, a_inv, b_inv, None, False)
    return _torch.scaled_mm(_row(a_q), _col(b_q), a_inv, b_inv, out_dtype=out_dtype)


def _out(dtype: torch.dtype) -> torch.dtype:
    """The product's dtype for a result of ``dtype``: its own where a GEMM writes it, else float32."""
    return dtype if dtype in (_BF16, torch.float32) else torch.float32


def _forward(a_q, b_q, a_s, b_s, add, alpha, beta, emulate: bool) -> torch.Tensor:
    """``alpha * (a @ b) + beta * add`` from the quantized operands, into bfloat16: the product in
    float32 where something is added (then one rounding, as torchao adds its bias after)."""
    plain = add is None or beta == 0  # Note: beta=0 ignores add (NaN too), as torch does
    out = _mm(a_q, b_q, a_s, b_s, _BF16 if plain and alpha == 1 else torch.float32, emulate)
    if alpha != 1:
        out = out * alpha
    if not plain:
        out = out + (add if beta == 1 else beta * add)
    return out.to(_BF16)


def _grad_b(a_q, g_q, a_s, g_s, out_dtype: torch.dtype, emulate: bool, transposed: bool) -> torch.Tensor:
    """``a.t() @ g``, the gradient of ``b``, laid out as ``b``: ``(g.t() @ a).t()`` for a
    ``weight.t()`` (torchao's order), so that the weight's gradient is contiguous and autograd's
    ``AccumulateGrad`` copies nothing (a 4 MB copy for a 1024-wide linear). The float32 ``mm``
    gives the same bits either way round (measured on shapes from 16 to 4096)."""
    if transposed:
        return _mm(g_q.t(), a_q, g_s.t(), a_s, out_dtype, emulate).t()
    return _mm(a_q.t(), g_q, a_s.t(), g_s, out_dtype, emulate)


def _save(ctx, a, b, add, emulate, alpha, beta) -> None:
    ctx.transposed = b.dim() == 2 and not b.is_contiguous() and b.t().is_contiguous()  # (a weight.t())
    ctx.emulate, ctx.alpha, ctx.beta = emulate, alpha, beta
    ctx.dtypes = (a.dtype, b.dtype, None if add is None else add.dtype, None if add is None else add.shape)


def _grad_add(ctx, grad):
    g_add = grad.float() * ctx.beta if ctx.beta != 1 else grad.float()
    return _sum_to(g_add, ctx.dtypes[3]).to(ctx.dtypes[2])


class _ScaledMatmul(torch.autograd.Function):
    """``alpha * (a @ b) + beta * add`` for 2-D ``a`` [m, k], ``b`` [k, n] (``add`` a bias or
    ``None``), per-tensor scales (``Tensorwise``, ``Delayed``): e4m3 operands, into bfloat16
    (``_forward``); the backward's products with the gradient in e5m2 against the saved e4m3
    operands."""

    @staticmethod
    def forward(ctx, a, b, add, histories, emulate, alpha=1, beta=1):
        k = _dispatch._keys
        with k.excluded():
            a_q, a_s = quantize(a, E4M3, histories[0])
            b_q, b_s = quantize(b, E4M3, histories[1])
            out = _forward(a_q, b_q, a_s, b_s, add, alpha, beta, emulate)
        ctx.save_for_backward(a_q, b_q, a_s, b_s)
        ctx.history = histories[2]
        _save(ctx, a, b, add, emulate, alpha, beta)
        return out

    @staticmethod
    def backward(ctx, grad):
        a_q, b_q, a_s, b_s = ctx.saved_tensors
        need_a, need_b, need_add = ctx.needs_input_grad[:3]
        grad_a = grad_b = grad_add = None
        k = _dispatch._keys
        with k.excluded():  # a backward run inside a region: its own ops are not cast
            g = grad if ctx.alpha == 1 else grad * ctx.alpha
            g_q, g_s = quantize(g, E5M2, ctx.history)
            if ctx.emulate and need_a and need_b:  # both products take it: dequantized once
                g_q = _dequantize(g_q, g_s)
            if need_a:
                dtype = ctx.dtypes[0]
                grad_a = _mm(g_q, b_q.t(), g_s, b_s, _out(dtype), ctx.emulate).to(dtype)
            if need_b:
                dtype = ctx.dtypes[1]
                grad_b = _grad_b(a_q, g_q, a_s, g_s, _out(dtype), ctx.emulate, ctx.transposed).to(dtype)
            if need_add:
                grad_add = _grad_add(ctx, grad)
        return grad_a, grad_b, grad_add, None, None, None, None


# [Note: rowwise scaling]
# A Rowwise recipe scales each operand of each GEMM per row along that GEMM's contraction
# dimension, as torchao's "rowwise" (float8_linear.py's three GEMMs, with their axiswise dims):
#   out    = a [m, k] @ b [k, n]      a per row (over k), b per column (over k)
#   grad_a = g [m, n] @ b.t() [n, k]  g per row (over n), b.t() per column (over n); "high":
#                                     b.t() per tensor
#   grad_b = (g.t() [n, m] @ a [m, k]).t()   g per column, a per column (over m); "high": this
#                                     GEMM unquantized, in the operands' promoted dtype
# every scale floored to a power of 2, every operand in e4m3 (the gradient too). So the backward
# quantizes a and b anew along other axes: they are saved as passed (a parameter costs nothing
# more; an activation is saved in its own dtype, as torchao saves it), not in fp8.
class _RowwiseMatmul(torch.autograd.Function):
    """``_ScaledMatmul`` with a ``Rowwise`` recipe's per-row scales (Note: rowwise scaling)."""

    @staticmethod
    def forward(ctx, a, b, add, high, emulate, alpha=1, beta=1):
        k = _dispatch._keys
        with k.excluded():
            a_q, a_s = quantize(a, E4M3, dim=-1, pow2=True)
            b_q, b_s = quantize(b, E4M3, dim=0, pow2=True)
            out = _forward(a_q, b_q, a_s, b_s, add, alpha, beta, emulate)
        ctx.save_for_backward(a, b)
        ctx.high = high
        _save(ctx, a, b, add, emulate, alpha, beta)
        return out

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        need_a, need_b, need_add = ctx.needs_input_grad[:3]
        grad_a = grad_b = grad_add = None
        k = _dispatch._keys
        with k.excluded():
            g = grad if ctx.alpha == 1 else grad * ctx.alpha
            if need_a:
                dtype = ctx.dtypes[0]
                g_q, g_s = quantize(g, E4M3, dim=-1, pow2=True)
                bt_q, bt_s = quantize(b.t(), E4M3, dim=None if ctx.high else 0, pow2=True)
                grad_a = _mm(g_q, bt_q, g_s, bt_s, _out(dtype), ctx.emulate).to(dtype)
            if need_b:
                dtype = ctx.dtypes[1]
                if ctx.high:
                    hp = torch.promote_types(g.dtype, a.dtype)
                    g, a = g.to(hp), a.to(hp)
                    grad_b = (torch.mm(g.t(), a).t() if ctx.transposed else torch.mm(a.t(), g)).to(dtype)
                else:
                    g_q, g_s = quantize(g, E4M3, dim=0, pow2=True)
                    a_q, a_s = quantize(a, E4M3, dim=0, pow2=True)
                    grad_b = _grad_b(a_q, g_q, a_s, g_s, _out(dtype), ctx.emulate, ctx.transposed).to(dtype)
            if need_add:
                grad_add = _grad_add(ctx, grad)
        return grad_a, grad_b, grad_add, None, None, None, None


def _sum_to(grad: torch.Tensor, shape) -> torch.Tensor:
    """``grad`` summed over the dimensions ``shape`` was broadcast along."""
    lead = grad.dim() - len(shape)
    grad = grad.sum(tuple(range(lead))) if lead else grad
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return (grad.sum(dims, keepdim=True) if dims else grad).reshape(shape)


# -- the GEMMs: each flattened or looped to 2-D products ----------------------------------------
def _matmul2d(h, a, b, add=None, alpha=1, beta=1):
    histories, emulate, recipe = h
    if isinstance(recipe, Rowwise):
        return _RowwiseMatmul.apply(a, b, add, recipe.weight_grad == "high", emulate, alpha, beta)
    return _ScaledMatmul.apply(a, b, add, histories, emulate, alpha, beta)


def _linear(h, input, weight, bias=None):
    out = _matmul2d(h, input.reshape(-1, input.shape[-1]), weight.t(), bias)
    return out.reshape(*input.shape[:-1], weight.shape[0])


def _mm_call(h, self, mat2):
    return _matmul2d(h, self, mat2)


def _addmm(h, self, mat1, mat2, *, beta=1, alpha=1):
    return _matmul2d(h, mat1, mat2, self, alpha, beta)


def _bmm(h, self, mat2, add=None, alpha=1, beta=1):
    if self.shape[0] == 0:  # an empty batch: nothing to quantize (stack takes no empty list)
        out = torch.bmm(self.to(_BF16), mat2.to(_BF16))
        return out if add is None else out + add.to(_BF16)
    adds = [None] * self.shape[0] if add is None else add.expand(self.shape[0], self.shape[1], mat2.shape[2]).unbind(0)
    return torch.stack([_matmul2d(h, a, b, c, alpha, beta) for a, b, c in zip(self.unbind(0), mat2.unbind(0), adds)])


def _baddbmm(h, self, batch1, batch2, *, beta=1, alpha=1):
    return _bmm(h, batch1, batch2, self, alpha, beta)


def _matmul(h, self, other):
    if other.dim() == 2:
        out = _matmul2d(h, self.reshape(-1, self.shape[-1]), other)
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
    return (
        f"matmul of {self.dim()}-D and {other.dim()}-D operands (N-D by 2-D, and N-D by N-D of one batch shape, only)"
    )


#: The GEMMs an fp8 region runs in fp8: overload -> (the shape check, the product).
_GEMMS = {
    _aten.linear.default: (_shape_linear, _linear),
    _aten.mm.default: (_shape_mm, _mm_call),
    _aten.addmm.default: (_shape_addmm, _addmm),
    _aten.bmm.default: (_shape_bmm, _bmm),
    _aten.baddbmm.default: (_shape_baddbmm, _baddbmm),
    _aten.matmul.default: (_shape_matmul, _matmul),
}
#: Where each GEMM's weight (the operand whose Delayed histories are kept) is.
_WEIGHT = {_aten.linear.default: 1, _aten.mm.default: 1, _aten.addmm.default: 2, _aten.matmul.default: 1}


class Gemm:
    """The fp8 product that replaces a GEMM's overload in a call (``route``): called as the
    overload would be, on the call's arguments as the user passed them (a float32 master weight is
    quantized directly, as torchao does: no bfloat16 copy between). ``emulated``: whether it
    multiplies dequantized float32 matrices (``recipes.emulates``)."""

    __slots__ = ("_product", "_h", "emulated")

    def __init__(self, product: Callable, histories: tuple, emulated: bool, recipe: Recipe) -> None:
        self._product, self._h, self.emulated = product, (histories, emulated, recipe), emulated

    def _op(self, *args, **kwargs):
        return self._product(self._h, *args, **kwargs)


#: A Gemm's event's reason: which product ran (the report counts them).
EMULATED = "fp8: emulated (dequantized float32 mm)"
_WARNED_COMPILE = []


def route(frame, op, args: tuple, kwargs: dict) -> Tuple[object, Optional[str]]:
    """What runs a LOWER call in an fp8 region (Note: fp8 regions), and why: for a GEMM the fp8
    path takes, its ``Gemm`` (called on the inputs as passed); else ``op`` (on its inputs cast to
    bfloat16), with the reason where ``op`` is a GEMM (``None`` for any other op)."""
    entry = _GEMMS.get(op)
    if entry is None:
        return op, None
    shape, product = entry
    region = frame.region
    policy = region.compiled.policy
    recipe = policy.fp8
    if op in policy.bf16_gemms:
        return op, "fp8: kept in bf16 by the policy (bf16_gemms)"
    runs = _torch.HAS_SCALED_MM and _torch.scaled_mm_runs_on(region.device_type)
    emulated = emulates(recipe, region.device_type, runs)
    if not all(t.is_floating_point() and region.eligible(t) for t in args if isinstance(t, torch.Tensor)):
        why = "an input the region does not cast (float64, another device)"
    elif not emulated and not _torch.HAS_SCALED_MM:
        why = f"torch {torch.__version__} has no torch._scaled_mm"
    elif not emulated and not runs:
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
    histories = _histories(recipe, weight, str(op))
    if histories[0] is not None and _compiling(weight):
        # Note: under torch.compile the GEMM is traced on stand-ins of the weight, so no history
        # persists across steps: the compiled GEMM scales tensorwise. Said once, loudly.
        histories = (None, None, None)
        if not _WARNED_COMPILE:
            _WARNED_COMPILE.append(True)
            warnings.warn(
                "hpu_autocast: a Delayed fp8 recipe under torch.compile scales tensorwise (compiled "
                "code keeps no amax history); run Delayed eagerly, or use Tensorwise()",
                stacklevel=2,
            )
    return Gemm(product, histories, emulated, recipe), EMULATED if emulated else None


def _compiling(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is a tracer's stand-in (torch.compile's fake or functional tensors)."""
    return torch.compiler.is_compiling() or type(weight) not in (torch.Tensor, torch.nn.Parameter)

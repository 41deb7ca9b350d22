"""Helpers for the torch-cpu parity tests (``internal/test_parity_ops.py``, ``test_parity_models.py``).

``ATEN[packet]()`` returns ``{overload name: (args, kwargs)}``: small, valid float32 (or
integer) inputs for calling each overload of ``torch.ops.aten.<packet>`` directly, built from a
fixed seed so two builds are equal. The public-function level (``torch.mm``, ``F.conv2d``,
``F.cross_entropy``) uses the shared table of ``tests/_samples.py``, whose input makers and
generator these builders use too.

``run`` calls once and returns ``(result, exception type)``; ``differences`` lists where two
results differ, bit for bit and NaN-aware (structure, types, dtypes, shapes, values).
"""

from __future__ import annotations

import warnings
import zlib
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_map

from _samples import _gen, _grid as grid, idx, pos, r, spd  # one generator, one set of input makers

Call = Tuple[tuple, dict]


def prob(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_gen) * 0.9 + 0.05


def sign(*shape: int) -> torch.Tensor:
    return torch.sign(r(*shape))


def chol(n: int = 3) -> torch.Tensor:
    return torch.linalg.cholesky(spd(n))


def c(*args, **kwargs) -> Call:
    return args, kwargs


def _named(*shape: int) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Named tensors ... are an experimental feature"
        return r(*shape).refine_names(*"NC"[: len(shape)])


def unnamed(ops) -> list:
    """``ops`` (in their order) less the overloads that take a dimension by name: up to torch 2.11
    the Dimname twins (``norm.names_ScalarOpt_dim``, ``sum.dim_DimnameList``) are operators, and a
    packet names them too. (A ``Dimname`` argument reads ``str`` in the schema torch prints.)"""
    return [op for op in ops if not any(a.name == "dim" and "str" in str(a.type) for a in op._schema.arguments)]


def _if_registered(packet: str, calls: Dict[str, Callable[[], Call]]) -> Dict[str, Call]:
    """The calls whose overload this torch's CPU autocast registers: the Dimname overloads of
    prod and index_copy are registered on torch 2.9, not on 2.13 (which has no named tensors);
    _addmm_activation not on 2.4; cholesky and qr not on 2.14 (which has neither op);
    linalg_matrix_sqrth from 2.14 on."""

    def registered(overload: str) -> bool:
        name = f"aten::{packet}" if overload == "default" else f"aten::{packet}.{overload}"
        try:
            return torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCPU")
        except RuntimeError:  # no such overload in this torch
            return False

    return {o: call() for o, call in calls.items() if registered(o)}


def _one(*args, **kwargs) -> Dict[str, Call]:
    return {"default": (args, kwargs)}


def _conv(dims: int) -> Dict[str, Call]:
    x, w, b = r(1, 2, *([4] * dims)), r(3, 2, *([2] * dims)), r(3)
    return {"default": c(x, w, b), "padding": c(x, w, b, [1] * dims, "same")}


def _conv_t(dims: int, overload: str) -> Dict[str, Call]:
    return {overload: c(r(1, 2, *([3] * dims)), r(2, 3, *([2] * dims)), r(3))}


def _unpool(dims: int) -> Dict[str, Call]:
    pool = F.max_pool2d if dims == 2 else F.max_pool3d
    out, indices = pool(r(1, 1, *([4] * dims)), 2, return_indices=True)
    extra = () if dims == 2 else ([2] * 3, [0] * 3)
    return _one(out, indices, [4] * dims, *extra)


def _qr() -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.geqrf(r(4, 3))


def _lu_solve() -> Dict[str, Call]:
    lu, piv = torch.linalg.lu_factor(spd())
    return _one(r(3, 2), lu, piv)


def _ctc() -> Dict[str, Call]:
    log_probs, targets = r(6, 2, 4).log_softmax(-1), torch.tensor([[1, 2], [3, 1]])
    return {
        "IntList": c(log_probs, targets, [6, 6], [2, 2]),
        "Tensor": c(log_probs, targets, torch.tensor([6, 6]), torch.tensor([2, 2])),
    }


def _mha() -> Dict[str, Call]:
    e, h = 4, 2
    q = r(2, 3, e)
    return _one(q, q, q, e, h, r(3 * e, e), r(3 * e), r(e, e), r(e))


def _rnn_layer() -> Dict[str, Call]:
    # One oneDNN LSTM layer: (T, B, I) input, the four weights and biases, h0 and c0, then
    # reverse, batch_sizes, mode (ideep's LSTM = 2), hidden size, layers, biases, bidirectional,
    # batch_first, train.
    t, b, i, h = 3, 2, 4, 3
    return _one(
        r(t, b, i),
        r(4 * h, i),
        r(4 * h, h),
        r(4 * h),
        r(4 * h),
        r(b, h),
        r(b, h),
        False,
        [],
        2,
        h,
        1,
        True,
        False,
        False,
        True,
    )


def _fft(dims: int) -> Dict[str, Call]:
    return _one(r(*([2, 4, 4][-dims:] if dims > 1 else [8])))


def _matrix_rank() -> Dict[str, Call]:
    a = r(4, 3)
    return {
        "default": c(a, 0.1),
        "tol_tensor": c(a, torch.tensor(0.1)),
        "atol_rtol_float": c(a, atol=0.1, rtol=0.01),
        "atol_rtol_tensor": c(a, atol=torch.tensor(0.1), rtol=torch.tensor(0.01)),
    }


#: Packet name -> builder of ``{overload name: (args, kwargs)}`` for ``torch.ops.aten``.
ATEN: Dict[str, Callable[[], Dict[str, Call]]] = {
    # --- GEMMs, convolutions, attention (lower precision) -----------------------------------
    "mm": lambda: _one(r(2, 4), r(4, 3)),
    "bmm": lambda: _one(r(2, 2, 4), r(2, 4, 3)),
    "addmm": lambda: _one(r(2, 3), r(2, 4), r(4, 3), beta=0.5),
    "addbmm": lambda: _one(r(2, 3), r(2, 2, 4), r(2, 4, 3)),
    "baddbmm": lambda: _one(r(2, 2, 3), r(2, 2, 4), r(2, 4, 3)),
    # Registered for AutocastCPU from torch 2.5 on.
    "_addmm_activation": lambda: _if_registered(
        "_addmm_activation", {"default": lambda: c(r(3), r(2, 4), r(4, 3), use_gelu=True)}
    ),
    "matmul": lambda: _one(r(2, 3, 4), r(4, 2)),
    "linear": lambda: _one(r(2, 4), r(3, 4), r(3)),
    "linalg_vecdot": lambda: _one(r(3, 4), r(3, 4), dim=0),
    "conv1d": lambda: _conv(1),
    "conv2d": lambda: _conv(2),
    "conv3d": lambda: _conv(3),
    "conv_transpose1d": lambda: _conv_t(1, "default"),
    "conv_transpose2d": lambda: _conv_t(2, "input"),
    "conv_transpose3d": lambda: _conv_t(3, "input"),
    "_convolution": lambda: {
        "deprecated": c(r(1, 2, 5), r(3, 2, 3), r(3), [1], [0], [1], False, [0], 1, False, False, True)
    },
    "conv_tbc": lambda: _one(r(5, 1, 2), r(3, 2, 4), r(4), 1),
    "prelu": lambda: _one(r(2, 3, 4), pos(3)),
    "scaled_dot_product_attention": lambda: _one(r(1, 2, 3, 4), r(1, 2, 3, 4), r(1, 2, 3, 4)),
    "_native_multi_head_attention": _mha,
    "mkldnn_rnn_layer": _rnn_layer,
    # --- pooling, padding, sampling (float32) -----------------------------------------------
    "avg_pool3d": lambda: _one(r(1, 1, 4, 4, 4), [2, 2, 2]),
    "max_pool3d": lambda: _one(r(1, 1, 4, 4, 4), [2, 2, 2]),
    "adaptive_avg_pool3d": lambda: _one(r(1, 1, 4, 4, 4), [2, 2, 2]),
    "adaptive_max_pool3d": lambda: _one(r(1, 1, 4, 4, 4), [2, 2, 2]),
    "max_unpool2d": lambda: _unpool(2),
    "max_unpool3d": lambda: _unpool(3),
    "fractional_max_pool2d": lambda: _one(r(1, 1, 5, 5), [2, 2], [2, 2], torch.rand(1, 1, 2, generator=_gen)),
    "fractional_max_pool3d": lambda: _one(r(1, 1, 5, 5, 5), [2, 2, 2], [2, 2, 2], torch.rand(1, 1, 3, generator=_gen)),
    "reflection_pad1d": lambda: _one(r(1, 2, 4), [1, 1]),
    "reflection_pad2d": lambda: _one(r(1, 2, 4, 4), [1, 1, 1, 1]),
    "replication_pad1d": lambda: _one(r(1, 2, 4), [1, 1]),
    "replication_pad2d": lambda: _one(r(1, 2, 4, 4), [1, 1, 1, 1]),
    "replication_pad3d": lambda: _one(r(1, 1, 3, 3, 3), [1] * 6),
    "grid_sampler": lambda: _one(r(1, 2, 4, 4), grid(2), 0, 0, False),
    "grid_sampler_2d": lambda: _one(r(1, 2, 4, 4), grid(2), 0, 0, False),
    "_grid_sampler_2d_cpu_fallback": lambda: _one(r(1, 2, 4, 4), grid(2), 0, 0, False),
    "grid_sampler_3d": lambda: _one(r(1, 2, 3, 3, 3), grid(3), 0, 0, False),
    # --- misc math (float32) ----------------------------------------------------------------
    "polar": lambda: _one(pos(3), r(3)),
    "prod": lambda: _if_registered(
        "prod",
        {
            "default": lambda: c(r(3, 4)),
            "dim_int": lambda: c(r(3, 4), 1, True),
            "dim_Dimname": lambda: c(_named(3, 4), "C", True),
        },
    ),
    "quantile": lambda: {"default": c(r(3, 4), torch.tensor([0.3, 0.6])), "scalar": c(r(3, 4), 0.3, 1)},
    "nanquantile": lambda: {"default": c(r(3, 4), torch.tensor([0.3, 0.6])), "scalar": c(r(3, 4), 0.3, 1)},
    "stft": lambda: {
        "default": c(r(16), 8, return_complex=True),
        "center": c(r(16), 8, None, None, None, True, "reflect", False, None, True),
    },
    "cdist": lambda: _one(r(3, 4), r(2, 4)),
    "trace": lambda: _one(r(3, 3)),
    "view_as_complex": lambda: _one(r(3, 2)),
    "fake_quantize_per_tensor_affine": lambda: _one(r(3, 4), 0.1, 0, 0, 255),
    # --- linear algebra (float32) -----------------------------------------------------------
    "cholesky": lambda: _if_registered("cholesky", {"default": lambda: c(spd())}),
    "cholesky_inverse": lambda: _one(chol()),
    "cholesky_solve": lambda: _one(r(3, 2), chol()),
    "inverse": lambda: _one(spd()),
    "lu_solve": _lu_solve,
    "orgqr": lambda: _one(*_qr()),
    "ormqr": lambda: _one(*_qr(), r(4, 2)),
    "pinverse": lambda: _one(r(3, 4)),
    "geqrf": lambda: _one(r(4, 3)),
    "_lu_with_info": lambda: _one(spd()),
    "qr": lambda: _if_registered("qr", {"default": lambda: c(r(4, 3))}),
    "svd": lambda: _one(r(4, 3)),
    "triangular_solve": lambda: _one(r(3, 2), chol(), False),
    "linalg_cond": lambda: {"default": c(spd()), "p_str": c(spd(), "fro")},
    "linalg_matrix_rank": _matrix_rank,
    "linalg_solve": lambda: _one(spd(), r(3, 2)),
    "linalg_cholesky": lambda: _one(spd()),
    "linalg_cholesky_ex": lambda: _one(spd()),
    "linalg_svdvals": lambda: _one(r(4, 3)),
    "linalg_eigvals": lambda: _one(spd()),
    "linalg_eigvalsh": lambda: _one(spd()),
    "linalg_eig": lambda: _one(spd()),
    "linalg_eigh": lambda: _one(spd()),
    "linalg_inv": lambda: _one(spd()),
    "linalg_inv_ex": lambda: _one(spd()),
    "linalg_householder_product": lambda: _one(*_qr()),
    "linalg_tensorinv": lambda: _one(spd(4).reshape(4, 2, 2), 1),
    "linalg_tensorsolve": lambda: _one(spd(4).reshape(2, 2, 4), r(2, 2)),
    "linalg_qr": lambda: _one(r(4, 3)),
    "linalg_svd": lambda: _one(r(4, 3), False),
    # gelsd: the default CPU driver, gelsy, is not deterministic run to run (plain float32 too).
    "linalg_lstsq": lambda: _one(r(4, 3), r(4, 2), driver="gelsd"),
    "linalg_matrix_sqrth": lambda: _if_registered("linalg_matrix_sqrth", {"default": lambda: c(spd())}),
    # --- losses (float32) -------------------------------------------------------------------
    "binary_cross_entropy": lambda: _one(prob(3, 4), prob(3, 4)),
    "binary_cross_entropy_with_logits": lambda: _one(r(3, 4), prob(3, 4), pos(3, 4), pos(4)),
    "mse_loss": lambda: _one(r(3, 4), r(3, 4)),
    "l1_loss": lambda: _one(r(3, 4), r(3, 4)),
    "huber_loss": lambda: _one(r(3, 4), r(3, 4), 1, 0.5),
    "smooth_l1_loss": lambda: _one(r(3, 4), r(3, 4)),
    "soft_margin_loss": lambda: _one(r(3, 4), sign(3, 4)),
    "cosine_embedding_loss": lambda: _one(r(3, 4), r(3, 4), torch.tensor([1, -1, 1])),
    "hinge_embedding_loss": lambda: _one(r(3, 4), sign(3, 4)),
    "margin_ranking_loss": lambda: _one(r(4), r(4), sign(4)),
    "triplet_margin_loss": lambda: _one(r(3, 4), r(3, 4), r(3, 4)),
    "multi_margin_loss": lambda: _one(r(3, 4), idx(4, 3), weight=pos(4)),
    "multilabel_margin_loss": lambda: _one(r(3, 4), torch.tensor([[0, 1, -1, 0]] * 3)),
    "multilabel_margin_loss_forward": lambda: _one(r(3, 4), torch.tensor([[0, 1, -1, 0]] * 3), 1),
    "nll_loss": lambda: _one(r(3, 4).log_softmax(-1), idx(4, 3), pos(4)),
    "nll_loss2d": lambda: _one(r(2, 4, 3, 3).log_softmax(1), idx(4, 2, 3, 3)),
    "cross_entropy_loss": lambda: _one(r(3, 4), idx(4, 3), pos(4), label_smoothing=0.1),
    "kl_div": lambda: _one(r(3, 4).log_softmax(-1), r(3, 4).softmax(-1), 2),
    "poisson_nll_loss": lambda: _one(r(3, 4), pos(3, 4), True, False, 1e-8, 1),
    "ctc_loss": _ctc,
    # --- FFTs (float32) ---------------------------------------------------------------------
    "fft_fft": lambda: _fft(1),
    "fft_ifft": lambda: _fft(1),
    "fft_fft2": lambda: _fft(2),
    "fft_ifft2": lambda: _fft(2),
    "fft_fftn": lambda: _fft(3),
    "fft_ifftn": lambda: _fft(3),
    "fft_rfft": lambda: _fft(1),
    "fft_irfft": lambda: _fft(1),
    "fft_rfft2": lambda: _fft(2),
    "fft_irfft2": lambda: _fft(2),
    "fft_rfftn": lambda: _fft(3),
    "fft_irfftn": lambda: _fft(3),
    "fft_hfft": lambda: _fft(1),
    "fft_ihfft": lambda: _fft(1),
    # --- promote to the widest input --------------------------------------------------------
    "cat": lambda: {"default": c([r(2, 3), r(1, 3)], 0)},
    "stack": lambda: {"default": c([r(2, 3), r(2, 3)], 1)},
    "index_copy": lambda: _if_registered(
        "index_copy",
        {
            "default": lambda: c(r(4, 3), 0, torch.tensor([0, 2]), r(2, 3)),
            "dimname": lambda: c(_named(4, 3), "N", torch.tensor([0, 2]), _named(2, 3)),
        },
    ),
}


def aten_call(packet: str, overload: str) -> Call:
    """The inputs for ``torch.ops.aten.<packet>.<overload>``, from the same seed every time."""
    _gen.manual_seed(zlib.crc32(f"{packet}.{overload}".encode()))
    return ATEN[packet]()[overload]


# --- variants of the inputs ------------------------------------------------------------------


def _floating(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def as_f32(dtype: torch.dtype) -> Callable:
    return lambda t: t


def as_lower(dtype: torch.dtype) -> Callable:
    """Every floating input already in ``dtype``."""
    return lambda t: t.to(dtype) if _floating(t) else t


def as_mixed(dtype: torch.dtype) -> Callable:
    """The first floating input in ``dtype``, the others float32: promote rules matter."""
    seen = []

    def f(t):
        if _floating(t):
            seen.append(t)
            return t.to(dtype) if len(seen) == 1 else t
        return t

    return f


def as_f64(dtype: torch.dtype) -> Callable:
    """Every floating input float64: never eligible, so nothing is cast."""
    return lambda t: t.double() if _floating(t) else t


VARIANTS = {"f32": as_f32, "lower": as_lower, "mixed": as_mixed, "f64": as_f64}


# --- running and comparing ------------------------------------------------------------------


def run(fn: Callable, args: tuple, kwargs: dict) -> Tuple[object, Optional[type]]:
    """``(fn(*args, **kwargs), None)``, or ``(None, type of the exception)`` it raised."""
    torch.manual_seed(0)  # ops that draw random numbers draw the same ones in both runs
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001  (callers compare the exception type)
        return None, type(e)


def run_with_grad(fn: Callable, args: tuple, kwargs: dict, region) -> Tuple[object, Optional[type]]:
    """Call ``fn`` inside ``region`` on copies of the floating inputs that require grad, then,
    outside the region, backpropagate the sum of its floating outputs. Returns
    ``((output, input gradients), None)``, or ``(None, type of the exception)``; the output is
    ``None`` too when no output requires grad."""

    def leaf(t):
        return t.detach().clone().requires_grad_(True) if _floating(t) else t

    args, kwargs = tree_map(leaf, args), tree_map(leaf, kwargs)
    leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    torch.manual_seed(0)
    try:
        with region:
            out = fn(*args, **kwargs)
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outs:
            return None, None
        loss = sum((o.real if o.is_complex() else o).float().sum() for o in outs)
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    except Exception as e:  # noqa: BLE001  (callers compare the exception type)
        return None, type(e)
    return (out, [torch.zeros(0) if g is None else g for g in grads]), None


def _bits_equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.is_complex():
        x, y = torch.view_as_real(x.resolve_conj()), torch.view_as_real(y.resolve_conj())
    if x.is_floating_point():
        # NaN-aware: NaN in the same places, equal everywhere else.
        nx, ny = torch.isnan(x), torch.isnan(y)
        return torch.equal(nx, ny) and torch.equal(x.masked_fill(nx, 0), y.masked_fill(ny, 0))
    return torch.equal(x, y)


def differences(a: object, b: object) -> list:
    """What differs between two results, bit for bit; empty when they are the same."""
    fa, sa = tree_flatten(a)
    fb, sb = tree_flatten(b)
    if sa != sb:
        return [f"structure {sa} != {sb}"]
    out = []
    for i, (x, y) in enumerate(zip(fa, fb)):
        if type(x) is not type(y):
            out.append(f"[{i}] type {type(x).__name__} != {type(y).__name__}")
        elif isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                out.append(f"[{i}] {x.dtype}{list(x.shape)} != {y.dtype}{list(y.shape)}")
            elif not _bits_equal(x, y):
                out.append(f"[{i}] values differ: {x} != {y}")
        elif x != y:
            out.append(f"[{i}] {x!r} != {y!r}")
    return out


def dtypes(a: object) -> list:
    return [t.dtype for t in tree_flatten(a)[0] if isinstance(t, torch.Tensor)]

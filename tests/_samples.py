"""Small valid calls of the ops on the presets' lists, by the name the source documents use.

``SAMPLES[name]()`` returns ``(fn, args, kwargs)``: a public torch callable and float32 (or
integer) inputs, built from a fixed seed so two builds are equal. Tests derive their variants
(inputs in lower precision, mixed inputs) from these.
"""

from __future__ import annotations

import zlib
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F

Sample = Tuple[Callable, tuple, dict]

_gen = torch.Generator()


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen)


def pos(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_gen) + 0.5


def unit(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_gen) * 1.6 - 0.8


def spd(n: int = 3) -> torch.Tensor:
    a = r(n, n)
    return a @ a.T + n * torch.eye(n)


def idx(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=_gen)


def _s(fn: Callable, *args, **kwargs) -> Sample:
    return fn, args, kwargs


def _lu_solve() -> Sample:
    lu, piv = torch.linalg.lu_factor(spd())
    return _s(torch.lu_solve, r(3, 2), lu, piv)


def _qr_pair() -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.geqrf(r(4, 3))


def _orgqr() -> Sample:
    a, tau = _qr_pair()
    return _s(torch.orgqr, a, tau)


def _ormqr() -> Sample:
    a, tau = _qr_pair()
    return _s(torch.ormqr, a, tau, r(4, 2))


def _householder() -> Sample:
    a, tau = _qr_pair()
    return _s(torch.linalg.householder_product, a, tau)


def _unpool(dims: int) -> Sample:
    pool = F.max_pool2d if dims == 2 else F.max_pool3d
    unpool = F.max_unpool2d if dims == 2 else F.max_unpool3d
    x = r(1, 1, *([4] * dims))
    out, indices = pool(x, 2, return_indices=True)
    return _s(unpool, out, indices, 2)


def _ctc() -> Sample:
    log_probs = r(6, 2, 4).log_softmax(-1)
    targets = torch.tensor([[1, 2], [3, 1]])
    return _s(F.ctc_loss, log_probs, targets, torch.tensor([6, 6]), torch.tensor([2, 2]))


def _mha() -> Sample:
    e, h = 4, 2
    q = r(2, 3, e)
    return _s(torch._native_multi_head_attention, q, q, q, e, h, r(3 * e, e), r(3 * e), r(e, e), r(e))


def _addmm_act() -> Sample:
    return _s(torch._addmm_activation, r(3), r(2, 4), r(4, 3))


def _convolution() -> Sample:
    # The `deprecated` overload (no allow_tf32): the one torch registers for CPU autocast.
    return _s(torch._convolution, r(1, 2, 5), r(3, 2, 3), r(3), [1], [0], [1], False, [0], 1, False, False, True)


def _embedding_bag() -> Sample:
    return _s(F.embedding_bag, idx(5, 6), r(5, 3), torch.tensor([0, 3]))


def _iadd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a += b
    return a


def _grid(dims: int) -> torch.Tensor:
    return unit(1, *([3] * dims), dims)


SAMPLES: Dict[str, Callable[[], Sample]] = {
    # --- GEMMs and convolutions -------------------------------------------------------------
    "addmm": lambda: _s(torch.addmm, r(2, 3), r(2, 4), r(4, 3)),
    "addbmm": lambda: _s(torch.addbmm, r(2, 3), r(2, 2, 4), r(2, 4, 3)),
    "baddbmm": lambda: _s(torch.baddbmm, r(2, 2, 3), r(2, 2, 4), r(2, 4, 3)),
    "bmm": lambda: _s(torch.bmm, r(2, 2, 4), r(2, 4, 3)),
    "dot": lambda: _s(torch.dot, r(4), r(4)),
    "mv": lambda: _s(torch.mv, r(3, 4), r(4)),
    "mm": lambda: _s(torch.mm, r(2, 4), r(4, 3)),
    "matmul": lambda: _s(torch.matmul, r(2, 3, 4), r(4, 2)),
    "linear": lambda: _s(F.linear, r(2, 4), r(3, 4), r(3)),
    "linalg_vecdot": lambda: _s(torch.linalg.vecdot, r(3, 4), r(3, 4)),
    "_addmm_activation": _addmm_act,
    "conv1d": lambda: _s(F.conv1d, r(1, 2, 5), r(3, 2, 3), r(3)),
    "conv2d": lambda: _s(F.conv2d, r(1, 2, 5, 5), r(3, 2, 3, 3), r(3)),
    "conv3d": lambda: _s(F.conv3d, r(1, 2, 4, 4, 4), r(3, 2, 2, 2, 2), r(3)),
    "conv_transpose1d": lambda: _s(F.conv_transpose1d, r(1, 2, 5), r(2, 3, 3), r(3)),
    "conv_transpose2d": lambda: _s(F.conv_transpose2d, r(1, 2, 4, 4), r(2, 3, 3, 3), r(3)),
    "conv_transpose3d": lambda: _s(F.conv_transpose3d, r(1, 2, 3, 3, 3), r(2, 3, 2, 2, 2), r(3)),
    "_convolution": _convolution,
    "conv_tbc": lambda: _s(torch.conv_tbc, r(5, 1, 2), r(3, 2, 4), r(4), 1),
    "prelu": lambda: _s(F.prelu, r(2, 3, 4), pos(3)),
    "scaled_dot_product_attention": lambda: _s(
        F.scaled_dot_product_attention, r(1, 2, 3, 4), r(1, 2, 3, 4), r(1, 2, 3, 4)
    ),
    "_native_multi_head_attention": _mha,
    "bilinear": lambda: _s(F.bilinear, r(2, 3), r(2, 4), r(5, 3, 4), r(5)),
    # --- norms (weight and bias float32) ----------------------------------------------------
    "batch_norm": lambda: _s(F.batch_norm, r(3, 2, 4), torch.zeros(2), torch.ones(2), pos(2), r(2), training=True),
    "group_norm": lambda: _s(F.group_norm, r(2, 4, 3), 2, pos(4), r(4)),
    "instance_norm": lambda: _s(F.instance_norm, r(2, 3, 4), weight=pos(3), bias=r(3)),
    "layer_norm": lambda: _s(F.layer_norm, r(2, 4), (4,), pos(4), r(4)),
    # --- pointwise and reductions -----------------------------------------------------------
    "dropout": lambda: _s(F.dropout, r(4, 4), 0.5, True),
    "feature_dropout": lambda: _s(torch.feature_dropout, r(2, 4, 3), 0.5, True),
    "leaky_relu": lambda: _s(F.leaky_relu, r(3, 4), 0.1),
    "mean": lambda: _s(torch.mean, r(3, 4)),
    "mul": lambda: _s(torch.mul, r(3, 4), r(3, 4)),
    "softmax": lambda: _s(torch.softmax, r(3, 4), -1),
    "log_softmax": lambda: _s(torch.log_softmax, r(3, 4), -1),
    "acos": lambda: _s(torch.acos, unit(3, 4)),
    "asin": lambda: _s(torch.asin, unit(3, 4)),
    "atan2": lambda: _s(torch.atan2, r(3, 4), r(3, 4)),
    "cosh": lambda: _s(torch.cosh, r(3, 4)),
    "sinh": lambda: _s(torch.sinh, r(3, 4)),
    "tan": lambda: _s(torch.tan, unit(3, 4)),
    "erfinv": lambda: _s(torch.erfinv, unit(3, 4)),
    "exp": lambda: _s(torch.exp, r(3, 4)),
    "expm1": lambda: _s(torch.expm1, r(3, 4)),
    "log": lambda: _s(torch.log, pos(3, 4)),
    "log10": lambda: _s(torch.log10, pos(3, 4)),
    "log1p": lambda: _s(torch.log1p, pos(3, 4)),
    "log2": lambda: _s(torch.log2, pos(3, 4)),
    "pow": lambda: _s(torch.pow, pos(3, 4), r(3, 4)),
    "reciprocal": lambda: _s(torch.reciprocal, pos(3, 4)),
    "rsqrt": lambda: _s(torch.rsqrt, pos(3, 4)),
    "softplus": lambda: _s(F.softplus, r(3, 4)),
    "div": lambda: _s(torch.div, r(3, 4), pos(3, 4)),
    "divide": lambda: _s(torch.divide, r(3, 4), pos(3, 4)),
    "true_divide": lambda: _s(torch.true_divide, r(3, 4), pos(3, 4)),
    "truediv": lambda: _s(lambda a, b: a / b, r(3, 4), pos(3, 4)),
    "addcdiv": lambda: _s(torch.addcdiv, r(3, 4), r(3, 4), pos(3, 4), value=0.5),
    "addcmul": lambda: _s(torch.addcmul, r(3, 4), r(3, 4), r(3, 4), value=0.5),
    "add": lambda: _s(torch.add, r(3, 4), r(3, 4)),
    "sub": lambda: _s(torch.sub, r(3, 4), r(3, 4)),
    "iadd": lambda: _s(_iadd, r(3, 4), r(3, 4)),
    "cat": lambda: _s(torch.cat, [r(2, 3), r(1, 3)]),
    "stack": lambda: _s(torch.stack, [r(2, 3), r(2, 3)]),
    "index_copy": lambda: _s(torch.index_copy, r(4, 3), 0, torch.tensor([0, 2]), r(2, 3)),
    "logsumexp": lambda: _s(torch.logsumexp, r(3, 4), 1),
    "renorm": lambda: _s(torch.renorm, r(3, 4), 2, 0, 1.0),
    "topk": lambda: _s(torch.topk, r(3, 5), 2),
    "cdist": lambda: _s(torch.cdist, r(3, 4), r(2, 4)),
    "dist": lambda: _s(torch.dist, r(3, 4), r(3, 4)),
    "pdist": lambda: _s(F.pdist, r(4, 3)),
    "cosine_similarity": lambda: _s(F.cosine_similarity, r(3, 4), r(3, 4)),
    "embedding": lambda: _s(F.embedding, idx(5, 2, 3), r(5, 4)),
    "embedding_bag": _embedding_bag,
    "prod": lambda: _s(torch.prod, r(3, 4)),
    "quantile": lambda: _s(torch.quantile, r(3, 4), 0.3),
    "nanquantile": lambda: _s(torch.nanquantile, r(3, 4), 0.3),
    "trace": lambda: _s(torch.trace, r(3, 3)),
    "polar": lambda: _s(torch.polar, pos(3), r(3)),
    "view_as_complex": lambda: _s(torch.view_as_complex, r(3, 2)),
    "stft": lambda: _s(torch.stft, r(16), 8, return_complex=True),
    "fake_quantize_per_tensor_affine": lambda: _s(torch.fake_quantize_per_tensor_affine, r(3, 4), 0.1, 0, 0, 255),
    # --- pooling, padding, sampling ---------------------------------------------------------
    "avg_pool3d": lambda: _s(F.avg_pool3d, r(1, 1, 4, 4, 4), 2),
    "max_pool3d": lambda: _s(F.max_pool3d, r(1, 1, 4, 4, 4), 2),
    "adaptive_avg_pool3d": lambda: _s(F.adaptive_avg_pool3d, r(1, 1, 4, 4, 4), 2),
    "adaptive_max_pool3d": lambda: _s(F.adaptive_max_pool3d, r(1, 1, 4, 4, 4), 2),
    "max_unpool2d": lambda: _unpool(2),
    "max_unpool3d": lambda: _unpool(3),
    "fractional_max_pool2d": lambda: _s(
        F.fractional_max_pool2d, r(1, 1, 5, 5), 2, output_size=2, _random_samples=torch.rand(1, 1, 2, generator=_gen)
    ),
    "fractional_max_pool3d": lambda: _s(
        F.fractional_max_pool3d, r(1, 1, 5, 5, 5), 2, output_size=2, _random_samples=torch.rand(1, 1, 3, generator=_gen)
    ),
    "reflection_pad1d": lambda: _s(F.pad, r(1, 2, 4), (1, 1), mode="reflect"),
    "reflection_pad2d": lambda: _s(F.pad, r(1, 2, 4, 4), (1, 1, 1, 1), mode="reflect"),
    "replication_pad1d": lambda: _s(F.pad, r(1, 2, 4), (1, 1), mode="replicate"),
    "replication_pad2d": lambda: _s(F.pad, r(1, 2, 4, 4), (1, 1, 1, 1), mode="replicate"),
    "replication_pad3d": lambda: _s(F.pad, r(1, 1, 3, 3, 3), (1,) * 6, mode="replicate"),
    "grid_sampler": lambda: _s(torch.grid_sampler, r(1, 2, 4, 4), _grid(2), 0, 0, False),
    "grid_sampler_2d": lambda: _s(torch.grid_sampler_2d, r(1, 2, 4, 4), _grid(2), 0, 0, False),
    "_grid_sampler_2d_cpu_fallback": lambda: _s(
        torch._grid_sampler_2d_cpu_fallback, r(1, 2, 4, 4), _grid(2), 0, 0, False
    ),
    "grid_sampler_3d": lambda: _s(torch.grid_sampler_3d, r(1, 2, 3, 3, 3), _grid(3), 0, 0, False),
    # --- linear algebra ---------------------------------------------------------------------
    "cholesky": lambda: _s(torch.cholesky, spd()),
    "cholesky_inverse": lambda: _s(torch.cholesky_inverse, torch.linalg.cholesky(spd())),
    "cholesky_solve": lambda: _s(torch.cholesky_solve, r(3, 2), torch.linalg.cholesky(spd())),
    "inverse": lambda: _s(torch.inverse, spd()),
    "lu_solve": _lu_solve,
    "orgqr": _orgqr,
    "ormqr": _ormqr,
    "pinverse": lambda: _s(torch.pinverse, r(3, 4)),
    "geqrf": lambda: _s(torch.geqrf, r(4, 3)),
    "_lu_with_info": lambda: _s(torch._lu_with_info, spd()),
    "qr": lambda: _s(torch.qr, r(4, 3)),
    "svd": lambda: _s(torch.svd, r(4, 3)),
    "triangular_solve": lambda: _s(torch.triangular_solve, r(3, 2), torch.linalg.cholesky(spd())),
    "linalg_cond": lambda: _s(torch.linalg.cond, spd()),
    "linalg_matrix_rank": lambda: _s(torch.linalg.matrix_rank, r(4, 3)),
    "linalg_solve": lambda: _s(torch.linalg.solve, spd(), r(3, 2)),
    "linalg_cholesky": lambda: _s(torch.linalg.cholesky, spd()),
    "linalg_cholesky_ex": lambda: _s(torch.linalg.cholesky_ex, spd()),
    "linalg_svdvals": lambda: _s(torch.linalg.svdvals, r(4, 3)),
    "linalg_eigvals": lambda: _s(torch.linalg.eigvals, spd()),
    "linalg_eigvalsh": lambda: _s(torch.linalg.eigvalsh, spd()),
    "linalg_eig": lambda: _s(torch.linalg.eig, spd()),
    "linalg_eigh": lambda: _s(torch.linalg.eigh, spd()),
    "linalg_inv": lambda: _s(torch.linalg.inv, spd()),
    "linalg_inv_ex": lambda: _s(torch.linalg.inv_ex, spd()),
    "linalg_householder_product": _householder,
    "linalg_tensorinv": lambda: _s(torch.linalg.tensorinv, spd(4).reshape(4, 2, 2), ind=1),
    "linalg_tensorsolve": lambda: _s(torch.linalg.tensorsolve, spd(4).reshape(2, 2, 4), r(2, 2)),
    "linalg_qr": lambda: _s(torch.linalg.qr, r(4, 3)),
    "linalg_matrix_sqrth": lambda: _s(torch.linalg.matrix_sqrth, spd()),  # torch 2.14 on
    "linalg_svd": lambda: _s(torch.linalg.svd, r(4, 3)),
    "linalg_lstsq": lambda: _s(torch.linalg.lstsq, r(4, 3), r(4, 2)),
    # --- losses -----------------------------------------------------------------------------
    "binary_cross_entropy": lambda: _s(
        F.binary_cross_entropy, torch.rand(3, 4, generator=_gen) * 0.9 + 0.05, torch.rand(3, 4, generator=_gen)
    ),
    "binary_cross_entropy_with_logits": lambda: _s(
        F.binary_cross_entropy_with_logits, r(3, 4), torch.rand(3, 4, generator=_gen)
    ),
    "mse_loss": lambda: _s(F.mse_loss, r(3, 4), r(3, 4)),
    "l1_loss": lambda: _s(F.l1_loss, r(3, 4), r(3, 4)),
    "huber_loss": lambda: _s(F.huber_loss, r(3, 4), r(3, 4)),
    "smooth_l1_loss": lambda: _s(F.smooth_l1_loss, r(3, 4), r(3, 4)),
    "soft_margin_loss": lambda: _s(F.soft_margin_loss, r(3, 4), torch.sign(r(3, 4))),
    "cosine_embedding_loss": lambda: _s(F.cosine_embedding_loss, r(3, 4), r(3, 4), torch.tensor([1, -1, 1])),
    "hinge_embedding_loss": lambda: _s(F.hinge_embedding_loss, r(3, 4), torch.sign(r(3, 4))),
    "margin_ranking_loss": lambda: _s(F.margin_ranking_loss, r(4), r(4), torch.sign(r(4))),
    "triplet_margin_loss": lambda: _s(F.triplet_margin_loss, r(3, 4), r(3, 4), r(3, 4)),
    "multi_margin_loss": lambda: _s(F.multi_margin_loss, r(3, 4), idx(4, 3)),
    "multilabel_margin_loss": lambda: _s(F.multilabel_margin_loss, r(3, 4), torch.tensor([[0, 1, -1, 0]] * 3)),
    "multilabel_margin_loss_forward": lambda: _s(
        torch.ops.aten.multilabel_margin_loss_forward, r(3, 4), torch.tensor([[0, 1, -1, 0]] * 3), 1
    ),
    "nll_loss": lambda: _s(F.nll_loss, r(3, 4).log_softmax(-1), idx(4, 3)),
    "nll_loss2d": lambda: _s(F.nll_loss, r(2, 4, 3, 3).log_softmax(1), idx(4, 2, 3, 3)),
    "cross_entropy_loss": lambda: _s(F.cross_entropy, r(3, 4), idx(4, 3)),
    "kl_div": lambda: _s(F.kl_div, r(3, 4).log_softmax(-1), r(3, 4).softmax(-1), reduction="batchmean"),
    "poisson_nll_loss": lambda: _s(F.poisson_nll_loss, r(3, 4), pos(3, 4)),
    "ctc_loss": _ctc,
    # --- names of the other presets' lists ------------------------------------------------
    "__matmul__": lambda: _s(lambda a, b: a @ b, r(2, 4), r(4, 3)),
    "__pow__": lambda: _s(lambda a, b: a**b, pos(3, 4), r(3, 4)),
    "__rpow__": lambda: _s(lambda a: 2.0**a, r(3, 4)),
    "__rdiv__": lambda: _s(lambda a: 2.0 / a, pos(3, 4)),
    "__rtruediv__": lambda: _s(lambda a: 2.0 / a, pos(3, 4)),
    "addmv": lambda: _s(torch.addmv, r(3), r(3, 4), r(4)),
    "addr": lambda: _s(torch.addr, r(3, 4), r(3), r(4)),
    "chain_matmul": lambda: _s(torch.linalg.multi_dot, [r(2, 3), r(3, 4), r(4, 2)]),
    "multi_dot": lambda: _s(torch.linalg.multi_dot, [r(2, 3), r(3, 4), r(4, 2)]),
    "linalg_multi_dot": lambda: _s(torch.linalg.multi_dot, [r(2, 3), r(3, 4), r(4, 2)]),
    "convolution": lambda: _s(torch.convolution, r(1, 2, 5), r(3, 2, 3), r(3), [1], [0], [1], False, [0], 1),
    "GRUCell": lambda: _s(torch.gru_cell, r(2, 3), r(2, 4), r(12, 3), r(12, 4), r(12), r(12)),
    "gru_cell": lambda: _s(torch.gru_cell, r(2, 3), r(2, 4), r(12, 3), r(12, 4), r(12), r(12)),
    "LSTMCell": lambda: _s(torch.lstm_cell, r(2, 3), (r(2, 4), r(2, 4)), r(16, 3), r(16, 4), r(16), r(16)),
    "RNNCell": lambda: _s(torch.rnn_tanh_cell, r(2, 3), r(2, 4), r(4, 3), r(4, 4), r(4), r(4)),
    "relu": lambda: _s(torch.relu, r(3, 4)),
    "t": lambda: _s(torch.t, r(3, 4)),
    "dropout1d": lambda: _s(F.dropout1d, r(2, 3, 4), 0.5, True),
    "dropout2d": lambda: _s(F.dropout2d, r(2, 3, 4, 4), 0.5, True),
    "dropout3d": lambda: _s(F.dropout3d, r(2, 3, 2, 2, 2), 0.5, True),
    "cross_entropy": lambda: _s(F.cross_entropy, r(3, 4), idx(4, 3)),
    "nll_loss_nd": lambda: _s(F.nll_loss, r(2, 4, 3).log_softmax(1), idx(4, 2, 3)),
    "cumprod": lambda: _s(torch.cumprod, r(3, 4), 1),
    "cumsum": lambda: _s(torch.cumsum, r(3, 4), 1),
    "sum": lambda: _s(torch.sum, r(3, 4)),
    "norm": lambda: _s(torch.norm, r(3, 4)),
    "normalize": lambda: _s(F.normalize, r(3, 4)),
    "softmin": lambda: _s(F.softmin, r(3, 4), -1),
    "frobenius_norm": lambda: _s(torch.ops.aten.frobenius_norm.dim, r(3, 4), [0, 1]),
    "nuclear_norm": lambda: _s(torch.nuclear_norm, r(3, 4)),
    "cross": lambda: _s(torch.cross, r(2, 3), r(2, 3), dim=1),
    "grid_sample": lambda: _s(F.grid_sample, r(1, 2, 4, 4), _grid(2), align_corners=False),
    "index_put": lambda: _s(torch.index_put, r(4, 3), (torch.tensor([0, 2]),), r(2, 3)),
    "tensordot": lambda: _s(torch.tensordot, r(2, 3, 4), r(3, 4, 2), 2),
    "scatter_add": lambda: _s(torch.scatter_add, r(3, 4), 1, idx(4, 3, 2), r(3, 2)),
    # --- registered by torch's CUDA autocast beyond its docs ---------------------------------
    "upsample_nearest1d": lambda: _s(F.interpolate, r(1, 2, 4), scale_factor=2, mode="nearest"),
    "upsample_nearest2d": lambda: _s(F.interpolate, r(1, 2, 3, 3), scale_factor=2, mode="nearest"),
    "upsample_nearest3d": lambda: _s(F.interpolate, r(1, 1, 2, 2, 2), scale_factor=2, mode="nearest"),
    "_upsample_nearest_exact1d": lambda: _s(F.interpolate, r(1, 2, 4), scale_factor=2, mode="nearest-exact"),
    "_upsample_nearest_exact2d": lambda: _s(F.interpolate, r(1, 2, 3, 3), scale_factor=2, mode="nearest-exact"),
    "_upsample_nearest_exact3d": lambda: _s(F.interpolate, r(1, 1, 2, 2, 2), scale_factor=2, mode="nearest-exact"),
    "upsample_linear1d": lambda: _s(F.interpolate, r(1, 2, 4), scale_factor=2, mode="linear"),
    "upsample_bilinear2d": lambda: _s(F.interpolate, r(1, 2, 3, 3), scale_factor=2, mode="bilinear"),
    "upsample_bicubic2d": lambda: _s(F.interpolate, r(1, 2, 3, 3), scale_factor=2, mode="bicubic"),
    "upsample_trilinear3d": lambda: _s(F.interpolate, r(1, 1, 2, 2, 2), scale_factor=2, mode="trilinear"),
    "_upsample_bilinear2d_aa": lambda: _s(
        F.interpolate, r(1, 2, 6, 6), scale_factor=0.5, mode="bilinear", antialias=True
    ),
    "_upsample_bicubic2d_aa": lambda: _s(
        F.interpolate, r(1, 2, 6, 6), scale_factor=0.5, mode="bicubic", antialias=True
    ),
    "einsum": lambda: _s(torch.einsum, "ij,jk->ik", r(2, 3), r(3, 4)),
    "vdot": lambda: _s(torch.vdot, r(4), r(4)),
    "linalg_matrix_norm": lambda: _s(torch.linalg.matrix_norm, r(3, 4)),
    "linalg_vector_norm": lambda: _s(torch.linalg.vector_norm, r(3, 4)),
    "rms_norm": lambda: _s(F.rms_norm, r(2, 4), (4,), pos(4)),
    "native_layer_norm": lambda: _s(torch.native_layer_norm, r(2, 4), (4,), pos(4), r(4), 1e-5),
    # --- FFTs -------------------------------------------------------------------------------
    "fft_fft": lambda: _s(torch.fft.fft, r(8)),
    "fft_ifft": lambda: _s(torch.fft.ifft, r(8)),
    "fft_fft2": lambda: _s(torch.fft.fft2, r(4, 4)),
    "fft_ifft2": lambda: _s(torch.fft.ifft2, r(4, 4)),
    "fft_fftn": lambda: _s(torch.fft.fftn, r(2, 4, 4)),
    "fft_ifftn": lambda: _s(torch.fft.ifftn, r(2, 4, 4)),
    "fft_rfft": lambda: _s(torch.fft.rfft, r(8)),
    "fft_irfft": lambda: _s(torch.fft.irfft, r(8)),
    "fft_rfft2": lambda: _s(torch.fft.rfft2, r(4, 4)),
    "fft_irfft2": lambda: _s(torch.fft.irfft2, r(4, 4)),
    "fft_rfftn": lambda: _s(torch.fft.rfftn, r(2, 4, 4)),
    "fft_irfftn": lambda: _s(torch.fft.irfftn, r(2, 4, 4)),
    "fft_hfft": lambda: _s(torch.fft.hfft, r(8)),
    "fft_ihfft": lambda: _s(torch.fft.ihfft, r(8)),
}


def build(name: str) -> Sample:
    """The sample call for ``name``, from the same seed every time."""
    _gen.manual_seed(zlib.crc32(name.encode()))
    return SAMPLES[name]()

"""Intel XPU autocast, preset ``xpu``: the lists of "Auto Mixed Precision (AMP)" (``torch.xpu.amp``
documentation, section "Autocast Op Reference"; seed 002, tests/seeds/002_xpu_amp.txt), in the
document's order, one list for bfloat16 and float16 alike (it gives the same ops for both).

One correction to the text: the lower-precision list reads "conv_transpose1d, conv_transpose1d,
conv_transpose3d"; the repeated name stands for conv_transpose2d, which torch's XPU autocast
registers, so it is listed here. Names this torch lacks (``_convolution_nogroup``,
``frobenius_norm`` in newer builds) are kept in ``Policy.missing``.
"""

LOWER = [
    # convolutions
    "conv1d",
    "conv2d",
    "conv3d",
    "_convolution",
    "convolution",
    "_convolution_nogroup",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "prelu",
    # GEMMs
    "addmm",
    "addmv",
    "addr",
    "linear",
    "matmul",
    "mm",
    "mv",
    "bmm",
    "baddbmm",
    "addbmm",
    "chain_matmul",
    "linalg_multi_dot",
    # recurrent cells
    "_thnn_fused_gru_cell",
    "gru_cell",
]

FP32 = [
    # losses
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "log_softmax",
    "nll_loss",
    "nll_loss2d",
    "nll_loss_nd",
    "cross_entropy_loss",
    # FFTs
    "fft_fft",
    "fft_ifft",
    "fft_fft2",
    "fft_ifft2",
    "fft_fftn",
    "fft_ifftn",
    "fft_rfft",
    "fft_irfft",
    "fft_rfft2",
    "fft_irfft2",
    "fft_rfftn",
    "fft_irfftn",
    "fft_hfft",
    "fft_ihfft",
    # pointwise math
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow",
    "softplus",
    # norms and distances
    "group_norm",
    "frobenius_norm",
    "nuclear_norm",
    "cosine_similarity",
    # losses
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    # distances and renorm
    "dist",
    "pdist",
    "cdist",
    "renorm",
]

PROMOTE = [
    # ops with several inputs whose dtypes must match
    "cat",
    "stack",
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
]

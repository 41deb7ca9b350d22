"""PyTorch's CPU autocast, preset ``torch-cpu``: the CPU lists of PyTorch's ``torch.amp``
reference ("CPU Ops that can autocast to bfloat16", "CPU Ops that can autocast to float32", "CPU
Ops that promote to the widest input type"; seed 003, tests/seeds/003_torch_amp.txt), every name,
grouped, plus three torch registers beyond them (marked). float16 shares the lists of bfloat16.

The lists are the union over torch versions; the registry keeps, of each name, the overloads
the installed torch registers for the ``AutocastCPU`` dispatch key, so the preset is exactly
what ``torch.autocast("cpu")`` does there (a name that torch lacks, such as ``cholesky`` and
``qr`` on torch 2.14, is in ``Policy.missing``).
"""

LOWER = [
    # convolutions
    "conv1d",
    "conv2d",
    "conv3d",
    "_convolution",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    # GEMMs
    "bmm",
    "mm",
    "linalg_vecdot",
    "baddbmm",
    "addmm",
    "addbmm",
    "linear",
    "matmul",
    # recurrent and attention
    "mkldnn_rnn_layer",
    "prelu",
    "scaled_dot_product_attention",
    "_native_multi_head_attention",
    # registered by torch for AutocastCPU although the docs do not list it
    "_addmm_activation",
]

FP32 = [
    # pooling, padding, sampling
    "avg_pool3d",
    "max_pool3d",
    "max_unpool2d",
    "max_unpool3d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool3d",
    "fractional_max_pool2d",
    "fractional_max_pool3d",
    "reflection_pad1d",
    "reflection_pad2d",
    "replication_pad1d",
    "replication_pad2d",
    "replication_pad3d",
    "grid_sampler",
    "grid_sampler_2d",
    "_grid_sampler_2d_cpu_fallback",
    "grid_sampler_3d",
    # misc math
    "polar",
    "prod",
    "quantile",
    "nanquantile",
    "stft",
    "cdist",
    "trace",
    "view_as_complex",
    "fake_quantize_per_tensor_affine",
    # linear algebra
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "inverse",
    "lu_solve",
    "orgqr",
    "ormqr",
    "pinverse",
    "geqrf",
    "_lu_with_info",
    "qr",
    "svd",
    "triangular_solve",
    "linalg_cond",
    "linalg_matrix_rank",
    "linalg_solve",
    "linalg_cholesky",
    "linalg_svdvals",
    "linalg_eigvals",
    "linalg_eigvalsh",
    "linalg_inv",
    "linalg_householder_product",
    "linalg_tensorinv",
    "linalg_tensorsolve",
    "linalg_qr",
    "linalg_cholesky_ex",
    "linalg_svd",
    "linalg_eig",
    "linalg_eigh",
    "linalg_lstsq",
    "linalg_inv_ex",
    # losses
    "binary_cross_entropy",
    "mse_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "poisson_nll_loss",
    "cross_entropy_loss",
    "l1_loss",
    "huber_loss",
    "margin_ranking_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "ctc_loss",
    "kl_div",
    "multilabel_margin_loss",
    "binary_cross_entropy_with_logits",
    "multilabel_margin_loss_forward",
    # registered by torch for AutocastCPU although the docs do not list them
    "smooth_l1_loss",
    "linalg_matrix_sqrth",
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
]

PROMOTE = [
    # joins and copies
    "cat",
    "stack",
    "index_copy",
]

"""PyTorch's CUDA autocast, preset ``torch-cuda``: the CUDA lists of PyTorch's ``torch.amp``
reference ("CUDA Ops that can autocast to float16", "CUDA Ops that can autocast to float32", "CUDA
Ops that promote to the widest input type"; seed 003, tests/seeds/003_torch_amp.txt), verbatim,
with the Python-level names the docs use (``__matmul__``, ``GRUCell``) resolved by
``hpu_autocast.policies.names``. bfloat16 shares the float16 list.

The document lists every float32 op together; torch registers some of them with its other two
float32 cast policies (``FP32_SET_OPT_DTYPE``, ``FP32_APPEND_DTYPE`` below, from ATen's
``AT_FORALL_FP32_SET_OPT_DTYPE`` and ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``), and the
registry gives those names that kind instead of ``fp32``.

The registry keeps, of each name, the overloads torch registers for ``AutocastCUDA``: a
composite with no kernel there (``cross_entropy_loss``, ``conv1d.padding``) decomposes, and
native autocast casts its insides, so the region does too. Names that resolve to nothing
registered are dropped: ``__rdiv__`` is ``reciprocal(self) * other`` in torch, so plain ``div``
stays uncast as under native autocast.

``binary_cross_entropy`` is banned, as torch bans it: its backward can produce gradients that
float16 cannot hold; the error names the safe replacement.
"""

# The document's order, alphabetical, is kept (tests compare the lists with it).
LOWER = [
    # GEMMs, convolutions, recurrent cells
    "__matmul__",
    "addbmm",
    "addmm",
    "addmv",
    "addr",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "multi_dot",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "GRUCell",
    "linear",
    "LSTMCell",
    "matmul",
    "mm",
    "mv",
    "prelu",
    "RNNCell",
]

FP32 = [
    # pointwise math, reductions, norms, losses
    "__pow__",
    "__rdiv__",
    "__rpow__",
    "__rtruediv__",
    "acos",
    "asin",
    "binary_cross_entropy_with_logits",
    "cosh",
    "cosine_embedding_loss",
    "cdist",
    "cosine_similarity",
    "cross_entropy",
    "cumprod",
    "cumsum",
    "dist",
    "erfinv",
    "exp",
    "expm1",
    "group_norm",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "layer_norm",
    "log",
    "log_softmax",
    "log10",
    "log1p",
    "log2",
    "margin_ranking_loss",
    "mse_loss",
    "multilabel_margin_loss",
    "multi_margin_loss",
    "nll_loss",
    "norm",
    "normalize",
    "pdist",
    "poisson_nll_loss",
    "pow",
    "prod",
    "reciprocal",
    "rsqrt",
    "sinh",
    "smooth_l1_loss",
    "soft_margin_loss",
    "softmax",
    "softmin",
    "softplus",
    "sum",
    "renorm",
    "tan",
    "triplet_margin_loss",
]

PROMOTE = [
    # ops with several inputs whose dtypes must match
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "grid_sample",
    "index_put",
    "scatter_add",
    "tensordot",
]

#: Registered by torch for AutocastCUDA although the docs do not list them, with the category
#: native autocast gives each (probed on an H100 with torch 2.11, linalg_matrix_sqrth, registered
#: from torch 2.14 on, with torch 2.14.1 on fake CUDA tensors: tests/internal/test_drift.py checks
#: it). torch.norm and F.normalize reach linalg_vector_norm, not norm.
REGISTERED_LOWER = [
    "_convolution",
    "convolution",
    "conv_tbc",
    "cudnn_convolution",
    "cudnn_convolution_transpose",
    "einsum",
    "linalg_vecdot",
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_thnn_fused_gru_cell",
    "_thnn_fused_lstm_cell",
    "_cudnn_rnn",
]
REGISTERED_FP32 = [
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "frobenius_norm",
    "nuclear_norm",
    "huber_loss",
    "logsumexp",
    "native_layer_norm",
    "rms_norm",
    "nll_loss2d",
    "linalg_matrix_sqrth",
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "upsample_bicubic2d",
    "upsample_trilinear3d",
    "_upsample_bilinear2d_aa",
    "_upsample_bicubic2d_aa",
]
REGISTERED_PROMOTE = ["vdot"]

#: The ops of the float32 lists above that torch registers as ``fp32_set_opt_dtype``: an unset
#: ``dtype`` argument becomes float32 and the input is not cast (ATen's
#: ``AT_FORALL_FP32_SET_OPT_DTYPE``); the document's ``softmin`` names ``softmax`` (names.py).
FP32_SET_OPT_DTYPE = [
    "cumprod",
    "cumsum",
    "linalg_matrix_norm",
    "linalg_vector_norm",
    "log_softmax",
    "prod",
    "softmax",
    "softmin",
    "sum",
]
#: The ops of the float32 lists above that torch registers as ``fp32_append_dtype``: the
#: overload with a ``dtype`` argument is called instead (ATen's
#: ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``); the document's ``normalize`` names ``norm``.
FP32_APPEND_DTYPE = ["norm", "normalize"]

BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast: "
        "their backward can produce gradients that float16 cannot hold. Many models use a sigmoid "
        "layer right before the binary cross entropy layer; combine the two with "
        "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, "
        "which are safe to autocast."
    ),
}

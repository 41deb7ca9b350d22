"""PyTorch's CUDA autocast: the lists of seed 003 (``torch.amp`` docs, "CUDA Ops that can
autocast to float16", "CUDA Ops that can autocast to float32", "CUDA Ops that promote to the
widest input type"), verbatim, with the Python-level names the docs use (``__matmul__``,
``GRUCell``) resolved by ``hpu_autocast.resolve``. bfloat16 shares the float16 list.

``binary_cross_entropy`` is banned, as torch bans it: its backward can produce gradients that
float16 cannot hold; the error names the safe replacement.
"""

LOWER = [
    "__matmul__", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul", "multi_dot",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "GRUCell", "linear", "LSTMCell", "matmul", "mm", "mv", "prelu", "RNNCell",
]

FP32 = [
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin",
    "binary_cross_entropy_with_logits", "cosh", "cosine_embedding_loss", "cdist",
    "cosine_similarity", "cross_entropy", "cumprod", "cumsum", "dist", "erfinv", "exp", "expm1",
    "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "log", "log_softmax",
    "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss", "multilabel_margin_loss",
    "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist", "poisson_nll_loss", "pow", "prod",
    "reciprocal", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss", "softmax", "softmin",
    "softplus", "sum", "renorm", "tan", "triplet_margin_loss",
    # registered by torch for AutocastCUDA although the docs do not list it: torch.norm and
    # F.normalize reach it, not aten::norm
    "linalg_vector_norm",
]

PROMOTE = [
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put",
    "scatter_add", "tensordot",
]

BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast: "
        "their backward can produce gradients that float16 cannot hold. Many models use a sigmoid "
        "layer right before the binary cross entropy layer; combine the two with "
        "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, "
        "which are safe to autocast."
    ),
}

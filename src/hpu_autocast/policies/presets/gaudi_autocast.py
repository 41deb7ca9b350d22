"""Intel Gaudi (HPU) autocast, preset ``hpu``: the default lists of "Mixed Precision Training
with PyTorch Autocast" (Intel Gaudi documentation, section "Registered Operators"; seed 000,
tests/seeds/000_gaudi_autocast.txt), every name of the document, grouped.

The rules the document states (FP32 and lower lists over promote, bfloat16 only) and what
Gaudi's bridge does beyond it (the norms cast their input alone; names that are not C++
functions of functional ops, ``iadd`` and ``truediv`` here, have no effect) are the registry's
options for the preset (``presets/__init__.py``, docs/hpu.md).
"""

LOWER = [
    # GEMMs and convolutions
    "addmm",
    "addbmm",
    "baddbmm",
    "bmm",
    "dot",
    "linear",
    "matmul",
    "mm",
    "mv",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "scaled_dot_product_attention",
    # norms (input only, see INPUT_ONLY)
    "batch_norm",
    "group_norm",
    "instance_norm",
    "layer_norm",
    # pointwise and reductions
    "dropout",
    "feature_dropout",
    "leaky_relu",
    "mean",
    "mul",
    "softmax",
    "log_softmax",
]

FP32 = [
    # pointwise math
    "acos",
    "asin",
    "atan2",
    "cosh",
    "sinh",
    "tan",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log1p",
    "log2",
    "pow",
    "reciprocal",
    "rsqrt",
    "softplus",
    "div",
    "divide",
    "truediv",
    "true_divide",
    "addcdiv",
    # reductions and distances
    "logsumexp",
    "renorm",
    "topk",
    "cdist",
    "dist",
    "pdist",
    "cosine_similarity",
    "bilinear",
    # embeddings
    "embedding",
    "embedding_bag",
    # losses
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "cosine_embedding_loss",
    "cross_entropy_loss",
    "hinge_embedding_loss",
    "huber_loss",
    "kl_div",
    "l1_loss",
    "margin_ranking_loss",
    "mse_loss",
    "multi_margin_loss",
    "multilabel_margin_loss",
    "nll_loss",
    "poisson_nll_loss",
    "smooth_l1_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
]

PROMOTE = [
    # pointwise arithmetic
    "add",
    "addcmul",
    "addcdiv",
    "div",
    "exp",
    "mul",
    "pow",
    "sub",
    # Python names (no effect on Gaudi, see the docstring)
    "iadd",
    "truediv",
    # joins
    "cat",
    "stack",
]

#: Ops that cast their input alone; weight, bias and running statistics keep their dtype.
INPUT_ONLY = ["batch_norm", "group_norm", "instance_norm", "layer_norm"]

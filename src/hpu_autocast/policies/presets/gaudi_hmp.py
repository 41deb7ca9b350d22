"""Habana Mixed Precision (HMP), presets ``hmp`` and ``hmp-O2``: the default lists of "Habana
Mixed Precision" (Intel Gaudi documentation, section "Configuration Options"; seed 001,
tests/seeds/001_gaudi_hmp.txt), verbatim. Its rules (ops on no list run in their first input's
dtype, in-place ops in their first input's, bfloat16 only) are the registry's options.

The document names the promote list by example only ("e.g. add, sub, cat, stack etc."); those
four are the list here. HMP wrapped Python functions and cast every tensor argument; the norms
here cast only their input, as Gaudi's bridge does, since a CPU or CUDA norm refuses bfloat16
parameters beside float32 running statistics, which must stay float32 for their updates to land.
"""

# The document's order, alphabetical, is kept (tests compare the lists with it).
BF16 = [
    # GEMMs, convolutions, norms, dropouts, pointwise, and t
    "addmm",
    "batch_norm",
    "bmm",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "dot",
    "dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "group_norm",
    "instance_norm",
    "layer_norm",
    "leaky_relu",
    "linear",
    "matmul",
    "mm",
    "mul",
    "mv",
    "relu",
    "t",
]

FP32 = [
    # losses, division, embeddings, logarithms, softmax, topk
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "cross_entropy",
    "div",
    "divide",
    "embedding",
    "embedding_bag",
    "log",
    "log2",
    "log_softmax",
    "nll_loss",
    "smooth_l1_loss",
    "softmax",
    "topk",
    "truediv",
]

PROMOTE = [
    # the document's examples of "OPs with multiple tensor inputs"
    "add",
    "sub",
    "cat",
    "stack",
]

#: Ops that cast their input alone; weight, bias and running statistics keep their dtype.
INPUT_ONLY = ["batch_norm", "group_norm", "instance_norm", "layer_norm"]

#: HMP's opt_level="O2" (``hmp.convert(opt_level="O2")``): GEMMs and convolutions in bfloat16,
#: everything else float32; the user's list files are ignored at that level.
O2_BF16 = [
    "addmm",
    "bmm",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "dot",
    "linear",
    "matmul",
    "mm",
    "mv",
]

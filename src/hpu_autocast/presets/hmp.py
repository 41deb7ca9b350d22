"""Habana Mixed Precision (HMP): the default lists of seed 001 ("Configuration Options"),
verbatim, and its rules, which the loader applies:

* ops on neither list run in the dtype of their first floating input (the others are cast to it);
* ops with several tensor inputs (the promote list) cast to the widest input dtype, with the BF16
  and FP32 lists taking precedence;
* in-place ops cast all inputs to the dtype of the first (which they write);
* bfloat16 only.

The seed names the promote list by example only ("e.g. add, sub, cat, stack etc."); those four
are the list here. HMP wrapped Python functions and cast every tensor argument; the norms here
cast only their input, as Gaudi's bridge does, since a CPU or CUDA norm refuses bfloat16
parameters beside float32 running statistics, which must stay float32 for their updates to land.
"""

BF16 = [
    "addmm", "batch_norm", "bmm", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "dot",
    "dropout", "dropout1d", "dropout2d", "dropout3d",
    "group_norm", "instance_norm", "layer_norm", "leaky_relu", "linear", "matmul",
    "mm", "mul", "mv", "relu", "t",
]

FP32 = [
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy", "div", "divide",
    "embedding", "embedding_bag", "log", "log2", "log_softmax", "nll_loss", "smooth_l1_loss",
    "softmax", "topk", "truediv",
]

PROMOTE = ["add", "sub", "cat", "stack"]

INPUT_ONLY = ["batch_norm", "group_norm", "instance_norm", "layer_norm"]

#: HMP's opt_level="O2" (``hmp.convert(opt_level="O2")``): GEMMs and convolutions in bfloat16,
#: everything else float32; the user's list files are ignored at that level.
O2_BF16 = [
    "addmm", "bmm", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "dot", "linear", "matmul", "mm", "mv",
]

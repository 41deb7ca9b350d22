"""A small CNN for ``tune``, the second worked example of docs/tuning.md:

    python -m hpu_autocast tune examples/tune_cnn.py

Three convolutions, each after the first fed the bfloat16 output of the one before beside its
float32 weight and bias, then a global average pool and a linear head. ``tune`` counts the
convolutions' FLOPs as the precision report does (``torch.utils.flop_counter``'s), so it keeps
them in lower precision first.
"""

import torch
import torch.nn as nn


def small_cnn() -> nn.Module:
    """conv-relu x3, a global average pool, a linear head: 10 classes from 3x16x16 images."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def tune_target():
    """What ``python -m hpu_autocast tune`` tunes: ``(fn, inputs)``."""
    torch.manual_seed(0)
    model = small_cnn().eval()
    x = torch.randn(4, 3, 16, 16)

    def forward(x):
        with torch.no_grad():
            return model(x)

    return forward, (x,)


if __name__ == "__main__":
    from hpu_autocast import tune

    fn, inputs = tune_target()
    print(tune(fn, *inputs, policy="hpu", tolerance=0.01))

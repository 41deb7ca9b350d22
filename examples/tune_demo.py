"""A small attention block whose hand-written layer norm breaks in bfloat16, for ``tune``:

    python -m hpu_autocast tune examples/tune_demo.py       # the command reads tune_target()
    python examples/tune_demo.py                            # the same, from Python

The norm computes the variance as E[h^2] - E[h]^2. The residual stream carries an offset (a
learned bias of 4), so both terms are about 16 and their difference about 1: in bfloat16 (8
bits of mantissa) the difference is mostly rounding, and under Gaudi's lists (``mean`` and
``mul`` lower) the output is off by 30%. docs/tuning.md reads the result.
"""

import math

import torch
import torch.nn as nn


class TinyBlock(nn.Module):
    """Embedding plus an offset, one attention layer, a head; two hand-written norms."""

    def __init__(self, d_in: int = 16, d: int = 32, d_out: int = 4, offset: float = 4.0) -> None:
        super().__init__()
        self.d = d
        self.embed = nn.Linear(d_in, d)
        self.offset = nn.Parameter(torch.full((d,), offset))
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.head = nn.Linear(d, d_out)

    def norm(self, h: torch.Tensor) -> torch.Tensor:
        mu = h.mean(-1, keepdim=True)
        var = (h * h).mean(-1, keepdim=True) - mu * mu
        return (h - mu) * torch.rsqrt(var + 1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.offset
        q, k, v = self.qkv(self.norm(h)).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d), -1)
        h = h + self.proj(a @ v)
        return self.head(self.norm(h))


def tune_target():
    """What ``python -m hpu_autocast tune`` tunes: ``(fn, inputs)``."""
    torch.manual_seed(0)
    model = TinyBlock().eval()
    x = torch.randn(2, 8, 16)

    def forward(x):
        with torch.no_grad():
            return model(x)

    return forward, (x,)


if __name__ == "__main__":
    from hpu_autocast import tune

    fn, inputs = tune_target()
    print(tune(fn, *inputs, policy="hpu", tolerance=0.01))

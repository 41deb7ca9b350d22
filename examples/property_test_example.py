"""A user's property test of a small transformer under the ``hpu`` policy:

    for all batch sizes 1..8 and sequence lengths 1..64, every matmul ran in bfloat16, every
    loss in float32, nothing departed from the policy, and no gradient is non-finite.

Run it with pytest (``python -m pytest examples/property_test_example.py``), or as a script to
see one run's findings, then a variant with an accidental float64 layer, then the property:

    python examples/property_test_example.py
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings

import hpu_autocast
from hpu_autocast.testing import check_policy, model_inputs

MATMULS = {"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "scaled_dot_product_attention"}
LOSSES = {"cross_entropy_loss", "nll_loss", "nll_loss_nd"}


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


MODEL = TinyLM()
EXAMPLE = (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))


def train_step(ids, labels):
    MODEL.zero_grad(set_to_none=True)
    loss = MODEL(ids, labels)
    loss.backward()
    return loss


def check(ids, labels, policy="hpu"):
    """One run under the policy: its deviations, and every event the engine reported."""
    events = []
    found = check_policy(train_step, ids, labels, policy=policy, dtype=torch.bfloat16, observer=events.append)
    return found, events


@settings(max_examples=10, deadline=None)
@given(inputs=model_inputs(EXAMPLE, batch=(1, 8), seq=(1, 64)))
def test_tiny_lm_follows_hpu(inputs):
    found, events = check(*inputs)
    assert not found, found
    for e in events:
        name = e.op._opname
        if name in MATMULS and e.outcome is not hpu_autocast.events.Outcome.UNLISTED:
            assert e.compute is torch.bfloat16, e
        if name in LOSSES:
            assert e.compute is torch.float32, e
    grads = [p.grad for p in MODEL.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)


class Float64Head(nn.Module):
    """The accident: a head someone made float64 'for stability'."""

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.proj = nn.Linear(head.in_features, head.out_features).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.double()).float()


def main() -> None:
    found, events = check(*EXAMPLE)
    print(f"one run, batch 2, sequence 16: {len(events)} events")
    print(found)
    clean_head = MODEL.head
    MODEL.head = Float64Head(clean_head)
    try:
        print("\nwith a float64 head:")
        print(check(*EXAMPLE)[0])
    finally:
        MODEL.head = clean_head
    print("\nthe property, for batch sizes 1..8 and sequence lengths 1..64:")
    test_tiny_lm_follows_hpu()
    print("held for 10 examples")


if __name__ == "__main__":
    main()

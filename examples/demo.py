"""A few training steps of a small transformer classifier under HpuAutocastMode on the default
device (HPU when habana_frameworks is installed and a Gaudi is present, else CUDA, else CPU),
then the precision report: what ran in which dtype.

    python examples/demo.py [--steps N] [--policy hpu|torch-cpu|...]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpu_autocast
from hpu_autocast import HpuAutocastMode


class TinyClassifier(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.encoder = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens))
        return self.head(self.norm(h).mean(dim=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--policy", default="hpu", choices=hpu_autocast.preset_names())
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device(hpu_autocast.hpu.default_device())
    model = TinyClassifier().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 50, (16, 12), device=device)
    labels = tokens[:, 0] % 4

    recorder = hpu_autocast.Recorder(policy=args.policy, dtype=torch.bfloat16)  # the report header
    for step in range(args.steps):
        with HpuAutocastMode(torch.bfloat16, policy=args.policy, observer=recorder):
            logits = model(tokens)  # the head's linear ran in bfloat16
            loss = F.cross_entropy(logits, labels)  # a loss: float32 under every preset
        loss.backward()  # outside the region, as with torch.autocast
        hpu_autocast.hpu.mark_step()  # Gaudi lazy mode: run the graph so far (no-op elsewhere)
        optimizer.step()
        hpu_autocast.hpu.mark_step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f} (logits {_name(logits.dtype)}, loss {_name(loss.dtype)})")

    print(f"\nWhat ran in which dtype, {args.steps} steps on {device}:\n")
    print(recorder.report())


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


if __name__ == "__main__":
    main()

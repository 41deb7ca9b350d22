"""A plain training loop with ``accelerate.Accelerator`` and the forward pass under
``HpuAutocastMode``: a tiny BERT classifier (random weights, nothing downloaded) trained for a
few steps on random tokens, the loss printed per step.

    python examples/accelerate_example.py [--steps N] [--policy hpu|torch-cpu|...]

Needs the ``models`` extra: ``pip install -c constraints.txt -e ".[models]"``.
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch
from accelerate import Accelerator
from transformers import BertConfig, BertForSequenceClassification

import hpu_autocast
from hpu_autocast import HpuAutocastMode


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(
        BertConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=16,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            num_labels=3,
        )
    )


def random_batches(n: int = 16, seq: int = 16) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(0, 64, (n, seq), generator=g), torch.randint(0, 3, (n,), generator=g)
    return [{"input_ids": i, "labels": y} for i, y in zip(ids, labels)]


def train(steps: int, autocast: Callable[[], object]) -> list[float]:
    """``steps`` steps of AdamW (batch 2) with each forward under ``autocast()``; the losses."""
    # mixed_precision="no": accelerate adds no autocast of its own around the model's forward.
    accelerator = Accelerator(mixed_precision="no")
    model = tiny_bert()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(random_batches(), batch_size=2, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    losses = []
    model.train()
    for step, batch in zip(range(steps), loader):
        with autocast():
            loss = model(**batch).loss  # the forward and the model's loss in the region
        accelerator.backward(loss)  # backward outside it, as with torch.autocast
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        print(f"step {step + 1}: loss {loss.item():.4f}")
    return losses


def main(argv=None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--policy", default="hpu", choices=hpu_autocast.preset_names())
    args = parser.parse_args(argv)
    return train(args.steps, lambda: HpuAutocastMode(torch.bfloat16, policy=args.policy))


if __name__ == "__main__":
    main()

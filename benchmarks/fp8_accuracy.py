"""The accuracy table of docs/fp8.md: a few real architectures (``tests/_real_models.py``: tiny
``transformers`` configs, random weights) trained for ``STEPS`` steps on one fixed batch with
Adam, in float32, under a bfloat16 region and under an fp8 region (the ``hpu`` policy); the loss
after the last step per dtype, and the share of the fp8 run's matmul FLOPs that ran in fp8.

    PYTHONPATH=src python -m benchmarks.fp8_accuracy [--steps N] [MODEL ...]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

from hpu_autocast import HpuAutocastMode, record

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import _real_models  # noqa: E402

MODELS = ("gpt2", "bert", "llama", "t5", "vit")
STEPS = 50


def _region(dtype):
    return contextlib.nullcontext() if dtype is torch.float32 else HpuAutocastMode(dtype, policy="hpu")


def train(name: str, dtype: torch.dtype, steps: int) -> float:
    """The loss after ``steps`` Adam steps on one batch (same weights and batch for every dtype)."""
    arch = _real_models.ARCHS[name]
    torch.manual_seed(0)
    model = arch.build().train()
    inputs = arch.inputs(torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = None
    for _ in range(steps):
        with _region(dtype):
            loss = model(**inputs)["loss"]
        opt.zero_grad()
        loss.float().backward()
        opt.step()
    with torch.no_grad(), _region(dtype):
        return float(model(**inputs)["loss"])


def fp8_share(name: str) -> str:
    arch = _real_models.ARCHS[name]
    torch.manual_seed(0)
    model = arch.build()
    with record(torch.float8_e4m3fn, policy="hpu") as rec:
        model(**arch.inputs(torch.Generator().manual_seed(0)))
    by = rec.report().flops_by_dtype
    total = sum(by.values())
    return f"{by.get('f8e4m3', 0) / total:.0%}" if total else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("models", nargs="*", default=list(MODELS))
    args = parser.parse_args(argv)
    print("| model | float32 | bfloat16 | fp8 (e4m3, tensorwise) | fp8 share of matmul FLOPs |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.models:
        losses = [train(name, d, args.steps) for d in (torch.float32, torch.bfloat16, torch.float8_e4m3fn)]
        print(f"| {name} | " + " | ".join(f"{v:.4f}" for v in losses) + f" | {fp8_share(name)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

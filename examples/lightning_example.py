"""A PyTorch Lightning ``Trainer`` whose mixed precision is ``HpuAutocastPrecision``: a small
classifier trained for a few steps on random data on the CPU, the loss printed per step, then one
validation pass and the dtypes its forward ran in.

    python examples/lightning_example.py [--steps N] [--policy hpu|torch-cpu|...] [--dtype bf16|fp16]

Needs the ``lightning`` extra: ``pip install -c constraints.txt -e ".[lightning]"``.
"""

from __future__ import annotations

import argparse
import importlib
import warnings

import torch
import torch.nn.functional as F

import hpu_autocast
from hpu_autocast.integrations.lightning import LIGHTNING, HpuAutocastPrecision

# A Trainer takes the plugins of its own package only: the plugin subclasses `lightning`'s where
# that is installed, else pytorch-lightning's (LIGHTNING says which), and so does this Trainer.
pl = importlib.import_module("lightning.pytorch" if LIGHTNING == "lightning" else "pytorch_lightning")

# Lightning 2.6 builds torch.utils._pytree.LeafSpec, which torch 2.13 deprecates (a FutureWarning
# per step, about neither this script nor hpu_autocast).
warnings.filterwarnings("ignore", message=r".isinstance\(treespec, LeafSpec\). is deprecated", category=FutureWarning)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Classifier(pl.LightningModule):
    """An MLP classifier; nothing in it knows about mixed precision."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)  # in the plugin's region; backward and the step are not
        self.losses.append(loss.item())
        print(f"step {len(self.losses)}: loss {loss.item():.4f}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        print(
            f"validation: loss {F.cross_entropy(logits, y).item():.4f}, logits {logits.dtype} "
            f"(region: policy {hpu_autocast.get_policy().name}, {hpu_autocast.get_dtype()})"
        )

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def random_data(n: int = 64, seed: int = 1) -> torch.utils.data.DataLoader:
    """Random inputs labelled by which of their first 4 features is largest (learnable)."""
    x = torch.randn(n, 32, generator=torch.Generator().manual_seed(seed))
    data = torch.utils.data.TensorDataset(x, x[:, :4].argmax(dim=1))
    return torch.utils.data.DataLoader(data, batch_size=8)


def train(steps: int, policy: str = "hpu", dtype: torch.dtype = torch.bfloat16) -> list[float]:
    """``steps`` steps on the CPU with the plugin; the losses."""
    pl.seed_everything(0, verbose=False)
    model = Classifier()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        # The CPU's tensors: on a machine with a GPU, a region left to its
        # default device would cast CUDA tensors only.
        plugins=[HpuAutocastPrecision(dtype, policy=policy, device_type="cpu")],
    )
    validation = random_data(8, seed=2)
    trainer.fit(model, random_data(), validation)  # validates at each epoch's end (8 steps)
    trainer.validate(model, validation, verbose=False)
    return model.losses


def main(argv=None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--policy", default="hpu", choices=hpu_autocast.preset_names())
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = parser.parse_args(argv)
    return train(args.steps, args.policy, DTYPES[args.dtype])


if __name__ == "__main__":
    main()

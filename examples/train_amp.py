"""A training loop with loss scaling, activation checkpointing and the optimizer outside the
region (the README's example).

    python examples/train_amp.py
"""

import torch
import torch.nn.functional as F

from torch.utils.checkpoint import checkpoint

from hpu_autocast import HpuAutocastMode

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu")  # float16 needs loss scaling; bfloat16 does not
x, y = torch.randn(16, 32), torch.randn(16, 8)

losses = []
for step in range(20):
    with HpuAutocastMode(torch.float16, policy="torch-cpu"):
        h = checkpoint(model[:2], x, use_reentrant=False)  # recomputed in backward, same policy
        loss = F.mse_loss(model[2](h), y)
    opt.zero_grad()
    scaler.scale(loss).backward()  # backward outside the region
    scaler.step(opt)  # the optimizer too: float32 master weights
    scaler.update()
    losses.append(loss.item())

if __name__ == "__main__":
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, h is {h.dtype}, scale {scaler.get_scale()}")

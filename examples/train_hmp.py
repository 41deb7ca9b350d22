"""Seed 001's HMP example, moved to hpu_autocast by changing only the import line.

    python examples/train_hmp.py

On Gaudi the original line was ``from habana_frameworks.torch.hpex import hmp`` and the
device was "hpu"; here it runs on whatever device is available (CPU in CI), with sizes and a
step count small enough to run in a second.
"""

import torch

from hpu_autocast import hmp  # was: from habana_frameworks.torch.hpex import hmp
from hpu_autocast.mode import default_device_type

# The device hmp.convert's region casts for (HMP's convert names none): Gaudi's once its bridge is
# loaded, else a GPU's where there is one, else the CPU's.
DEVICE = default_device_type()

N, D_in, D_out = 16, 32, 8
torch.manual_seed(0)
x = torch.randn(N, D_in, device=DEVICE)
y = torch.randn(N, D_out, device=DEVICE)

# enable mixed precision training with default BF16 list, default FP32 list and logging disabled
hmp.convert(bf16_file_path="", fp32_file_path="", isVerbose=False)
model = torch.nn.Linear(D_in, D_out).to(torch.device(DEVICE))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

losses = []
for t in range(20):
    y_pred = model(x)
    loss = torch.nn.functional.mse_loss(y_pred, y)

    optimizer.zero_grad()
    loss.backward()

    # disable mixed precision for optimizer block
    with hmp.disable_casts():
        optimizer.step()
    losses.append(loss.item())

if __name__ == "__main__":
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} ({loss.dtype})")

"""A plain float32 training step, to be run under the report command:

    python -m hpu_autocast report examples/report_demo.py --steps 2

It does not import hpu_autocast: the command runs it under ``HpuAutocastMode`` (policy
``hpu``, bfloat16 unless told otherwise) and prints what ran in which dtype when it ends.
"""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(5, 8)
y = torch.tensor([0, 1, 2, 3, 0])

for _ in range(args.steps):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"loss {loss.item():.4f}")

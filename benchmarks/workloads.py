"""What is timed: the devices, the variants (plain, no-op mode, native autocast, ours) and the
workloads (one pass-through op, one cast op, three training steps).

Nothing here imports ``habana_frameworks`` unless the HPU device is asked for and importable.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hpu_autocast import HpuAutocastMode, hpu

from .harness import Runner

__all__ = ["Backend", "Scale", "FULL", "SMOKE", "NoOpDispatchMode", "backend_for", "resolve_device",
           "op_variants", "step_variants", "check_dtype", "MODELS", "VARIANTS"]

# Interleaving order within a round (rotated each round, see harness.interleave).
VARIANTS = ("ours", "native", "noop", "plain")


class NoOpDispatchMode(TorchDispatchMode):
    """The floor for any Python interceptor: a dispatch mode that calls every op unchanged."""

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class Backend:
    """One device: where tensors live, which native autocast and preset to compare, and how to
    wait for it (``sync``) and end a step (``end_step``, Gaudi's ``mark_step``)."""

    name: str
    device: torch.device
    autocast_type: str
    policy: str
    sync: Callable[[], None]
    end_step: Callable[[], None]
    device_name: str


def _nothing() -> None:
    pass


def resolve_device(name: str) -> str:
    """``auto``: hpu when ``habana_frameworks`` is importable, else cuda when available, else cpu."""
    if name != "auto":
        return name
    if hpu.hpu_importable():
        return "hpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def backend_for(name: str) -> Backend:
    """The ``Backend`` for ``cpu``, ``cuda`` or ``hpu``; raises if that device is not usable."""
    if name == "cpu":
        return Backend("cpu", torch.device("cpu"), "cpu", "torch-cpu", _nothing, _nothing, _cpu_model())
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch.cuda.is_available() is False")
        return Backend("cuda", torch.device("cuda"), "cuda", "torch-cuda", torch.cuda.synchronize, _nothing,
                       torch.cuda.get_device_name())
    if name == "hpu":
        if not hpu.hpu_importable():
            raise RuntimeError("--device hpu: habana_frameworks is not importable")
        import habana_frameworks.torch.core as htcore  # registers the "hpu" device

        hpu_mod = getattr(torch, "hpu", None)
        sync = getattr(hpu_mod, "synchronize", _nothing)
        get_name = getattr(hpu_mod, "get_device_name", None)
        # Gaudi's lazy mode runs the accumulated graph at mark_step; a step ends there.
        return Backend("hpu", torch.device("hpu"), "hpu", "hpu", sync, htcore.mark_step,
                       get_name() if get_name is not None else "Gaudi")
    raise ValueError(f"unknown device {name!r}; expected cpu, cuda, hpu or auto")


def _regions(backend: Backend, dtype: torch.dtype) -> Dict[str, Callable[[], ContextManager]]:
    """A fresh context manager per entry, as users write ``with ...:`` in their loop."""
    return {
        "ours": lambda: HpuAutocastMode(dtype, policy=backend.policy),
        "native": lambda: torch.autocast(backend.autocast_type, dtype=dtype),
        "noop": NoOpDispatchMode,
        "plain": contextlib.nullcontext,
    }


@dataclass(frozen=True)
class Scale:
    """Workload sizes. ``FULL`` is what the figures and targets mean; ``SMOKE`` only checks
    that the machinery runs (its numbers mean nothing)."""

    op_size: int = 32
    d_model: int = 256
    nhead: int = 8
    layers: int = 4
    seq: int = 128
    batch: int = 8
    image: int = 32
    mlp_width: int = 64
    mlp_depth: int = 24
    mlp_batch: int = 32


FULL = Scale()
SMOKE = Scale(op_size=8, d_model=16, nhead=2, layers=1, seq=8, batch=2, image=8, mlp_width=8, mlp_depth=3,
              mlp_batch=4)


# -- per-op workloads -----------------------------------------------------------------------
def op_variants(op: str, backend: Backend, dtype: torch.dtype, scale: Scale) -> Dict[str, Runner]:
    """``passthrough``: ``torch.relu``, on none of the ``torch-cpu``, ``torch-cuda`` and ``hpu``
    lists, so it runs as is; ``cast``: ``torch.mm`` of two float32 matrices (LOWER: both inputs
    cast). The region is entered once per block of ``n`` calls, so this is the per-call cost."""
    n = scale.op_size
    x = torch.randn(n, n, device=backend.device)
    y = torch.randn(n, n, device=backend.device)
    call: Callable[[], object] = (lambda: torch.relu(x)) if op == "passthrough" else (lambda: torch.mm(x, y))

    def runner(region: Callable[[], ContextManager]) -> Runner:
        def run(iters: int) -> None:
            with region():
                for _ in range(iters):
                    call()
        return run

    return {name: runner(region) for name, region in _regions(backend, dtype).items()}


# -- training-step workloads ----------------------------------------------------------------
class SmallCNN(nn.Module):
    """conv-bn-relu-pool twice, then a linear classifier over 10 classes."""

    def __init__(self, image: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * (image // 4) ** 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def _transformer(s: Scale, device: torch.device):
    layer = nn.TransformerEncoderLayer(s.d_model, s.nhead, dim_feedforward=4 * s.d_model, dropout=0.1,
                                       batch_first=True)
    model = nn.TransformerEncoder(layer, s.layers, enable_nested_tensor=False).to(device)
    x = torch.randn(s.batch, s.seq, s.d_model, device=device)
    return model, x, lambda out: out.float().pow(2).mean()


def _cnn(s: Scale, device: torch.device):
    model = SmallCNN(s.image).to(device)
    x = torch.randn(s.batch, 3, s.image, s.image, device=device)
    labels = torch.randint(0, 10, (s.batch,), device=device)
    return model, x, lambda out: F.cross_entropy(out, labels)


def _mlp(s: Scale, device: torch.device):
    layers = []
    for _ in range(s.mlp_depth):
        layers += [nn.Linear(s.mlp_width, s.mlp_width), nn.ReLU()]
    model = nn.Sequential(*layers).to(device)
    x = torch.randn(s.mlp_batch, s.mlp_width, device=device)
    return model, x, lambda out: out.float().pow(2).mean()


MODELS: Dict[str, Callable] = {"transformer": _transformer, "cnn": _cnn, "mlp": _mlp}


def step_variants(model_name: str, backend: Backend, dtype: torch.dtype, scale: Scale) -> Dict[str, Runner]:
    """One training step per iteration: forward and loss inside the region, backward outside it
    (as users write it), gradients cleared. Train mode, so the transformer's fast path is off.
    All variants share one model and one input, so they do the same arithmetic."""
    model, x, loss_fn = MODELS[model_name](scale, backend.device)
    model.train()
    params = list(model.parameters())

    def runner(region: Callable[[], ContextManager]) -> Runner:
        def run(iters: int) -> None:
            for _ in range(iters):
                with region():
                    loss = loss_fn(model(x))
                loss.backward()
                for p in params:
                    p.grad = None
                backend.end_step()
        return run

    return {name: runner(region) for name, region in _regions(backend, dtype).items()}


def check_dtype(backend: Backend, dtype: torch.dtype) -> Optional[str]:
    """Why ``dtype`` cannot be benchmarked on ``backend`` (or ``None`` when it can)."""
    if backend.name == "hpu" and dtype == torch.float16:
        return "the hpu policy and Gaudi's autocast take bfloat16 only"
    return None

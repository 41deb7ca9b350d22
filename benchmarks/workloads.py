"""What is timed: the devices, the variants (plain, native autocast, the two no-op modes, ours)
and the workloads (a pass-through op, a cast op, a tiny MLP's forward, loops on fresh inputs, a
region's entry and exit, three training steps, a compiled training step, the first region of a
fresh process).

Nothing here imports ``habana_frameworks`` unless the HPU device is asked for and importable.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Callable, ContextManager, Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import hpu_autocast
from hpu_autocast import HpuAutocastMode, hpu

from .harness import Runner

__all__ = [
    "Backend",
    "Scale",
    "FULL",
    "SMOKE",
    "NoOpFunctionMode",
    "NoOpDispatchMode",
    "backend_for",
    "resolve_device",
    "op_variants",
    "passthrough_after_hpu_variants",
    "mlp_forward_variants",
    "region_variants",
    "Fresh",
    "fresh_loop_variants",
    "FRESH_VARIANTS",
    "step_variants",
    "CompiledStep",
    "compile_backend",
    "first_region",
    "check_dtype",
    "cpu_model",
    "fast_bf16",
    "MODELS",
    "VARIANTS",
    "MAP_VARIANTS",
    "map_variants",
]

# Interleaving order within a round (rotated each round, see harness.interleave). ``ours-hpu``
# is timed for the region workload only, ``fn-mode`` and ``disp-mode`` not for compiled steps.
VARIANTS = ("ours", "ours-hpu", "native", "fn-mode", "disp-mode", "plain")


class NoOpFunctionMode(TorchFunctionMode):
    """A floor: a function mode that calls every torch function unchanged. It sees Python-level
    calls only (``torch.mm``, ``F.linear``), above autograd: the cheapest place Python can hook."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class NoOpDispatchMode(TorchDispatchMode):
    """A floor: a dispatch mode that calls every ATen op unchanged (what the engine was before it
    became dispatcher kernels: a ``TorchDispatchMode`` sees every op, listed or not)."""

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


def _cpuinfo(field: str) -> Optional[str]:
    """The first value of ``field`` in /proc/cpuinfo (``None`` where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field) and line[len(field) :].lstrip().startswith(":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; elsewhere what ``platform`` knows)."""
    name = _cpuinfo("model name")
    if name:
        return name
    import platform

    return platform.processor() or platform.machine()


#: CPU flags of bfloat16 arithmetic in hardware (AVX-512 BF16, AMX). Without them a bfloat16
#: matmul on CPU converts to float32 and back, and is no faster than float32.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")


def fast_bf16() -> Optional[List[str]]:
    """The bfloat16 flags this CPU has (an empty list: none), ``None`` where unknown."""
    flags = _cpuinfo("flags")
    if flags is None:
        return None
    have = set(flags.split())
    return [f for f in BF16_FLAGS if f in have]


def backend_for(name: str) -> Backend:
    """The ``Backend`` for ``cpu``, ``cuda`` or ``hpu``; raises if that device is not usable."""
    if name == "cpu":
        return Backend("cpu", torch.device("cpu"), "cpu", "torch-cpu", _nothing, _nothing, cpu_model())
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch.cuda.is_available() is False")
        return Backend(
            "cuda",
            torch.device("cuda"),
            "cuda",
            "torch-cuda",
            torch.cuda.synchronize,
            _nothing,
            torch.cuda.get_device_name(),
        )
    if name == "hpu":
        if not hpu.hpu_importable():
            raise RuntimeError("--device hpu: habana_frameworks is not importable")
        import habana_frameworks.torch.core as htcore  # registers the "hpu" device

        hpu_mod = getattr(torch, "hpu", None)
        sync = getattr(hpu_mod, "synchronize", _nothing)
        get_name = getattr(hpu_mod, "get_device_name", None)
        # Gaudi's lazy mode runs the accumulated graph at mark_step; a step ends there.
        return Backend(
            "hpu",
            torch.device("hpu"),
            "hpu",
            "hpu",
            sync,
            htcore.mark_step,
            get_name() if get_name is not None else "Gaudi",
        )
    raise ValueError(f"unknown device {name!r}; expected cpu, cuda, hpu or auto")


def _regions(backend: Backend, dtype: torch.dtype) -> Dict[str, Callable[[], ContextManager]]:
    """A fresh context manager per entry, as users write ``with ...:`` in their loop."""
    return {
        "ours": lambda: HpuAutocastMode(dtype, policy=backend.policy),
        "native": lambda: torch.autocast(backend.autocast_type, dtype=dtype),
        "fn-mode": NoOpFunctionMode,
        "disp-mode": NoOpDispatchMode,
        "plain": contextlib.nullcontext,
    }


@dataclass(frozen=True)
class Scale:
    """Workload sizes. ``FULL`` is what the figures and targets mean; ``SMOKE`` only checks
    that the machinery runs (its numbers mean nothing)."""

    op_size: int = 8
    fwd_width: int = 16
    fwd_depth: int = 24
    fwd_batch: int = 16
    compiled_d_model: int = 64
    compiled_nhead: int = 4
    compiled_layers: int = 2
    compiled_seq: int = 32
    compiled_batch: int = 8
    d_model: int = 256
    nhead: int = 8
    layers: int = 4
    seq: int = 128
    batch: int = 8
    image: int = 32
    mlp_width: int = 64
    mlp_depth: int = 24
    mlp_batch: int = 32
    loop_width: int = 16
    loop_depth: int = 24
    loop_batch: int = 4
    loop_mm: int = 8
    loop_mm_calls: int = 16
    fp8_width: int = 4096
    fp8_batch: int = 256
    map_width: int = 16
    map_depth: int = 12
    map_batch: int = 4
    gpt2_embd: int = 32
    gpt2_layers: int = 2
    gpt2_seq: int = 16
    gpt2_batch: int = 2


FULL = Scale()
SMOKE = Scale(
    op_size=8,
    fwd_width=8,
    fwd_depth=3,
    fwd_batch=4,
    compiled_d_model=16,
    compiled_nhead=2,
    compiled_layers=1,
    compiled_seq=8,
    compiled_batch=2,
    d_model=16,
    nhead=2,
    layers=1,
    seq=8,
    batch=2,
    image=8,
    mlp_width=8,
    mlp_depth=3,
    mlp_batch=4,
    loop_width=8,
    loop_depth=3,
    loop_batch=4,
    loop_mm=8,
    loop_mm_calls=4,
    fp8_width=32,
    fp8_batch=16,
    map_depth=3,
    gpt2_layers=1,
    gpt2_seq=8,
)
#: ``--quick``: the full figures' workloads, but the fp8 linear 1024 wide on a batch of 256 (issue 38's
#: measure of the CPU emulation; 4096 wide takes a second a step there).
QUICK = replace(FULL, fp8_width=1024, fp8_batch=256)


# -- per-op workloads -----------------------------------------------------------------------
def op_variants(op: str, backend: Backend, dtype: torch.dtype, scale: Scale) -> Dict[str, Runner]:
    """``passthrough``: ``torch.add`` of two float32 matrices, on no list of the ``torch-cpu`` and
    ``torch-cuda`` presets, so it runs as is; ``cast``: ``torch.mm`` (LOWER: both inputs cast).
    The region is entered once per block of ``n`` calls, so this is the per-call cost."""
    n = scale.op_size
    x = torch.randn(n, n, device=backend.device)
    y = torch.randn(n, n, device=backend.device)
    call: Callable[[], object] = (lambda: torch.add(x, y)) if op == "passthrough" else (lambda: torch.mm(x, y))

    def runner(region: Callable[[], ContextManager]) -> Runner:
        def run(iters: int) -> None:
            with region():
                for _ in range(iters):
                    call()

        return run

    return {name: runner(region) for name, region in _regions(backend, dtype).items()}


def mlp_forward_variants(backend: Backend, dtype: torch.dtype, scale: Scale) -> Dict[str, Runner]:
    """One forward of a tiny MLP per iteration, without grad, the region entered per forward:
    ``fwd_depth`` x (``Linear(w, w)`` + ``LayerNorm(w)`` + ``GELU``), input ``fwd_batch`` x ``w``.
    Kernels of microseconds: the toll per op decides."""
    w = scale.fwd_width
    layers: List[nn.Module] = []
    for _ in range(scale.fwd_depth):
        layers += [nn.Linear(w, w), nn.LayerNorm(w), nn.GELU()]
    model = nn.Sequential(*layers).to(backend.device).eval()
    x = torch.randn(scale.fwd_batch, w, device=backend.device)

    def runner(region: Callable[[], ContextManager]) -> Runner:
        def run(iters: int) -> None:
            with torch.no_grad():
                for _ in range(iters):
                    with region():
                        model(x)

        return run

    return {name: runner(region) for name, region in _regions(backend, dtype).items()}


def region_variants(backend: Backend, dtype: torch.dtype, scale: Scale) -> Dict[str, Runner]:
    """A region entered and exited with nothing in it, per iteration, the context manager made
    fresh each time (``with HpuAutocastMode(...): ...`` in a loop). ``ours-hpu`` is the ``hpu``
    preset, whose entry also reads the ``PT_HPU_AUTOCAST_*`` override variables."""
    regions = _regions(backend, dtype)
    regions["ours-hpu"] = lambda: HpuAutocastMode(dtype, policy="hpu", device_type=backend.device.type)

    def runner(region: Callable[[], ContextManager]) -> Runner:
        def run(iters: int) -> None:
            for _ in range(iters):
                with region():
                    pass

        return run

    return {name: runner(regions[name]) for name in VARIANTS if name in regions}


# -- loops on fresh inputs ------------------------------------------------------------------
#: The loops on fresh inputs time ours and native side by side, with no autocast for scale.
FRESH_VARIANTS = ("ours", "native", "plain")


class Fresh:
    """Tensors made before the clock starts, each handed out once: what a training loop's data
    loader gives, a new tensor every step. No input is seen twice, so no cast cache can serve a
    cast of it: a loop that takes its inputs here pays for every cast, as a real one does. A
    tensor handed out is dropped from the pool (its memory, and any cache entry of it, go
    when the step is done with it)."""

    def __init__(self, shape: tuple, count: int, device: torch.device) -> None:
        self._items: List[Optional[torch.Tensor]] = [torch.randn(*shape, device=device) for _ in range(count)]
        self._next = 0

    def take(self) -> torch.Tensor:
        if self._next == len(self._items):
            raise RuntimeError(f"benchmarks: a pool of {len(self._items)} fresh inputs ran out (sized too small)")
        t, self._items[self._next] = self._items[self._next], None
        self._next += 1
        return t


def fresh_loop_variants(name: str, backend: Backend, dtype: torch.dtype, scale: Scale, steps: int) -> Dict[str, Runner]:
    """Loops as training runs them, one region per step on inputs never seen before (``Fresh``),
    so the figure is what each step pays, casts included, with nothing cached from an earlier
    step or call. ``steps`` is how many iterations each variant will run in all (warm-up
    included): each gets a pool that large of its own.

    * ``linear``: ``loop_depth`` x ``Linear(loop_width, loop_width)`` (no activation: every op is
      a cast op), a fresh ``loop_batch`` x ``loop_width`` input per forward, under
      ``torch.no_grad()``, the region entered per forward;
    * ``linear-grad``: the same stack, forward in the region and ``backward()`` of the summed
      output after it, gradients set to ``None``: a training step without the optimizer;
    * ``mm``: ``loop_mm_calls`` calls of ``torch.mm`` of two fresh ``loop_mm`` x ``loop_mm``
      matrices per region, no input used twice (the cast op figure's loop, which reuses its two
      inputs for a thousand calls, made honest)."""
    regions = _regions(backend, dtype)
    device = backend.device
    if name == "mm":
        n, calls = scale.loop_mm, scale.loop_mm_calls

        def mm_runner(region: Callable[[], ContextManager]) -> Runner:
            pool = Fresh((n, n), 2 * calls * steps, device)

            def run(iters: int) -> None:
                for _ in range(iters):
                    with region():
                        for _ in range(calls):
                            torch.mm(pool.take(), pool.take())

            return run

        return {v: mm_runner(regions[v]) for v in FRESH_VARIANTS}
    if name not in ("linear", "linear-grad"):
        raise ValueError(f"unknown fresh-input loop {name!r}; expected linear, linear-grad or mm")
    w = scale.loop_width
    model = nn.Sequential(*[nn.Linear(w, w) for _ in range(scale.loop_depth)]).to(device)
    params = list(model.parameters())
    grad = name == "linear-grad"

    def linear_runner(region: Callable[[], ContextManager]) -> Runner:
        pool = Fresh((scale.loop_batch, w), steps, device)

        def run(iters: int) -> None:
            with torch.set_grad_enabled(grad):
                for _ in range(iters):
                    with region():
                        out = model(pool.take())
                    if grad:
                        out.float().sum().backward()
                        for p in params:
                            p.grad = None
                    backend.end_step()

        return run

    return {v: linear_runner(regions[v]) for v in FRESH_VARIANTS}


def passthrough_after_hpu_variants(backend: Backend, dtype: torch.dtype, scale: Scale) -> Dict[str, Runner]:
    """The pass-through op again (ours and native only), after a region of the ``hpu`` preset has
    run in this process. That preset lists ``add``, so its kernel is registered, and the
    registration lasts the process: from then on a ``torch-cpu`` region's ``add`` enters Python to
    be passed on. (An ``hpu`` region is entered here, so the figure does not depend on order.)"""
    with HpuAutocastMode(dtype, policy="hpu", device_type=backend.device.type):
        pass
    variants = op_variants("passthrough", backend, dtype, scale)
    return {name: variants[name] for name in ("ours", "native")}


# -- training-step workloads ----------------------------------------------------------------
class SmallCNN(nn.Module):
    """conv-bn-relu-pool twice, then a linear classifier over 10 classes."""

    def __init__(self, image: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * (image // 4) ** 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def _transformer(s: Scale, device: torch.device):
    layer = nn.TransformerEncoderLayer(s.d_model, s.nhead, dim_feedforward=4 * s.d_model, dropout=0.1, batch_first=True)
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
    return {name: _step_runner(model, x, loss_fn, backend, region) for name, region in _regions(backend, dtype).items()}


def _step_runner(
    model: nn.Module, x: torch.Tensor, loss_fn: Callable, backend: Backend, region: Callable[[], ContextManager]
) -> Runner:
    """Training steps of ``model`` on ``x``: forward and loss in ``region()``, backward outside it,
    gradients cleared (train mode, so the transformer's fast path is off)."""
    model.train()
    params = list(model.parameters())

    def run(iters: int) -> None:
        for _ in range(iters):
            with region():
                loss = loss_fn(model(x))
            loss.backward()
            for p in params:
                p.grad = None
            backend.end_step()

    return run


# -- fp8 against bf16 (issue 32) ---------------------------------------------------------------
FP8_VARIANTS = ("fp8", "bf16")


def fp8_variants(name: str, backend: Backend, scale: Scale) -> Dict[str, Runner]:
    """One training step per iteration under the ``hpu`` policy, in an fp8 region and in a
    bfloat16 one: ``linear``, a ``fp8_width``-wide ``nn.Linear`` forward and backward; ``transformer``,
    the transformer step. On a CPU the ratio is the emulation's cost (dequantized float32 GEMMs,
    docs/fp8.md: no target); on a GPU or Gaudi it is fp8's speed-up."""
    if name == "linear":
        model = nn.Linear(scale.fp8_width, scale.fp8_width).to(backend.device)
        x = torch.randn(scale.fp8_batch, scale.fp8_width, device=backend.device)
        loss_fn = lambda out: out.float().pow(2).mean()  # noqa: E731
    else:
        model, x, loss_fn = MODELS[name](scale, backend.device)

    def region(dtype: torch.dtype) -> Callable[[], ContextManager]:
        return lambda: HpuAutocastMode(dtype, policy="hpu", device_type=backend.device.type)

    return {
        "fp8": _step_runner(model, x, loss_fn, backend, region(torch.float8_e4m3fn)),
        "bf16": _step_runner(model, x, loss_fn, backend, region(torch.bfloat16)),
    }


# -- module maps: the hooks' cost (issue 37) ----------------------------------------------------
#: The module-map workloads time a region without a map (``ours``), with a map that matches one
#: module (``map-one``) and with one that matches none (``map-none``), and native autocast.
MAP_VARIANTS = ("map-one", "map-none")


class MapWorkload:
    """What ``map_variants`` returns: the runners, and how many modules one forward calls (the
    root included: each call enters the map's two hooks), to give the cost per module call."""

    def __init__(self, variants: Dict[str, Runner], module_calls: int) -> None:
        self.variants = variants
        self.module_calls = module_calls


def _count_module_calls(model: nn.Module, forward: Callable[[], object]) -> int:
    from torch.nn.modules import module as nn_module

    calls = [0]

    def count(module, args):
        calls[0] += 1

    handle = nn_module.register_module_forward_pre_hook(count)
    try:
        with torch.no_grad():
            forward()
    finally:
        handle.remove()
    return calls[0]


def map_variants(name: str, backend: Backend, dtype: torch.dtype, scale: Scale) -> Optional[MapWorkload]:
    """A region per forward (``mlp``, ``gpt2``) or per forward and ``backward()`` after it
    (``mlp-grad``, ``gpt2-grad``), under ``torch.no_grad()`` for the forward-only ones:

    * ``mlp``: ``map_depth`` x ``Linear(map_width, map_width)`` in an ``nn.Sequential``, a
      ``map_batch`` x ``map_width`` input; kernels of microseconds, so the cost per module shows;
      ``map-one`` maps the middle layer to float32;
    * ``gpt2``: a tiny Hugging Face GPT-2 (``GPT2LMHeadModel``, ``gpt2_layers`` blocks
      ``gpt2_embd`` wide, built from its config: no download), ``gpt2_batch`` x ``gpt2_seq`` token
      ids; ``map-one`` maps ``lm_head`` to float32 (``None`` without transformers).

    ``map-none``'s pattern matches no module; its unmatched-pattern warning (once per mode) is
    silenced. Every variant sees the same model and input."""
    import warnings

    base, grad = name.split("-")[0], name.endswith("-grad")
    device = backend.device
    if base == "mlp":
        w = scale.map_width
        model = nn.Sequential(*[nn.Linear(w, w) for _ in range(scale.map_depth)]).to(device)
        x = torch.randn(scale.map_batch, w, device=device)
        forward = lambda: model(x)  # noqa: E731
        one = str(scale.map_depth // 2)
    elif base == "gpt2":
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            return None
        config = GPT2Config(
            vocab_size=128,
            n_positions=scale.gpt2_seq,
            n_embd=scale.gpt2_embd,
            n_layer=scale.gpt2_layers,
            n_head=2,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = GPT2LMHeadModel(config).to(device)
        ids = torch.randint(0, 128, (scale.gpt2_batch, scale.gpt2_seq), device=device)
        forward = lambda: model(ids).logits  # noqa: E731
        one = "lm_head"
    else:
        raise ValueError(f"unknown module-map workload {name!r}; expected mlp, mlp-grad, gpt2 or gpt2-grad")
    model.train(grad)
    params = list(model.parameters())
    regions = {
        "ours": lambda: HpuAutocastMode(dtype, policy=backend.policy),
        "map-one": lambda: HpuAutocastMode(dtype, policy=backend.policy, modules={one: torch.float32}),
        "map-none": lambda: HpuAutocastMode(dtype, policy=backend.policy, modules={"no_such_module": torch.float32}),
        "native": _regions(backend, dtype)["native"],
    }

    def runner(region: Callable[[], ContextManager]) -> Runner:
        def run(iters: int) -> None:
            with warnings.catch_warnings(), torch.set_grad_enabled(grad):
                warnings.simplefilter("ignore")  # map-none's pattern matches nothing, on purpose
                for _ in range(iters):
                    with region():
                        out = forward()
                    if grad:
                        out.float().sum().backward()
                        for p in params:
                            p.grad = None
                    backend.end_step()

        return run

    return MapWorkload({v: runner(r) for v, r in regions.items()}, _count_module_calls(model, forward))


# -- a compiled training step -----------------------------------------------------------------
def compile_backend(quick: bool) -> str:
    """``inductor`` where it compiles here (it needs a C++ compiler on CPU), else ``aot_eager``;
    ``aot_eager`` for ``--quick`` and ``--smoke`` (inductor's first compilation of the step took
    over a minute of quick's 137 s on a shared 2-core CPU). Both variants compile with the same
    backend, so the ratio still says what the region adds to compiled code."""
    if quick:
        return "aot_eager"
    try:
        fn = torch.compile(lambda t: (t * 2).sin(), backend="inductor", fullgraph=True)
        fn(torch.randn(4))
    except Exception:  # no compiler, no headers, ...: whatever inductor raises
        return "aot_eager"
    finally:
        torch._dynamo.reset()
    return "inductor"


class CompiledStep:
    """A small transformer's training step, ``torch.compile``d once: the forward and loss run
    compiled under the region (ours, or native autocast), ``backward()`` outside it; no dropout,
    so both variants compute the same loss when their graphs hold the same casts."""

    def __init__(self, backend: Backend, dtype: torch.dtype, scale: Scale, compiler: str) -> None:
        s = scale
        layer = nn.TransformerEncoderLayer(
            s.compiled_d_model, s.compiled_nhead, dim_feedforward=4 * s.compiled_d_model, dropout=0.0, batch_first=True
        )
        self.model = nn.TransformerEncoder(layer, s.compiled_layers, enable_nested_tensor=False).to(backend.device)
        self.model.train()
        self.params = list(self.model.parameters())
        self.x = torch.randn(s.compiled_batch, s.compiled_seq, s.compiled_d_model, device=backend.device)
        self.compiled = torch.compile(self.model, backend=compiler)
        self.backend = backend
        regions = _regions(backend, dtype)
        self.regions = {"ours": regions["ours"], "native": regions["native"]}

    def step(self, region: Callable[[], ContextManager]) -> torch.Tensor:
        with region():
            loss = self.compiled(self.x).float().pow(2).mean()
        loss.backward()
        for p in self.params:
            p.grad = None
        self.backend.end_step()
        return loss.detach()

    def losses(self) -> Dict[str, float]:
        """One step of each variant (parameters are not updated, so they see the same model)."""
        return {name: self.step(region).item() for name, region in self.regions.items()}

    def variants(self) -> Dict[str, Runner]:
        def runner(region: Callable[[], ContextManager]) -> Runner:
            def run(iters: int) -> None:
                for _ in range(iters):
                    self.step(region)

            return run

        return {name: runner(region) for name, region in self.regions.items()}


# -- the first region of a fresh process --------------------------------------------------------
_FIRST_REGION = """
import sys, time, json
import torch
{setup}
device = torch.device({device!r})
x = torch.randn(8, 8, device=device)
y = torch.randn(8, 8, device=device)
{sync}
start = time.perf_counter()
with {region}:
    torch.mm(x, y)
{sync}
elapsed = time.perf_counter() - start
print(json.dumps({{"s": elapsed, "dynamo": "torch._dynamo" in sys.modules}}))
"""


def first_region(backend: Backend, dtype: torch.dtype, runs: int, threads: int) -> Dict[str, object]:
    """Seconds from just before the first ``with`` of a fresh process to just after its first op
    (``torch.mm``) and the exit, the median of ``runs`` processes, for ours and native autocast;
    and whether the process had imported ``torch._dynamo`` by then (it costs seconds).
    Imports come before the clock starts, so this is what the first region itself costs: building
    the policy, registering its kernels, the first call."""
    dtype_name = str(dtype).replace("torch.", "")
    sync = "torch.cuda.synchronize()" if backend.name == "cuda" else ""
    threads_line = f"torch.set_num_threads({threads})" if threads else ""
    setup = {"ours": f"{threads_line}\nfrom hpu_autocast import HpuAutocastMode", "native": threads_line}
    region = {
        "ours": f"HpuAutocastMode(torch.{dtype_name}, policy={backend.policy!r})",
        "native": f"torch.autocast({backend.autocast_type!r}, dtype=torch.{dtype_name})",
    }
    # The child imports this same hpu_autocast (a checkout, not an installed copy).
    src = os.path.dirname(os.path.dirname(os.path.abspath(hpu_autocast.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    if backend.name == "hpu":
        setup = {k: v + "\nimport habana_frameworks.torch.core" for k, v in setup.items()}
    out: Dict[str, object] = {}
    for name in ("ours", "native"):
        code = _FIRST_REGION.format(setup=setup[name], device=str(backend.device), sync=sync, region=region[name])
        results = []
        for _ in range(runs):
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(f"the first-region process failed:\n{proc.stderr[-2000:]}")
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        out[name] = {
            "s": statistics.median(r["s"] for r in results),
            "runs_s": [r["s"] for r in results],
            "dynamo_imported": any(r["dynamo"] for r in results),
        }
    return out


def check_dtype(backend: Backend, dtype: torch.dtype) -> Optional[str]:
    """Why ``dtype`` cannot be benchmarked on ``backend`` (or ``None`` when it can)."""
    if backend.name == "hpu":
        from hpu_autocast._facts.devices import check_dtype as device_allows

        try:
            device_allows(dtype, "hpu")  # float16: not on a first-generation Gaudi, as its bridge
        except ValueError as e:
            return str(e)
    return None

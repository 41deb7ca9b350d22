"""The mode on CUDA: parity with native ``torch.autocast("cuda")`` under the ``torch-cuda``
policy, a training step captured with ``torch.cuda.graph`` under the mode, and a ``trace()``
graph run on the GPU. Skipped without CUDA.

The capture follows torch's "whole network capture" recipe (docs: CUDA semantics, CUDA Graphs):
warm up on a side stream, static inputs, ``zero_grad(set_to_none=True)`` before capture, and
autocast's cache off (``cache_enabled=False``), as torch recommends for autocast in a graph.
The mode's Python runs once, at capture; a replay launches the recorded kernels only.

The real models of test_real_models.py (transformers, torchvision, timm; issue 28) take one
training step under ``torch-cuda`` against ``torch.autocast("cuda")``, bit for bit, under whichever
engine is active; native must first equal itself over two runs (cuDNN deterministic, cuBLAS's
workspace fixed), else the model skips with what differed."""

import copy
import os

import pytest
import torch
import torch.nn.functional as F

from _real_models import ARCHS, pair
from hpu_autocast import HpuAutocastMode
from hpu_autocast import cast_nodes, trace
from test_real_models import _assert_train_steps_equal, _differences, _train_step

# cuBLAS picks its reduction order by workspace; a fixed one makes a GEMM deterministic. It is read
# when cuBLAS starts, so it is set here, at collection, before any test runs a kernel.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

POLICY = "torch-cuda"


def dtypes():
    if not torch.cuda.is_available():
        return [torch.float16]
    return [torch.float16] + ([torch.bfloat16] if torch.cuda.is_bf16_supported() else [])


@pytest.fixture(autouse=True)
def deterministic():
    # Same kernels for the two runs compared (cuDNN would otherwise pick algorithms by timing).
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 8)
    ).cuda()


def batches(n):
    g = torch.Generator(device="cuda").manual_seed(1)
    return [
        (torch.randn(16, 32, device="cuda", generator=g), torch.randn(16, 8, device="cuda", generator=g))
        for _ in range(n)
    ]


def region(native, dtype, cache_enabled=True):
    if native:
        return torch.autocast("cuda", dtype=dtype, cache_enabled=cache_enabled)
    return HpuAutocastMode(dtype, policy=POLICY, cache_enabled=cache_enabled)


def assert_same(xs, ys):
    assert len(xs) == len(ys)
    for a, b in zip(xs, ys):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("dtype", dtypes())
def test_step_matches_native_autocast(dtype):
    # Forward in the region, backward outside: output, loss and every gradient, bit for bit.
    results = []
    for native in (True, False):
        model = mlp()
        ((x, target),) = batches(1)
        with region(native, dtype):
            y = model(x)
            loss = F.mse_loss(y, target)  # mse_loss is on CUDA autocast's fp32 list
        loss.backward()
        results.append([y.detach(), loss.detach()] + [p.grad for p in model.parameters()])
    assert results[1][0].dtype == dtype and results[1][1].dtype == torch.float32
    assert_same(results[1], results[0])


def step(model, opt, x, target, dtype):
    with HpuAutocastMode(dtype, policy=POLICY, cache_enabled=False):
        loss = F.mse_loss(model(x), target)
    loss.backward()
    opt.step()
    return loss


@pytest.mark.parametrize("dtype", dtypes())
def test_captured_step_replays_like_the_eager_step(dtype):
    model = mlp()
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    data = batches(4)
    static_x, static_target = (t.clone() for t in data[0])

    # Warm-up on a side stream; then put the parameters back, so both runs start equal.
    start = [p.detach().clone() for p in model.parameters()]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step(model, opt, static_x, static_target, dtype)
    torch.cuda.current_stream().wait_stream(s)
    with torch.no_grad():
        for p, p0 in zip(model.parameters(), start):
            p.copy_(p0)

    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = step(model, opt, static_x, static_target, dtype)

    for x, target in data:
        static_x.copy_(x)
        static_target.copy_(target)
        graph.replay()
        twin_opt.zero_grad(set_to_none=True)
        loss = step(twin, twin_opt, x, target, dtype)
        torch.cuda.synchronize()
        assert static_loss.dtype == loss.dtype == torch.float32
        assert torch.equal(static_loss, loss)
    assert_same([p.detach() for p in model.parameters()], [p.detach() for p in twin.parameters()])


@pytest.mark.parametrize("dtype", dtypes())
def test_trace_graph_runs_on_cuda(dtype):
    model = mlp()
    ((x, _),) = batches(1)
    gm = trace(model, x, dtype=dtype, policy=POLICY)
    assert cast_nodes(gm)
    with HpuAutocastMode(dtype, policy=POLICY):
        ref = model(x)
    y = gm(x)
    assert y.device.type == "cuda" and y.dtype == dtype == ref.dtype
    assert torch.equal(y, ref)
    compiled = torch.compile(gm, backend="aot_eager")
    assert torch.equal(compiled(x), ref)


# --- real models ---------------------------------------------------------------------------------


def _on_cuda(model: torch.nn.Module, inputs: dict):
    return model.cuda(), {k: v.cuda() for k, v in inputs.items()}


def _real_step(name: str, region):
    """One training step of a fresh ``name`` on CUDA: forward and loss in ``region``, backward outside."""
    model, _, inputs = pair(name)
    return _train_step(*_on_cuda(model, inputs), region)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(ARCHS))
def test_real_model_training_step_matches_native_cuda(name, dtype):
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    ref = _real_step(name, torch.autocast("cuda", dtype=dtype))
    again = _real_step(name, torch.autocast("cuda", dtype=dtype))
    unstable = _differences(again[0], ref[0]) + _differences(again[1], ref[1])
    if unstable:
        pytest.skip(f"native autocast differs from itself on this GPU: {unstable[0]}")
    _assert_train_steps_equal(_real_step(name, HpuAutocastMode(dtype, policy=POLICY)), ref)

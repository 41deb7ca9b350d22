"""``hpu_autocast.trace``: a function run under the mode, captured by ``make_fx`` as an FX graph
whose casts are explicit nodes. The graph runs without the mode and is compared with the eager
run under the mode, bit for bit: forward values, gradients, and a whole traced training step."""

import copy
import operator
import time

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

import hpu_autocast
from hpu_autocast import HpuAutocastMode
from hpu_autocast import cast_nodes, trace

POLICIES = ["torch-cpu", "hpu"]


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 3))


def convnet():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 3),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 3),
    )


def example(model):
    torch.manual_seed(1)
    return torch.randn(4, 6) if isinstance(model[0], torch.nn.Linear) else torch.randn(2, 3, 8, 8)


def assert_same(xs, ys):
    assert len(xs) == len(ys)
    for a, b in zip(xs, ys):
        assert a.dtype == b.dtype and torch.equal(a, b)


def step_values(run, model, x):
    """Output, then the gradients of a float32 loss, backward outside any region."""
    model.zero_grad()
    y = run(x)
    y.float().pow(2).mean().backward()
    return [y.detach()] + [p.grad.clone() for p in model.parameters()]


# -- the graph ---------------------------------------------------------------------------------


def mm_softmax(a, b):
    return torch.mm(a, b).softmax(-1)


def test_casts_are_nodes_and_mm_takes_bf16():
    gm = trace(mm_softmax, torch.randn(2, 3), torch.randn(3, 4), policy="hpu", device_type="cpu")
    casts = cast_nodes(gm)
    # hpu: mm is on the lower list (both inputs cast, the last first, as native casts them),
    # softmax is unlisted (runs in bf16 as given).
    assert [(str(n.args[0]), n.meta["val"].dtype) for n in casts] == [("b_1", torch.bfloat16), ("a_1", torch.bfloat16)]
    (mm,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert [a.meta["val"].dtype for a in mm.args] == [torch.bfloat16, torch.bfloat16]
    assert list(mm.args) == casts[::-1]


def test_code_reads_as_the_ops_that_ran():
    gm = trace(mm_softmax, torch.randn(2, 3), torch.randn(3, 4), policy="torch-cpu")
    # torch-cpu: mm is on the lower list (b cast before a, as native: make_fx of the same
    # function under torch.autocast("cpu") prints this text); softmax is on none of CPU
    # autocast's lists, so it runs in the dtype it is given.
    assert (
        gm.code.strip()
        == """\
def forward(self, a_1, b_1):
    _to_copy = torch.ops.aten._to_copy.default(b_1, dtype = torch.bfloat16);  b_1 = None
    _to_copy_1 = torch.ops.aten._to_copy.default(a_1, dtype = torch.bfloat16);  a_1 = None
    mm = torch.ops.aten.mm.default(_to_copy_1, _to_copy);  _to_copy_1 = _to_copy = None
    _softmax = torch.ops.aten._softmax.default(mm, -1, False);  mm = None
    return _softmax"""
    )


def test_module_tensors_are_named_and_shared():
    model = mlp()
    gm = trace(model, example(model), policy="torch-cpu")
    # Parameters are held by reference under torch.export-style names: optimizer steps are seen.
    assert gm.p_0_weight is model[0].weight and gm.p_3_bias is model[3].bias
    assert "p_0_weight" in gm.code and "_param_constant" not in gm.code


def test_dispatch_level_casts_are_recorded():
    # einsum is a C++ composite: its bmm is cast by the dispatch mode, below autograd.
    w = torch.randn(3, 5)
    gm = trace(lambda x: torch.einsum("ij,jk->ik", x, w), torch.randn(4, 3), policy="torch-cpu")
    (bmm,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.bmm.default]
    assert [a.meta["val"].dtype for a in bmm.args] == [torch.bfloat16, torch.bfloat16]
    x = torch.randn(4, 3)
    with HpuAutocastMode(policy="torch-cpu"):
        ref = torch.einsum("ij,jk->ik", x, w)
    assert torch.equal(gm(x), ref)


def test_graph_calls_only_aten_and_runs_without_the_mode():
    model = mlp()
    gm = trace(model, example(model), policy="hpu", device_type="cpu")
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert all(isinstance(t, torch._ops.OpOverload) or t is operator.getitem for t in targets)
    seen = []

    def check(module, args):
        seen.append(
            (hpu_autocast.is_enabled(), torch._C._len_torch_dispatch_stack(), torch._C._len_torch_function_stack())
        )

    gm.register_forward_pre_hook(check)
    gm(example(model))
    assert seen == [(False, 0, 0)]


def test_symbolic_trace_runs_at_other_shapes():
    gm = trace(mm_softmax, torch.randn(2, 3), torch.randn(3, 4), policy="torch-cpu", tracing_mode="symbolic")
    a, b = torch.randn(5, 3), torch.randn(3, 7)
    with HpuAutocastMode(policy="torch-cpu"):
        ref = mm_softmax(a, b)
    assert len(cast_nodes(gm)) == 2 and torch.equal(gm(a, b), ref)


def test_trace_inside_a_region_records_its_own_regions_casts():
    # The engine sits above the tracer wherever the region is entered, so a trace inside another
    # region records the casts of the trace's own region (the innermost), not the outer one's.
    a, b = torch.randn(2, 3), torch.randn(3, 4)
    outside = trace(mm_softmax, a, b, policy="hpu", device_type="cpu")
    with HpuAutocastMode(torch.float16, policy="torch-cpu"):
        inside = trace(mm_softmax, a, b, policy="hpu", device_type="cpu")
    with HpuAutocastMode(enabled=False):
        disabled = trace(mm_softmax, a, b, policy="hpu", device_type="cpu")
    assert outside.code == inside.code == disabled.code
    assert torch.equal(outside(a, b), inside(a, b))


# -- values: the graph without the mode == eager under the mode ----------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("make", [mlp, convnet])
def test_forward_and_gradients_match_eager_under_the_mode(make, policy):
    model = make()
    x = example(model)
    gm = trace(model, x, policy=policy, device_type="cpu")  # runs the model once (BatchNorm's statistics move)
    twin = copy.deepcopy(model)

    def eager(inp):
        with HpuAutocastMode(policy=policy, device_type="cpu"):
            return twin(inp)

    for _ in range(2):  # the second step sees the first one's running statistics
        assert_same(step_values(gm, model, x), step_values(eager, twin, x))
    assert_same(list(model.buffers()), list(twin.buffers()))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backward_in_region", [True, False])
def test_traced_training_step_matches_eager(policy, backward_in_region):
    # A whole step, backward included, traced with the parameters as inputs.
    model = mlp()
    params = {k: v.detach().requires_grad_() for k, v in model.named_parameters()}
    x, target = example(model), torch.tensor([0, 2, 1, 2])

    def step(params, x, target):
        # trace() puts all of fn in the region; a disabled region inside it runs the
        # backward plainly, as a training loop that calls backward outside the region does.
        loss = F.cross_entropy(functional_call(model, params, (x,)), target)
        with HpuAutocastMode(policy=policy, device_type="cpu", enabled=backward_in_region):
            return loss, torch.autograd.grad(loss, list(params.values()))

    gm = trace(step, params, x, target, policy=policy, device_type="cpu")
    with HpuAutocastMode(policy=policy, device_type="cpu"):
        ref_loss, ref_grads = step(params, x, target)
    loss, grads = gm(params, x, target)
    assert_same([loss, *grads], [ref_loss, *ref_grads])
    # The backward's products are in the graph, in bf16 (the forward's addmm ran in bf16), and
    # each gradient is cast back to its float32 parameter's dtype by an explicit node.
    assert {g.dtype for g in grads} == {torch.float32}
    mms = [n.meta["val"].dtype for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert mms and set(mms) == {torch.bfloat16}


# -- torch.compile of the graph --------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("policy", POLICIES)
def test_compiled_graph_matches_eager_under_the_mode(backend, policy):
    torch._dynamo.reset()
    model = mlp()
    x = example(model)
    gm = trace(model, x, policy=policy, device_type="cpu")
    twin = copy.deepcopy(model)
    compiled = torch.compile(gm, backend=backend)

    def eager(inp):
        with HpuAutocastMode(policy=policy, device_type="cpu"):
            return twin(inp)

    assert_same(step_values(compiled, model, x), step_values(eager, twin, x))


def _cpp_compiler_works():
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _cpp_compiler_works(), reason="inductor needs a C++ compiler on CPU")
def test_inductor_compiles_the_graph():
    # Inductor fuses and may round differently from eager (bf16 intermediates kept in float32
    # registers), so this compares to a tolerance and checks the dtypes the policy chose.
    torch._dynamo.reset()
    model = mlp()
    x = example(model)
    gm = trace(model, x, policy="torch-cpu")
    start = time.perf_counter()
    y = torch.compile(gm, backend="inductor")(x)
    if time.perf_counter() - start > 120:
        pytest.skip("inductor took over two minutes to compile here")
    with HpuAutocastMode(policy="torch-cpu"):
        ref = model(x)
    assert y.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(y, ref, atol=2e-2, rtol=2e-2)

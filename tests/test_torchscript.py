"""TorchScript inside a region: scripted and traced code under ``torch-cpu`` gives native
``torch.autocast("cpu")``'s values bit for bit (outputs and gradients, every call: the profiling
executor builds its optimized graph at the second or third), and under any other policy it is
refused with an error naming the function (``_torchscript``'s Note).
"""

import dataclasses
import threading
import warnings

import pytest
import torch
import torch.nn as nn

from hpu_autocast import HpuAutocastMode, disable_casts, with_lists

CALLS = 4


@pytest.fixture(autouse=True)
def _quiet_jit():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's own deprecation notices
        yield


def mixed(a, v, c):
    # What the JIT casts differently from eager autocast: mv is on the JIT's lower list only;
    # the executor rewrites addmm into mm and add; add promotes to float32 where its input's
    # dtype was not profiled. linalg_vecdot is on eager autocast's lower list only.
    return torch.mv(a, v) + torch.addmm(c, a, a)[0] + torch.linalg.vecdot(a, c)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.up = nn.ConvTranspose2d(2, 2, 3)  # conv_transpose2d: eager autocast's list only

    def forward(self, x, v, img):
        h = self.norm(torch.relu(self.lin(x)))
        return h.float().sum() + torch.mv(h, v).float().sum() + self.up(img).float().sum()


def _inputs():
    torch.manual_seed(1)
    return torch.randn(8, 8), torch.randn(8), torch.randn(8, 8)


def _net_inputs():
    torch.manual_seed(2)
    return torch.randn(8, 8, requires_grad=True), torch.randn(8), torch.randn(1, 2, 5, 5)


def _scripted(kind, fn, inputs):
    return torch.jit.script(fn) if kind == "script" else torch.jit.trace(fn, inputs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["script", "trace"])
def test_a_scripted_function_under_torch_cpu_gives_native_values_at_every_call(kind, dtype):
    inputs = _inputs()
    fn = _scripted(kind, mixed, inputs)
    for call in range(CALLS):
        with torch.autocast("cpu", dtype=dtype):
            native = fn(*inputs)
        with HpuAutocastMode(dtype, policy="torch-cpu"):
            ours = fn(*inputs)
        assert ours.dtype == native.dtype and torch.equal(ours, native), call


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_a_scripted_module_trains_as_under_native_autocast(kind):
    # Forward and backward, the region's run first: the executor's graphs are shared between
    # the two (it keys them on autocast being on), so whichever builds it, both run it.
    net, inputs = Net(), _net_inputs()
    module = _scripted(kind, net, inputs)

    def step(region):
        net.zero_grad()
        x = inputs[0].detach().requires_grad_()
        with region:
            out = module(x, *inputs[1:])
        out.backward()
        return [out.detach(), x.grad] + [p.grad.clone() for p in net.parameters()]

    for call in range(CALLS):
        ours = step(HpuAutocastMode(policy="torch-cpu"))
        native = step(torch.autocast("cpu"))
        for a, b in zip(ours, native):
            assert a.dtype == b.dtype and torch.equal(a, b), call


def mv(a, v):
    return torch.mv(a, v)


def test_scripted_code_is_cast_by_the_jits_lists_not_by_eager_autocasts():
    # mv is on the JIT's lower list and on no list of eager autocast: scripted, it runs in
    # bfloat16 under native autocast, and so in the region (which ran it in float32 before).
    a, v, _ = _inputs()
    fn = torch.jit.script(mv)
    for _ in range(CALLS):
        with torch.autocast("cpu"):
            assert fn(a, v).dtype == torch.bfloat16 and mv(a, v).dtype == torch.float32
        with HpuAutocastMode(policy="torch-cpu"):
            assert fn(a, v).dtype == torch.bfloat16 and mv(a, v).dtype == torch.float32


def test_a_nested_opt_out_runs_scripted_code_uncast_as_native_does():
    inputs = _inputs()
    fn = torch.jit.script(mixed)
    for _ in range(CALLS):
        with torch.autocast("cpu"), torch.autocast("cpu", enabled=False):
            native = fn(*inputs)
        with HpuAutocastMode(policy="torch-cpu"), torch.autocast("cpu", enabled=False):
            ours = fn(*inputs)
        assert ours.dtype == torch.float32 and torch.equal(ours, native)


def test_a_function_traced_inside_the_region_keeps_its_casts_as_one_traced_in_native_autocast():
    # torch's CPU recipe: trace inside autocast, run the traced graph (its casts baked in) outside.
    inputs = _inputs()
    jit_pass = torch._C._jit_set_autocast_mode(False)  # as the recipe says
    try:
        with torch.autocast("cpu", cache_enabled=False):
            native = torch.jit.trace(mixed, inputs, check_trace=False)
        with HpuAutocastMode(policy="torch-cpu", cache_enabled=False):
            ours = torch.jit.trace(mixed, inputs, check_trace=False)
    finally:
        torch._C._jit_set_autocast_mode(jit_pass)
    for _ in range(CALLS):
        assert torch.equal(ours(*inputs), native(*inputs))


# -- refused where no native behaviour exists ------------------------------------------------
def _refusing_regions():
    from hpu_autocast.policies.builder import get_preset

    torch_cpu = get_preset("torch-cpu")
    return {
        "hpu": lambda: HpuAutocastMode(policy="hpu"),
        "hmp": lambda: HpuAutocastMode(policy="hmp"),
        "torch-cpu changed": lambda: HpuAutocastMode(policy=with_lists(torch_cpu, fp32=["mm"], name="torch-cpu")),
        "torch-cpu on meta": lambda: HpuAutocastMode(policy="torch-cpu", device_type="meta"),
    }


@pytest.mark.parametrize("region", sorted(_refusing_regions()))
def test_other_policies_refuse_scripted_code_naming_it(region):
    inputs = _inputs()
    fn = torch.jit.script(mixed)
    module = torch.jit.script(Net())
    outside = fn(*inputs)
    with _refusing_regions()[region]():
        with pytest.raises(RuntimeError, match=r"TorchScript function 'mixed' .*disable_casts"):
            fn(*inputs)
        with pytest.raises(RuntimeError, match=r"TorchScript method 'Net.forward'"):
            module(*_net_inputs())
        with disable_casts():  # the remedy the message gives
            assert torch.equal(fn(*inputs), outside)


def test_a_policy_equal_to_torch_cpu_is_torch_cpu_and_one_renamed_is_not():
    from hpu_autocast.policies.builder import get_preset

    inputs = _inputs()
    fn = torch.jit.script(mixed)
    same = dataclasses.replace(get_preset("torch-cpu"))  # another object, the same value
    with HpuAutocastMode(policy=same):
        fn(*inputs)
    with HpuAutocastMode(policy=dataclasses.replace(same, name="mine")):
        with pytest.raises(RuntimeError, match="policy 'mine'"):
            fn(*inputs)


def test_torch_is_left_alone_outside_regions_and_in_threads_without_one():
    inputs = _inputs()
    fn = torch.jit.script(mixed)
    call, method_call = vars(torch._C.ScriptFunction)["__call__"], vars(torch._C.ScriptMethod)["__call__"]
    with HpuAutocastMode(policy="hpu"):
        pass
    # Torch's own objects are back as soon as the last region closes.
    assert vars(torch._C.ScriptFunction)["__call__"] is call
    assert vars(torch._C.ScriptMethod)["__call__"] is method_call
    outside = fn(*inputs)
    results = []
    with HpuAutocastMode(policy="hpu"):
        assert vars(torch._C.ScriptFunction)["__call__"] is not call  # replaced while a region is open
        worker = threading.Thread(target=lambda: results.append(fn(*inputs)))
        worker.start()
        worker.join()
    assert len(results) == 1 and torch.equal(results[0], outside)  # no region in that thread
    assert torch.equal(fn(*inputs), outside)
    assert vars(torch._C.ScriptFunction)["__call__"] is call
    assert vars(torch._C.ScriptMethod)["__call__"] is method_call


def test_a_torchbind_method_is_not_torchscript_and_runs_as_it_is():
    # A C++ class's method comes through ScriptMethod.__call__ too, with no graph to cast.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # quantized tensors are deprecated
        weight = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 0, torch.qint8)
        try:
            packed = torch.ops.quantized.linear_prepack(weight, None)
        except RuntimeError:
            pytest.skip("no quantized engine in this torch build")
    with HpuAutocastMode(policy="hpu"):
        unpacked, _ = packed.unpack()
    assert torch.equal(unpacked.int_repr(), weight.int_repr())

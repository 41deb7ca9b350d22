"""Engine regressions: each test failed before the fix it names."""

import dataclasses

import pytest

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hpu_autocast import CastPolicy, HpuAutocastMode, build_policy, get_preset, is_enabled


def test_multihead_attention_runs_and_trains():
    # nn.MultiheadAttention's Python body (unflatten, linear, sdpa), backward outside the region.
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 3, 8)
    with HpuAutocastMode(policy="torch-cpu"):
        out, _ = mha(x, x, x)
    out.float().sum().backward()
    # Reference: native CPU autocast on the same weights.
    ref = nn.MultiheadAttention(8, 2, batch_first=True)
    ref.load_state_dict(mha.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rout, _ = ref(x, x, x)
    rout.float().sum().backward()
    assert out.dtype == rout.dtype and torch.equal(out, rout)
    for p, q in zip(mha.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_unlisted_and_inplace_defaults_cast_to_first_input():
    # HMP's rules: unlisted ops run in the dtype of the first floating input; in-place ops too.
    policy = dataclasses.replace(get_preset("hpu"), name="first", unlisted=CastPolicy.FIRST, inplace=CastPolicy.FIRST)
    a, b = torch.randn(3), torch.randn(3).bfloat16()
    with HpuAutocastMode(policy=policy, device_type="cpu"):
        assert torch.maximum(b, a).dtype == torch.bfloat16  # first input bf16: a cast down
        assert torch.maximum(a, b).dtype == torch.float32  # first input f32: b cast up
        c = a.clone()
        c.add_(b)  # in-place: b cast to c's float32 (no-op for the result dtype)
    assert torch.equal(c, a + b.float())


def test_region_state_cleared_after_exception():
    try:
        with HpuAutocastMode():
            raise KeyError("boom")
    except KeyError:
        pass
    assert not is_enabled()
    assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float32


def test_cross_entropy_runs_wholly_in_fp32_under_hpu():
    # cross_entropy_loss is FP32 under hpu; its insides (log_softmax, LOWER) are left alone.
    x = torch.randn(4, 5, dtype=torch.bfloat16)
    t = torch.tensor([0, 1, 2, 3])
    with HpuAutocastMode(device_type="cpu"):
        loss = F.cross_entropy(x, t)
    assert loss.dtype == torch.float32
    assert torch.equal(loss, F.cross_entropy(x.float(), t))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_input_only_norm_on_cuda_casts_its_params():
    # CUDA's layer_norm/group_norm kernels need weight and bias in the input's dtype (CPU and HPU
    # accept float32 parameters); under `hpu` they failed with "expected scalar type BFloat16".
    torch.manual_seed(0)
    x = torch.randn(4, 8, device="cuda")
    ln = nn.LayerNorm(8).cuda()
    gn = nn.GroupNorm(2, 8).cuda()
    with HpuAutocastMode(device_type="cuda"):
        y, z = ln(x), gn(x.view(4, 8, 1))
    h = x.bfloat16()
    assert torch.equal(y, F.layer_norm(h, (8,), ln.weight.bfloat16(), ln.bias.bfloat16()))
    assert torch.equal(z, F.group_norm(h.view(4, 8, 1), 2, gn.weight.bfloat16(), gn.bias.bfloat16()))
    bn = nn.BatchNorm1d(8).cuda()
    with HpuAutocastMode(device_type="cuda"):
        b = bn(x)
    assert b.dtype == torch.bfloat16 and bn.running_mean.dtype == torch.float32
    assert torch.count_nonzero(bn.running_mean) > 0


def test_python_wrapper_passing_out_none_is_not_an_out_call():
    # torch.functional.tensordot calls handle_torch_function with out=None; an older engine took
    # that for an out= call, left tensordot alone, and its inner mm ran in lower precision.
    a, b = torch.randn(2, 3, 4), torch.randn(3, 4, 2)
    with HpuAutocastMode(torch.bfloat16, policy="torch-cuda", device_type="cpu"):
        out = torch.tensordot(a, b, 2)
    assert out.dtype == torch.float32 and torch.equal(out, torch.tensordot(a, b, 2))


def test_a_composite_another_policy_lists_still_decomposes_into_this_policys_ops():
    # Kernels are registered per overload for every policy a process uses. xpu lists
    # nll_loss_nd (the composite F.nll_loss calls); torch-cuda lists nll_loss, which nll_loss_nd
    # calls from C++. Under torch-cuda, passing nll_loss_nd on with the key excluded hid the
    # nll_loss inside it: bfloat16 instead of float32, only once an xpu region had run.
    x, t = torch.randn(3, 4).bfloat16(), torch.tensor([1, 1, 0])
    with HpuAutocastMode(policy="xpu", device_type="cpu"):
        F.nll_loss(x, t)
    with HpuAutocastMode(policy="torch-cuda", device_type="cpu"):
        out = F.nll_loss(x, t)
    assert out.dtype == torch.float32 and torch.equal(out, F.nll_loss(x.float(), t))


def test_a_wrapped_scalar_reaches_an_op_another_policy_lists():
    # `x / 3` calls aten.div.Tensor with a wrapped number, which a Python kernel receives as a
    # Python int; a boxed redispatch of it raised "Expected a value of type 'Tensor'".
    with HpuAutocastMode(policy="hpu"):  # lists div: registers its kernel
        pass
    x = torch.randn(3)
    with HpuAutocastMode(policy="torch-cpu"):  # does not list div
        assert torch.equal(x / 3, x / 3.0)


def test_a_parameter_made_inside_an_observing_region():
    # The observing fallback gave the tensor detached inside nn.Parameter a Python object, and
    # Parameter then refused it ("already associated to a python object of type Tensor").
    with HpuAutocastMode(record=True):
        lin = nn.Linear(4, 3)
    assert isinstance(lin.weight, nn.Parameter)


class _PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_an_observing_region_with_a_dispatch_mode_inside():
    # A Python *fallback* on the observing key failed torch's internal assert (`func != nullptr`)
    # whenever a TorchDispatchMode was active; per-op kernels do not.
    lin, x = nn.Linear(4, 3), torch.randn(2, 4)
    events = []
    with HpuAutocastMode(policy="torch-cpu", observer=events.append), _PassThrough():
        out = F.relu(lin(x))
    assert out.dtype == torch.bfloat16
    assert [e.name for e in events] == ["aten.linear.default", "aten.relu.default"]


def test_meta_and_fake_tensors_follow_native_autocast():
    # torch.autocast("cpu") casts CPU tensors only: meta tensors pass through, fake CPU tensors
    # (torch.compile's) are cast.
    from torch._subclasses.fake_tensor import FakeTensorMode

    m = torch.randn(2, 2, device="meta")
    with HpuAutocastMode(policy="torch-cpu"):
        ours = torch.mm(m, m).dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = torch.mm(m, m).dtype
    assert ours == native == torch.float32
    with FakeTensorMode():
        f = torch.randn(2, 2)
        with HpuAutocastMode(policy="torch-cpu"):
            ours = torch.mm(f, f).dtype
        with torch.autocast("cpu", dtype=torch.bfloat16):
            native = torch.mm(f, f).dtype
    assert ours == native == torch.bfloat16


def test_a_custom_op_on_a_policy_is_cast():
    # Custom ops live in their own namespace; a policy may name them like any aten op.
    torch.library.define("hpu_autocast_engine_test::scale", "(Tensor x, Tensor w) -> Tensor")

    @torch.library.impl("hpu_autocast_engine_test::scale", "CompositeExplicitAutograd")
    def _scale(x, w):
        return x * w

    policy = build_policy("custom", lower=["hpu_autocast_engine_test::scale"], device_type="cpu")
    x, w = torch.randn(3), torch.randn(3)
    with HpuAutocastMode(policy=policy):
        out = torch.ops.hpu_autocast_engine_test.scale(x, w)
    assert out.dtype == torch.bfloat16 and torch.equal(out, x.bfloat16() * w.bfloat16())

"""Engine regressions: each test failed before the fix it names."""

import dataclasses

import pytest

import torch
import torch.nn as nn
import torch.nn.functional as F

from hpu_autocast import _compat
from hpu_autocast import CastPolicy, HpuAutocastMode, get_preset
from hpu_autocast._engine import current_engine


def test_python_method_calling_its_c_base_does_not_recurse():
    # Tensor.unflatten's Python body calls TensorBase.unflatten, which reports Tensor.unflatten to
    # the function mode again; re-entering it a second time recursed without end.
    x = torch.randn(2, 6)
    with HpuAutocastMode():
        y = x.unflatten(1, (2, 3))
    assert torch.equal(y, x.unflatten(1, (2, 3)))


def test_multihead_attention_runs_and_trains():
    # nn.MultiheadAttention uses Tensor.unflatten (see above); backward outside the region.
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
        if _compat.HAS_REDISPATCH:
            assert torch.equal(p.grad, q.grad)
        else:
            # Older torch: F.multi_head_attention_forward's body is invisible to the function
            # mode, so its linear is cast after it decomposes (mm in bf16, bias add in f32) and
            # in_proj_bias's gradient is summed in f32 instead of bf16 (docs/design.md, Versions).
            torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=2e-2)


def test_dispatch_level_cast_has_backward_in_forward_dtype():
    # torch.ops.aten.mm.default is cast below autograd; the bridge makes MmBackward use the
    # bfloat16 copies, so the gradient equals the hand-cast control's.
    torch.manual_seed(0)
    a = torch.randn(4, 5, requires_grad=True)
    b = torch.randn(5, 3, requires_grad=True)
    with HpuAutocastMode():
        y = torch.ops.aten.mm.default(a, b)
    y.float().sum().backward()
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref = torch.mm(a2.to(torch.bfloat16), b2.to(torch.bfloat16))
    ref.float().sum().backward()
    assert y.dtype == torch.bfloat16 and torch.equal(y, ref)
    assert torch.equal(a.grad, a2.grad) and torch.equal(b.grad, b2.grad)
    assert not current_engine().pending


def test_unlisted_and_inplace_defaults_cast_to_first_input():
    # HMP's rules: unlisted ops run in the dtype of the first floating input; in-place ops too.
    policy = dataclasses.replace(get_preset("hpu"), name="first", unlisted=CastPolicy.FIRST,
                                 inplace=CastPolicy.FIRST)
    a, b = torch.randn(3), torch.randn(3).bfloat16()
    with HpuAutocastMode(policy=policy):
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
    engine = current_engine()
    assert engine.region is None and not engine.regions and not engine.cache
    assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float32


def test_cross_entropy_runs_wholly_in_fp32_under_hpu():
    # cross_entropy_loss is FP32 under hpu; its insides (log_softmax, LOWER) are left alone.
    x = torch.randn(4, 5, dtype=torch.bfloat16)
    t = torch.tensor([0, 1, 2, 3])
    with HpuAutocastMode():
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
    with HpuAutocastMode():
        y, z = ln(x), gn(x.view(4, 8, 1))
    h = x.bfloat16()
    assert torch.equal(y, F.layer_norm(h, (8,), ln.weight.bfloat16(), ln.bias.bfloat16()))
    assert torch.equal(z, F.group_norm(h.view(4, 8, 1), 2, gn.weight.bfloat16(), gn.bias.bfloat16()))
    bn = nn.BatchNorm1d(8).cuda()
    with HpuAutocastMode():
        b = bn(x)
    assert b.dtype == torch.bfloat16 and bn.running_mean.dtype == torch.float32
    assert torch.count_nonzero(bn.running_mean) > 0


def test_python_wrapper_passing_out_none_is_not_an_out_call():
    # torch.functional.tensordot calls handle_torch_function with out=None; the older-torch path
    # (HPU_AUTOCAST_NO_REDISPATCH=1) took that for an out= call, left tensordot alone, and its
    # inner mm ran in lower precision.
    policy = get_preset("torch-cuda")
    a, b = torch.randn(2, 3, 4), torch.randn(3, 4, 2)
    with HpuAutocastMode(torch.bfloat16, policy=policy):
        out = torch.tensordot(a, b, 2)
    assert out.dtype == torch.float32 and torch.equal(out, torch.tensordot(a, b, 2))


def test_dtype_taking_overloads_do_not_make_a_call_resolve_its_overload(monkeypatch):
    # aten::mm.dtype (torch 2.13) takes out_dtype: a call of it has an explicit dtype and is never
    # eligible, so torch-cpu, which lists mm.default only, can treat torch.mm as one rule.
    from hpu_autocast import _ops

    assert _ops.requires_dtype(torch.ops.aten.mm.dtype) if hasattr(torch.ops.aten.mm, "dtype") else True
    assert not _ops.requires_dtype(torch.ops.aten.sum.default)  # dtype=None is optional
    calls = []
    real = torch._C._jit_resolve_packet
    monkeypatch.setattr(torch._C, "_jit_resolve_packet", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    a, b = torch.randn(2, 3), torch.randn(3, 4)
    with HpuAutocastMode(policy="torch-cpu"):
        out = torch.mm(a, b)
    assert out.dtype == torch.bfloat16 and torch.equal(out, torch.mm(a.bfloat16(), b.bfloat16()))
    assert "aten::mm" not in calls

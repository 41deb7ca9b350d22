"""FP8 regions (issue 32): ``HpuAutocastMode(torch.float8_e4m3fn)`` runs the policy's GEMMs as
scaled e4m3 products into bfloat16, the rest of the lower list in bfloat16; the backward's GEMMs
with the gradient in e5m2; scaling recipes as part of the policy. Oracles: float32 runs, bf16
autocast runs, and a hand-quantized ``torch._scaled_mm`` control."""

import copy
import dataclasses
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

from hpu_autocast import HpuAutocastMode, build_policy, get_preset, record
from hpu_autocast.policies.recipes import Delayed, Rowwise, Tensorwise
from hpu_autocast.policies.policy import CastPolicy
from hpu_autocast import _torch
from hpu_autocast._engine import fp8 as _fp8


@pytest.fixture(autouse=True)
def without_a_gpu(monkeypatch):
    # These tests run fp8 regions on CPU tensors; their regions, tune and the strategies follow the
    # machine's device (a GPU's where there is one, or under --as-if-cuda), so they run as on a
    # machine without a GPU.
    from hpu_autocast._facts import devices as _devices

    monkeypatch.setattr(_devices, "_cuda", False)


FP8 = torch.float8_e4m3fn
pytestmark = pytest.mark.skipif(
    not _torch.scaled_mm_runs_on("cpu"), reason=f"torch {torch.__version__} has no torch._scaled_mm for CPU tensors"
)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _events(fn, dtype=FP8, **kw):
    seen = []
    with HpuAutocastMode(dtype, observer=seen.append, **kw):
        out = fn()
    return out, seen


def _hand(x, dtype):
    """The control: per-tensor scale from the amax (divided in float64, as torchao), saturated,
    cast; the inverse scale (``_scaled_mm``'s)."""
    big = torch.finfo(dtype).max
    scale = (big / x.abs().max().double()).float()
    return (x.float() * scale).clamp(-big, big).to(dtype), scale.reciprocal()


#: The hpu policy asking for the real torch._scaled_mm on CPU (the default there emulates it).
SCALED_MM = dataclasses.replace(get_preset("hpu"), name="hpu-scaled-mm", fp8=Tensorwise(emulate=False))


# -- 1. forward ---------------------------------------------------------------------------------
def test_linear_returns_bf16_with_an_error_between_bf16s_and_ten_percent():
    torch.manual_seed(0)
    x, lin = torch.randn(32, 64), torch.nn.Linear(64, 48)
    ref = lin(x)
    with HpuAutocastMode(FP8):
        y = lin(x)
    with HpuAutocastMode(torch.bfloat16):
        y16 = lin(x)
    assert y.dtype is torch.bfloat16
    assert _rel(y16, ref) < _rel(y, ref) < 0.10


def test_linear_equals_a_hand_quantized_scaled_mm():
    torch.manual_seed(1)
    x, w, b = torch.randn(2, 16, 64), torch.randn(32, 64), torch.randn(32)
    with HpuAutocastMode(FP8, policy=SCALED_MM):
        y = F.linear(x, w, b)
    with HpuAutocastMode(FP8):  # the CPU's default: the same operands, dequantized, in float32
        emulated = F.linear(x, w, b)
    # float32 master values quantized directly; the bias added to the float32 product (torchao)
    xq, xs = _hand(x.reshape(-1, 64), FP8)
    wq, ws = _hand(w, FP8)
    ref = torch._scaled_mm(xq, wq.t(), xs, ws, out_dtype=torch.float32) + b
    assert torch.equal(y, ref.to(torch.bfloat16).reshape(2, 16, 32))
    ref = torch.mm(xq.float() / xs.reciprocal(), wq.float().t() / ws.reciprocal()) + b
    assert torch.equal(emulated, ref.to(torch.bfloat16).reshape(2, 16, 32))


def test_hpu_runs_mm_in_fp8_and_softmax_in_bf16():
    a, b = torch.randn(32, 64), torch.randn(64, 16)
    out, seen = _events(lambda: torch.softmax(torch.mm(a, b), -1), policy="hpu")
    compute = {str(e.op): e.compute for e in seen}
    assert compute["aten.mm.default"] is FP8 and compute["aten.softmax.int"] is torch.bfloat16
    assert out.dtype is torch.bfloat16


@pytest.mark.parametrize(
    "name, fn",
    [
        ("addmm", lambda a, b, c: torch.addmm(c[0], a, b)),
        ("addmm", lambda a, b, c: torch.addmm(c, a, b, beta=0.5, alpha=2.0)),
        ("bmm", lambda a, b, c: torch.bmm(a.reshape(2, 16, 64), b.reshape(2, 32, 32)[:, :, :16].repeat(1, 2, 1))),
        (
            "baddbmm",
            lambda a, b, c: torch.baddbmm(
                c[:16, :16].expand(2, 16, 16), a.reshape(2, 16, 64), b.reshape(2, 32, 32).repeat(1, 2, 1)[:, :, :16]
            ),
        ),
        ("matmul", lambda a, b, c: torch.matmul(a.reshape(2, 16, 64), b)),
        (
            "matmul",
            lambda a, b, c: torch.matmul(a.reshape(2, 1, 16, 64), b.reshape(2, 1, 32, 32)[..., :16].repeat(1, 1, 2, 1)),
        ),
    ],
)
def test_each_gemm_runs_in_fp8_near_float32(name, fn):
    torch.manual_seed(2)
    a, b, c = torch.randn(32, 64), torch.randn(64, 32), torch.randn(32, 32)
    ref = fn(a, b, c)
    out, seen = _events(lambda: fn(a, b, c))
    assert any(str(e.op) == f"aten.{name}.default" and e.compute is FP8 for e in seen), seen
    assert out.dtype is torch.bfloat16 and _rel(out, ref) < 0.10


def test_shapes_scaled_mm_does_not_take_fall_back_to_bf16_and_the_report_names_them():
    a, b = torch.randn(32, 64), torch.randn(64, 30)
    with record(FP8) as rec:
        out = torch.mm(a, b).sum() + torch.mm(a, torch.randn(64, 32)).sum()
    report = rec.report()
    by = report.flops_by_dtype
    assert by == {"bf16": 2 * 32 * 64 * 30, "f8e4m3": 2 * 32 * 64 * 32}
    assert any("aten.mm.default ran in bf16, not fp8" in w and "(32, 64, 30)" in w for w in report.warnings)
    assert out.dtype is torch.bfloat16


def test_a_torch_whose_scaled_mm_has_no_kernel_for_the_device_falls_back_to_bf16_and_says_so(monkeypatch):
    # torch 2.4.1's _scaled_mm runs on CUDA alone: there a CPU fp8 region raised NotImplementedError
    # from inside the GEMM. Now the GEMM runs in bf16 and the report says why.
    monkeypatch.setattr(_torch, "scaled_mm_runs_on", lambda device_type: False)
    a, b = torch.randn(32, 64), torch.randn(64, 32)
    with record(FP8) as rec:  # the default emulates where _scaled_mm has no kernel
        torch.mm(a, b)
    assert rec.report().flops_by_dtype == {"f8e4m3": 2 * 32 * 64 * 32}
    with record(FP8, policy=SCALED_MM) as rec:
        out = torch.mm(a, b)
    report = rec.report()
    assert out.dtype is torch.bfloat16 and report.flops_by_dtype == {"bf16": 2 * 32 * 64 * 32}
    assert any("torch._scaled_mm has no kernel for cpu tensors" in w for w in report.warnings), report.warnings


def test_torch_2_4s_scaled_mm_is_called_with_its_keywords_and_its_pair_unwrapped(monkeypatch):
    # torch 2.4's signature: (self, mat2, *, bias, out_dtype, scale_a, scale_b, ...) -> (out, amax).
    seen = {}

    def scaled_mm_2_4(a, b, *, bias=None, out_dtype=None, scale_a=None, scale_b=None):
        seen.update(bias=bias, out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b)
        return torch.ones(2, 2), torch.tensor(0.0)

    monkeypatch.setattr(_torch, "_scaled_mm", scaled_mm_2_4)
    monkeypatch.setattr(_torch, "_SCALES_BY_KEYWORD", True)
    sa, sb = torch.tensor(2.0), torch.tensor(3.0)
    out = _torch.scaled_mm(torch.zeros(2, 2), torch.zeros(2, 2), sa, sb, out_dtype=torch.bfloat16)
    assert torch.equal(out, torch.ones(2, 2))
    assert seen == {"bias": None, "out_dtype": torch.bfloat16, "scale_a": sa, "scale_b": sb}


def test_a_float64_gemm_is_left_alone():
    a = torch.randn(32, 32, dtype=torch.float64)
    out, seen = _events(lambda: torch.mm(a, a))
    assert out.dtype is torch.float64


@pytest.mark.parametrize("preset", ["torch-cpu", "torch-cuda", "xpu", "hpu"])
def test_any_policy_that_runs_bf16_runs_its_gemms_in_fp8_and_its_other_lower_ops_in_bf16(preset):
    # issue 38: torch-cuda's lists were refused, so a CUDA user had to take Gaudi's.
    policy = get_preset(preset)
    a, b = torch.randn(32, 64), torch.randn(64, 16)
    out, seen = _events(
        lambda: torch.softmax(torch.mm(a, b), -1).matmul(torch.randn(16, 16)), policy=preset, device_type="cpu"
    )  # CPU tensors under any device's lists
    lowered = [e for e in seen if policy.table.get(e.op) is CastPolicy.LOWER]
    assert {str(e.op) for e in lowered} >= {"aten.mm.default"}
    for e in lowered:  # the GEMMs in fp8, the rest of the lower list in bf16
        assert e.compute is (FP8 if e.op in _fp8._GEMMS else torch.bfloat16), e


def test_a_policy_without_bf16_refuses_fp8_naming_what_it_accepts():
    policy = build_policy("f16-only", lower=["mm"], dtypes=(torch.float16,))
    with pytest.raises(ValueError, match=r"does not support dtype=float8_e4m3fn; accepted: float16; fp8"):
        HpuAutocastMode(FP8, policy=policy)


def test_the_c_core_decides_no_call_of_an_fp8_region():
    from hpu_autocast._engine import core as _core, innermost
    from hpu_autocast._engine.entry import core_of

    with HpuAutocastMode(FP8):
        assert core_of(innermost()) is None
    if _core.ENGINE == "c++":
        with HpuAutocastMode(torch.bfloat16):
            assert core_of(innermost()) is not None


# -- 2. backward ----------------------------------------------------------------------------------
def test_gradients_within_25_percent_of_float32s_and_master_weights_float32():
    torch.manual_seed(3)
    lin, x = torch.nn.Linear(64, 32), torch.randn(48, 64, requires_grad=True)
    lin(x).square().mean().backward()
    ref = [p.grad.clone() for p in (x, lin.weight, lin.bias)]
    for p in (x, lin.weight, lin.bias):
        p.grad = None
    with HpuAutocastMode(FP8):
        y = lin(x)
    y.float().square().mean().backward()
    for p, r in zip((x, lin.weight, lin.bias), ref):
        assert p.grad.dtype is torch.float32 and p.dtype is torch.float32
        assert _rel(p.grad, r) < 0.25


def test_the_backward_quantizes_the_gradient_to_e5m2():
    torch.manual_seed(4)
    a = torch.randn(16, 32, requires_grad=True)
    b = torch.randn(32, 16)
    g = torch.randn(16, 16)
    with HpuAutocastMode(FP8, policy=SCALED_MM):
        y = torch.mm(a, b)
    y.backward(g.to(torch.bfloat16))
    gq, gs = _hand(g.to(torch.bfloat16), torch.float8_e5m2)
    bq, bs = _hand(b, FP8)
    ref = torch._scaled_mm(gq, bq.t().contiguous().t().t(), gs, bs, out_dtype=torch.float32)
    assert torch.equal(a.grad, ref)  # the float32 input's gradient: the float32 product


def test_a_small_mlp_trains_to_within_1_5x_of_its_bf16_loss():
    def train(dtype):
        torch.manual_seed(5)
        net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
        teacher = torch.nn.Linear(32, 16)
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        for _ in range(200):
            x = torch.randn(64, 32)
            with torch.no_grad():
                t = torch.tanh(teacher(x))
            with HpuAutocastMode(dtype):
                loss = F.mse_loss(net(x).float(), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return loss.item()

    fp8, bf16 = train(FP8), train(torch.bfloat16)
    assert fp8 < 1.5 * bf16, (fp8, bf16)


# -- 4. recipes -----------------------------------------------------------------------------------
def test_the_recipe_is_part_of_the_policys_value():
    hpu = get_preset("hpu")
    delayed = dataclasses.replace(hpu, fp8=Delayed(history=4, margin=1))
    assert hpu.fp8 == Tensorwise() and delayed != hpu and hash(delayed) != hash(hpu)
    assert dataclasses.replace(hpu, fp8=Delayed(history=4, margin=1)) == delayed
    assert pickle.loads(pickle.dumps(delayed)) == delayed and copy.deepcopy(delayed).fp8 == Delayed(4, 1)
    from hpu_autocast._engine.compiled import policy_serial

    assert policy_serial(delayed) != policy_serial(hpu)  # the compiled key the compile guard checks


@pytest.mark.parametrize(
    "bad, match",
    [(dict(history=0), "history"), (dict(margin=-1), "margin"), (dict(amax_compute="mean"), "amax_compute")],
)
def test_a_bad_delayed_recipe_names_what_is_accepted(bad, match):
    with pytest.raises(ValueError, match=f"{match} = .*accepted"):
        Delayed(**bad)
    with pytest.raises(TypeError, match="fp8 = .*accepted"):
        dataclasses.replace(get_preset("hpu"), fp8="delayed")


def test_delayed_scaling_scales_by_the_history_of_earlier_calls():
    policy = dataclasses.replace(get_preset("hpu"), name="hpu-delayed", fp8=Delayed(history=2))
    w = torch.nn.Parameter(torch.randn(16, 32))
    x1 = torch.randn(16, 32)
    with HpuAutocastMode(FP8, policy=policy):
        first = F.linear(x1, w)
    with HpuAutocastMode(FP8):
        dynamic = F.linear(x1, w)
    assert torch.equal(first, dynamic)  # an empty history: the call's own amax
    x2 = x1 * 0.25  # with "max" over the history, x2 is scaled by x1's amax: fewer levels used
    with HpuAutocastMode(FP8, policy=policy):
        second = F.linear(x2, w)
    x1s = (448 / x1.abs().max().double()).float()
    xq = (x2 * x1s).to(FP8)
    wq, ws = _hand(w.detach(), FP8)
    ref = torch.mm(xq.float() / x1s, wq.float().t() / ws.reciprocal())  # the CPU's emulated product
    assert torch.equal(second, ref.to(torch.bfloat16))


# -- 5. tune, testing, torch.compile ----------------------------------------------------------------
def _net():
    torch.manual_seed(6)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).eval()
    return net, torch.randn(32, 64)


def test_tune_moves_a_gemm_from_fp8_to_bf16_before_anything_to_float32():
    from hpu_autocast import tune
    from hpu_autocast.numerics import compare_outputs

    net, x = _net()
    fn = lambda x: torch.softmax(net(x), -1)  # noqa: E731
    loose = tune(fn, x, dtype=FP8, tolerance=0.5)
    assert loose.bf16_gemms == () and loose.policy == loose.start  # fp8 meets it: nothing moves
    result = tune(fn, x, dtype=FP8, tolerance=0.5 * loose.start_error)
    assert result.bf16_gemms == ("linear",) and result.moved == () and result.met
    assert torch.ops.aten.linear.default in result.policy.bf16_gemms
    ref = fn(x)
    with HpuAutocastMode(FP8, policy=result.policy):  # the tuned policy's error is what it says
        again = compare_outputs(ref, fn(x))
    _, seen = _events(lambda: fn(x), policy=result.policy)
    assert {e.compute for e in seen if str(e.op) == "aten.linear.default"} == {torch.bfloat16}
    assert again.max_rel == pytest.approx(result.error)


def test_check_policy_finds_no_deviation_in_an_fp8_region():
    from hpu_autocast.testing import check_policy

    net, x = _net()
    assert not check_policy(net, x, dtype=FP8, policy="hpu")


def test_the_strategies_draw_fp8_regions_with_their_recipes():
    from hypothesis import given, settings, HealthCheck
    from hpu_autocast.testing import policies

    drawn = []

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(policies(dtype=FP8, presets=["hpu"], max_changes=0))
    def run(policy):
        drawn.append(policy.fp8)
        a, b = torch.randn(16, 32), torch.randn(32, 16)
        out, seen = _events(lambda: torch.mm(a, b), policy=policy)
        lowered = policy.table.get(torch.ops.aten.mm.default) is CastPolicy.LOWER
        assert FP8 in policy.dtypes and (out.dtype is torch.bfloat16) == lowered

    run()
    assert any(isinstance(r, Delayed) for r in drawn) and Tensorwise() in drawn
    assert any(isinstance(r, Rowwise) for r in drawn)


def test_torch_compile_in_an_fp8_region_gives_eagers_values():
    net, x = _net()
    x.requires_grad_(True)
    fn = lambda x: torch.softmax(net(x), -1)  # noqa: E731
    with HpuAutocastMode(FP8):
        eager = fn(x)
        (gx,) = torch.autograd.grad(eager.float().sum(), x)
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="aot_eager")(x)
        (cgx,) = torch.autograd.grad(compiled.float().sum(), x)
    torch._dynamo.reset()
    assert torch.equal(compiled, eager) and torch.equal(cgx, gx)


def test_torch_compile_in_an_fp8_region_of_a_bf16_policy_warns_nothing():
    # Dynamo restores torch's autocast state around each compilation: set_autocast_dtype of the
    # bfloat16 an fp8 region answers. Under torch-cpu (dtypes bfloat16, float16: fp8 through its
    # bfloat16) that restore warned "torch.autocast asked for torch.float8_e4m3fn inside a region
    # of policy 'torch-cpu'", twice a compilation (found by benchmarks/fp8_gpu.py --smoke).
    net, x = _net()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with HpuAutocastMode(FP8, policy="torch-cpu", device_type="cpu"):
            eager = net(x)
            torch._dynamo.reset()
            compiled = torch.compile(net, backend="eager")(x)
    torch._dynamo.reset()
    assert [str(w.message) for w in caught if "hpu_autocast" in str(w.message)] == []
    assert torch.equal(compiled, eager)


def test_the_report_shows_the_recipe_beside_the_fp8_dtype():
    policy = dataclasses.replace(get_preset("hpu"), fp8=Delayed(history=8, amax_compute="most_recent"))
    a = torch.randn(16, 16)
    with record(FP8, policy=policy) as rec:
        torch.mm(a, a)
    assert str(rec.report()).startswith(
        "hpu_autocast precision report: policy hpu, dtype f8e4m3 (delayed(history=8, margin=0, amax=most_recent); emulated)"
    )
    with record(torch.bfloat16) as rec:
        torch.mm(a, a)
    assert rec.report().dtype == "bf16"


# -- 6. Gaudi: the bridge's fp8 GEMM ------------------------------------------------------------------
def test_on_hpu_tensors_the_bridges_fp8_gemm_runs(monkeypatch):
    import _fake_habana

    bridge = _fake_habana.install(monkeypatch)
    x, w = _fake_habana.fake_hpu(torch.randn(2, 16, 64)), _fake_habana.fake_hpu(torch.randn(32, 64))
    seen = []
    with HpuAutocastMode(FP8, policy="hpu", device_type="hpu", observer=seen.append):
        y = torch.softmax(F.linear(x, w), -1)
    assert (y.dtype, y.device.type, tuple(y.shape)) == (torch.bfloat16, "hpu", (2, 16, 32))
    assert bridge.calls.count(("fp8_gemm_v2", FP8, FP8, torch.bfloat16)) == 1
    assert [(str(e.op), e.compute) for e in seen] == [
        ("aten.linear.default", FP8),
        ("aten.softmax.int", torch.bfloat16),
    ]


def test_the_stand_ins_fp8_gemm_computes_what_scaled_mm_does(monkeypatch):
    import _fake_habana

    _fake_habana.install(monkeypatch)
    a, sa = _hand(torch.randn(16, 32), FP8)
    b, sb = _hand(torch.randn(32, 16), FP8)
    ours = torch.ops.hpu.fp8_gemm_v2(a, False, b, False, None, torch.bfloat16, sa, sb, None, False)
    ref = torch._scaled_mm(a, b.t().contiguous().t(), sa, sb, out_dtype=torch.bfloat16)
    torch.testing.assert_close(ours, ref)  # bfloat16's tolerance: float32 sums in another order

"""Rowwise fp8 recipes (issue 38, item 4) against torchao's "rowwise" and "rowwise_with_gw_hp",
and the CPU emulation's faster steps (item 5) against the plain torch ops they replace."""

import dataclasses

import pytest
import torch

from hpu_autocast import HpuAutocastMode, get_preset, record
from hpu_autocast import _torch
from hpu_autocast._engine import fp8 as _fp8
from hpu_autocast.policies.recipes import Rowwise, Tensorwise

from _torchao_oracle import assert_equals_torchao, torchao_float8

FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16


@pytest.fixture(autouse=True)
def without_a_gpu(monkeypatch):
    # fp8 regions on CPU tensors, as on a machine without a GPU (as tests/test_fp8.py).
    from hpu_autocast._facts import devices as _devices

    monkeypatch.setattr(_devices, "_cuda", False)


def _policy(recipe):
    return dataclasses.replace(get_preset("hpu"), name="hpu-r", fp8=recipe)


def _spread(*shape):
    # rows of very different magnitudes (2**-6 .. 2**6): per-row scales then differ from one scale
    torch.manual_seed(7)
    return torch.randn(*shape) * torch.exp2(torch.randint(-6, 7, (shape[0], 1)).float())


# -- torchao as the oracle ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "emulate, bias",
    [
        pytest.param(True, True, id="emulated-bias"),
        pytest.param(True, False, id="emulated"),
        pytest.param(
            False,
            True,
            id="scaled_mm-bias",
            marks=pytest.mark.skipif(not _torch.scaled_mm_runs_on("cpu"), reason="no torch._scaled_mm for CPU tensors"),
        ),
    ],
)
@pytest.mark.parametrize("name, recipe", [("rowwise", Rowwise()), ("rowwise_with_gw_hp", Rowwise(weight_grad="high"))])
def test_a_rowwise_regions_linear_equals_torchaos_bit_for_bit_in_bf16(name, recipe, emulate, bias):
    ao = torchao_float8()
    net = torch.nn.Sequential(torch.nn.Linear(64, 48, bias=bias))
    with torch.no_grad():
        net[0].weight.copy_(_spread(48, 64) * 0.1)
    config = dataclasses.replace(ao.Float8LinearConfig.from_recipe_name(name), emulate=True)
    x = _spread(32, 64)
    g = torch.randn(32, 48).to(BF16)
    region = HpuAutocastMode(FP8, policy=_policy(dataclasses.replace(recipe, emulate=emulate)))
    y = assert_equals_torchao(net, config, x, g, region)
    # the oracle discriminates: one scale per tensor gives another output on these rows
    with HpuAutocastMode(FP8, policy=_policy(Tensorwise())):
        assert not torch.equal(net(x), y)


# -- without torchao: a hand-quantized control ----------------------------------------------------
def _rows(x, dim):
    # torchao's rowwise cast: amax along dim, float64 division, floored to a power of 2, saturated
    amax = x.abs().amax(dim=dim, keepdim=True).double().clamp(min=1e-12)
    scale = torch.exp2(torch.floor(torch.log2((448.0 / amax).float())))
    return (x.float() * scale).clamp(-448, 448).to(FP8).float() / scale


def test_rowwise_scales_each_row_along_the_contraction_by_a_power_of_2():
    a, b = _spread(32, 64), _spread(48, 64).t()
    with HpuAutocastMode(FP8, policy=_policy(Rowwise())):
        out = torch.mm(a, b)
    assert torch.equal(out, torch.mm(_rows(a, -1), _rows(b, 0)).to(BF16))


def test_an_nd_linear_and_a_bmm_take_rowwise_scales_per_2d_product():
    x, w = _spread(32, 64).reshape(2, 16, 64), _spread(48, 64)
    batch = torch.stack([_spread(16, 32), _spread(16, 32) * 3])
    other = _spread(32, 16).expand(2, 32, 16)
    with HpuAutocastMode(FP8, policy=_policy(Rowwise())):
        lin, bmm = torch.nn.functional.linear(x, w), torch.bmm(batch, other)
        flat = torch.nn.functional.linear(x.reshape(32, 64), w)
        each = [torch.mm(p, q) for p, q in zip(batch, other)]
    assert torch.equal(lin, flat.reshape(2, 16, 48)) and torch.equal(bmm, torch.stack(each))


# -- the recipe as data ---------------------------------------------------------------------------
def test_rowwise_is_policy_data_named_in_the_report():
    assert Rowwise() == Rowwise("e4m3") != Rowwise(weight_grad="high")
    assert _policy(Rowwise()) != _policy(Rowwise(weight_grad="high"))
    assert [str(r) for r in (Rowwise(), Rowwise(weight_grad="high"), Rowwise(emulate=False))] == [
        "rowwise",
        "rowwise(weight_grad=high)",
        "rowwise(scaled_mm)",
    ]
    a = torch.randn(16, 32)
    with record(FP8, policy=_policy(Rowwise(weight_grad="high"))) as rec:
        torch.mm(a, a.t())
    assert rec.report().dtype == "f8e4m3 (rowwise(weight_grad=high); emulated)"


def test_a_bad_rowwise_recipe_names_what_is_accepted():
    with pytest.raises(ValueError, match=r"Rowwise: weight_grad = 'bf16'; accepted: 'e4m3' or 'high'"):
        Rowwise(weight_grad="bf16")
    with pytest.raises(TypeError, match=r"recipes.Rowwise\(...\)"):
        _policy("rowwise")


def test_tune_names_the_recipe_and_keeps_it():
    from hpu_autocast import tune

    torch.manual_seed(6)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).eval()
    lines = []
    result = tune(
        lambda x: net(x),
        torch.randn(32, 64),
        dtype=FP8,
        policy=_policy(Rowwise()),
        tolerance=1e-3,
        max_runs=12,
        progress=lines.append,
    )
    assert any("start (hpu-r, rowwise) -> error" in line for line in lines)
    assert result.bf16_gemms == ("linear",) and result.policy.fp8 == Rowwise()


# -- the emulation's faster steps give the plain ops' values --------------------------------------
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_the_code_table_dequantizes_as_the_fp8_conversion_does(dtype):
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(16, 16)  # every code, NaN too
    for q in (codes, codes.t()):
        for scale in (torch.tensor(3.7), torch.rand(16, 1) + 0.5, torch.rand(1, 16) + 0.5):
            got, ref = _fp8._dequantize(q, scale), q.float() / scale
            assert torch.equal(got.nan_to_num(), ref.nan_to_num()) and torch.equal(got.isnan(), ref.isnan())
            assert got.stride() == ref.stride()  # the layout the float32 mm sums by


def test_the_amax_is_vector_norms_nan_and_inf_too():
    x = torch.randn(32, 16)
    for special in (None, float("inf"), float("nan")):
        if special is not None:
            x[3, 5] = special
        for t in (x, x.t(), x.to(BF16)):
            ref = torch.linalg.vector_norm(t, float("inf")).float()
            assert torch.equal(_fp8._amax(t).nan_to_num(), ref.nan_to_num())
            for dim in (0, -1):  # per row: torchao's abs().amax
                ref = t.abs().amax(dim=dim, keepdim=True).float()
                assert torch.equal(_fp8._amax(t, dim).nan_to_num(), ref.nan_to_num())


@pytest.mark.parametrize("recipe", [Tensorwise(), Rowwise()], ids=str)
def test_a_linears_weight_gradient_comes_contiguous(recipe):
    # computed as (g.t() @ a).t() for a weight.t(): AccumulateGrad copies nothing (same bits)
    lin, seen = torch.nn.Linear(32, 16), []
    lin.weight.register_hook(lambda g: seen.append(g.is_contiguous()))  # the gradient as it arrives
    with HpuAutocastMode(FP8, policy=_policy(recipe)):
        y = lin(torch.randn(16, 32))
    y.float().sum().backward()
    assert seen == [True]

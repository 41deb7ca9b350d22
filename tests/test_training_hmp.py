"""``hpu_autocast.hmp``: seed 001's HMP calls, run by changing only the import line, checked
against hand-cast controls that do HMP's casts explicitly."""

import os
import runpy

import pytest
import torch
import torch.nn.functional as F

import hpu_autocast
from hpu_autocast import hmp

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "train_hmp.py")
BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def without_a_gpu(monkeypatch):
    # HMP's convert names no device: its region casts for the machine's (a GPU's where there is
    # one). These tests check HMP's casts on CPU tensors, as on a machine without a GPU, which
    # the example then runs on too.
    from hpu_autocast._facts import devices as _devices

    monkeypatch.setattr(_devices, "_cuda", False)


@pytest.fixture(autouse=True)
def clean_up_convert():
    # hmp.convert lasts until process end, as HMP's does; every test undoes it.
    yield
    hmp.reset()
    assert not hmp.is_converted() and not hpu_autocast.is_enabled()
    assert not getattr(torch.autograd.backward, "_hpu_autocast_hmp", False)


def hand_cast_seed_loop(steps=20):
    # Seed 001's loop with HMP's casts written out: linear is on the BF16 list (inputs cast),
    # mse_loss is on no list, so it runs in its first input's dtype (y cast to bf16);
    # backward is plain autograd; SGD runs on the float32 parameters.
    torch.manual_seed(0)
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    model = torch.nn.Linear(32, 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        y_pred = F.linear(x.to(BF16), model.weight.to(BF16), model.bias.to(BF16))
        loss = F.mse_loss(y_pred, y.to(BF16))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses, loss.dtype


def _cpu_bf16_mse_loss() -> bool:
    try:
        F.mse_loss(torch.ones(1, dtype=BF16), torch.ones(1, dtype=BF16))
    except RuntimeError:  # torch 2.4: "mse_cpu" not implemented for 'BFloat16'
        return False
    return True


@pytest.mark.skipif(not _cpu_bf16_mse_loss(), reason="this torch has no bfloat16 mse_loss on CPU")
def test_seed_example_runs_by_changing_the_import_line():
    ns = runpy.run_path(EXAMPLE, run_name="example")
    assert hmp.is_converted()  # convert lasts past the script, as HMP's does
    model, losses, dtype = hand_cast_seed_loop()
    assert ns["loss"].dtype is dtype is BF16
    assert ns["losses"] == losses
    assert losses[-1] < losses[0]
    for a, b in zip(ns["model"].parameters(), model.parameters()):
        assert a.dtype is torch.float32 and torch.equal(a, b)


def test_backward_is_not_cast():
    # div is on HMP's FP32 list and mul on its BF16 list: div's backward computes with mul,
    # which a region left open during backward would lower. HMP never casts backward.
    torch.manual_seed(0)
    a = torch.randn(4, 4, requires_grad=True)
    b = (torch.rand(4, 4) + 1).requires_grad_()
    hmp.convert()
    q = torch.div(a, b)
    assert q.dtype is torch.float32
    q.pow(3).sum().backward()
    hmp.reset()
    ga, gb = a.grad, b.grad
    a.grad = b.grad = None
    torch.div(a, b).pow(3).sum().backward()  # the control: float32 throughout, no casts
    assert torch.equal(ga, a.grad) and torch.equal(gb, b.grad)


def test_disable_casts_block_runs_uncast():
    hmp.convert()
    x = torch.randn(3, 3)
    assert torch.mm(x, x).dtype is BF16
    with hmp.disable_casts():
        assert torch.mm(x, x).dtype is torch.float32
        assert not hpu_autocast.is_enabled()
    assert torch.mm(x, x).dtype is BF16


def test_is_verbose_logs_each_decision(capsys):
    hmp.convert(isVerbose=True)
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    F.linear(x, w)
    torch.log(x.abs())
    hmp.reset()
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "aten.linear.default  lower  f32,f32 -> bf16",
        "aten.abs.default  first (unlisted)  f32 -> f32",
        "aten.log.default  fp32  f32 -> f32",
    ]


def test_user_list_files_replace_the_defaults(tmp_path):
    bf16 = tmp_path / "bf16.txt"
    fp32 = tmp_path / "fp32.txt"
    bf16.write_text("# GEMMs only\nmm\n")
    fp32.write_text("linear\n")
    hmp.convert(bf16_file_path=str(bf16), fp32_file_path=str(fp32))
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    assert torch.mm(x, w.t()).dtype is BF16
    assert F.linear(x.to(BF16), w).dtype is torch.float32  # moved to FP32 by the file
    assert torch.relu(x).dtype is torch.float32  # off the default BF16 list: first input's dtype
    assert torch.relu(x.to(BF16)).dtype is BF16


def test_bad_list_entry_names_file_and_line(tmp_path):
    bad = tmp_path / "bf16.txt"
    bad.write_text("mm\nnot_an_op_xyz\n")
    with pytest.raises(hpu_autocast.PolicyError, match=r"not_an_op_xyz.*bf16\.txt.*2|bf16\.txt.*2.*not_an_op_xyz"):
        hmp.convert(bf16_file_path=str(bad))
    assert not hmp.is_converted()


def test_opt_level_o2_keeps_hmp_meaning_and_ignores_lists(tmp_path):
    f = tmp_path / "bf16.txt"
    f.write_text("relu\n")
    with pytest.warns(UserWarning, match="O2.*ignores bf16_file_path and fp32_file_path"):
        hmp.convert(opt_level="O2", bf16_file_path=str(f))
    x = torch.randn(2, 4)
    h = x.to(BF16)
    assert torch.mm(x, x.t()).dtype is BF16  # GEMM: bfloat16
    assert F.conv1d(x.view(1, 2, 4), torch.randn(2, 2, 3)).dtype is BF16  # convolution: bfloat16
    assert torch.relu(h).dtype is torch.float32  # everything else float32, the file ignored
    assert (h + h).dtype is torch.float32


def test_convert_twice_and_bad_opt_level_are_errors():
    with pytest.raises(ValueError, match="opt_level must be one of \\['O1', 'O2'\\], got 'O3'"):
        hmp.convert(opt_level="O3")
    hmp.convert()
    with pytest.raises(RuntimeError, match="already called"):
        hmp.convert()


def test_reset_while_a_later_region_is_open_leaves_that_region_in_force():
    hmp.convert()
    inner = hpu_autocast.HpuAutocastMode(torch.float16, policy="torch-cpu")
    inner.__enter__()
    try:
        hmp.reset()
        assert not hmp.is_converted() and hpu_autocast.get_dtype() == torch.float16
    finally:
        inner.__exit__(None, None, None)
    assert not hpu_autocast.is_enabled()

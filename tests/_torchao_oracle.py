"""torchao's ``Float8Linear`` as the outside oracle of fp8 regions (tests/test_fp8_trust.py,
tests/test_fp8_rowwise.py): the same model and input run through a region and through torchao's
converted copy, compared bit for bit after rounding to bfloat16."""

import copy

import pytest
import torch

BF16 = torch.bfloat16


def torchao_float8():
    """``torchao.float8``, or the test is skipped where the fp8 extra is not installed."""
    return pytest.importorskip("torchao.float8", reason="torchao (the fp8 extra) is not installed")


def assert_equals_torchao(net: torch.nn.Module, config, x: torch.Tensor, g: torch.Tensor, region) -> torch.Tensor:
    """Run ``net`` on ``x`` in ``region`` (a context manager) and torchao's conversion of a copy
    (``config``) on a copy of ``x``; back from the output's gradient ``g`` (bfloat16: one bfloat16
    holds exactly; ours reaches the product in bf16, torchao's in float32); assert the output, the input's
    gradient and each parameter's gradient equal bit for bit in bfloat16. Returns the region's
    output."""
    ao = torchao_float8()
    theirs = ao.convert_to_float8_training(copy.deepcopy(net), config=config)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    with region:
        y = net(x_ours)
    y.backward(g)
    y_ref = theirs(x_theirs)
    y_ref.backward(g.float())
    assert torch.equal(y, y_ref.to(BF16))
    assert torch.equal(x_ours.grad.to(BF16), x_theirs.grad.to(BF16))
    for p, q in zip(net.parameters(), theirs.parameters()):
        assert torch.equal(p.grad.to(BF16), q.grad.to(BF16))
    return y

"""Autograd under the mode: each node's backward computes in the dtype its forward computed in,
with backward outside or inside the region, double backward, ``torch.autograd.grad``.

The oracle is native ``torch.autocast("cpu")`` on the same policy (``torch-cpu``). Each test runs
both the function-level path (``torch.mm``: cast above autograd) and the dispatch-level path
(``torch.ops.aten.mm.default``: cast below autograd, saved tensors recast by the bridge)."""

from __future__ import annotations

import pytest
import torch

from hpu_autocast import HpuAutocastMode

MM = {"function": torch.mm, "dispatch": torch.ops.aten.mm.default}
LEVELS = sorted(MM)


def _leaves(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, generator=g, requires_grad=True)
    w = torch.randn(4, 5, generator=g, requires_grad=True)
    return x, w


def _both(fn):
    """``fn(region)`` under our mode and under native autocast, on equal fresh leaves."""
    ours = fn(HpuAutocastMode(torch.bfloat16, policy="torch-cpu"), *_leaves())
    native = fn(torch.autocast("cpu", dtype=torch.bfloat16), *_leaves())
    return ours, native


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y)


@pytest.mark.parametrize("level", LEVELS)
def test_backward_outside_the_region(level):
    def run(region, x, w):
        with region:
            y = MM[level](x, w)
        (y.float() ** 2).sum().backward()
        return y, x.grad, w.grad

    ours, native = _both(run)
    _equal(ours, native)
    assert ours[1].dtype == torch.float32  # leaves' grads in their own dtype


@pytest.mark.parametrize("level", LEVELS)
def test_backward_inside_the_region(level):
    def run(region, x, w):
        with region:
            y = MM[level](x, w)
            (y.float() ** 2).sum().backward()
        return x.grad, w.grad

    _equal(*_both(run))


@pytest.mark.parametrize("level", LEVELS)
def test_autograd_grad(level):
    def run(region, x, w):
        with region:
            loss = MM[level](x, w).float().sum()
        return torch.autograd.grad(loss, (x, w))

    _equal(*_both(run))


@pytest.mark.parametrize("level", LEVELS)
def test_double_backward(level):
    def run(region, x, w):
        with region:
            y = MM[level](torch.tanh(x), w)
            loss = (y.float() ** 2).sum()
        (gx,) = torch.autograd.grad(loss, x, create_graph=True)
        (gx.float() ** 2).sum().backward()
        return gx, w.grad

    _equal(*_both(run))


@pytest.mark.parametrize("level", LEVELS)
def test_retain_graph_twice(level):
    def run(region, x, w):
        with region:
            loss = MM[level](x, w).float().sum()
        loss.backward(retain_graph=True)
        first = w.grad.clone()
        loss.backward()
        return first, w.grad

    ours, native = _both(run)
    _equal(ours, native)
    assert torch.equal(ours[1], 2 * ours[0])


@pytest.mark.parametrize("level", LEVELS)
def test_tensor_used_by_two_cast_ops(level):
    def run(region, x, w):
        with region:
            a = MM[level](x, w)
            b = MM[level](x, w * 2)
            loss = (a.float() * b.float()).sum()
        loss.backward()
        return x.grad, w.grad

    _equal(*_both(run))


def test_no_grad_region_leaves_nothing_pending():
    from hpu_autocast._engine import current_engine

    x, w = _leaves()
    with torch.no_grad(), HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
        y = torch.ops.aten.mm.default(x, w)
        assert not current_engine().pending
    assert y.dtype == torch.bfloat16 and y.grad_fn is None

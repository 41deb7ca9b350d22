"""Autograd under the mode: each node's backward computes in the dtype its forward computed in,
with backward outside or inside the region, double backward, ``torch.autograd.grad``.

The oracle is native ``torch.autocast("cpu")`` on the same policy (``torch-cpu``). Each test runs
a policy op called directly (``torch.mm``) and one called from C++ inside a composite that has no
rule of its own (``torch.einsum``'s inner ``bmm``): both are cast above autograd by the engine's
kernel, as native autocast casts them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hpu_autocast import HpuAutocastMode, get_preset, with_lists

MM = {"direct": torch.mm, "inside einsum": lambda x, w: torch.einsum("ij,jk->ik", x, w)}
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


def test_no_grad_region_records_no_graph():
    x, w = _leaves()
    with torch.no_grad(), HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
        y = torch.ops.aten.mm.default(x, w)
    assert y.dtype == torch.bfloat16 and y.grad_fn is None


# --- models: nn.Linear, convolutions, matmul chains ------------------------------------------
# Each builder returns (params, inputs, forward); forward(params, inputs) runs the model's
# forward with fresh, equal leaves each time. BF is the region's dtype.

BF = torch.bfloat16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _p(*shape, seed):
    return (torch.randn(*shape, generator=_gen(seed)) * 0.5).requires_grad_()


def _mlp():
    params = {"w1": _p(6, 4, seed=1), "b1": _p(6, seed=2), "w2": _p(3, 6, seed=3), "b2": _p(3, seed=4)}
    inputs = {"x": _p(5, 4, seed=5)}

    def forward(p, i, c):
        # c(t): the hand-cast control's cast of a tensor entering a lower-list op (identity for
        # our mode, which casts by itself).
        h = torch.relu(F.linear(c(i["x"]), c(p["w1"]), c(p["b1"])))
        return F.linear(c(h), c(p["w2"]), c(p["b2"]))

    return params, inputs, forward


def _cnn():
    params = {"w": _p(3, 2, 3, 3, seed=6), "b": _p(3, seed=7), "fc": _p(2, 12, seed=8)}
    inputs = {"x": _p(2, 2, 4, 4, seed=9)}

    def forward(p, i, c):
        h = torch.tanh(F.conv2d(c(i["x"]), c(p["w"]), c(p["b"]), padding=1))
        h = F.max_pool2d(h, 2).flatten(1)
        return F.linear(c(h), c(p["fc"]))

    return params, inputs, forward


def _matmul_chain():
    params = {"a": _p(4, 5, seed=10), "b": _p(5, 3, seed=11)}
    inputs = {"x": _p(2, 3, 4, seed=12)}

    def forward(p, i, c):
        h = torch.matmul(c(i["x"]), c(p["a"]))
        return torch.matmul(c(torch.sin(h)), c(p["b"]))

    return params, inputs, forward


MODELS = {"mlp": _mlp, "cnn": _cnn, "matmul_chain": _matmul_chain}


def _loss(out):
    return (out.float() ** 2).mean()


def _train_step(build, region, cast=None, *, inside=False):
    params, inputs, forward = build()
    c = cast or (lambda t: t)
    with region:
        out = forward(params, inputs, c)
        if inside:
            _loss(out).backward()
    if not inside:
        _loss(out).backward()
    leaves = {**params, **inputs}
    return out, {k: v.grad for k, v in leaves.items()}


def _assert_same(a, b):
    (out_a, grads_a), (out_b, grads_b) = a, b
    assert out_a.dtype == out_b.dtype == BF and torch.equal(out_a, out_b)
    assert grads_a.keys() == grads_b.keys()
    for k in grads_a:
        # Leaves are float32, and so are their grads, on both sides.
        assert grads_a[k].dtype == grads_b[k].dtype == torch.float32, k
        assert torch.equal(grads_a[k], grads_b[k]), k


class _NoMode:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _to_bf16(t):
    return t.to(BF) if t.dtype == torch.float32 else t


@pytest.mark.parametrize("inside", [False, True], ids=["backward_outside", "backward_inside"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_against_native_autocast(model, inside):
    ours = _train_step(MODELS[model], HpuAutocastMode(BF, policy="torch-cpu"), inside=inside)
    native = _train_step(MODELS[model], torch.autocast("cpu", dtype=BF), inside=inside)
    _assert_same(ours, native)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_under_hpu_against_a_hand_cast_control(model):
    # hpu: linear, conv2d, matmul are on the lower list; relu, tanh, sin, max_pool2d unlisted.
    # Backward outside the region only: inside it, the ops backward runs are cast too (as
    # native autocast does, see test_ops_run_by_backward_inside_the_region_are_cast), and under
    # hpu those include mul (PowBackward, MulBackward), so a hand-cast control cannot follow.
    ours = _train_step(MODELS[model], HpuAutocastMode(device_type="cpu"))
    control = _train_step(MODELS[model], _NoMode(), _to_bf16)
    _assert_same(ours, control)


class _MmInBackward(torch.autograd.Function):
    """Identity whose backward calls torch.mm on float32 tensors."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        out = torch.mm(g, torch.eye(g.shape[1]))
        _MmInBackward.seen.append(out.dtype)
        return out.float()


@pytest.mark.parametrize("inside", [False, True], ids=["backward_outside", "backward_inside"])
def test_ops_run_by_backward_inside_the_region_are_cast(inside):
    # Native autocast's state is thread-local dispatch keys, which the autograd engine carries
    # into backward: an op a backward runs inside the region is autocast, outside it is not.
    def run(region):
        _MmInBackward.seen = []
        x = torch.randn(2, 3, requires_grad=True)
        with region:
            y = _MmInBackward.apply(x).sum()
            if inside:
                y.backward()
        if not inside:
            y.backward()
        return _MmInBackward.seen

    ours = run(HpuAutocastMode(BF, policy="torch-cpu"))
    native = run(torch.autocast("cpu", dtype=BF))
    assert ours == native == [BF if inside else torch.float32]


def test_layer_norm_and_loss_under_hpu_against_a_hand_cast_control():
    # layer_norm casts its input only (weight and bias stay float32, and get float32 grads);
    # mse_loss is FP32: its bfloat16 input is cast up.
    def run(region, cast_input, cast_loss):
        x = _p(3, 4, seed=20)
        w, b = (torch.rand(4, generator=_gen(21)) + 0.5).requires_grad_(), _p(4, seed=22)
        target = torch.randn(3, 4, generator=_gen(23))
        with region:
            y = F.layer_norm(cast_input(x), (4,), w, b)
            loss = F.mse_loss(cast_loss(y), target)
        loss.backward()
        return y, loss, x.grad, w.grad, b.grad

    ours = run(HpuAutocastMode(device_type="cpu"), lambda t: t, lambda t: t)
    control = run(_NoMode(), _to_bf16, lambda t: t.float())
    assert ours[0].dtype == BF and ours[1].dtype == torch.float32
    for a, b in zip(ours, control):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert all(g.dtype == torch.float32 for g in ours[2:])


@pytest.mark.parametrize("oracle", ["native", "hand_cast"])
@pytest.mark.parametrize("model", ["mlp", "matmul_chain"])
def test_autograd_grad_and_double_backward(model, oracle):
    # A gradient penalty: grad of the input with create_graph=True, then backward through it.
    # Oracles: torch-cpu against native autocast; hpu against the hand-cast control.
    def run(region, cast=lambda t: t):
        params, inputs, forward = MODELS[model]()
        with region:
            out = forward(params, inputs, cast)
        (gx,) = torch.autograd.grad(_loss(out), inputs["x"], create_graph=True)
        (gx**2).sum().backward()
        return gx, {k: v.grad for k, v in params.items()}

    if oracle == "native":
        ours, ref = run(HpuAutocastMode(BF, policy="torch-cpu")), run(torch.autocast("cpu", dtype=BF))
    else:
        ours, ref = run(HpuAutocastMode(device_type="cpu")), run(_NoMode(), _to_bf16)
    (gx, grads), (rgx, rgrads) = ours, ref
    assert gx.dtype == rgx.dtype == torch.float32 and torch.equal(gx, rgx)
    assert gx.grad_fn is not None  # create_graph kept the graph of the gradient
    for k in grads:
        assert grads[k].dtype == torch.float32 and torch.equal(grads[k], rgrads[k]), k


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_module_called_twice_against_native(cache_enabled):
    # The same weight feeds two cast ops; with the cache both use one cast copy, whose
    # backward accumulates both contributions (as native autocast's cache does).
    def run(region):
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        x = torch.randn(3, 4, requires_grad=True)
        with region:
            out = lin(torch.relu(lin(x)))
        _loss(out).backward()
        return out, {"x": x.grad, "w": lin.weight.grad, "b": lin.bias.grad}

    ours = run(HpuAutocastMode(BF, policy="torch-cpu", cache_enabled=cache_enabled))
    native = run(torch.autocast("cpu", dtype=BF, cache_enabled=cache_enabled))
    _assert_same(ours, native)


def test_weight_first_used_under_no_grad_still_gets_its_gradient():
    def run(region, call=None):
        torch.manual_seed(0)
        lin = nn.Linear(4, 3)
        x = torch.randn(2, 4)
        with region:
            with torch.no_grad():
                lin(x)  # an evaluation pass first (an EMA teacher, a metric)
            out = lin(x) if call is None else call(lin, x)
        if not out.requires_grad:
            return None
        _loss(out).backward()
        return out, {"w": lin.weight.grad, "b": lin.bias.grad}

    ours = run(HpuAutocastMode(BF, policy="torch-cpu"))
    assert ours is not None, "the output lost its graph"
    native = run(torch.autocast("cpu", dtype=BF))
    if native is None:
        # Older torch's autocast (seen on 2.9.1) cached the cast made under no_grad: the same bug
        # (its output did not require grad); compare with a hand-cast control there.
        native = run(_NoMode(), lambda lin, x: F.linear(x.to(BF), lin.weight.to(BF), lin.bias.to(BF)))
    _assert_same(ours, native)


def test_iadd_on_a_promote_list_against_a_hand_cast_control():
    # iadd on a promote list (seed 000 lists it; Gaudi's bridge ignores the name, hence not
    # under hpu itself) keeps its first input's dtype: the float32 operand is cast to bfloat16,
    # and its gradient comes back through that cast in float32.
    hpu = get_preset("hpu")
    documented = dataclasses.replace(hpu, record=dataclasses.replace(hpu.record, c_names_only=False))
    policy = with_lists(documented, promote=["iadd"], name="hpu+iadd")

    def run(region, cast):
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        x, y = torch.randn(2, 4), torch.randn(2, 4, requires_grad=True)
        with region:
            h = lin(x) if cast is None else F.linear(cast(x), cast(lin.weight), cast(lin.bias))
            h += y if cast is None else cast(y)
        _loss(h).backward()
        return h, {"y": y.grad, "w": lin.weight.grad, "b": lin.bias.grad}

    _assert_same(run(HpuAutocastMode(policy=policy, device_type="cpu"), None), run(_NoMode(), _to_bf16))


# Calls with no rule of their own whose listed insides are cast where they are called (a composite
# on no list decomposes, and the kernels see its insides, above autograd): under hpu, against
# hand-cast controls.
DISPATCH_LEVEL = {
    "einsum": (
        lambda x, w: torch.einsum("bij,jk->bik", x, w),
        lambda x, w: torch.einsum("bij,jk->bik", x.to(BF), w.to(BF)),
    ),
    "linalg.matmul": (lambda x, w: torch.linalg.matmul(x, w), lambda x, w: torch.matmul(x.to(BF), w.to(BF))),
    "tensordot": (lambda x, w: torch.tensordot(x, w, 1), lambda x, w: torch.tensordot(x.to(BF), w.to(BF), 1)),
    "multiply": (lambda x, w: torch.multiply(x, x), lambda x, w: torch.mul(x.to(BF), x.to(BF))),
    "special.expm1": (lambda x, w: torch.special.expm1(x.to(BF)), lambda x, w: torch.expm1(x.to(BF).float())),
}


@pytest.mark.parametrize("name", sorted(DISPATCH_LEVEL))
def test_dispatch_level_casts_under_hpu_against_a_hand_cast_control(name):
    def run(region, fn):
        x, w = _p(2, 3, 4, seed=30), _p(4, 2, seed=31)
        with region:
            y = fn(x, w)
        _loss(y).backward()
        return y, x.grad, w.grad

    ours_fn, control_fn = DISPATCH_LEVEL[name]
    ours, control = run(HpuAutocastMode(device_type="cpu"), ours_fn), run(_NoMode(), control_fn)
    for a, b in zip(ours, control):
        assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b))
    assert ours[1].dtype == torch.float32


# A kernel whose backward returns float32 gradients for low-precision inputs, as oneDNN's
# mkldnn_rnn_layer_backward does on CPUs without AMX (nn.LSTM under torch-cpu on AMD EPYC).
# Native autocast rounds such a gradient through the copy's dtype: autograd casts it to the
# dtype of the input the node saw, then ToCopyBackward casts it to float32. The engine casts
# above autograd too, so a custom op placed on a policy's list gets the same bits.
torch.library.define("hpu_autocast_test::scale_f32_grad", "(Tensor x) -> Tensor")


@torch.library.impl("hpu_autocast_test::scale_f32_grad", "CompositeExplicitAutograd")
def _scale_f32_grad(x):
    return x * 2


def _scale_f32_grad_backward(ctx, grad):
    return grad.float() * 1.1  # float32, and not representable in bfloat16


torch.library.register_autograd("hpu_autocast_test::scale_f32_grad", _scale_f32_grad_backward)


def test_a_float32_gradient_is_rounded_through_the_cast_dtype():
    from hpu_autocast import build_policy

    op = torch.ops.hpu_autocast_test.scale_f32_grad.default
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    policy = build_policy("custom", lower=["hpu_autocast_test::scale_f32_grad"], device_type="cpu")
    with HpuAutocastMode(policy=policy):
        out = op(x)
    assert out.dtype == torch.bfloat16
    (ours,) = torch.autograd.grad(out.float().sum(), x)
    (control,) = torch.autograd.grad(op(x.bfloat16()).float().sum(), x)
    assert ours.dtype == control.dtype == torch.float32
    assert torch.equal(ours, control)
    assert not torch.equal(ours, torch.full_like(x, 1.1))  # the rounding is visible

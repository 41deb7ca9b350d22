"""Training with the mode: GradScaler loss scaling, custom autograd functions, disabling casts.
Every run is compared with a native ``torch.autocast("cpu")`` twin under the ``torch-cpu``
policy (the same op lists), bit for bit."""

import pytest
import torch
import torch.nn.functional as F

import hpu_autocast
from hpu_autocast import HpuAutocastMode, amp

POLICY = "torch-cpu"


def region(native: bool, dtype: torch.dtype, enabled: bool = True):
    if native:
        return torch.autocast("cpu", dtype=dtype, enabled=enabled)
    return HpuAutocastMode(dtype, policy=POLICY, enabled=enabled)


def tiny_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


# -- loss scaling ----------------------------------------------------------------------------


def _scaled_loop(native: bool, steps: int = 6, inf_at: int = 2):
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # growth_interval=2 so the scale grows within a few steps as well as backing off.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    torch.manual_seed(1)
    xs, ys = torch.randn(steps, 4, 6), torch.randn(steps, 4, 3)
    scales, params, skipped = [], [], []
    for i in range(steps):
        opt.zero_grad()
        with region(native, torch.float16):
            loss = F.mse_loss(model(xs[i]), ys[i])
        scaler.scale(loss).backward()
        if i == inf_at:
            model[0].weight.grad[0, 0] = float("inf")  # an overflowed gradient
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        skipped.append(all(torch.equal(b, p) for b, p in zip(before, model.parameters())))
        scales.append(scaler.get_scale())
        params.append([p.detach().clone() for p in model.parameters()])
    return scales, params, skipped, loss.dtype


def test_grad_scaler_float16_matches_native_autocast():
    ours = _scaled_loop(native=False)
    native = _scaled_loop(native=True)
    assert ours[3] == native[3] == torch.float32  # mse_loss is on torch-cpu's fp32 list
    # The scale history: grows every 2 clean steps, halves at the injected inf (step 2).
    assert ours[0] == native[0]
    assert ours[0] == [256.0, 512.0, 256.0, 256.0, 512.0, 512.0]
    assert ours[2] == native[2] == [False, False, True, False, False, False]
    for a, b in zip(ours[1], native[1]):
        for pa, pb in zip(a, b):
            assert torch.equal(pa, pb)


# -- custom autograd functions ---------------------------------------------------------------


def _make_function(native: bool, cast_inputs):
    if native:
        fwd = torch.amp.custom_fwd(device_type="cpu", cast_inputs=cast_inputs)
        bwd = torch.amp.custom_bwd(device_type="cpu")
    else:
        fwd = amp.custom_fwd(cast_inputs=cast_inputs)
        bwd = amp.custom_bwd

    class MulMM(torch.autograd.Function):
        """y = (a @ b) * a[:, :1]; backward multiplies a saved input by the gradient with mm,
        so its dtype shows the state backward runs in."""

        @staticmethod
        @fwd
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            ctx.seen = (a.dtype, torch.mm(a, b).dtype)
            return torch.mm(a, b)

        @staticmethod
        @bwd
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            ga, gb = torch.mm(g, b.t()), torch.mm(a.t(), g)
            ctx.bwd_seen = (ga.dtype, gb.dtype)
            return ga, gb

    return MulMM


@pytest.mark.parametrize("cast_inputs", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backward_inside", [False, True])
def test_custom_fwd_bwd_matches_torch_amp(cast_inputs, backward_inside):
    results = {}
    for native in (True, False):
        fn = _make_function(native, cast_inputs)
        torch.manual_seed(0)
        a = torch.randn(3, 4, requires_grad=True)
        b = torch.randn(4, 2, requires_grad=True)
        ctxs = []
        with region(native, torch.bfloat16):
            y = fn.apply(a, b)
            ctxs.append(y.grad_fn)
            if backward_inside:
                y.float().sum().backward()
        if not backward_inside:  # after the region: custom_bwd must re-enter the forward's state
            y.float().sum().backward()
        results[native] = (y, a.grad, b.grad, y.grad_fn.seen, y.grad_fn.bwd_seen)
    nat, ours = results[True], results[False]
    assert ours[3] == nat[3] and ours[4] == nat[4]
    for x, z in zip(nat[:3], ours[:3]):
        assert x.dtype == z.dtype and torch.equal(x, z)
    # The reasoning: cast_inputs=None runs mm in bf16 in forward and in backward (re-entered);
    # cast_inputs=dtype casts a, b to dtype and runs both passes with casting off.
    expected = {None: torch.bfloat16, torch.float32: torch.float32, torch.bfloat16: torch.bfloat16}[cast_inputs]
    assert ours[3] == ((torch.float32 if cast_inputs is None else cast_inputs), expected)
    assert ours[4] == (expected, expected)


def test_custom_fwd_outside_region_is_a_no_op():
    fn = _make_function(False, torch.bfloat16)
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, 2, requires_grad=True)
    y = fn.apply(a, b)
    y.sum().backward()
    assert y.grad_fn.seen == (torch.float32, torch.float32)
    assert y.grad_fn.bwd_seen == (torch.float32, torch.float32)
    assert torch.equal(a.grad, torch.ones(3, 2) @ b.detach().t())


def test_custom_bwd_records_the_region_policy_not_the_default():
    # float16 and cache off are not the mode's defaults: backward must re-enter exactly the
    # forward region's policy, dtype and cache setting.
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        @amp.custom_fwd
        def forward(ctx, x):
            return x * 1

        @staticmethod
        @amp.custom_bwd
        def backward(ctx, g):
            seen.append(amp.current_state())
            return g

    x = torch.randn(2, requires_grad=True)
    with HpuAutocastMode(torch.float16, policy=POLICY, cache_enabled=False):
        y = Probe.apply(x)
    y.sum().backward()
    (state,) = seen
    assert state.enabled and state.dtype is torch.float16 and state.cache_enabled is False
    assert state.policy is hpu_autocast.get_preset(POLICY)
    assert not hpu_autocast.is_enabled()  # and the re-entered region was left


def test_custom_bwd_without_custom_fwd_names_the_function():
    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        @amp.custom_bwd
        def backward(ctx, g):
            return g

    y = Bad.apply(torch.randn(2, requires_grad=True))
    with pytest.raises(RuntimeError, match="Bad.backward has no recorded state"):
        y.sum().backward()


def test_custom_fwd_rejects_a_non_float_cast_dtype():
    with pytest.raises(TypeError, match="cast_inputs must be a floating-point torch.dtype"):
        amp.custom_fwd(lambda ctx, x: x, cast_inputs=torch.int32)


# -- disabling casts -------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["disable_casts", "enabled=False"])
def test_optimizer_step_and_hand_code_under_disabled_casts(how):
    def off(native):
        if native:
            return torch.autocast("cpu", enabled=False)
        return hpu_autocast.disable_casts() if how == "disable_casts" else HpuAutocastMode(enabled=False)

    out = {}
    for native in (True, False):
        model = tiny_mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        torch.manual_seed(3)
        x, y = torch.randn(4, 6), torch.randn(4, 3)
        dtypes = []
        for _ in range(3):
            with region(native, torch.bfloat16):
                pred = model(x)
                with off(native):
                    # hand-written float32 code inside the region: not cast
                    penalty = torch.mm(model[0].weight, model[0].weight.t()).trace()
                    dtypes.append(penalty.dtype)
                loss = F.mse_loss(pred.float(), y) + 1e-3 * penalty
                loss.backward()
                with off(native):
                    opt.step()
                    opt.zero_grad()
        out[native] = ([p.detach() for p in model.parameters()], dtypes, pred.dtype)
    assert out[False][1] == out[True][1] == [torch.float32] * 3
    assert out[False][2] == out[True][2] == torch.bfloat16
    for a, b in zip(out[False][0], out[True][0]):
        assert a.dtype is torch.float32 and torch.equal(a, b)


# -- the README's example --------------------------------------------------------------------


def test_readme_training_example_runs_and_matches_native():
    import os
    import runpy

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "train_amp.py")
    ours = runpy.run_path(path, run_name="example")
    # The control: the same script under native torch.autocast and torch's own checkpoint.
    src = open(path).read()
    src = src.replace(
        'HpuAutocastMode(torch.float16, policy="torch-cpu")', 'torch.autocast("cpu", dtype=torch.float16)'
    )
    native: dict = {}
    exec(compile(src, path, "exec"), native)
    assert ours["h"].dtype is torch.float16
    assert ours["losses"] == native["losses"] and ours["losses"][-1] < ours["losses"][0] / 4
    for a, b in zip(ours["model"].parameters(), native["model"].parameters()):
        assert torch.equal(a, b)


def test_out_of_order_exit_leaves_no_region_behind():
    outer = HpuAutocastMode(torch.bfloat16, policy=POLICY)
    inner = HpuAutocastMode(torch.float16, policy=POLICY)
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # out of order: closed; the inner region stays in force
    assert hpu_autocast.get_dtype() == torch.float16
    inner.__exit__(None, None, None)
    assert not hpu_autocast.is_enabled()

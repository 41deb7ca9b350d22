"""Autograd-graph features under the mode: activation checkpointing, saved-tensor hooks, and
backward on other threads. Compared with the same model without the feature and with native
``torch.autocast("cpu")`` under the ``torch-cpu`` policy, bit for bit."""

import contextlib
import threading

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint

import hpu_autocast
from hpu_autocast import HpuAutocastMode


def region(native: bool, policy: str = "torch-cpu", dtype=torch.bfloat16):
    if native:
        return torch.autocast("cpu", dtype=dtype)
    return HpuAutocastMode(dtype, policy=policy, device_type="cpu")


class Block(torch.nn.Module):
    """Linear -> GELU -> LayerNorm -> Linear -> softmax: lower, fp32 and unlisted ops."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(6, 8)
        self.n = torch.nn.LayerNorm(8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.n(F.gelu(self.a(x)))).softmax(-1)


def tensordot_block(w):
    # tensordot is a C++ composite with no rule: the mm it calls from C++ reaches the engine's
    # kernel, as native autocast's, and is cast above autograd like any other call.
    def f(x):
        return torch.tensordot(torch.relu(x), w, ([1], [0]))

    return f


def grads_of(fn, x, params, wrap=lambda f, x: f(x), ctx=region(False), outer=contextlib.nullcontext):
    for p in (*params, x):
        p.grad = None
    with outer():
        with ctx:
            y = wrap(fn, x)
    y.float().pow(2).sum().backward()  # backward outside the region
    return [y.detach()] + [p.grad.clone() for p in (*params, x)]


def assert_equal_lists(xs, ys):
    assert len(xs) == len(ys)
    for a, b in zip(xs, ys):
        assert a.dtype == b.dtype and torch.equal(a, b)


def _x():
    torch.manual_seed(1)
    return torch.randn(5, 6, requires_grad=True)


# -- activation checkpointing ----------------------------------------------------------------


def test_torch_checkpoint_recomputes_under_the_forwards_region():
    # torch restores torch.autocast's state only, so before the engine took part the
    # recomputation (backward is outside the region) ran uncast and torch's metadata check fired:
    # "CheckpointError: Recomputed values ... have different metadata".
    m, x = Block(), _x()
    with region(False):
        y = torch_checkpoint.checkpoint(m, x, use_reentrant=False)
    y.float().sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def _selective(f, x):
    # Selective activation checkpointing: a context_fn of torch's, saving the mm outputs.
    if not hasattr(torch_checkpoint, "CheckpointPolicy"):
        pytest.skip("this torch has no selective activation checkpointing (torch.utils.checkpoint.CheckpointPolicy)")
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    return torch_checkpoint.checkpoint(
        f, x, use_reentrant=False, context_fn=lambda: create_selective_checkpoint_contexts(policy)
    )


CKPT = {
    "checkpoint": lambda f, x: torch_checkpoint.checkpoint(f, x, use_reentrant=False),
    "checkpoint reentrant": lambda f, x: torch_checkpoint.checkpoint(f, x, use_reentrant=True),
    "selective": _selective,
    "sequential": lambda f, x: torch_checkpoint.checkpoint_sequential(
        torch.nn.Sequential(f), 1, x, use_reentrant=False
    ),
}


@pytest.mark.parametrize("policy", ["torch-cpu", "hpu"])
@pytest.mark.parametrize("how", list(CKPT))
def test_checkpoint_grads_equal_no_checkpoint(policy, how):
    m, x = Block(), _x()
    plain = grads_of(m, x, list(m.parameters()), ctx=region(False, policy))
    ckpt = grads_of(m, x, list(m.parameters()), wrap=CKPT[how], ctx=region(False, policy))
    assert_equal_lists(plain, ckpt)


@pytest.mark.parametrize("how", list(CKPT))
def test_checkpoint_matches_native_checkpoint(how):
    m, x = Block(), _x()
    native = grads_of(m, x, list(m.parameters()), ctx=region(True), wrap=CKPT[how])
    ours = grads_of(m, x, list(m.parameters()), wrap=CKPT[how], ctx=region(False))
    assert_equal_lists(native, ours)


def test_checkpoint_of_disabled_region_recomputes_disabled():
    # Recomputation happens inside an enabled region here, yet must run uncast, as the forward
    # did; the control is the same code without checkpointing (backward in the region too).
    def run(wrap):
        m, x = Block(), _x()
        with region(False):
            with hpu_autocast.disable_casts():
                y = wrap(m, x)
            y.float().pow(2).sum().backward()
        return [y.detach(), x.grad] + [p.grad for p in m.parameters()]

    ckpt, plain = run(CKPT["checkpoint"]), run(lambda f, x: f(x))
    assert ckpt[0].dtype is torch.float32
    assert_equal_lists(plain, ckpt)


def test_checkpoint_forward_is_observed_once():
    calls = []
    m, x = Block(), _x()
    mode = HpuAutocastMode(torch.bfloat16, policy="torch-cpu", observer=lambda event: calls.append(event.name))
    with mode:
        y = torch_checkpoint.checkpoint(m, x, use_reentrant=False)
    n = len(calls)
    y.sum().backward()
    assert n > 0 and len(calls) == n  # the recomputation is not reported again


def test_checkpoint_with_dispatch_level_cast():
    torch.manual_seed(2)
    w = torch.randn(6, 3, requires_grad=True)
    f, x = tensordot_block(w), _x()
    plain = grads_of(f, x, [w])
    ckpt = grads_of(f, x, [w], wrap=CKPT["checkpoint"])
    assert_equal_lists(plain, ckpt)


# -- saved-tensor hooks ----------------------------------------------------------------------


def _user_hooks():
    # A user's own pack/unpack pair that copies (as offloading or compression would).
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t.clone())


HOOKS = {"save_on_cpu": torch.autograd.graph.save_on_cpu, "user hooks": _user_hooks}


@pytest.mark.parametrize("hooks", list(HOOKS))
def test_saved_tensor_hooks_around_forward_match_native(hooks):
    m, x = Block(), _x()
    native = grads_of(m, x, list(m.parameters()), ctx=region(True), outer=HOOKS[hooks])
    ours = grads_of(m, x, list(m.parameters()), ctx=region(False), outer=HOOKS[hooks])
    plain = grads_of(m, x, list(m.parameters()), ctx=region(False))
    assert_equal_lists(native, ours)
    assert_equal_lists(plain, ours)


def test_dispatch_level_cast_without_hooks_matches_native():
    # The control for the test below.
    torch.manual_seed(2)
    w = torch.randn(6, 3, requires_grad=True)
    f, x = tensordot_block(w), _x()
    assert_equal_lists(grads_of(f, x, [w], ctx=region(True)), grads_of(f, x, [w]))


@pytest.mark.parametrize("hooks", list(HOOKS))
def test_saved_tensor_hooks_with_dispatch_level_cast(hooks):
    torch.manual_seed(2)
    w = torch.randn(6, 3, requires_grad=True)
    f, x = tensordot_block(w), _x()
    native = grads_of(f, x, [w], ctx=region(True), outer=HOOKS[hooks])
    ours = grads_of(f, x, [w], outer=HOOKS[hooks])
    assert_equal_lists(native, ours)


# -- threads ---------------------------------------------------------------------------------


def test_region_in_one_thread_does_not_cast_another():
    inside, done = threading.Barrier(2, timeout=30), threading.Barrier(2, timeout=30)
    dtypes = {}
    a, b = torch.randn(3, 3), torch.randn(3, 3)

    def with_region():
        with HpuAutocastMode(torch.bfloat16, device_type="cpu"):
            inside.wait()  # the other thread computes while this region is open
            dtypes["region"] = torch.mm(a, b).dtype
            done.wait()

    def without():
        inside.wait()
        dtypes["other"] = torch.mm(a, b).dtype
        dtypes["other enabled"] = hpu_autocast.is_enabled()
        done.wait()

    threads = [threading.Thread(target=with_region), threading.Thread(target=without)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert dtypes == {"region": torch.bfloat16, "other": torch.float32, "other enabled": False}


@pytest.mark.parametrize("native", [True, False])
def test_backward_on_another_thread(native):
    torch.manual_seed(2)
    w = torch.randn(6, 3, requires_grad=True)
    f, x = tensordot_block(w), _x()
    same_thread = grads_of(f, x, [w], ctx=region(native))
    w.grad = x.grad = None
    with region(native):
        y = f(x)
    errors = []

    def backward():
        try:
            y.float().pow(2).sum().backward()
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    t = threading.Thread(target=backward)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive() and not errors, errors
    assert_equal_lists(same_thread, [y.detach(), w.grad, x.grad])
    if not native:
        assert_equal_lists(grads_of(f, x, [w], ctx=region(True)), same_thread)

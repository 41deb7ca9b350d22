"""HpuAutocastMode as a context manager and decorator: nesting, enabling, exceptions, threads,
the cast cache, and the state queries."""

from __future__ import annotations

import dataclasses
import threading
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import hpu_autocast
from _native import CACHES_WITH_GRAD
from hpu_autocast import HpuAutocastMode, disable_casts, get_dtype, get_policy, get_preset, is_enabled

A, B = torch.randn(2, 3), torch.randn(3, 2)


def test_context_manager_and_decorator():
    with HpuAutocastMode(device_type="cpu"):
        assert torch.mm(A, B).dtype == torch.bfloat16

    @HpuAutocastMode(torch.float16, policy="torch-cpu")
    def f(a, b):
        return torch.mm(a, b)

    assert f(A, B).dtype == torch.float16
    assert f(A, B).dtype == torch.float16  # reusable, and state is gone between calls
    assert torch.mm(A, B).dtype == torch.float32


def test_nesting_innermost_wins():
    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
        with HpuAutocastMode(torch.float16, policy="torch-cpu"):
            assert torch.mm(A, B).dtype == torch.float16
            assert get_dtype() == torch.float16
        assert torch.mm(A, B).dtype == torch.bfloat16
        assert get_policy() == get_preset("torch-cpu")
        # Another policy inside: hpu has exp on the FP32 list, torch-cpu does not list it.
        x = torch.randn(3, dtype=torch.bfloat16)
        assert torch.exp(x).dtype == torch.bfloat16
        with HpuAutocastMode(device_type="cpu"):
            assert torch.exp(x).dtype == torch.float32
            assert get_policy().name == "hpu"
        with HpuAutocastMode(enabled=False):
            assert get_policy() is None
    assert get_policy() is None


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # torch.autocast("cuda") without CUDA
def test_regions_of_two_devices_nest_as_one_stack_and_torch_autocast_is_per_device():
    # docs/migration.md: the innermost region decides whatever its device (torch keeps a state
    # per device: native CPU casting stays on in a torch.autocast("cuda") block); a
    # torch.autocast for another device inside a region is per device, as in torch.
    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
        for enabled in (True, False):
            with HpuAutocastMode(torch.float16, policy="torch-cuda", device_type="cuda", enabled=enabled):
                assert torch.mm(A, B).dtype == torch.float32
        assert torch.mm(A, B).dtype == torch.bfloat16
        with torch.autocast("cuda", dtype=torch.float16):  # without CUDA, it disables itself
            assert torch.is_autocast_enabled("cuda") is torch.cuda.is_available()
            assert torch.is_autocast_enabled("cpu") and torch.mm(A, B).dtype == torch.bfloat16
        with torch.autocast("cuda", enabled=False):
            assert torch.mm(A, B).dtype == torch.bfloat16
        assert not torch.is_autocast_enabled("cuda")


def test_enabled_false_inside_turns_casting_off():
    with HpuAutocastMode(device_type="cpu"):
        with HpuAutocastMode(enabled=False):
            assert torch.mm(A, B).dtype == torch.float32
            assert not is_enabled()
        assert torch.mm(A, B).dtype == torch.bfloat16
        with disable_casts():
            assert torch.mm(A, B).dtype == torch.float32
        assert is_enabled()


def test_exception_leaves_no_state():
    with pytest.raises(ZeroDivisionError):
        with HpuAutocastMode(device_type="cpu"):
            with HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
                1 / 0
    assert not is_enabled() and get_dtype() is None
    assert torch.mm(A, B).dtype == torch.float32
    assert torch._C._len_torch_dispatch_stack() == 0
    with HpuAutocastMode(device_type="cpu"):
        assert torch.mm(A, B).dtype == torch.bfloat16


def test_the_same_mode_object_cannot_be_entered_twice():
    mode = HpuAutocastMode(device_type="cpu")
    with mode:
        with pytest.raises(RuntimeError, match="already entered"):
            with mode:
                pass
    with mode:  # once exited, it can be entered again
        assert torch.mm(A, B).dtype == torch.bfloat16


def test_regions_are_per_thread():
    inside = threading.Event()
    done = threading.Event()
    seen = {}

    def other():
        inside.wait(5)
        seen["dtype"] = torch.mm(A, B).dtype
        seen["enabled"] = is_enabled()
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with HpuAutocastMode(device_type="cpu"):
        inside.set()
        done.wait(5)
        assert torch.mm(A, B).dtype == torch.bfloat16
    t.join(5)
    assert seen == {"dtype": torch.float32, "enabled": False}


def test_a_region_in_another_thread_does_not_leak_here():
    barrier = threading.Barrier(2, timeout=5)

    def other():
        with HpuAutocastMode(device_type="cpu"):
            barrier.wait()  # the region is open now
            barrier.wait()  # the main thread has checked

    t = threading.Thread(target=other)
    t.start()
    barrier.wait()
    assert torch.mm(A, B).dtype == torch.float32
    barrier.wait()
    t.join(5)


class _CountCopies(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.copies += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cache_enabled, expected", [(True, 1 + 3), (False, 3 + 3)])
def test_cast_cache(cache_enabled, expected):
    # A weight used three times: cast once with the cache, three times without. Each of the
    # three inputs is cast once either way (not leaves that require grad).
    lin = nn.Linear(4, 4, bias=False)
    xs = [torch.randn(2, 4) for _ in range(3)]
    counter = _CountCopies()
    with counter, HpuAutocastMode(torch.bfloat16, policy="torch-cpu", cache_enabled=cache_enabled):
        for x in xs:
            lin(x)
    assert counter.copies == expected


def test_cache_is_dropped_when_the_outermost_region_exits():
    # The cached copy of the weight lives as long as the outermost region: seen through the
    # events (a cache hit is marked), then a new region makes a new copy.
    lin = nn.Linear(4, 4)
    events = []
    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu", cache_enabled=True, observer=events.append):
        lin(torch.randn(2, 4))
        lin(torch.randn(2, 4))
    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu", cache_enabled=True, observer=events.append):
        lin(torch.randn(2, 4))
    weight = [[c.cached for c in e.casts if c.arg == "weight"] for e in events if e.name == "aten.linear.default"]
    assert weight == [[False], [True], [False]]


def test_state_queries():
    assert not is_enabled() and get_dtype() is None
    with HpuAutocastMode(torch.float16, policy="torch-cpu"):
        assert is_enabled() and get_dtype() == torch.float16


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="dtype"):
        HpuAutocastMode("bfloat16")
    with pytest.raises(Exception, match="no-such-preset"):
        HpuAutocastMode(policy="no-such-preset")


def test_public_api():
    for name in hpu_autocast.__all__:
        assert hasattr(hpu_autocast, name), name


def test_decorated_function_raising_leaves_no_state():
    @HpuAutocastMode(device_type="cpu")
    def boom():
        assert torch.mm(A, B).dtype == torch.bfloat16
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        boom()
    assert not is_enabled() and torch.mm(A, B).dtype == torch.float32


def test_decorator_keeps_the_function_name_and_nests_when_recursive():
    @HpuAutocastMode()
    def depth(n):
        """doc"""
        assert get_dtype() == torch.bfloat16
        return 0 if n == 0 else 1 + depth(n - 1)

    assert depth.__name__ == "depth" and depth.__doc__ == "doc"
    assert depth(3) == 3 and not is_enabled()


def test_disabled_then_enabled_again_inside():
    with HpuAutocastMode(device_type="cpu"):
        with disable_casts():
            assert get_dtype() is None and not is_enabled()
            with HpuAutocastMode(torch.float16, policy="torch-cpu"):
                assert torch.mm(A, B).dtype == torch.float16
            assert torch.mm(A, B).dtype == torch.float32
        assert get_dtype() == torch.bfloat16


def test_a_region_exited_out_of_order_closes_and_the_inner_one_stays():
    # A generator's region closed late, say: the outer region ends, the inner one stays in
    # force until it exits, and then nothing is left on.
    outer, inner = HpuAutocastMode(device_type="cpu"), HpuAutocastMode(torch.float16, policy="torch-cpu")
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    assert get_dtype() == torch.float16 and torch.mm(A, B).dtype == torch.float16
    inner.__exit__(None, None, None)
    assert not is_enabled() and torch.mm(A, B).dtype == torch.float32


def test_two_threads_in_different_regions_at_once():
    barrier = threading.Barrier(2, timeout=5)
    seen = {}

    def worker(key, mode):
        with mode:
            barrier.wait()  # both regions are open now
            seen[key] = (torch.mm(A, B).dtype, get_dtype())
            barrier.wait()  # both have looked
        seen[key + "_after"] = torch.mm(A, B).dtype

    threads = [
        threading.Thread(target=worker, args=("bf16", HpuAutocastMode(device_type="cpu"))),
        threading.Thread(target=worker, args=("f16", HpuAutocastMode(torch.float16, policy="torch-cpu"))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {
        "bf16": (torch.bfloat16, torch.bfloat16),
        "f16": (torch.float16, torch.float16),
        "bf16_after": torch.float32,
        "f16_after": torch.float32,
    }
    assert not is_enabled()


def test_cache_lives_as_long_as_the_outermost_region():
    # Nested regions (an inner one disabled, too) share the outer region's cast copies, as
    # torch.autocast's cache does: the weight is cast once in all.
    lin = nn.Linear(4, 4, bias=False)
    x = torch.randn(2, 4, dtype=torch.bfloat16)  # already bfloat16: only the weight is cast
    counter = _CountCopies()
    with counter, HpuAutocastMode(torch.bfloat16, policy="torch-cpu", cache_enabled=True):
        lin(x)
        with HpuAutocastMode(torch.bfloat16, policy="torch-cpu", cache_enabled=True):
            lin(x)
        with disable_casts():
            pass
        lin(x)
    assert counter.copies == 1


def test_observer_sees_each_cast_call():
    events = []

    def observer(event):
        events.append(
            (str(event.op), str(event.outcome), event.action and str(event.action), event.compute, len(event.casts))
        )

    with HpuAutocastMode(device_type="cpu", observer=observer):
        torch.mm(A, B)
        torch.exp(A)
        torch.relu(A)  # not listed: reported as such (the observer sees the fallback too)
    assert events == [
        ("aten.mm.default", "cast", "lower", torch.bfloat16, 2),
        ("aten.exp.default", "cast", "fp32", torch.float32, 0),
        ("aten.relu.default", "unlisted", None, torch.float32, 0),
    ]


def test_cache_defaults_on_without_hpu_and_is_off_on_hpu(monkeypatch):
    import sys
    import types

    assert HpuAutocastMode().cache_enabled is True  # no Gaudi bridge loaded here
    # Seed 000: "autocast caching is permanently disabled on HPU", even when asked for; and on a
    # first-generation Gaudi float16 is not supported there, whatever the policy (Gaudi 2 and
    # later take it: docs/hpu.md). "There" is the region's device: the hpu preset's default once
    # the bridge is loaded, or named; a CPU region keeps the CPU's rules.
    monkeypatch.setitem(sys.modules, "habana_frameworks.torch", types.ModuleType("habana_frameworks.torch"))
    bridge_hpu = types.ModuleType("habana_frameworks.torch.hpu")
    bridge_hpu.is_available, bridge_hpu.get_device_name = (lambda: True), (lambda device=None: "GAUDI")
    monkeypatch.setitem(sys.modules, "habana_frameworks.torch.hpu", bridge_hpu)
    assert HpuAutocastMode().cache_enabled is False
    assert HpuAutocastMode(policy="torch-cpu", device_type="hpu", cache_enabled=True).cache_enabled is False
    with pytest.raises(ValueError, match="float16 is not supported on a first-generation Gaudi"):
        HpuAutocastMode(torch.float16, policy="torch-cpu", device_type="hpu")
    assert HpuAutocastMode(torch.float16, policy="torch-cpu").cache_enabled is True
    bridge_hpu.get_device_name = lambda device=None: "GAUDI2"
    assert HpuAutocastMode(torch.float16, policy="torch-cpu", device_type="hpu").cache_enabled is False


def test_float16_refused_by_a_bfloat16_only_policy_naming_it():
    # The hpu preset takes float16 off Gaudi (issue 29); a policy of bfloat16 alone refuses it.
    assert HpuAutocastMode(torch.float16).policy.name == "hpu"
    bf16_only = dataclasses.replace(get_preset("hpu"), dtypes=(torch.bfloat16,))
    with pytest.raises(ValueError, match=r"float16.*accepted: bfloat16"):
        HpuAutocastMode(torch.float16, policy=bf16_only)
    HpuAutocastMode(torch.float16, policy=bf16_only, enabled=False)  # a disabled region checks nothing


def test_verbose_logs_through_the_hpu_autocast_logger(caplog):
    import logging

    with caplog.at_level(logging.DEBUG, logger="hpu_autocast"):
        with HpuAutocastMode(device_type="cpu", verbose=True):
            torch.mm(A, B)
            with disable_casts():
                torch.mm(A, B)  # disabled: no decision, no line
        with HpuAutocastMode(device_type="cpu"):  # not verbose: no line
            torch.mm(A, B)
    lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [("hpu_autocast", "DEBUG", "aten.mm.default  lower  f32,f32 -> bf16")]


def test_record_and_report_with_the_decorator():
    mode = HpuAutocastMode(device_type="cpu", record=True)

    @mode
    def step(a, b):
        return torch.exp(torch.mm(a, b))

    step(A, B)
    rows = {r.op: (r.action, r.compute, r.calls) for r in mode.report().rows}
    assert rows == {"aten.mm.default": ("lower", "bf16", 1), "aten.exp.default": ("fp32", "f32", 1)}
    step(A, B)  # the report covers every call's region; last=True the last one's (issue 37)
    assert [r.calls for r in mode.report().rows] == [2, 2]
    assert [r.calls for r in mode.report(last=True).rows] == [1, 1]
    with pytest.raises(RuntimeError, match="record=True"):
        HpuAutocastMode().report()


def test_an_op_raising_inside_the_region_leaves_it_working():
    # A kernel switches the engine's keys off while it runs an op; a raising op must not leave
    # them off (the next ops would run uncast).
    import torch.nn.functional as F

    bad_calls = [
        lambda: torch.mm(A, A),
        lambda: torch.ops.aten.mm.default(A, A),
        lambda: F.linear(A, B),
        lambda: F.cross_entropy(A, torch.tensor([5, 7])),
        lambda: F.layer_norm(A, (5,)),
    ]
    with HpuAutocastMode(device_type="cpu"):
        for bad in bad_calls:
            with pytest.raises((RuntimeError, IndexError)):
                bad()
            assert torch.mm(A, B).dtype == torch.bfloat16
            assert F.cross_entropy(A.bfloat16(), torch.tensor([0, 1])).dtype == torch.float32


def test_observer_runs_with_the_policy_off_and_may_raise():
    # An observer's own torch calls are not the user's: not cast, not observed (no recursion).
    seen = []

    def observer(event):
        seen.append(torch.mm(A, B).dtype)

    with HpuAutocastMode(device_type="cpu", observer=observer):
        assert torch.mm(A, B).dtype == torch.bfloat16
    assert seen == [torch.float32]

    def failing(*event):
        raise LookupError("observer failed")

    with HpuAutocastMode(device_type="cpu") as outer:
        with pytest.raises(LookupError):
            with HpuAutocastMode(device_type="cpu", observer=failing):
                torch.mm(A, B)
        # The failure unwound the inner region only; the outer one still casts.
        assert get_dtype() == outer.dtype and torch.mm(A, B).dtype == torch.bfloat16
    assert not is_enabled()


def test_only_weights_are_cached_as_native_caches_them():
    # Native autocast caches the casts of float32 leaves that require grad (weights), nothing
    # else: an input or a mask is cast at each use, since its values can change behind any
    # version counter (.data, NumPy writes).
    events = []
    m = torch.randn(3, 3)
    w = torch.randn(3, 3, requires_grad=True)
    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu", observer=events.append):
        torch.mm(m, w), torch.mm(m, w)
    cached = [[cast.cached for cast in e.casts] for e in events if e.name == "aten.mm.default"]
    assert cached == [[False, False], [False, True]]  # m cast twice; w once, then served


@pytest.mark.skipif(
    not CACHES_WITH_GRAD,
    reason="native's cache predates pytorch#158232 here: it "
    "serves a no_grad copy to a use with grad; the region does what torch 2.13 and later do",
)
def test_a_weight_copy_made_under_no_grad_serves_a_use_with_grad_as_native():
    # Native makes a cached copy with grad enabled, also under no_grad (pytorch#158232): the
    # copy carries its ToCopyBackward, so a later use with grad shares it and the weight gets
    # its gradient.
    def run(ctx):
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        x = torch.randn(2, 4)
        with ctx:
            with torch.no_grad():
                lin(x)
            y = lin(x)
            z = lin(x)
        (y.float().sum() + z.float().sum()).backward()
        return y, z, lin.weight.grad

    events = []
    ours = run(HpuAutocastMode(torch.bfloat16, policy="torch-cpu", observer=events.append))
    native = run(torch.autocast("cpu", dtype=torch.bfloat16))
    for o, n in zip(ours, native):
        assert torch.equal(o, n) and o.dtype == n.dtype
    weight = [[c.cached for c in e.casts if c.arg == "weight"] for e in events if e.name == "aten.linear.default"]
    assert weight == [[False], [True], [True]]


# --- torch-cuda without CUDA; generators and coroutines decorated (issue 31, item 7) ---------------


def test_a_cuda_region_without_cuda_warns_as_torch_autocast_does(monkeypatch):
    # Failed before: silent. torch.autocast("cuda") warns "CUDA is not available ..." there.
    from hpu_autocast._facts import devices as _devices

    monkeypatch.setattr(_devices, "_cuda", False)
    with pytest.warns(UserWarning, match="a region for device 'cuda', but CUDA is not available: it casts nothing"):
        HpuAutocastMode(torch.float16, policy="torch-cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HpuAutocastMode(policy="torch-cpu")
        HpuAutocastMode(torch.float16, policy="torch-cuda", enabled=False)


def _mm_dtypes_in_steps():
    a = torch.randn(2, 2)
    seen = yield torch.mm(a, a).dtype
    yield torch.mm(a, a).dtype, seen, torch.is_autocast_enabled("cpu")


def test_a_decorated_generator_runs_each_resumption_in_the_region():
    # Failed before: the region opened and closed at the call, before the body's first step;
    # both mm ran in float32. Between steps, the caller's code runs uncast.
    gen = HpuAutocastMode(policy="torch-cpu")(_mm_dtypes_in_steps)()
    first = next(gen)
    assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float32 and not hpu_autocast.is_enabled()
    second = gen.send("sent")
    assert (first, second) == (torch.bfloat16, (torch.bfloat16, "sent", True))
    # As native would run the same body inside torch.autocast at each step:
    with torch.autocast("cpu"):
        native = torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype
    assert native == first
    gen.close()
    assert not hpu_autocast.is_enabled()


def test_a_decorated_generator_takes_what_is_thrown_in_and_returns_its_value():
    @HpuAutocastMode(policy="torch-cpu")
    def gen():
        try:
            yield 1
        except KeyError:
            yield torch.is_autocast_enabled("cpu")
        return "done"

    g = gen()
    assert next(g) == 1 and g.throw(KeyError("k")) is True
    with pytest.raises(StopIteration) as stop:
        next(g)
    assert stop.value.value == "done" and not hpu_autocast.is_enabled()


def test_a_decorated_coroutine_runs_each_step_in_the_region_and_no_other_task():
    # Failed before: the coroutine's body ran uncast. Another task running while it is suspended
    # sees no region (regions are per context).
    import asyncio

    @HpuAutocastMode(policy="torch-cpu")
    async def cast(event):
        a = torch.randn(2, 2)
        before = torch.mm(a, a).dtype
        await event.wait()
        return before, torch.mm(a, a).dtype

    async def other(event):
        seen = torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype, hpu_autocast.is_enabled()
        event.set()
        return seen

    async def main():
        event = asyncio.Event()
        return await asyncio.gather(cast(event), other(event))

    ours, theirs = asyncio.run(main())
    assert ours == (torch.bfloat16, torch.bfloat16) and theirs == (torch.float32, False)


def test_a_decorated_async_generator_is_refused_at_decoration():
    async def agen():
        yield 1

    with pytest.raises(TypeError, match="agen is an async generator"):
        HpuAutocastMode()(agen)

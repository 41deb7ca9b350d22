"""HpuAutocastMode as a context manager and decorator: nesting, enabling, exceptions, threads,
the cast cache, and the state queries."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import hpu_autocast
from hpu_autocast import HpuAutocastMode, disable_casts, get_dtype, is_enabled

A, B = torch.randn(2, 3), torch.randn(3, 2)


def test_context_manager_and_decorator():
    with HpuAutocastMode():
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
        # Another policy inside: hpu has exp on the FP32 list, torch-cpu does not list it.
        x = torch.randn(3, dtype=torch.bfloat16)
        assert torch.exp(x).dtype == torch.bfloat16
        with HpuAutocastMode():
            assert torch.exp(x).dtype == torch.float32


def test_enabled_false_inside_turns_casting_off():
    with HpuAutocastMode():
        with HpuAutocastMode(enabled=False):
            assert torch.mm(A, B).dtype == torch.float32
            assert not is_enabled()
        assert torch.mm(A, B).dtype == torch.bfloat16
        with disable_casts():
            assert torch.mm(A, B).dtype == torch.float32
        assert is_enabled()


def test_exception_leaves_no_state():
    with pytest.raises(ZeroDivisionError):
        with HpuAutocastMode():
            with HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
                1 / 0
    assert not is_enabled() and get_dtype() is None
    assert torch.mm(A, B).dtype == torch.float32
    assert torch._C._len_torch_dispatch_stack() == 0
    with HpuAutocastMode():
        assert torch.mm(A, B).dtype == torch.bfloat16


def test_the_same_mode_object_cannot_be_entered_twice():
    mode = HpuAutocastMode()
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
    with HpuAutocastMode():
        inside.set()
        done.wait(5)
        assert torch.mm(A, B).dtype == torch.bfloat16
    t.join(5)
    assert seen == {"dtype": torch.float32, "enabled": False}


def test_a_region_in_another_thread_does_not_leak_here():
    barrier = threading.Barrier(2, timeout=5)

    def other():
        with HpuAutocastMode():
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
    from hpu_autocast._engine import current_engine

    lin = nn.Linear(4, 4)
    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu", cache_enabled=True):
        lin(torch.randn(2, 4))
        assert current_engine().cache
    assert not current_engine().cache


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

"""The C++ core (src/hpu_autocast/csrc/core.cpp): which calls it decides, which it hands to the
Python kernels, that the two share one cast cache, and how the engine is chosen.

Its results are checked where every result is: CI runs the whole suite once under each engine
(``.ci/run``: with the core built and ``hpu-autocast info`` saying it runs, then with
``HPU_AUTOCAST_ENGINE=python``), parity, real-model and fuzzer suites included. These tests pin what only the core has; they skip where it is not built.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import subprocess
import sys
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hpu_autocast
from hpu_autocast import HpuAutocastMode, with_lists
from hpu_autocast._engine import core as _core

needs_core = pytest.mark.skipif(_core.core is None, reason=f"engine: {_core.REASON}")


def _counts() -> dict:
    return _core.core.counts()


class _Counted:
    """How the calling thread's calls on the ops key went inside the block."""

    def __enter__(self) -> "_Counted":
        self._before = _counts()
        return self

    def __exit__(self, *exc) -> None:
        after = _counts()
        self.delta = {k: after[k] - self._before[k] for k in after}


class _NoOp(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_the_engine_attribute_names_the_engine_that_runs():
    assert hpu_autocast.ENGINE == ("c++" if _core.core is not None else "python")
    if os.environ.get("HPU_AUTOCAST_ENGINE") in ("c++", "python"):
        assert hpu_autocast.ENGINE == os.environ["HPU_AUTOCAST_ENGINE"]


def test_info_says_which_engine_runs_and_why(capsys):
    from hpu_autocast.cli import main

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"engine: {hpu_autocast.ENGINE} ({_core.REASON})" in out


@needs_core
@pytest.mark.parametrize("policy", ["torch-cpu", "hpu"])
def test_a_cast_op_is_decided_by_the_core(policy):
    a, b = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
    with HpuAutocastMode(policy=policy, device_type="cpu"):
        with _Counted() as c:
            y = torch.mm(a, b)
    assert y.dtype is torch.bfloat16
    assert c.delta == {"decided": 1, "passed": 0, "handed": 0}
    torch.testing.assert_close(y, (a.bfloat16() @ b.bfloat16()), rtol=0, atol=0)


@needs_core
def test_an_op_another_policy_registered_is_passed_on_by_the_core():
    x = torch.randn(4, 4)
    with HpuAutocastMode(policy="hpu", device_type="cpu"):
        pass  # registers hpu's kernels (acos among them), which torch-cpu does not list
    with HpuAutocastMode(policy="torch-cpu"):
        with _Counted() as c:
            y = torch.acos(x)
    assert y.dtype is torch.float32
    assert c.delta["passed"] >= 1 and c.delta["handed"] == 0


def _mm_in(run) -> tuple:
    """``run(f)`` runs ``f`` (an mm on fresh inputs) somewhere; returns its result's dtype and counts."""
    out = {}

    def f():
        with _Counted() as c:
            out["dtype"] = torch.mm(torch.randn(4, 4), torch.randn(4, 4)).dtype
        out["delta"] = c.delta

    run(f)
    return out["dtype"], out["delta"]


@needs_core
def test_calls_in_an_observing_region_go_to_the_python_kernels():
    with hpu_autocast.record(policy="torch-cpu") as rec:
        dtype, delta = _mm_in(lambda f: f())
    assert dtype is torch.bfloat16 and delta["handed"] == 1 and delta["decided"] == 0
    assert [r.op for r in rec.report().rows] == ["aten.mm.default"]


@needs_core
def test_calls_under_a_dispatch_mode_go_to_the_python_kernels():
    with HpuAutocastMode(policy="torch-cpu"), _NoOp():
        dtype, delta = _mm_in(lambda f: f())
    assert dtype is torch.bfloat16 and delta["handed"] == 1 and delta["decided"] == 0


@needs_core
def test_a_copied_context_goes_to_the_python_kernels_and_casts_as_its_frame_says():
    # The core's copy of the frame belongs to the context that set it; a copy of that context
    # (a new context object) holds the same frame, which the Python kernel reads.
    with HpuAutocastMode(policy="torch-cpu"):
        dtype, delta = _mm_in(lambda f: contextvars.copy_context().run(f))
    assert dtype is torch.bfloat16 and delta["handed"] == 1 and delta["decided"] == 0


@needs_core
def test_an_asyncio_task_outside_the_region_is_not_cast_while_another_task_is_inside_it():
    # Regions belong to the context that entered them (docs/design.md): task b, created before
    # task a entered its region, runs in the same thread while a is suspended inside the region.
    seen = {}

    async def a(entered: asyncio.Event, done: asyncio.Event):
        with HpuAutocastMode(policy="torch-cpu"):
            entered.set()
            await done.wait()
            seen["a"] = _mm_in(lambda f: f())

    async def b(entered: asyncio.Event, done: asyncio.Event):
        await entered.wait()
        seen["b"] = _mm_in(lambda f: f())
        done.set()

    async def main():
        entered, done = asyncio.Event(), asyncio.Event()
        await asyncio.gather(a(entered, done), b(entered, done))

    asyncio.run(main())
    assert seen["b"][0] is torch.float32 and seen["b"][1]["decided"] == 0
    assert seen["a"][0] is torch.bfloat16


@needs_core
def test_regions_in_two_threads_each_cast_by_their_own_frame():
    results, barrier = {}, threading.Barrier(2)

    def work(name, dtype):
        with HpuAutocastMode(dtype=dtype, policy="torch-cpu"):
            barrier.wait()
            results[name] = [torch.mm(torch.randn(4, 4), torch.randn(4, 4)).dtype for _ in range(200)]

    threads = [
        threading.Thread(target=work, args=("bf16", torch.bfloat16)),
        threading.Thread(target=work, args=("fp16", torch.float16)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results["bf16"]) == {torch.bfloat16} and set(results["fp16"]) == {torch.float16}


@needs_core
def test_a_rule_the_core_leaves_to_python_is_handed_over():
    # A named out= overload computes into a copy and writes back (_inplace): Python's to do.
    policy = with_lists(hpu_autocast.get_preset("torch-cpu"), lower=["aten.mm.out"], name="mm-out")
    a, b, out = torch.randn(4, 4), torch.randn(4, 4), torch.empty(4, 4)
    with HpuAutocastMode(policy=policy):
        with _Counted() as c:
            torch.mm(a, b, out=out)
    assert c.delta["handed"] == 1
    assert torch.equal(out, (a.bfloat16() @ b.bfloat16()).float())


@needs_core
def test_the_core_and_the_python_kernels_share_one_cast_cache():
    # A weight used by a call the core decides and by one it hands to Python (under a dispatch
    # mode) is cast once, as native autocast casts it once: one copy, one ToCopyBackward, and
    # native's gradient bit for bit.
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    xs = [torch.randn(64, 64) for _ in range(2)]

    def program(ctx):
        with ctx:
            y1 = torch.mm(xs[0], w)
            with _NoOp():
                y2 = torch.mm(xs[1], w)
            copies = {y1.grad_fn.next_functions[1][0], y2.grad_fn.next_functions[1][0]}
        (y1.float().square().sum() + y2.float().square().sum()).backward()
        grad, w.grad = w.grad, None
        return grad, len(copies)

    ours, ours_copies = program(HpuAutocastMode(policy="torch-cpu"))
    native, native_copies = program(torch.autocast("cpu", dtype=torch.bfloat16))
    assert ours_copies == native_copies == 1
    assert torch.equal(ours, native)


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


@pytest.mark.engine_independent
def test_an_unknown_engine_name_is_refused_naming_the_accepted_ones():
    r = _python("import hpu_autocast", HPU_AUTOCAST_ENGINE="fast")
    assert r.returncode != 0
    assert "HPU_AUTOCAST_ENGINE='fast': expected 'auto', 'c++' or 'python'" in r.stderr


@pytest.mark.engine_independent
def test_without_a_build_the_python_kernels_run_and_say_how_to_build_the_core(tmp_path):
    r = _python(
        "import hpu_autocast._engine.core as c; print(c.ENGINE); print(c.REASON)",
        HPU_AUTOCAST_ENGINE="auto",
        HPU_AUTOCAST_CORE_DIR=str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    engine, reason = r.stdout.splitlines()
    assert engine == "python" and "hpu-autocast build-core" in reason
    r = _python("import hpu_autocast", HPU_AUTOCAST_ENGINE="c++", HPU_AUTOCAST_CORE_DIR=str(tmp_path))
    assert r.returncode != 0 and "HPU_AUTOCAST_ENGINE=c++, but the C++ core is not built" in r.stderr


def test_a_build_is_found_only_for_the_torch_and_source_it_was_built_from():
    from hpu_autocast._engine import core_build as _core_build

    tag = _core_build.build_dir().name
    assert f"torch{torch.__version__}-" in tag and sys.implementation.cache_tag in tag
    assert _core_build.hashlib.sha256(_core_build.SOURCE.read_bytes()).hexdigest()[:12] in tag

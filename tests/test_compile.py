"""``torch.compile`` and the mode. The documented behaviour (docs/graphs.md):

* a compiled callable called inside a region runs its original code eagerly, under the policy:
  values equal the eager run under the mode, bit for bit, and no graph is compiled there;
* doing so leaves Dynamo as it was: the same callable compiles and runs compiled outside;
* the fast path is ``torch.compile(hpu_autocast.trace(...))``, tested in test_trace.py.

The last tests pin down torch's own behaviour that the package works around, so that a torch
release that changes it is noticed."""

import threading

import pytest
import torch
import torch._dynamo
from torch.utils._python_dispatch import TorchDispatchMode

from hpu_autocast import HpuAutocastMode, _compile_hooks
from hpu_autocast.trace import trace
from test_trace import example, mlp

# The lower dtype out of the last Linear, per policy: both put linear/addmm on the lower list.
POLICIES = ["torch-cpu", "hpu"]


class Backend:
    """A torch.compile backend that counts the graphs it compiles and the times they run."""

    def __init__(self, inner="eager"):
        self.inner = torch._dynamo.lookup_backend(inner)
        self.runs = []

    def __call__(self, gm, example_inputs):
        i = len(self.runs)
        self.runs.append(0)
        compiled = self.inner(gm, example_inputs)

        def run(*args):
            self.runs[i] += 1
            return compiled(*args)
        return run


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # also forgets the code objects Dynamo marked as skipped
    yield
    torch._dynamo.reset()


def stance():
    return torch._dynamo.eval_frame._stance.stance


def x():
    return example(mlp())


def eager_step(model, inp, policy, compiled=None):
    """Forward in the region, backward outside: output and gradients."""
    model.zero_grad()
    with HpuAutocastMode(policy=policy):
        y = (compiled or model)(inp)
    y.float().pow(2).mean().backward()
    return [y.detach()] + [p.grad.clone() for p in model.parameters()]


def assert_same(xs, ys):
    for a, b in zip(xs, ys, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


# -- the documented behaviour ------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("policy", POLICIES)
def test_compiled_model_inside_a_region_runs_eagerly_under_the_policy(backend, policy):
    model = mlp()
    counter = Backend(backend)
    compiled = torch.compile(model, backend=counter)
    got = eager_step(model, x(), policy, compiled)
    assert got[0].dtype == torch.bfloat16
    assert_same(got, eager_step(model, x(), policy))
    assert counter.runs == []  # nothing compiled inside the region
    assert stance() == "default"


@pytest.mark.parametrize("first", ["inside", "outside"])
def test_a_call_inside_a_region_leaves_the_compiled_model_compiled(first):
    model = mlp()
    counter = Backend()
    compiled = torch.compile(model, backend=counter)
    if first == "outside":
        compiled(x())
    with HpuAutocastMode(policy="torch-cpu"):
        assert compiled(x()).dtype == torch.bfloat16
    y = compiled(x())
    # One graph, compiled outside; it ran for every call outside (1 or 2), none inside.
    assert counter.runs == [2 if first == "outside" else 1]
    assert y.dtype == torch.float32 and torch.equal(y, model(x()))


class OtherThreadRegion:
    """A region in another thread, opened and closed on demand (``open`` waits until it is in)."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        with HpuAutocastMode(policy="hpu"):
            self.entered.set()
            self.release.wait(10)

    def open(self):
        self.thread.start()
        self.entered.wait(10)

    def close(self):
        self.release.set()
        self.thread.join()


def test_stance_is_counted_across_nesting_and_threads():
    other = OtherThreadRegion()
    with HpuAutocastMode(policy="hpu"):
        assert stance() == "force_eager"
        with HpuAutocastMode(enabled=False), HpuAutocastMode(policy="torch-cpu"):
            assert stance() == "force_eager"
        other.open()
    # This thread's region is gone, the other thread's is still open.
    assert stance() == "force_eager"
    other.close()
    assert stance() == "default"


def test_regions_ending_out_of_order_in_two_threads_leave_no_mode_flag_set():
    # torch keeps "a dispatch mode is active" in process-global flags that each mode's exit
    # restores to what its entry saw; this thread's region ends first, the other's last, so
    # torch alone would leave them set (and torch < 2.10's Dynamo would never compile again).
    from torch.utils import _python_dispatch

    other = OtherThreadRegion()
    with HpuAutocastMode(policy="hpu"):
        other.open()
    other.close()
    for name in _compile_hooks._MODE_FLAGS:
        assert getattr(_python_dispatch, name, False) is False, name
    counter = Backend()
    f = torch.compile(lambda t: (t * 2).sin(), backend=counter)
    f(torch.randn(3))
    assert counter.runs == [1]


def test_a_region_entered_inside_a_compiled_function_gives_eager_values():
    # Dynamo cannot trace the region (the package is on its skip list: it graph-breaks at
    # HpuAutocastMode.__init__ instead of tracing the policy machinery), so the function runs
    # eagerly, under the policy. Better: call the compiled function inside the region.
    model = mlp()
    counter = Backend()

    def f(inp):
        with HpuAutocastMode(policy="torch-cpu"):
            return model(inp)

    got = torch.compile(f, backend=counter)(x())
    with HpuAutocastMode(policy="torch-cpu"):
        ref = model(x())
    assert got.dtype == torch.bfloat16 and torch.equal(got, ref)
    from torch._dynamo import trace_rules

    assert trace_rules.check(HpuAutocastMode.__init__.__code__)
    assert stance() == "default"


def test_compiled_trace_is_the_fast_path():
    # What docs/graphs.md recommends for speed: the casts are in the graph, no mode at run time.
    model = mlp()
    counter = Backend("aot_eager")
    fast = torch.compile(trace(model, x(), policy="hpu"), backend=counter)
    got = fast(x())
    with HpuAutocastMode(policy="hpu"):
        ref = model(x())
    assert counter.runs == [1]
    assert got.dtype == torch.bfloat16 and torch.equal(got, ref)


# -- torch's behaviour underneath (a change here means docs/graphs.md needs a look) ------------

class NopDispatchMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 9),
                    reason="pins torch >= 2.9: on 2.6.0 torch._dynamo.reset() does not forget the skip")
def test_torch_skips_frames_under_a_dispatch_mode_and_remembers_it():
    # Under any non-infra dispatch mode Dynamo does not compile the frame, and it marks the code
    # object skipped for good: the compiled function then runs eagerly outside the mode too.
    # This is what the stance forced in a region avoids.
    counter = Backend()
    f = torch.compile(lambda t: (t * 2).sin(), backend=counter)
    with NopDispatchMode():
        f(torch.randn(3))
    f(torch.randn(3))
    assert counter.runs == []
    torch._dynamo.reset()
    f(torch.randn(3))
    assert counter.runs == [1]


def test_without_the_stance_the_engine_alone_gives_right_values(monkeypatch):
    # The same without the package's workaround: Dynamo skips the user's frames (the engine's
    # dispatch mode is on the stack), so values are still right; the skip is remembered.
    _compile_hooks._skip_our_files()  # keep the engine's own helpers out of the count
    monkeypatch.setattr(_compile_hooks, "region_entered", lambda: False)
    model = mlp()
    counter = Backend()
    compiled = torch.compile(model, backend=counter)
    with HpuAutocastMode(policy="torch-cpu"):
        got = compiled(x())
        ref = model(x())
    assert torch.equal(got, ref) and got.dtype == torch.bfloat16
    compiled(x())
    # No graph was ever compiled: the model's code was marked skipped inside the region, so
    # the call outside ran eagerly too.
    assert counter.runs == []

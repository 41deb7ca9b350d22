"""The Gaudi (HPU) glue, tested against a stand-in bridge (``_fake_habana``) since no Gaudi is
reachable here: detection, cache off, bfloat16 only, lazy mode (``mark_step``, no host
synchronisation added by the mode), ``wrap_in_hpu_graph`` capture/replay, and how everything
degrades without the bridge. Tensors stay on the CPU: what is tested is the glue, not Gaudi."""

import contextlib
import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import _fake_habana
from hpu_autocast import HpuAutocastMode, hpu

aten = torch.ops.aten
NOT_HPU = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def gaudi(monkeypatch):
    """The stand-in bridge, loaded (as after ``import habana_frameworks.torch.core``)."""
    return _fake_habana.install(monkeypatch)


@pytest.fixture
def no_gaudi():
    if hpu.hpu_importable():
        pytest.skip("a real habana_frameworks is installed here")


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 8, generator=g), torch.randint(0, 4, (32,), generator=g)


# The stand-in bridge has no HPU tensors: its tensors are on the CPU, so the regions here name
# the CPU as their device (on Gaudi, a region of the default policy casts HPU tensors).
ON_CPU = {"device_type": "cpu"}


def train(steps=3, **mode_kwargs):
    """A lazy-mode style loop: forward in the region, ``mark_step`` after backward and after the
    optimizer step, as Gaudi's guides place it."""
    mode_kwargs = {**ON_CPU, **mode_kwargs}
    model, (x, y) = mlp(), data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        with HpuAutocastMode(**mode_kwargs):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        hpu.mark_step()
        opt.step()
        hpu.mark_step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return losses


# -- detection, cache, dtype --------------------------------------------------------------


def test_detected_with_the_bridge(gaudi):
    assert hpu.backend_loaded() and hpu.hpu_importable()
    assert hpu.default_device() == "hpu"
    gaudi.available = False  # bridge installed, no card: torch.hpu.is_available() is False
    assert hpu.default_device() == NOT_HPU


def test_lazy_mode_asks_the_bridge_then_the_environment(monkeypatch):
    bridge = _fake_habana.install(monkeypatch)
    assert hpu.lazy_mode() is True
    bridge.lazy = False  # habana_frameworks.torch.utils.internal.is_lazy() says eager
    assert hpu.lazy_mode() is False

    monkeypatch.delitem(sys.modules, "habana_frameworks.torch.utils.internal")
    monkeypatch.delitem(sys.modules, "habana_frameworks.torch.utils")
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    assert hpu.lazy_mode() is True  # no is_lazy(): the older stacks' default, lazy
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert hpu.lazy_mode() is False


def test_cache_is_always_off_on_hpu(gaudi):
    # Seed 000: "autocast caching is permanently disabled on HPU" (graph mode dedups casts),
    # so even an explicit cache_enabled=True is overridden, for every region that casts HPU
    # tensors: the default device with the bridge loaded, or named.
    assert HpuAutocastMode().device_type == "hpu"
    assert HpuAutocastMode().cache_enabled is False
    assert HpuAutocastMode(cache_enabled=True).cache_enabled is False
    assert HpuAutocastMode(policy="torch-cpu", device_type="hpu", cache_enabled=True).cache_enabled is False


def test_a_cpu_region_caches_with_the_bridge_loaded(gaudi):
    # The cache rule is the HPU's, not the process's: a CPU region casts CPU tensors, which
    # Gaudi's graph mode never sees, so it caches as torch.autocast("cpu") does: a weight used
    # twice is cast once (one ToCopyBackward). It used to be turned off once the bridge loaded.
    x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
    for mode in (HpuAutocastMode(**ON_CPU), HpuAutocastMode(policy="torch-cpu")):
        assert mode.cache_enabled is True
        with mode:
            a, b = torch.mm(x, w), torch.mm(x, w)
        assert a.grad_fn.next_functions[1][0] is b.grad_fn.next_functions[1][0]
    # Asked off, it is off.
    with HpuAutocastMode(cache_enabled=False, **ON_CPU):
        a, b = torch.mm(x, w), torch.mm(x, w)
    assert a.grad_fn.next_functions[1][0] is not b.grad_fn.next_functions[1][0]


def test_cache_is_on_off_hpu_for_contrast(no_gaudi):
    x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
    with HpuAutocastMode(**ON_CPU):
        a, b = torch.mm(x, w), torch.mm(x, w)
    assert a.grad_fn.next_functions[1][0] is b.grad_fn.next_functions[1][0]  # one cached cast


@pytest.mark.parametrize("policy", ["hpu", "torch-cpu"])
def test_float16_refused_on_hpu_naming_the_accepted_dtype(gaudi, policy):
    # The stand-in is a first-generation Gaudi unless told otherwise: no float16 there, under
    # any policy, for a region that casts HPU tensors.
    assert torch.hpu.get_device_name() == "GAUDI"
    with pytest.raises(ValueError, match=r"float16 is not supported on a first-generation Gaudi.*bfloat16"):
        HpuAutocastMode(torch.float16, policy=policy, device_type="hpu")
    HpuAutocastMode(torch.bfloat16, policy=policy, device_type="hpu")
    HpuAutocastMode(torch.float16, policy=policy, enabled=False)  # a disabled region checks nothing


def test_a_cpu_region_may_use_float16_with_the_bridge_loaded(gaudi):
    # The dtype rule is the HPU's: a torch-cpu region (device cpu) in a process that loaded the
    # bridge casts CPU tensors, and float16 works there as under torch.autocast("cpu"). It was
    # refused with "dtype=float16 is not supported on HPU".
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with HpuAutocastMode(torch.float16, policy="torch-cpu") as mode:
        out = torch.mm(a, b)
    assert mode.device_type == "cpu" and out.dtype == torch.float16
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.equal(out, torch.mm(a, b))
    # The hpu preset casts CPU tensors to float16 on a first-generation Gaudi too: the refusal is
    # the HPU device's, not the preset's.
    with HpuAutocastMode(torch.float16, **ON_CPU):
        assert torch.mm(a, b).dtype == torch.float16


@pytest.mark.parametrize("generation", ["GAUDI2", "GAUDI3"])
@pytest.mark.parametrize("policy", ["hpu", "hmp"])
def test_float16_is_accepted_on_gaudi_2_and_later(monkeypatch, generation, policy):
    # The bridge takes the region's dtype from get_autocast_dtype("hpu"); Gaudi 2 and later run
    # float16 (the bridge's tests add torch.half where not is_gaudi1()). Was: refused everywhere.
    _fake_habana.install(monkeypatch, device_name=generation)
    mode = HpuAutocastMode(torch.float16, policy=policy, device_type="hpu")
    assert mode.dtype == torch.float16 and mode.cache_enabled is False


def test_the_device_rules_hold_without_the_bridge(no_gaudi):
    # Off Gaudi, a region that names the HPU takes float16 (there is no first-generation Gaudi to
    # refuse it) and does not cache: the rules are the device's. Was: float16 refused.
    for policy in ("hpu", "hmp", "hmp-O2", "torch-cpu"):
        assert HpuAutocastMode(torch.float16, policy=policy, device_type="hpu").dtype == torch.float16
    assert HpuAutocastMode(policy="torch-cpu", device_type="hpu").cache_enabled is False
    assert HpuAutocastMode(torch.float16, policy="torch-cpu").cache_enabled is True


@pytest.mark.parametrize("policy", ["hpu", "hmp"])
def test_float16_under_a_gaudi_preset_off_gaudi_casts_as_the_lists_say(no_gaudi, policy):
    # Held-back case: float16 under hpu off Gaudi. The lists are dtype-blind: mm lower (float16),
    # log FP32 in both presets' lists; control: the hand-cast call.
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with HpuAutocastMode(torch.float16, policy=policy, device_type="cpu"):
        mm, log = torch.mm(a, b), torch.log(a.abs().half())
    assert torch.equal(mm, torch.mm(a.half(), b.half())) and log.dtype == torch.float32


# -- lazy mode: mark_step, no host synchronisation -------------------------------------------


def test_training_loop_with_mark_step_matches_the_loop_without_the_bridge(monkeypatch):
    baseline = train()
    bridge = _fake_habana.install(monkeypatch)
    losses = train()
    # Two mark_steps per step, passed through with the bridge's defaults.
    assert bridge.calls == [("mark_step", "", False)] * 6
    # Bit for bit: every weight of the MLP is used once per step, so the cast cache being off
    # on HPU changes no value (it would only merge the casts of a weight used twice).
    assert [loss.item() for loss in losses] == [loss.item() for loss in baseline]
    assert losses[-1] < losses[0]


_SYNC_OPS = {
    aten._local_scalar_dense.default,
    aten.is_nonzero.default,
    aten.nonzero.default,
    aten.nonzero_static.default,
    aten.equal.default,
    aten.item.default,
}
_SYNC_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__")


class SyncGuard(TorchDispatchMode):
    """Records what would make the host wait for the device: ATen ops that read a value
    (``_local_scalar_dense``, ``is_nonzero``, ``nonzero``, ``equal``), copies from a device to the
    CPU, and the Tensor methods that return host data. On the CPU these cost nothing, so they
    are counted rather than timed. Entered inside a region, it sits above the library's dispatch mode."""

    def __init__(self):
        super().__init__()
        self.seen = []
        self.ops = set()  # everything that passed, to show the guard saw the step

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.add(func)
        if func in _SYNC_OPS:
            self.seen.append(str(func))
        elif (
            func is aten._to_copy.default
            and args[0].device.type != "cpu"
            and torch.device(kwargs.get("device", args[0].device)).type == "cpu"
        ):
            self.seen.append("to cpu")  # a device-to-host copy (never, with CPU tensors)
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def methods(self):
        saved = {n: torch.Tensor.__dict__.get(n) for n in _SYNC_METHODS}

        def recording(name, orig):
            def method(t, *a, **k):
                self.seen.append(f"Tensor.{name}")
                return orig(t, *a, **k)

            return method

        try:
            for n in _SYNC_METHODS:
                setattr(torch.Tensor, n, recording(n, getattr(torch.Tensor, n)))
            yield
        finally:
            for n, orig in saved.items():
                if orig is None:
                    delattr(torch.Tensor, n)
                else:
                    setattr(torch.Tensor, n, orig)


def guarded_step(region):
    model, (x, y) = mlp(), data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = SyncGuard()
    with guard.methods():
        with region:
            with guard:  # inside the region: above the library's modes
                loss = F.cross_entropy(model(x), y)
        with guard:
            loss.backward()
            hpu.mark_step()
            opt.step()
            hpu.mark_step()
    return guard


def test_the_guard_sees_host_synchronisation():
    x = torch.randn(3)
    guard = SyncGuard()
    with guard.methods(), HpuAutocastMode(**ON_CPU), guard:
        x[0].item(), bool(x[0]), x.nonzero(), x.tolist(), x.cpu(), torch.equal(x, x)
    assert {
        "Tensor.item",
        "Tensor.__bool__",
        "Tensor.tolist",
        "Tensor.cpu",
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten.equal.default",
    } <= set(guard.seen)


@pytest.mark.parametrize("kwargs", [{}, {"record": True, "verbose": True}], ids=["plain", "record"])
def test_the_mode_adds_no_host_synchronisation(gaudi, kwargs):
    # The same step with and without the mode; whatever the model and optimizer do themselves
    # is in both (nothing here), and the mode must add nothing, recording or not.
    without = guarded_step(contextlib.nullcontext())
    with_mode = guarded_step(HpuAutocastMode(**kwargs, **ON_CPU))
    assert with_mode.seen == without.seen == []
    # The guard did see the step, the mode's casts included (the first Linear in bfloat16).
    assert {aten.addmm.default, aten.mm.default} <= without.ops
    assert aten._to_copy.default in with_mode.ops - without.ops
    assert gaudi.names() == ["mark_step"] * 4


# -- HPU graphs ------------------------------------------------------------------------------
# The stand-in keys graphs as the bridge does (input shapes and views, native HPU autocast's
# state) and replays the captured ATen graph without running the module's Python, so a graph
# keyed on the inputs alone would replay one region's casts under another.

#: Region states a wrapped module may be called in: (name, a fresh context for it).
REGIONS = {
    "hpu bf16": lambda: HpuAutocastMode(**ON_CPU),
    "outside": contextlib.nullcontext,
    "torch-cpu bf16": lambda: HpuAutocastMode(policy="torch-cpu"),  # layer_norm in float32 here
    "torch-cpu fp16": lambda: HpuAutocastMode(torch.float16, policy="torch-cpu"),
    "disabled": lambda: _nested(HpuAutocastMode(**ON_CPU), HpuAutocastMode(enabled=False)),
}


@contextlib.contextmanager
def _nested(*modes):
    with contextlib.ExitStack() as stack:
        for m in modes:
            stack.enter_context(m)
        yield


def graphed(**kwargs):
    """An MLP behind a LayerNorm (its float32 input lowered under hpu, left alone under
    torch-cpu), in eval mode, and a copy of it wrapped in an HPU graph."""
    plain = torch.nn.Sequential(torch.nn.LayerNorm(8), mlp()).eval()
    return plain, hpu.wrap_in_hpu_graph(copy.deepcopy(plain), **kwargs)


def run(module, region, x):
    with torch.no_grad(), REGIONS[region]():
        return module(x).clone()  # the bridge returns its static outputs: a replay overwrites them


def test_the_stand_in_replays_without_running_python(gaudi):
    # What makes the stand-in realistic: the module's forward runs once, at capture; a replay
    # copies the call's inputs into the captured ones (the bridge's copy_to: the tensors of the
    # capturing call, which a replay overwrites), runs the captured ATen graph, and the same
    # output tensor comes back, overwritten.
    calls = []
    model = mlp().eval()
    forward = model.forward
    model.forward = lambda x: (calls.append(x.shape), forward(x))[1]
    wrapped = hpu.wrap_in_hpu_graph(model)
    x, _ = data()
    x2 = x * 2
    with torch.no_grad():
        first = wrapped(x)
        ref = first.clone()
        second = wrapped(x2)
    assert calls == [x.shape] and second is first and not torch.equal(second, ref)
    assert torch.equal(x, x2)  # the capture's input now holds the replay's
    with torch.no_grad():
        assert torch.equal(second, forward(x2))
    assert gaudi.names() == ["wrap", "capture", "replay"]


def test_in_eager_mode_the_module_runs_without_graphs_with_one_warning(monkeypatch):
    # Held-back case: bridge 1.19 exports wrap_in_hpu_graph in lazy mode only. Was: an
    # AttributeError from the glue. Now the module runs as it is, each call with its region's
    # casts (control: the unwrapped module in the same region), after one warning.
    bridge = _fake_habana.install(monkeypatch, lazy=False)
    assert not hasattr(torch.hpu, "wrap_in_hpu_graph")
    plain = torch.nn.Sequential(torch.nn.LayerNorm(8), mlp()).eval()
    model = copy.deepcopy(plain)
    with pytest.warns(RuntimeWarning, match=r"no wrap_in_hpu_graph in eager mode.*PT_HPU_LAZY_MODE=1"):
        wrapped = hpu.wrap_in_hpu_graph(model)
    assert wrapped is model
    x, _ = data()
    for region in (HpuAutocastMode(torch.bfloat16, **ON_CPU), contextlib.nullcontext()):
        with torch.no_grad(), region:
            assert torch.equal(wrapped(x), plain(x))
    wrapped.clear_cache()  # code written for graphs keeps working
    assert bridge.names() == []


@pytest.mark.parametrize("later", [r for r in REGIONS if r != "hpu bf16"])
def test_a_graph_captured_in_a_region_is_not_replayed_in_another_state(gaudi, later):
    # Wrapped and first called in a bfloat16 hpu region, then called outside any region, under
    # another policy or dtype, or in a disabled region: each call computes what the plain module
    # computes there, bit for bit, because each state gets a capture of its own. (Keyed on the
    # inputs alone, as the bridge keys them, the later calls replayed the bfloat16 graph.)
    plain, wrapped = graphed()
    x, _ = data()
    for region in ("hpu bf16", later, "hpu bf16", later):
        out, ref = run(wrapped, region, x), run(plain, region, x)
        assert out.dtype == ref.dtype and torch.equal(out, ref), region
    assert gaudi.calls[1:] == [("capture", 0), ("capture", 1), ("replay", 0), ("replay", 1)]


def test_one_capture_per_region_state_and_input_shape(gaudi):
    plain, wrapped = graphed(disable_tensor_cache=True)
    x, _ = data()
    for _ in range(2):
        for region in REGIONS:
            for inputs in (x, x[:4]):
                out, ref = run(wrapped, region, inputs), run(plain, region, inputs)
                assert out.dtype == ref.dtype and torch.equal(out, ref), region
    # Five states x two shapes, less one: no region and a disabled one cast nothing alike and
    # share their graphs. Keyword arguments pass through to the bridge.
    assert gaudi.calls[0] == ("wrap", "Sequential", dict(asynchronous=False, disable_tensor_cache=True))
    assert gaudi.names().count("capture") == 8 and gaudi.names().count("replay") == 12
    assert [run(wrapped, r, x).dtype for r in REGIONS] == [
        torch.bfloat16,
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float32,
    ]


def test_graphs_past_max_graphs_run_uncaptured_with_their_casts(gaudi):
    plain, wrapped = graphed(max_graphs=1)
    x, _ = data()
    for region in ("hpu bf16", "outside", "hpu bf16", "outside"):
        out, ref = run(wrapped, region, x), run(plain, region, x)
        assert out.dtype == ref.dtype and torch.equal(out, ref), region
    assert gaudi.names()[1:] == ["capture", "uncached", "replay", "uncached"]
    wrapped.clear_cache()  # the bridge's: frees the graphs
    run(wrapped, "outside", x)
    assert gaudi.calls[-1] == ("capture", 1)


def test_an_observing_region_runs_the_module_itself(gaudi):
    # A replay runs no Python, so an observer would see none of the module's calls: in a region
    # with an observer the module runs uncaptured, and the observer sees its casts.
    plain, wrapped = graphed()
    x, _ = data()
    run(wrapped, "hpu bf16", x)
    events = []
    with torch.no_grad(), HpuAutocastMode(observer=events.append, **ON_CPU):
        out = wrapped(x)
    assert torch.equal(out, run(plain, "hpu bf16", x))
    assert any(e.casts for e in events) and {str(e.op) for e in events} >= {"aten.linear.default"}
    assert gaudi.names() == ["wrap", "capture"]  # no replay, no second capture


def test_without_the_region_keyword_the_module_is_unchanged(gaudi):
    # The keyword that carries the region's state to the bridge never reaches forward, and the
    # bridge's own keywords pass through.
    plain, wrapped = graphed()
    x, _ = data()
    with torch.no_grad():
        assert torch.equal(wrapped(x, bypass_hpu_graphs=True), plain(x))
    assert gaudi.names() == ["wrap", "bypass"]


# -- without the bridge ----------------------------------------------------------------------


def test_without_the_bridge_everything_degrades(no_gaudi):
    assert not hpu.backend_loaded() and not hpu.lazy_mode()
    assert hpu.default_device() == NOT_HPU
    hpu.mark_step()  # nothing to flush, nothing raised
    assert HpuAutocastMode().cache_enabled is True
    with pytest.raises(ModuleNotFoundError, match=r"habana_frameworks\.torch.*not installed"):
        hpu.wrap_in_hpu_graph(mlp())


_RAISING = 'raise ImportError("stand-in: habana_frameworks must not be imported")\n'


def test_installed_but_not_loaded_is_not_imported_by_the_mode(tmp_path, monkeypatch, machine_device):
    # A findable habana_frameworks that fails if imported: the mode, mark_step and lazy_mode
    # must not touch it; default_device, which asks for it, warns and falls back.
    if "habana_frameworks" in sys.modules:
        pytest.skip("a habana_frameworks is loaded in this process (gaudi-check loads the bridge first)")
    (tmp_path / "habana_frameworks").mkdir()
    (tmp_path / "habana_frameworks" / "__init__.py").write_text(_RAISING)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert hpu.hpu_importable() and not hpu.backend_loaded()
    with HpuAutocastMode() as mode:  # not loaded: not on HPU, on the machine's device
        cpu_mm = torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype
    assert mode.device_type == machine_device and mode.cache_enabled is True
    assert cpu_mm == (torch.bfloat16 if machine_device == "cpu" else torch.float32)
    hpu.mark_step()
    assert hpu.lazy_mode() is False
    assert "habana_frameworks" not in sys.modules
    with pytest.warns(RuntimeWarning, match="did not import"):
        assert hpu.default_device() == NOT_HPU


@pytest.mark.engine_independent
def test_importing_the_library_does_not_import_the_bridge(tmp_path):
    (tmp_path / "habana_frameworks").mkdir()
    (tmp_path / "habana_frameworks" / "__init__.py").write_text(_RAISING)
    code = textwrap.dedent("""
        import sys, torch, hpu_autocast
        with hpu_autocast.HpuAutocastMode():
            torch.mm(torch.randn(2, 2), torch.randn(2, 2))
        hpu_autocast.hpu.mark_step()
        assert hpu_autocast.hpu.hpu_importable()
        assert not [m for m in sys.modules if m.startswith("habana_frameworks")]
    """)
    env_path = [str(tmp_path)] + sys.path
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in env_path if p)},
    )
    assert r.returncode == 0, r.stderr

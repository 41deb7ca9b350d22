"""hpu_autocast.testing: check_policy's deviations, the strategies, the pytest fixture."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import hpu_autocast
from hpu_autocast import CastPolicy, HpuAutocastMode, Policy
from hpu_autocast.testing import (
    Deviation,
    Deviations,
    Kind,
    PolicyViolation,
    assert_follows_policy,
    check_policy,
    eligible_tensors,
    inputs_for,
    model_inputs,
    policies,
    watch_policy,
)

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
aten = torch.ops.aten
#: The presets a region on this machine casts for (the CUDA and XPU ones need their device).
PRESETS = [n for n in hpu_autocast.preset_names() if hpu_autocast.get_preset(n).device_type in (None, "cpu")]
FAST = settings(max_examples=15, deadline=None)


@pytest.fixture(autouse=True)
def without_a_gpu(monkeypatch):
    # hpu_autocast.testing follows the machine's device (check_policy's region, the strategies'
    # tensors: a GPU's where there is one). These tests check it on CPU models and tensors, as on
    # a machine without a GPU, and its defaults with them (the pytest fixture's, the example's).
    from hpu_autocast._facts import devices as _devices

    monkeypatch.setattr(_devices, "_cuda", False)


# --- a small model with a path that can be made float64 ------------------------------------------
class MLP(nn.Module):
    def __init__(self, d: int, float64: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.float64 = float64
        if float64:
            self.proj.double()

    def forward(self, x):
        h = F.relu(self.fc(x))
        if self.float64:  # the accident: a float64 layer deep inside, its result cast back
            return self.proj(h.double()).float()
        return self.proj(h)


class Layer(nn.Module):
    def __init__(self, d: int, float64: bool = False) -> None:
        super().__init__()
        self.mlp = MLP(d, float64)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.mlp(x))


class Encoder(nn.Module):
    def __init__(self, d: int, float64_at=None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(d, i == float64_at) for i in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Model(nn.Module):
    def __init__(self, float64_at=None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = Encoder(8, float64_at)
        self.head = nn.Linear(8, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.encoder(x)), y)


def _xy(n: int = 5):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def _step(model):
    def step(x, y):
        loss = model(x, y)
        loss.backward()
        return loss

    return step


# --- the acceptance pair -------------------------------------------------------------------------
def test_a_float64_layer_deep_inside_is_reported_with_its_op_why_and_module_path():
    found = check_policy(Model(float64_at=1), *_xy(), policy="hpu")
    # Exactly the float64 layer's linear: its input is the model's own cast (relu's bf16 output
    # made float64 in the MLP), so it runs in float64 where hpu lists linear as lower.
    assert str(found) == (
        "1 deviation from policy 'hpu' (bf16):\n"
        "  dtype  encoder.layers.1.mlp.proj  aten.linear.default  f64,f64,f64 -> f64, policy bf16: "
        "the model's own cast (bf16 -> f64 in encoder.layers.1.mlp)"
    )
    (d,) = found
    assert (d.kind, d.op, d.module, d.why) == (
        Kind.DTYPE,
        aten.linear.default,
        "encoder.layers.1.mlp.proj",
        "the model's own cast",
    )
    assert (d.inputs, d.compute, d.expected) == ((torch.float64,) * 3, torch.float64, torch.bfloat16)


@pytest.mark.parametrize("policy", PRESETS)
def test_a_clean_model_reports_nothing(policy):
    found = check_policy(_step(Model()), *_xy(), policy=policy)
    assert str(found) == f"no deviations from policy {policy!r} (bf16)"
    assert not found and found.output.dtype == torch.float32  # cross_entropy: fp32 on every list


def test_backward_calls_of_the_float64_path_are_reported_as_backward():
    found = check_policy(_step(Model(float64_at=1)), *_xy(), policy="torch-cpu")
    # torch-cpu lists mm too: the float64 layer's two backward matmuls (grad of input, of weight).
    assert [(d.module, str(d.op), d.why) for d in found] == [
        ("encoder.layers.1.mlp.proj", "aten.linear.default", "the model's own cast"),
        ("(backward)", "aten.mm.default", "float64 inputs"),
        ("(backward)", "aten.mm.default", "the model's own cast"),
    ]
    assert found[1].source == "parameter encoder.layers.1.mlp.proj.weight"


# --- each kind, provoked -------------------------------------------------------------------------
class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 2.0, dtype=torch.float64))

    def forward(self, x):
        return x * self.scale


def test_float64_from_a_buffer_names_the_buffer():
    found = check_policy(Scaled(), torch.ones(3, 4))
    # hpu lists mul as lower: x is cast to bf16, the float64 buffer is not, the product is f64.
    assert str(found) == (
        "1 deviation from policy 'hpu' (bf16):\n"
        "  dtype  (root)  aten.mul.Tensor  f32,f64 -> f64, policy bf16: float64 inputs (buffer scale)"
    )


def test_float64_from_the_caller_names_the_input():
    x = torch.randn(3, 3, dtype=torch.float64)
    (d,) = check_policy(lambda a: torch.mm(a, a), x)
    assert (d.op, d.module, d.why, d.source) == (
        aten.mm.default,
        None,
        "float64 inputs",
        "the caller's input inputs[0]",
    )
    assert (
        str(d)
        == "dtype  -  aten.mm.default  f64,f64 -> f64, policy bf16: float64 inputs (the caller's input inputs[0])"
    )


def test_a_policy_default_is_checked_like_a_list():
    # hmp-O2 runs every op on no list in float32 (its default): relu of a float64 value did not.
    found = check_policy(lambda x: torch.relu(x.double()), torch.randn(3), policy="hmp-O2")
    assert str(found) == (
        "1 deviation from policy 'hmp-O2' (bf16):\n"
        "  dtype  -  aten.relu.default  f64 -> f64, policy f32: the model's own cast "
        "(f32 -> f64 outside modules)"
    )
    assert not check_policy(lambda x: torch.relu(x.double()), torch.randn(3), policy="hpu")  # relu: on no list


def test_integer_inputs_with_a_floating_result():
    # mul is lower under hpu; an integer tensor times a Python float has no floating tensor to
    # cast, and computes in float32. An integer product is exact: not reported.
    found = check_policy(lambda t: (t * 0.5, t * 2), torch.arange(4))
    assert str(found) == (
        "1 deviation from policy 'hpu' (bf16):\n  dtype  -  aten.mul.Tensor  i64 -> f32, policy bf16: integer inputs"
    )


def test_explicit_dtype():
    # softmax is lower under hpu; under a policy that leaves calls with dtype= alone (torch.amp's
    # documented rule), dtype= wins and the check says why.

    leave = dataclasses.replace(hpu_autocast.get_preset("hpu"), name="hpu (leave)", explicit_dtype="leave")
    found = check_policy(lambda x: torch.softmax(x, -1, dtype=torch.float32), torch.randn(2, 3), policy=leave)
    assert [(str(d.op), d.why, d.compute, d.expected) for d in found] == [
        ("aten.softmax.int", "explicit dtype", torch.float32, torch.bfloat16)
    ]
    assert not check_policy(
        lambda x: torch.softmax(x, -1, dtype=torch.float32), torch.randn(2, 3), ignore=["explicit dtype"], policy=leave
    )
    # hpu casts the input as Gaudi's bridge does: the call follows the policy.
    assert not check_policy(lambda x: torch.softmax(x, -1, dtype=torch.float32), torch.randn(2, 3))


class Guarded(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.how = how

    def forward(self, x):
        off = torch.autocast("cpu", enabled=False) if self.how == "torch" else hpu_autocast.disable_casts()
        with off:
            return self.inner(x)


@pytest.mark.parametrize("how, op", [("torch", "linear"), ("hpu_autocast", "addmm")])
def test_disabled_block(how, op):
    found = check_policy(Guarded(how), torch.randn(2, 4), policy="torch-cpu")
    # A torch.autocast(enabled=False) block of the region: the engine reports the linear the
    # model called ("ineligible: disabled"). A disabled region of its own (disable_casts) makes
    # no events: the call is seen below the engine, as the addmm linear decomposes into, which
    # torch-cpu lists too. Either ran in float32.
    assert str(found) == (
        "1 deviation from policy 'torch-cpu' (bf16):\n"
        f"  dtype  inner  aten.{op}.default  f32,f32,f32 -> f32, policy bf16: disabled block"
    )


def test_rounded_input_from_the_models_own_cast():
    found = check_policy(lambda x: torch.exp(F.relu(x.bfloat16())), torch.randn(4))
    # exp is fp32 under hpu; its input was rounded by the model, passed through relu (unlisted).
    assert str(found) == (
        "1 deviation from policy 'hpu' (bf16):\n"
        "  rounded  -  aten.exp.default  bf16 -> f32, policy f32: the model's own cast "
        "(self: f32 -> bf16 outside modules)"
    )


def test_rounded_input_from_a_lower_precision_parameter():
    emb = nn.Embedding(10, 4).bfloat16()
    (d,) = check_policy(emb, torch.tensor([[1, 2, 3]]))
    assert (d.kind, d.op, d.why, d.source) == (
        Kind.ROUNDED,
        aten.embedding.default,
        "lower-precision inputs",
        "weight: parameter weight",
    )


def test_lower_precision_made_by_the_policy_is_not_rounding():
    # linear (lower) makes bf16 logits; cross_entropy (fp32) receives them: the policy's intent.
    model = nn.Linear(4, 3)
    assert not check_policy(lambda x, y: F.cross_entropy(model(x), y), torch.randn(2, 4), torch.tensor([0, 2]))


class Ema(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x):
        self.ema = 0.9 * self.ema + 0.1 * x.mean(0)  # rebinding: the buffer takes mul's dtype
        return x


class SkipsUnderAutocast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        if not torch.is_autocast_enabled(x.device.type):
            self.count += 1
        return x


def test_write_cast():
    m = Ema()
    found = check_policy(m, torch.randn(3, 4))
    # mul is lower under hpu: the new average is bf16, and so is the buffer now.
    assert str(found) == (
        "1 deviation from policy 'hpu' (bf16):\n  write  (root)  -  f32 -> bf16: write cast (buffer ema)"
    )
    assert m.ema.dtype == torch.bfloat16  # the state left is the mode run's


def test_write_lost():
    m = SkipsUnderAutocast()
    (d,) = check_policy(m, torch.randn(2))
    assert (d.kind, d.why, d.source, d.module) == (Kind.WRITE, "write lost", "buffer count", "")
    assert m.count.item() == 0  # the float32 run's write was put back


def test_inf_nan_the_float32_run_does_not_have():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    x = torch.full((2, 8), 300.0)
    with torch.no_grad():
        model[0].weight.fill_(300.0)
    found = check_policy(model, x, dtype=torch.float16, policy="torch-cpu")
    # 8 * 300 * 300 = 720000 overflows float16 (max 65504) in the addmm linear decomposes to.
    assert str(found) == (
        "1 deviation from policy 'torch-cpu' (f16):\n"
        "  non-finite  0  aten.addmm.default  f16,f16,f16 -> f16: inf/nan (output out)"
    )
    assert not check_policy(model, x, dtype=torch.float16, policy="torch-cpu", ignore=["non-finite"])


def test_a_run_without_reference_checks_only_the_events():
    m = SkipsUnderAutocast()
    assert not check_policy(m, torch.randn(2), reference=False)
    assert m.count.item() == 0


def test_assert_follows_policy():
    x = torch.randn(2, 4)
    out = assert_follows_policy(nn.Linear(4, 4), x, policy="torch-cpu")
    assert out.dtype == torch.bfloat16
    with pytest.raises(PolicyViolation, match="disabled block") as info:
        assert_follows_policy(Guarded("torch"), x, policy="torch-cpu")
    assert isinstance(info.value, AssertionError) and len(info.value.deviations) == 1


def test_watch_policy_counts_repeated_calls_once():
    model = Guarded("torch")
    with watch_policy(policy="torch-cpu", modules={"model": model}) as w:
        for _ in range(3):
            model(torch.randn(2, 4))
    assert str(w.deviations) == (
        "1 deviation from policy 'torch-cpu' (bf16):\n"
        "  dtype  model.inner  aten.linear.default  f32,f32,f32 -> f32, policy bf16: disabled block, 3 calls"
    )
    assert isinstance(w.mode, HpuAutocastMode)


def test_deviation_strings():
    d = Deviation(
        Kind.DTYPE,
        aten.mm.default,
        "a.b",
        "float64 inputs",
        (torch.float64, torch.float32),
        torch.float64,
        torch.bfloat16,
        "buffer a.b.s",
        2,
    )
    assert str(d) == "dtype  a.b  aten.mm.default  f64,f32 -> f64, policy bf16: float64 inputs (buffer a.b.s), 2 calls"
    assert str(Deviations([], "hpu", torch.bfloat16)) == "no deviations from policy 'hpu' (bf16)"


# --- strategies ----------------------------------------------------------------------------------
@FAST
@given(policy=policies())
def test_drawn_policies_are_valid_and_run(policy):
    assert isinstance(policy, Policy)
    assert all(isinstance(a, CastPolicy) for a in policy.table.values())
    assert policy.input_only <= set(policy.table) and set(policy.banned) <= set(policy.table)
    x = torch.randn(2, 2)
    found = check_policy(lambda a: torch.mm(a, a), x, policy=policy, dtype=policy.dtypes[0], reference=False)
    assert not found  # float32 inputs of a listed op are always cast to its dtype


@FAST
@given(
    policy=policies(presets=[], ops=[aten.mul.Tensor, aten.add.Tensor, aten.exp.default], max_changes=3), data=st.data()
)
def test_drawn_policies_are_followed(policy, data):
    # Any policy over these three ops: each runs in the dtype its list gives, or is unlisted.
    x = data.draw(eligible_tensors(dtypes=[torch.float32]), label="x")
    with watch_policy(policy=policy) as w:
        out = {"mul": torch.mul(x, x), "add": torch.add(x, x), "exp": torch.exp(x)}
    assert not w.deviations
    for name, op in (("mul", aten.mul.Tensor), ("add", aten.add.Tensor), ("exp", aten.exp.default)):
        action = policy.table.get(op)
        expected = {CastPolicy.LOWER: torch.bfloat16}.get(action, torch.float32)
        assert out[name].dtype == expected, (name, action)


@FAST
@given(data=st.data())
def test_eligible_tensors(data):
    # The strategy made in the test: its default device is the one the region has then (here the
    # CPU, without_a_gpu), not the one it had when this module was imported.
    t = data.draw(eligible_tensors(max_dims=2), label="t")
    assert t.dtype in (torch.float32, torch.bfloat16, torch.float16) and t.dim() <= 2
    assert t.device.type == "cpu"  # the region's default device here
    assert hpu_autocast.policies.rules.is_eligible(t, t.device.type)


@pytest.mark.parametrize(
    "op",
    [
        aten.mm.default,
        aten.addmm.default,
        aten.linear.default,
        aten.conv2d.default,
        aten.layer_norm.default,
        aten.scaled_dot_product_attention.default,
        aten.embedding.default,
        aten.softmax.int,
        aten.atan2.default,
    ],
    ids=str,
)
def test_inputs_for_are_accepted(op):
    @settings(max_examples=8, deadline=None)
    @given(call=inputs_for(op))
    def runs(call):
        args, kwargs = call
        out = op(*args, **kwargs)
        assert isinstance(out, torch.Tensor)

    runs()


def test_inputs_for_an_op_with_no_rule():
    with pytest.raises(
        ValueError,
        match=r"inputs_for\(aten.reflection_pad1d.default\): no rule for a required "
        r"argument padding: List\[int\]",
    ):
        inputs_for(aten.reflection_pad1d.default)


@FAST
@given(data=st.data())
def test_model_inputs_vary_batch_and_sequence(data):
    example = {
        "ids": torch.randint(3, 9, (2, 5)),
        "mask": torch.ones(2, 5, dtype=torch.bool),
        "labels": torch.tensor([0, 1]),
        "x": torch.randn(2, 5, 4),
    }
    drawn = data.draw(model_inputs(example, batch=(1, 4), seq=(1, 16)))
    b, s = drawn["ids"].shape
    assert 1 <= b <= 4 and 1 <= s <= 16
    assert drawn["mask"].shape == (b, s) and drawn["labels"].shape == (b,) and drawn["x"].shape == (b, s, 4)
    assert drawn["ids"].min() >= 3 and drawn["ids"].max() <= 8  # token ids stay in the example's range
    assert drawn["labels"].max() <= 1 and drawn["x"].dtype == torch.float32


# --- imports and the pytest plugin ---------------------------------------------------------------
def _imports(code: str) -> set:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": ""},
    )
    return set(out.stdout.split())


@pytest.mark.engine_independent
def test_importing_testing_or_the_plugin_does_not_import_hypothesis():
    # One interpreter: the plugin alone (what pytest loads in every run) imports neither torch
    # nor hypothesis; hpu_autocast.testing imports torch, and hypothesis only for a strategy.
    loaded = _imports(
        "import pytest_hpu_autocast, sys\n"
        "assert 'torch' not in sys.modules and 'hypothesis' not in sys.modules\n"
        "import hpu_autocast.testing"
    )
    assert "pytest_hpu_autocast" in loaded and "hpu_autocast.testing" in loaded and "hypothesis" not in loaded


def test_the_plugin_is_an_entry_point():
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\npytest_hpu_autocast = "pytest_hpu_autocast"' in text


FIXTURE_TESTS = """
import pytest, torch
import hpu_autocast

def test_clean(hpu_autocast_region):
    y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16 and hpu_autocast.is_enabled()

def test_disabled_block(hpu_autocast_region):
    with torch.autocast("cpu", enabled=False):
        torch.mm(torch.randn(2, 2), torch.randn(2, 2))

@pytest.mark.hpu_autocast(policy="torch-cpu", dtype=torch.float16)
def test_marker(hpu_autocast_region):
    assert hpu_autocast.get_dtype() == torch.float16 and hpu_autocast.get_policy().name == "torch-cpu"

@pytest.mark.hpu_autocast(ignore=["explicit dtype"])
def test_ignored(hpu_autocast_region):
    torch.softmax(torch.randn(3), 0, dtype=torch.float32)

@pytest.mark.parametrize("hpu_autocast_region", [{"policy": "hmp"}], indirect=True)
def test_param(hpu_autocast_region):
    assert hpu_autocast.get_policy().name == "hmp"

def test_without_the_fixture():
    assert not hpu_autocast.is_enabled()
    with torch.autocast("cpu", enabled=False):
        torch.mm(torch.randn(2, 2), torch.randn(2, 2))
"""


def test_the_fixture_passes_and_fails(pytester):
    pytester.makepyfile(test_user=FIXTURE_TESTS)
    result = pytester.runpytest("-p", "pytest_hpu_autocast", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*PolicyViolation: 1 deviation from policy 'hpu' (bf16):",
            "*dtype  -  aten.mm.default  f32,f32 -> f32, policy bf16: disabled block",
            "FAILED test_user.py::test_disabled_block*",
        ]
    )


# --- the example ---------------------------------------------------------------------------------
def _example():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "property_test_example", ROOT / "examples" / "property_test_example.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_property_holds_for_its_example_and_finds_a_float64_head():
    ex = _example()
    ex.test_tiny_lm_follows_hpu.hypothesis.inner_test(ex.EXAMPLE)  # one example of the property
    clean = ex.MODEL.head
    ex.MODEL.head = ex.Float64Head(clean)
    try:
        found, _ = ex.check(*ex.EXAMPLE)
    finally:
        ex.MODEL.head = clean
    # docs/testing.md shows this output.
    assert str(found) == (
        "3 deviations from policy 'hpu' (bf16):\n"
        "  dtype  head.proj  aten.linear.default  f64,f64,f64 -> f64, policy bf16: the model's own cast (f32 -> f64 in head)\n"
        "  dtype  (backward)  aten.mm.default  f64,f64 -> f64, policy bf16: float64 inputs (parameter head.proj.weight)\n"
        "  dtype  (backward)  aten.mm.default  f64,f64 -> f64, policy bf16: the model's own cast (f32 -> f64 in head)"
    )


@pytest.mark.parametrize("ignore", ["explicit dtype", ("explicit dtype",)], ids=["string", "tuple"])
def test_ignore_takes_one_why_as_a_string(ignore):
    # Failed before (issue 31, item 7): a string was iterated by character and filtered nothing.
    # A policy that leaves explicit-dtype calls alone (torch.amp's documented rule; hpu casts them).
    leave = dataclasses.replace(hpu_autocast.get_preset("hpu"), name="hpu (leave)", explicit_dtype="leave")
    fn = lambda x: torch.softmax(x, -1, dtype=torch.float32)  # noqa: E731
    assert check_policy(fn, torch.randn(2, 3), policy=leave)  # the oracle: there is a deviation to ignore
    assert not check_policy(fn, torch.randn(2, 3), policy=leave, ignore=ignore)


# --- the two float32 dtype kinds: checked as FP32 is -----------------------------------------------
#: sum sets an unset dtype= to float32, norm.Scalar goes to norm.ScalarOpt_dtype with float32:
#: neither casts its input, both compute in float32, as an FP32 op does. (norm.Scalar is called as
#: itself: torch.norm reaches linalg_vector_norm instead.)
KIND_OPS = {"sum": (torch.sum, aten.sum.default), "norm": (aten.norm.Scalar, aten.norm.Scalar)}
DTYPE_KINDS = hpu_autocast.build_policy(
    "dtype kinds", fp32_set_opt_dtype=["sum"], fp32_append_dtype=["norm"], device_type="cpu"
)


@pytest.mark.parametrize("op", KIND_OPS)
def test_the_float32_dtype_kinds_follow_their_policy_on_float32_inputs(op):
    assert not check_policy(lambda x: KIND_OPS[op][0](x), torch.randn(2, 3), policy=DTYPE_KINDS)


@pytest.mark.parametrize("op", KIND_OPS)
def test_the_float32_dtype_kinds_report_float64_inputs(op):
    call, overload = KIND_OPS[op]
    # The first argument is float64, not eligible: the op runs in float64 (the policy intends f32).
    (d,) = check_policy(lambda x: call(x.double()), torch.randn(2, 3), policy=DTYPE_KINDS)
    assert (d.kind, d.op, d.why, d.compute, d.expected) == (
        Kind.DTYPE,
        overload,
        "the model's own cast",
        torch.float64,
        torch.float32,
    )


def test_fp32_set_opt_dtype_reports_a_dtype_the_call_sets():
    # The rule keeps a dtype= the call gives (ATen's set_opt_dtype): sum ran in bfloat16.
    found = check_policy(lambda x: x.sum(dtype=torch.bfloat16), torch.randn(2, 3), policy=DTYPE_KINDS)
    assert str(found) == (
        "1 deviation from policy 'dtype kinds' (bf16):\n"
        "  dtype  -  aten.sum.default  f32 -> bf16, policy f32: explicit dtype"
    )
    assert not check_policy(
        lambda x: x.sum(dtype=torch.bfloat16), torch.randn(2, 3), policy=DTYPE_KINDS, ignore="explicit dtype"
    )


@pytest.mark.parametrize("op", KIND_OPS)
def test_the_float32_dtype_kinds_report_rounded_inputs(op):
    call, overload = KIND_OPS[op]
    # Nothing is cast: the op reads the model's bfloat16 value as it is (and computes in f32).
    (d,) = check_policy(lambda x: call(F.relu(x.bfloat16())), torch.randn(4), policy=DTYPE_KINDS)
    assert (d.kind, d.op, d.why, d.source) == (
        Kind.ROUNDED,
        overload,
        "the model's own cast",
        "self: f32 -> bf16 outside modules",
    )
    # The caller's bfloat16 input, likewise.
    (d,) = check_policy(lambda x: KIND_OPS[op][0](x), torch.randn(4).bfloat16(), policy=DTYPE_KINDS)
    assert (d.kind, d.op, d.why, d.source) == (
        Kind.ROUNDED,
        overload,
        "lower-precision inputs",
        "self: the caller's input inputs[0]",
    )


@pytest.mark.parametrize("op", KIND_OPS)
def test_the_float32_dtype_kinds_report_a_disabled_block(op):
    call, overload = KIND_OPS[op]

    # No event in a disabled region of its own: the call is seen below the engine, in bfloat16.
    def fn(x):
        with hpu_autocast.disable_casts():
            return call(x.bfloat16())

    found = check_policy(fn, torch.randn(4), policy=DTYPE_KINDS)
    assert [(d.kind, d.op, d.why, d.compute, d.expected) for d in found] == [
        (Kind.DTYPE, overload, "disabled block", torch.bfloat16, torch.float32)
    ]

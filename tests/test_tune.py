"""tune(): a policy with the most lower-precision work within a tolerance of float32.

Every result is measured again here, independently of tune's own runs: ``compare()`` runs the
function in float32 and under the returned policy afresh, and ``record()`` says what ran in
which dtype. The search itself, on written-down error functions, is in
tests/internal/test_tuning_search.py."""

from __future__ import annotations

import json
import os
import pathlib
import re
import runpy
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hpu_autocast import CastPolicy, HpuAutocastMode, Policy, TuneResult, compare, get_preset, record, tune, with_lists
from hpu_autocast.policies.builder import policy_from_files
from hpu_autocast.policies.gaudi import ENV_FP32, ENV_LOWER
from hpu_autocast.cli import main
from hpu_autocast.policies.presets import gaudi_autocast

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "tune_demo.py"
DOC = ROOT / "docs" / "tuning.md"
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
TOL = 0.01
aten = torch.ops.aten


def _error(fn, *inputs, policy) -> float:
    """The default metric, measured by compare(): an inf or nan float32 lacks is infinite."""
    c = compare(fn, *inputs, dtype=torch.bfloat16, policy=policy, device_type="cpu")
    return float("inf") if c.nonfinite else c.max_rel


def _moved(*names, start="hpu") -> Policy:
    """The hpu preset with ``names`` moved to its FP32 list, written out from the preset's own
    data module (not from tune's reading of a policy)."""
    lower = [n for n in gaudi_autocast.LOWER if n not in names]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truediv on the FP32 list: no effect under hpu, as on Gaudi
        return with_lists(get_preset(start), lower=lower, fp32=gaudi_autocast.FP32 + list(names))


def _compute_dtypes(fn, *inputs, policy) -> dict:
    """``{op name: {compute dtypes}}`` of a recorded run."""
    with record(torch.bfloat16, policy=policy, device_type="cpu") as rec:
        fn(*inputs)
    out: dict = {}
    for row in rec.report().rows:
        out.setdefault(row.op.split(".")[1], set()).add(row.compute)
    return out


# --- the worked example (examples/tune_demo.py, docs/tuning.md) -----------------------------------


@pytest.fixture(scope="module")
def demo():
    fn, inputs = runpy.run_path(str(DEMO), run_name="demo")["tune_target"]()
    return fn, inputs, tune(fn, *inputs, policy="hpu", device_type="cpu", tolerance=TOL)


def test_the_worked_example_meets_the_tolerance_measured_again(demo):
    fn, inputs, result = demo
    assert _error(fn, *inputs, policy="hpu") > 10 * TOL  # Gaudi's lists: about 30% off
    assert _error(fn, *inputs, policy=result.policy) <= TOL
    assert result.met and result.error == _error(fn, *inputs, policy=result.policy)


def test_the_worked_example_keeps_the_gemms_lower_and_moves_a_handful(demo):
    fn, inputs, result = demo
    assert result.moved == ("mean", "mul")  # the norm's two reductions of E[h^2] - E[h]^2
    assert result.flops[0] == result.flops[1] > 0
    ran = _compute_dtypes(fn, *inputs, policy=result.policy)
    assert ran["linear"] == {"bf16"} and ran["matmul"] == {"bf16"}
    assert ran["mean"] == {"f32"}
    assert result.policy.table[aten.mean.dim] is CastPolicy.FP32
    assert result.policy.table[aten.mul.Tensor] is CastPolicy.FP32
    # Everything else as the start had it.
    start = get_preset("hpu")
    changed = {
        op
        for op in start.table.keys() | result.policy.table.keys()
        if start.table.get(op) is not result.policy.table.get(op)
    }
    assert {op.name().split("::")[1].split(".")[0] for op in changed} == {"mean", "mul"}


def test_the_worked_example_moves_two_ops_that_only_help_together(demo):
    fn, inputs, result = demo
    for name in ("mean", "mul"):
        assert _error(fn, *inputs, policy=_moved(name)) > 10 * TOL  # alone: no better
    assert _error(fn, *inputs, policy=_moved("mean", "mul")) <= TOL
    rows = {r.op: r for r in result.rows}
    assert rows["mean"].moved_alone > 10 * TOL and rows["mul"].moved_alone > 10 * TOL
    assert rows["linear"].alone_lower <= TOL  # only the GEMMs lower: fine


def test_the_worked_example_is_the_documented_one(demo):
    # docs/tuning.md prints the table; the error figures are those of the torch it names.
    text = DOC.read_text()
    block = re.search(r"```\n(hpu_autocast tune: policy hpu -> .*?)```", text, re.S).group(1)
    printed = str(demo[2]) + "\n"
    number = re.compile(r"\d\.\d+e[+-]\d+")
    assert number.sub("E", printed) == number.sub("E", block)
    documented = re.search(r"\(torch (\d+\.\d+\.\d+)", text).group(1)
    if torch.__version__.split("+")[0] == documented:
        assert printed == block


def test_the_run_count_is_printed_and_bounded(demo):
    fn, inputs, result = demo
    assert f"runs: {result.runs} of max_runs=200" in str(result)
    n = len(result.rows)
    assert result.runs <= 3 + 2 + 2 * n + n + n.bit_length()


def test_progress_gets_a_line_per_run_and_max_runs_bounds_them(demo):
    fn, inputs, _ = demo
    lines = []
    result = tune(fn, *inputs, policy="hpu", device_type="cpu", tolerance=TOL, max_runs=8, progress=lines.append)
    assert result.runs == 8 and len(lines) == 8 - 1  # the reference's two runs make one line
    assert lines[0] == "run 2/8: float32 reference, run twice (difference 0.0e+00)"
    assert lines[1].startswith("run 3/8: start (hpu) -> error ")
    # Too few runs for the sensitivity: the search goes straight on, and still finds the pair.
    assert [r.moved_alone for r in result.rows] == [None] * len(result.rows)
    assert result.moved == ("mean", "mul") and result.met


# --- a start within tolerance ------------------------------------------------------------------


def test_a_model_within_tolerance_is_returned_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert _error(model, x, policy="hpu") <= TOL
        result = tune(model, x, policy="hpu", device_type="cpu", tolerance=TOL)
    assert result.policy is get_preset("hpu")
    assert result.moved == () and result.runs == 3  # float32 twice, the start once
    assert all(not r.moved and r.why == "the start is within tolerance" for r in result.rows)
    assert result.error == result.start_error


# --- ops that only matter together ---------------------------------------------------------------


class OffsetMean(nn.Module):
    """``mean(lin(x) + 1000) - 1000``: the add (promote: a bf16 tensor and a Python number stay
    bf16) rounds 1000 + y to bfloat16's spacing of 4-8 there, and the mean (lower) would round
    it again: each op alone in float32 still rounds in the other one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return (self.lin(x) + 1000).mean(-1) - 1000


def test_a_pair_single_moves_do_not_fix_is_found():
    model, x = OffsetMean().eval(), torch.randn(4, 8)
    with torch.no_grad():
        ran = _compute_dtypes(model, x, policy="hpu")
        assert set(ran) == {"linear", "add", "mean", "sub"}
        for name in ran:  # one op at a time: none is enough
            assert _error(model, x, policy=_moved(name)) > 10 * TOL, name
        result = tune(model, x, policy="hpu", device_type="cpu", tolerance=TOL)
        assert result.moved == ("add", "mean")
        assert _error(model, x, policy=result.policy) <= TOL
        assert _error(model, x, policy=_moved("add", "mean")) <= TOL
    assert result.flops[0] == result.flops[1]  # the linear stays bf16
    rows = {r.op: r for r in result.rows}
    assert rows["add"].why.startswith("needed: back in bf16, error ")


# --- metrics ----------------------------------------------------------------------------------------


def test_a_user_metric_takes_the_two_runs_outputs():
    model, x = OffsetMean().eval(), torch.randn(4, 8)
    seen = []

    def metric(ref, out):
        seen.append((ref.dtype, out.dtype))
        return (ref - out.float()).abs().max()  # a 0-dim tensor is accepted

    with torch.no_grad():
        result = tune(model, x, policy="hpu", device_type="cpu", tolerance=0.05, metric=metric)
    assert seen[0] == (torch.float32, torch.float32)  # the float32 rerun
    assert (torch.float32, torch.bfloat16) in seen
    with torch.no_grad():
        with HpuAutocastMode(torch.bfloat16, policy=result.policy):
            out = model(x)
    assert (model(x) - out.float()).abs().max() <= 0.05
    assert result.met and result.moved == ("add", "mean")


def test_a_metric_never_met_returns_the_least_error_and_says_so():
    model, x = OffsetMean().eval(), torch.randn(4, 8)
    answers = iter([0.0])  # the float32 rerun's: the same; then every candidate is off
    with torch.no_grad():
        result = tune(
            model, x, policy="hpu", device_type="cpu", tolerance=0.0, metric=lambda ref, out: next(answers, 1.0)
        )
    assert not result.met
    assert "NOT within tolerance" in str(result)
    assert all(r.why == "tolerance not met: this is the least error measured" for r in result.rows)


def _bf16_only():
    """The hpu preset restricted to bfloat16 (the preset itself takes float16, as Gaudi 2 does)."""
    import dataclasses

    return dataclasses.replace(get_preset("hpu"), dtypes=(torch.bfloat16,))


def test_bad_arguments_are_named():
    model, x = OffsetMean().eval(), torch.randn(4, 8)
    with pytest.raises(ValueError, match="tolerance must be a finite number >= 0.*got -1"):
        tune(model, x, device_type="cpu", tolerance=-1)
    with pytest.raises(TypeError, match="metric must be None .* got 3"):
        tune(model, x, metric=3)
    with pytest.raises(ValueError, match="max_runs must be an int >= 3.*got 2"):
        tune(model, x, max_runs=2)
    with pytest.raises(ValueError, match="does not support dtype=float16"):
        tune(model, x, dtype=torch.float16, policy=_bf16_only())
    with pytest.raises(TypeError, match="metric must return a float .* got 'bad'"):
        tune(model, x, metric=lambda ref, out: "bad")


def test_a_function_that_changes_between_runs_is_refused():
    calls = []

    def fn(x):
        calls.append(1)
        return x * len(calls)

    with pytest.raises(ValueError, match=r"two float32 runs of fn differ by 1\.000e\+00, more than the tolerance"):
        tune(fn, torch.ones(3))


# --- writers --------------------------------------------------------------------------------------


def test_the_list_files_load_back_to_the_same_policy(demo, tmp_path, monkeypatch):
    result = demo[2]
    lower, fp32 = result.write_lists(tmp_path / "lists")
    assert pathlib.Path(lower).read_text().splitlines() == list(result.lower_list)
    assert "mean" in result.fp32_list and "mean" not in result.lower_list and "linear" in result.lower_list
    # The loader's route: policy_from_files, and Gaudi's variables read by a mode's default policy.
    assert policy_from_files("hpu", lower=lower, fp32=fp32) == result.policy
    env = result.environment(lower, fp32)
    assert set(env) == {ENV_LOWER, ENV_FP32}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert HpuAutocastMode(torch.bfloat16).policy == result.policy


def test_the_gaudi_config_loads_back_to_the_same_policy(demo, tmp_path):
    result = demo[2]
    path = result.write_gaudi_config(tmp_path / "gaudi_config.json")
    config = json.loads(pathlib.Path(path).read_text())
    assert config == {
        "use_torch_autocast": True,
        "autocast_bf16_ops": list(result.lower_list),
        "autocast_fp32_ops": list(result.fp32_list),
    }
    # optimum-habana writes the two lists to files, one op per line, and points Gaudi's
    # variables at them (GaudiConfig.write_bf16_fp32_ops_to_text_files).
    for key, name in (("autocast_bf16_ops", "bf16.txt"), ("autocast_fp32_ops", "fp32.txt")):
        (tmp_path / name).write_text("".join(op + "\n" for op in config[key]))
    assert policy_from_files("hpu", lower=tmp_path / "bf16.txt", fp32=tmp_path / "fp32.txt") == result.policy


def test_an_unchanged_result_writes_the_start_lists(tmp_path):
    model = nn.Linear(4, 4).eval()
    with torch.no_grad():
        result = tune(model, torch.randn(2, 4), device_type="cpu", tolerance=0.5)
    assert result.policy is get_preset("hpu")
    lower, fp32 = result.write_lists(tmp_path)
    assert policy_from_files("hpu", lower=lower, fp32=fp32).table == get_preset("hpu").table


def test_another_start_policy_round_trips_too(tmp_path):
    model, x = OffsetMean().eval(), torch.randn(4, 8)
    with torch.no_grad():
        result = tune(model, x, policy="torch-cpu", device_type="cpu", tolerance=TOL)
    assert result.met and result.start is get_preset("torch-cpu")
    lower, fp32 = result.write_lists(tmp_path)
    assert policy_from_files(get_preset("torch-cpu"), lower=lower, fp32=fp32) == result.policy


# --- the command --------------------------------------------------------------------------------


def test_the_command_tunes_the_scripts_target(tmp_path, capsys):
    script = tmp_path / "pair.py"
    script.write_text(
        "import sys, torch\n"
        "assert __name__ != '__main__'\n"
        "def tune_target():\n"
        "    torch.manual_seed(0)\n"
        "    lin = torch.nn.Linear(8, 8)\n"
        "    def fn(x):  # OffsetMean\n"
        "        with torch.no_grad():\n"
        "            return (lin(x) + 1000).mean(-1) - 1000\n"
        "    if sys.argv[1:] == ['never']:  # a metric no candidate meets\n"
        "        answers = iter([0.0])\n"
        "        return fn, (torch.randn(4, 8),), lambda ref, out: next(answers, 1.0)\n"
        "    return fn, torch.randn(4, 8)\n"
    )
    code = main(
        [
            "tune",
            "--device-type",
            "cpu",
            "--lists",
            str(tmp_path / "lists"),
            "--gaudi-config",
            str(tmp_path / "g.json"),
            str(script),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert "moved to fp32: add, mean" in out and "error: " in out
    assert f"export {ENV_LOWER}={tmp_path / 'lists' / 'lower_ops.txt'}" in out
    assert re.search(r"^run 2/200: float32 reference", err, re.M)  # progress on stderr
    assert json.loads((tmp_path / "g.json").read_text())["use_torch_autocast"] is True
    assert main(["tune", "--device-type", "cpu", "--quiet", "--max-runs", "5", str(script), "never"]) == 1  # not met
    assert capsys.readouterr().err == ""


def test_the_command_explains_a_script_without_a_target(tmp_path, capsys):
    script = tmp_path / "plain.py"
    script.write_text("x = 1\n")
    assert main(["tune", str(script)]) == 2
    err = capsys.readouterr().err
    assert f"error: {script} defines no tune_target(); define one returning (fn, inputs)" in err
    script.write_text("def tune_target():\n    return 3\n")
    assert main(["tune", str(script)]) == 2
    assert "must return (fn, inputs) or (fn, inputs, metric)" in capsys.readouterr().err


def test_a_script_without_a_target_is_refused_before_it_runs(tmp_path, capsys):
    # Failed before: the script's top level (a training loop, here a file written) ran first.
    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').write('the loop ran')\n")
    assert main(["tune", str(script)]) == 2
    assert f"error: {script} defines no tune_target()" in capsys.readouterr().err and not ran.exists()
    # A target bound another way than by `def` is found: the script runs, and its target is used.
    script.write_text("import torch\nglobals()['tune_target'] = lambda: (torch.nn.Identity(), torch.ones(2))\n")
    assert main(["tune", "--device-type", "cpu", "--quiet", str(script)]) == 0
    capsys.readouterr()


def test_the_command_tunes_in_fp8(tmp_path, capsys):
    # Failed before: --dtype took bfloat16 and float16 only.
    from hpu_autocast import _torch

    if not _torch.scaled_mm_runs_on("cpu"):
        pytest.skip(f"torch {torch.__version__} has no torch._scaled_mm for CPU tensors")
    script = tmp_path / "lin.py"
    script.write_text(
        "import torch\ndef tune_target():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Linear(16, 16), torch.randn(16, 16)\n"
    )
    assert main(["tune", "--device-type", "cpu", "--dtype", "fp8", "--quiet", "--tolerance", "1", str(script)]) == 0
    out = capsys.readouterr().out
    assert "dtype f8e4m3" in out and "matmul/conv FLOPs in f8e4m3: 8192 of 8192 (100.0%)" in out


def test_the_command_refuses_flags_out_of_range(capsys):
    assert main(["tune", "--tolerance", "-1", str(DEMO)]) == 2
    assert "error: --tolerance must be >= 0 (got -1.0)" in capsys.readouterr().err
    assert main(["tune", "--max-runs", "2", str(DEMO)]) == 2


def test_the_command_in_a_fresh_interpreter_on_the_demo(tmp_path):
    cmd = [sys.executable, "-m", "hpu_autocast", "tune", "--device-type", "cpu", "--quiet", str(DEMO)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "moved to fp32: mean, mul" in done.stdout


# --- small random models ------------------------------------------------------------------------

BLOCKS = ("linear", "offset", "center", "rms", "softmax", "relu", "tanh", "cumsum", "scale")
#: Steps that lose precision in bfloat16: an offset rounded away before a shift-invariant step.
TROUBLE = (("offset", "center"), ("offset", "softmax"), ("offset", "cumsum", "center"))


class Chain(nn.Module):
    """A chain of the ``BLOCKS`` on ``[4, 8]`` activations."""

    def __init__(self, blocks, seed, offset):
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = list(blocks)
        self.offset = offset
        self.linears = nn.ModuleList(nn.Linear(8, 8) for b in blocks if b == "linear")

    def forward(self, x):
        linears = iter(self.linears)
        for b in self.blocks:
            if b == "linear":
                x = next(linears)(x)
            elif b == "offset":
                x = x + self.offset
            elif b == "center":
                x = x - x.mean(-1, keepdim=True)
            elif b == "rms":
                x = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5)
            elif b == "softmax":
                x = torch.softmax(x, -1)
            elif b == "relu":
                x = torch.relu(x)
            elif b == "tanh":
                x = torch.tanh(x)
            elif b == "cumsum":
                x = x.cumsum(-1)
            elif b == "scale":
                x = x * 3.0
        return x


@st.composite
def small_models(draw):
    parts = draw(st.lists(st.sampled_from(BLOCKS + TROUBLE + TROUBLE), min_size=1, max_size=2))
    blocks = [b for part in parts for b in ((part,) if isinstance(part, str) else part)]
    blocks.insert(draw(st.integers(0, len(blocks))), "linear")  # at least one GEMM
    model = Chain(blocks, draw(st.integers(0, 2**16)), draw(st.sampled_from([64.0, 1000.0]))).eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(draw(st.integers(0, 2**16))))
    return model, x, draw(st.sampled_from([1e-2, 3e-2]))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_models())
def test_when_only_the_gemms_lower_meets_the_tolerance_tune_meets_it_keeping_them(case):
    model, x, tol = case
    with torch.no_grad():
        ran = {}
        with record(torch.bfloat16, policy="hpu") as rec:
            model(x)
        for row in rec.report().rows:
            if row.compute == "bf16" and row.op != "aten._to_copy.default":
                ran.setdefault(row.op.split(".")[1], row.flops is not None)
        gemms = {name for name, gemm in ran.items() if gemm}
        # Only the GEMMs in lower precision: every other op that ran in bf16 moved to float32.
        floor = _error(model, x, policy=_moved(*sorted(set(ran) - gemms)))
        result = tune(model, x, policy="hpu", device_type="cpu", tolerance=tol)
        measured = _error(model, x, policy=result.policy)
        assert measured == result.error  # tune reports what a fresh run measures
        event(
            "start within tolerance"
            if result.start_error <= tol
            else f"floor {'meets' if floor <= tol else 'misses'} the tolerance; {len(result.moved)} moved"
        )
        if floor <= tol:
            assert result.met and measured <= tol
            assert not gemms & set(result.moved)
            dtypes = _compute_dtypes(model, x, policy=result.policy)
            assert all(dtypes[g] == {"bf16"} for g in gemms)
        if result.met:
            assert all(
                _error(model, x, policy=_moved(*sorted(set(result.moved) - {n}))) > tol for n in result.moved
            )  # 1-minimal: no moved op can go back


def test_the_result_type_is_exported():
    assert isinstance(tune(lambda x: x * 2, torch.ones(2), device_type="cpu", tolerance=0.5), TuneResult)


# --- the CNN worked example (examples/tune_cnn.py, docs/tuning.md) --------------------------------


def test_the_cnn_example_counts_every_conv_and_is_the_documented_one():
    # Issue 31, item 1: every conv after the first gets a bf16 input beside float32 weights;
    # tune counted only the first conv's FLOPs and ranked the rest as elementwise work.
    from torch.utils.flop_counter import FlopCounterMode

    fn, inputs = runpy.run_path(str(ROOT / "examples" / "tune_cnn.py"), run_name="cnn")["tune_target"]()
    result = tune(fn, *inputs, policy="hpu", device_type="cpu", tolerance=0.002)
    with FlopCounterMode(display=False) as counter:
        fn(*inputs)  # float32; FLOPs are shapes alone
    flops = {k.__name__: v for k, v in counter.get_flop_counts()["Global"].items()}
    rows = {r.op: r for r in result.rows}
    assert rows["conv2d"].flops == flops["convolution"] and rows["linear"].flops == flops["addmm"]
    assert result.moved == ("linear",) and result.met
    assert _error(fn, *inputs, policy=result.policy) <= 0.002
    blocks = re.findall(r"```\n(hpu_autocast tune: policy hpu -> .*?)```", DOC.read_text(), re.S)
    number = re.compile(r"\d\.\d+e[+-]\d+")
    assert number.sub("E", str(result) + "\n") == number.sub("E", blocks[1])


@pytest.mark.parametrize("outputs", [lambda x: x.sum(0)[:0], lambda x: (x, {"logits": x * 2})], ids=["sliced", "batch"])
def test_an_empty_batch_is_refused_not_met_with_error_0(outputs):
    # Failed before (issue 31, item 7): met=True, error 0, whatever the policy.
    x = torch.randn(0, 4)
    with pytest.raises(ValueError, match=r"hold no floating element \(an empty batch\?\)"):
        tune(lambda t: outputs(torch.nn.functional.linear(t, torch.ones(3, 4))), x, device_type="cpu", tolerance=TOL)
    # With a metric of the user's, the outputs are the metric's business.
    assert tune(lambda t: t * 2, x, metric=lambda ref, out: 0.0).met


def test_tune_keeps_the_float32_dtype_policies_and_moves_only_lower_ops():
    # A start with softmax as fp32_set_opt_dtype and norm as fp32_append_dtype (as torch-cuda has
    # them): tune moves lower ops to fp32 only; the dtype policies stay as they were.
    from hpu_autocast import build_policy

    start = build_policy(
        "dtype kinds",
        lower=["linear", "mean", "mul"],
        fp32_set_opt_dtype=["softmax"],
        fp32_append_dtype=["norm"],
        device_type="cpu",
    )
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)

    def fn(x):
        y = torch.softmax(lin(x) * 1000, -1)
        return torch.ops.aten.norm.Scalar(y, 2) + (lin(x) + 1000).mean() - 1000

    x = torch.randn(4, 8)
    with torch.no_grad():
        result = tune(fn, x, policy=start, tolerance=1e-4)
    assert result.moved  # something had to move for the tolerance
    for action in (CastPolicy.FP32_SET_OPT_DTYPE, CastPolicy.FP32_APPEND_DTYPE):
        assert result.policy.ops(action) == start.ops(action)
    assert all(
        start.table[op] is CastPolicy.LOWER for op, a in result.policy.table.items() if a is not start.table.get(op)
    )

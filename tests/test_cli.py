"""The command line: policy, check, diff, docs (and report, in internal/test_report_cli)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from hpu_autocast import CastPolicy, get_preset
from hpu_autocast.cli import main, policies_markdown

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "policies.md"
#: A fresh interpreter imports this checkout's package (not another installed copy).
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_policy_json_rows(capsys):
    assert main(["policy", "--preset", "torch-cpu", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"op": "aten.mm.default", "action": "lower"} in rows
    assert {"op": "aten.cat.default", "action": "promote"} in rows
    assert {r["action"] for r in rows} == {"lower", "fp32", "promote"}
    policy = get_preset("torch-cpu")
    assert len(rows) == len(policy.table)
    names = {CastPolicy.LOWER: "lower", CastPolicy.FP32: "fp32", CastPolicy.PROMOTE: "promote"}
    assert {r["op"]: r["action"] for r in rows} == {str(op): names[a] for op, a in policy.table.items()}


def test_policy_table_and_markdown_with_list_files(tmp_path, capsys):
    lower = tmp_path / "lower.txt"
    lower.write_text("mm\n")
    assert main(["policy", "--lower-list", str(lower)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^aten\.mm\.default\s+lower$", out, re.M)
    assert not re.search(r"^aten\.bmm\.default", out, re.M)  # the lower list was replaced
    assert main(["policy", "--preset", "hpu", "--format", "markdown"]) == 0
    assert "| `aten.mm.default` | lower |" in capsys.readouterr().out


def test_check_lists_bad_names_with_their_lines(tmp_path, capsys):
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("mm\n# comment\naten::addmm.out\n")
    bad.write_text("mm\nadddmm\n\nnot_an_op\n")
    assert main(["check", str(good)]) == 0
    assert "2 ops, all valid" in capsys.readouterr().out
    assert main(["check", str(good), str(bad), str(tmp_path / "missing.txt")]) == 1
    out = capsys.readouterr().out
    assert f"unknown op 'adddmm' ({bad}, line 2); closest valid names: addmm" in out
    assert f"unknown op 'not_an_op' ({bad}, line 4)" in out
    assert "missing.txt' does not exist" in out
    assert "Traceback" not in out


def test_check_refuses_attributes_of_a_packet(tmp_path, capsys):
    # `mm.overloads` once passed as valid (and printed a bound method under `policy`).
    lst = tmp_path / "lower.txt"
    lst.write_text("mm\nmm.overloads\nmm.__name__\n")
    assert main(["check", str(lst)]) == 1
    out = capsys.readouterr().out
    assert f"unknown overload 'mm.overloads' ({lst}, line 2); aten::mm has: " in out
    assert f"unknown overload 'mm.__name__' ({lst}, line 3); aten::mm has: " in out
    assert main(["policy", "--lower-list", str(lst)]) == 2
    assert "unknown overload 'mm.overloads'" in capsys.readouterr().err


def test_policy_with_a_bad_file_is_an_error_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("nope_op\n")
    assert main(["policy", "--fp32-list", str(bad)]) == 2
    assert "unknown op 'nope_op'" in capsys.readouterr().err


def test_diff(capsys):
    assert main(["diff", "hpu", "torch-cpu"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^aten\.exp\.default\s+fp32\s+-$", out, re.M)
    assert re.search(r"^aten\.conv_tbc\.default\s+-\s+lower$", out, re.M)
    assert not re.search(r"^aten\.mm\.default", out, re.M)  # lower in both
    assert main(["diff", "hpu", "hpu"]) == 0
    assert "0 overloads differ" in capsys.readouterr().out


def test_unknown_preset_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["policy", "--preset", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_policies_doc_is_current():
    text = DOCS.read_text()
    version = re.search(r"\(torch ([\d.]+)\)", text).group(1)
    if version != torch.__version__.split("+")[0]:
        pytest.skip(f"docs/policies.md was generated with torch {version}")
    assert text == policies_markdown() + "\n", "stale: run python -m hpu_autocast docs > docs/policies.md"


@pytest.mark.engine_independent
def test_module_entry_point_runs():
    out = subprocess.run(
        [sys.executable, "-m", "hpu_autocast", "policy", "--preset", "hmp", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=ENV,
    ).stdout
    assert {"op": "aten.linear.default", "action": "lower"} in json.loads(out)


@pytest.mark.engine_independent
def test_a_reader_that_leaves_early_is_not_a_traceback():
    # `python -m hpu_autocast docs | head -1`: the pipe closes while the table is printed.
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpu_autocast", "docs"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
    )
    assert proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode()


def test_console_script_is_declared():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "hpu-autocast"]
    assert script.value == "hpu_autocast.cli:main"


#: ``python -m hpu_autocast ARGS`` for each ``ARGS`` of ``argv[1]`` (JSON), in one interpreter where
#: NumPy cannot be imported, as in a fresh install of torch; prints what each wrote to stderr
#: (a warning of one location is printed once per process: the first command that meets it has it).
_WITHOUT_NUMPY = """
import contextlib, io, json, runpy, sys
sys.modules['numpy'] = None
said = {}
for args in json.loads(sys.argv[1]):
    sys.argv = ['hpu-autocast', *args]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_module('hpu_autocast', run_name='__main__', alter_sys=True)
        except SystemExit as e:
            code = e.code
    said[' '.join(args)] = [code, err.getvalue()]
print(json.dumps(said))
"""

_TRAIN = """\
import torch, hpu_autocast
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # imports torch._dynamo; nothing is compiled
with hpu_autocast.record():
    loss = model(torch.randn(3, 4)).sum()
loss.backward()
optimizer.step()
"""

#: The commands that run no region (one interpreter for all), and the one that does (its own: it
#: follows the engine and the default device; the others are engine_independent).
_NO_REGION = [["--help"], ["policy", "--preset", "torch-cpu"], ["check", "ops.txt"], ["diff", "hpu", "hmp"], ["docs"]]


@pytest.mark.parametrize(
    "commands",
    [
        pytest.param(_NO_REGION, id="no-region", marks=pytest.mark.engine_independent),
        pytest.param([["report", "train.py"]], id="report"),
    ],
)
def test_a_command_prints_no_warning_also_without_numpy(commands, tmp_path):
    # torch's own import warns "Failed to initialize NumPy" where NumPy is absent (the package's
    # __init__ hides that one message); an optimizer imports Dynamo, which is no reason for the
    # report's region to warn about compiled code (_compile_guard: only once Dynamo compiled).
    (tmp_path / "ops.txt").write_text("mm\nlinear\n")
    (tmp_path / "train.py").write_text(_TRAIN)
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NUMPY, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=tmp_path,
    )
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    said = json.loads(proc.stdout.splitlines()[-1])
    assert said == {" ".join(c): [0, ""] for c in commands}


# --- usage errors: exit status 2, one line on stderr, nothing run (issue 31, item 5) ------------


def _script(tmp_path) -> pathlib.Path:
    """A script that leaves a mark when it runs (the usage errors below must stop before it)."""
    script = tmp_path / "s.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    return script


def _exit_status(argv) -> int:
    """``main(argv)``'s exit status, whether returned or raised by argparse."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["report", "--preset", "nope", "{script}"], "--preset 'nope' is not a preset; valid presets: "),
        (["tune", "--preset", "nope", "{script}"], "--preset 'nope' is not a preset; valid presets: "),
        (["tune", "{missing}"], "missing.py' does not exist"),
        (["report", "{missing}"], "missing.py' does not exist"),
        (
            ["report", "--bogus", "{script}"],
            "hpu-autocast: error: unrecognized arguments: --bogus (see hpu-autocast --help)",
        ),
        (["tune", "--tolerance", "x", "{script}"], "argument --tolerance: invalid float value: 'x'"),
        (["report", "--plot", "report.pdf", "{script}"], "--plot 'report.pdf': give a .png or .svg path"),
    ],
    ids=["report-preset", "tune-preset", "tune-missing", "report-missing", "unknown-flag", "bad-value", "plot-suffix"],
)
def test_usage_errors_exit_2_with_one_line_before_anything_runs(argv, expected, tmp_path, capsys):
    # Failed before: a traceback and exit status 1 (for tune, "tolerance not met"), the report's
    # header printed first for a missing script, argparse's usage lines before its error.
    script = _script(tmp_path)
    argv = [a.format(script=script, missing=tmp_path / "missing.py") for a in argv]
    assert _exit_status(argv) == 2
    out, err = capsys.readouterr()
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert out == "" and not (tmp_path / "ran").exists()


def test_report_plot_without_matplotlib_fails_before_running_the_script(tmp_path, capsys, monkeypatch):
    # Failed before: the whole script ran, the report was printed, then an ImportError traceback.
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    script = _script(tmp_path)
    assert main(["report", "--plot", str(tmp_path / "r.png"), str(script)]) == 2
    out, err = capsys.readouterr()
    assert err == "error: --plot needs matplotlib, which is not installed: pip install matplotlib\n"
    assert out == "" and not (tmp_path / "ran").exists()


def test_check_reports_an_op_on_two_files_as_the_loader_would(tmp_path, capsys):
    # Failed before: both files "all valid", exit 0, where the loader refuses the pair.
    from hpu_autocast import PolicyError
    from hpu_autocast.builder import policy_from_files

    lower, fp32 = tmp_path / "lower.txt", tmp_path / "fp32.txt"
    lower.write_text("mm\nlinear\n")
    fp32.write_text("softmax\n# the head\nlinear\n")
    with pytest.raises(PolicyError) as loader:
        policy_from_files("hpu", lower=lower, fp32=fp32)
    assert main(["check", str(lower), str(fp32)]) == 1
    out = capsys.readouterr().out
    assert f"error: {lower} (lower) with {fp32} (FP32): {loader.value}" in out
    assert "fp32.txt, line 3" in str(loader.value)  # the oracle names the entry
    fp32.write_text("softmax\n")
    assert main(["check", str(lower), str(fp32)]) == 0


def test_check_help_says_what_it_checks(capsys):
    assert _exit_status(["check", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "every name on it must name an op this torch has" in text
    assert "an op on both (by any spelling) is an error, which the loader would refuse" in text


def test_build_core_in_a_directory_that_is_a_file_is_one_error_line(tmp_path, monkeypatch, capsys):
    # Failed before: a NotADirectoryError traceback. A built core for this torch is looked up
    # first (none under a file), so this never builds.
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HPU_AUTOCAST_CORE_DIR", str(tmp_path / "file"))
    assert main(["build-core"]) == 1
    # torch's own notice on importing its extension builder where a CUDA build finds no CUDA
    # (torch 2.4's "No CUDA runtime is found, ...") is torch's line, not this error's.
    err = "".join(
        line
        for line in capsys.readouterr().err.splitlines(keepends=True)
        if not line.startswith("No CUDA runtime is found")
    )
    assert err.startswith("error: hpu_autocast: the C++ core's build directory ") and err.count("\n") == 1
    assert f"(HPU_AUTOCAST_CORE_DIR={str(tmp_path / 'file')!r}) cannot be made: Not a directory" in err


def test_build_core_says_reused_when_it_compiled_nothing(tmp_path, monkeypatch, capsys):
    # Failed before: "C++ core built for this torch" for a build found in the cache.
    from hpu_autocast._engine import core_build

    found = tmp_path / "hpu_autocast_core.so"
    monkeypatch.setattr(core_build, "built_path", lambda: found)
    monkeypatch.setattr(core_build, "build", lambda verbose=False: pytest.fail("compiled a cached core"))
    assert main(["build-core"]) == 0
    assert capsys.readouterr().out == f"C++ core reused (built before for this torch and source): {found}\n"
    # Nothing cached: it builds, and says so with the time it took.
    monkeypatch.setattr(core_build, "built_path", lambda: None)
    monkeypatch.setattr(core_build, "build", lambda verbose=False: found)
    assert main(["build-core"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("C++ core built for this torch in ") and out.endswith(f" s: {found}\n")


def test_report_in_fp8_names_the_engine_that_decided_its_calls(tmp_path, capsys):
    # Failed before: --dtype took no fp8 dtype; and an fp8 report's header said "engine c++"
    # under the core, which decides no call of an fp8 region (the Python kernels run it).
    from hpu_autocast import _torch

    if not _torch.scaled_mm_runs_on("cpu"):
        pytest.skip(f"torch {torch.__version__} has no torch._scaled_mm for CPU tensors")
    script = tmp_path / "lin.py"
    script.write_text("import torch\ntorch.nn.Linear(16, 16)(torch.randn(16, 16))\n")
    assert main(["report", "--device-type", "cpu", "--dtype", "fp8", str(script)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "hpu_autocast precision report: policy hpu, dtype f8e4m3, engine python"
    assert "aten.linear.default    lower       f32,f32,f32 -> f8e4m3" in out


def test_policy_output_names_the_float32_dtype_policies(capsys):
    assert main(["policy", "--preset", "torch-cuda", "--format", "json"]) == 0
    rows = {r["op"]: r["action"] for r in json.loads(capsys.readouterr().out)}
    assert rows["aten.softmax.int"] == "fp32_set_opt_dtype" and rows["aten.norm.Scalar"] == "fp32_append_dtype"
    assert rows["aten.layer_norm.default"] == "fp32" and "aten.cross_entropy_loss.default" not in rows
    assert main(["policy", "--preset", "torch-cuda"]) == 0
    assert re.search(r"^aten\.sum\.default +fp32_set_opt_dtype$", capsys.readouterr().out, re.M)

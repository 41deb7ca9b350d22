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


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "hpu_autocast", "policy", "--preset", "hmp", "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=True, env=ENV).stdout
    assert {"op": "aten.linear.default", "action": "lower"} in json.loads(out)


def test_a_reader_that_leaves_early_is_not_a_traceback():
    # `python -m hpu_autocast docs | head -1`: the pipe closes while the table is printed.
    proc = subprocess.Popen([sys.executable, "-m", "hpu_autocast", "docs"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    assert proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode()


def test_console_script_is_declared():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "hpu-autocast"]
    assert script.value == "hpu_autocast.cli:main"


#: ``python -m hpu_autocast ARGS`` where NumPy cannot be imported, as in a fresh install of torch.
_WITHOUT_NUMPY = ("import runpy, sys; sys.modules['numpy'] = None; sys.argv[0] = 'hpu-autocast'; "
                  "runpy.run_module('hpu_autocast', run_name='__main__', alter_sys=True)")

_TRAIN = """\
import torch, hpu_autocast
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # imports torch._dynamo; nothing is compiled
with hpu_autocast.record():
    loss = model(torch.randn(3, 4)).sum()
loss.backward()
optimizer.step()
"""


@pytest.mark.parametrize("command", [["--help"], ["policy", "--preset", "torch-cpu"], ["check", "LIST"],
                                     ["diff", "hpu", "hmp"], ["docs"], ["report", "SCRIPT"]],
                         ids=lambda c: c[0])
def test_a_command_prints_no_warning_also_without_numpy(command, tmp_path):
    # torch's own import warns "Failed to initialize NumPy" where NumPy is absent (the package's
    # __init__ hides that one message); an optimizer imports Dynamo, which is no reason for the
    # report's region to warn about compiled code (_compile_guard: only once Dynamo compiled).
    (tmp_path / "ops.txt").write_text("mm\nlinear\n")
    (tmp_path / "train.py").write_text(_TRAIN)
    args = [{"LIST": "ops.txt", "SCRIPT": "train.py"}.get(a, a) for a in command]
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_NUMPY, *args], capture_output=True, text=True,
                          timeout=300, env=ENV, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_policy_output_names_the_float32_dtype_policies(capsys):
    assert main(["policy", "--preset", "torch-cuda", "--format", "json"]) == 0
    rows = {r["op"]: r["action"] for r in json.loads(capsys.readouterr().out)}
    assert rows["aten.softmax.int"] == "fp32_set_opt_dtype" and rows["aten.norm.Scalar"] == "fp32_append_dtype"
    assert rows["aten.layer_norm.default"] == "fp32" and "aten.cross_entropy_loss.default" not in rows
    assert main(["policy", "--preset", "torch-cuda"]) == 0
    assert re.search(r"^aten\.sum\.default +fp32_set_opt_dtype$", capsys.readouterr().out, re.M)

"""The report command: run a script under the mode, print the report at exit."""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hpu_autocast
from hpu_autocast.cli import report_command as _report_cli

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "examples" / "report_demo.py")

# The demo's training step, one step (see docs/report.md for the reading of each row).
DEMO_REPORT = """\
hpu_autocast precision report: policy hpu, dtype bf16, engine {engine}
op                                       action      dtypes                  calls  casts  cast bytes  FLOPs
aten.uniform_.default                    not listed  f32 -> f32                  4      0           0      -
aten.linear.default                      lower       f32,f32,f32 -> bf16         1      3         368   1280
aten.relu.default                        not listed  bf16 -> bf16                1      0           0      -
aten.linear.default                      lower       bf16,f32,f32 -> bf16        1      2         136    640
aten.cross_entropy_loss.default          fp32        bf16,i64 -> f32             1      1          80      -
aten.ones_like.default                   not listed  f32 -> f32                  1      0           0      -
aten.nll_loss_backward.default           not listed  f32,f32,i64,f32 -> f32      1      0           0      -
aten._log_softmax_backward_data.default  not listed  f32,f32 -> f32              1      0           0      -
aten._to_copy.default                    not listed  f32 -> bf16                 1      0           0      -
aten.mm.default                          lower       bf16,bf16 -> bf16           3      0           0   2560
aten.sum.dim_IntList                     not listed  bf16 -> bf16                2      0           0      -
aten._to_copy.default                    not listed  bf16 -> f32                 4      0           0      -
aten.threshold_backward.default          not listed  bf16,bf16 -> bf16           1      0           0      -
aten._local_scalar_dense.default         not listed  f32 -> -                    1      0           0      -

casts inserted: 6 (584 bytes)
matmul/conv FLOPs: 4480 (bf16 100.0%)
warnings:
  - aten.cross_entropy_loss.default (fp32 list) got bf16 input: it computes in f32 from values already rounded; \
move their producer to the fp32 list if that matters
""".replace("{engine}", hpu_autocast.ENGINE)


def _dynamo_import_runs_tensor_ops() -> bool:
    # torch 2.6 fills a table by running some seventy tensor ops when torch._dynamo.variables.
    # torch_function is imported; torch 2.9 moved that to torch._dynamo.variables.builtin, run
    # when first needed. Asked in a fresh interpreter, to leave this one's imports as they are.
    code = "import torch._dynamo.variables.torch_function as m; print(hasattr(m, 'populate_builtin_to_tensor_fn_map'))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "True"


def test_report_command_on_the_demo(tmp_path):
    # Run as a user would, in a fresh interpreter.
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [
        sys.executable,
        "-m",
        "hpu_autocast.cli.report_command",
        "report",
        "--device-type",
        "cpu",
        "--json",
        str(tmp_path / "r.json"),
        DEMO,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout
    loss, report = out.split("\n", 1)
    assert re.fullmatch(r"loss \d+\.\d{4}", loss)
    # Forward: linear 2*5*8*16 = 1280 and 2*5*16*4 = 640 FLOPs in bf16. Backward (inside the
    # region, as the whole script is): three bf16 mm, 640 + 640 + 1280 = 2560. The SGD step runs
    # with casting off, as outside a region: none of its ops is seen.
    if report != DEMO_REPORT and _dynamo_import_runs_tensor_ops():
        pytest.xfail(
            "this torch's import of torch._dynamo runs tensor ops of its own "
            "(populate_builtin_to_tensor_fn_map): the demo's optimizer imports it inside the region"
        )
    assert report == DEMO_REPORT
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["casts"], data["cast_bytes"], data["flops_by_dtype"]) == (6, 584, {"bf16": 4480})


def test_script_arguments_exit_code_and_outputs(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text(
        "import sys, torch\nprint(sys.argv[1:])\ntorch.mm(torch.ones(2, 2), torch.ones(2, 2))\nsys.exit(3)\n"
    )
    md = tmp_path / "r.md"
    code = _report_cli.main(["report", "--markdown", str(md), "--preset", "torch-cpu", str(script), "a", "--b"])
    out = capsys.readouterr().out
    assert code == 3
    assert out.splitlines()[:4] == [
        "['a', '--b']",
        f"hpu_autocast precision report: policy torch-cpu, dtype bf16, engine {hpu_autocast.ENGINE}",
        "op               action  dtypes           calls  casts  cast bytes  FLOPs",
        "aten.mm.default  lower   f32,f32 -> bf16      1      2          16     16",
    ]
    assert md.read_text().startswith("**hpu_autocast precision report**: policy `torch-cpu`")


def test_report_printed_when_the_script_fails(tmp_path, capsys):
    # As `python s.py` ends: the traceback on stderr, from the script's frames on, and status 1.
    script = tmp_path / "s.py"
    script.write_text("import torch\ntorch.mm(torch.ones(2, 2), torch.ones(2, 2))\nraise ValueError('boom')\n")
    assert _report_cli.main(["report", "--device-type", "cpu", str(script)]) == 1
    out, err = capsys.readouterr()
    assert "aten.mm.default  lower" in out
    assert err == (
        f'Traceback (most recent call last):\n  File "{script}", line 3, in <module>\n'
        "    raise ValueError('boom')\nValueError: boom\n"
    )


def test_plot_flag(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    script = tmp_path / "s.py"
    script.write_text("import torch\ntorch.mm(torch.ones(2, 2), torch.ones(2, 2))\n")
    assert _report_cli.main(["report", "--device-type", "cpu", "--plot", str(tmp_path / "r.png"), str(script)]) == 0
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_device_type_picks_the_tensors_the_scripts_region_casts(tmp_path, capsys):
    # Failed before: no such flag, so a GPU machine's report of a CPU script (its region casting
    # CUDA tensors, the machine's) showed nothing cast, and could not be asked otherwise.
    script = tmp_path / "s.py"
    script.write_text("import torch\ntorch.mm(torch.ones(2, 2), torch.ones(2, 2))\n")
    rows = {}
    for device in ("cpu", "meta"):
        assert _report_cli.main(["report", "--device-type", device, str(script)]) == 0
        rows[device] = [line.split()[:2] for line in capsys.readouterr().out.splitlines() if "aten.mm" in line]
    assert rows == {"cpu": [["aten.mm.default", "lower"]], "meta": []}  # a meta region leaves CPU tensors


def test_add_parser_registers_report():
    parser = argparse.ArgumentParser()
    _report_cli.add_parser(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["report", "--dtype", "bf16", "x.py", "--steps", "2"])
    assert (ns.func, ns.script, ns.args, ns.preset) == (_report_cli.run, "x.py", ["--steps", "2"], "hpu")


def test_list_flags_replace_the_presets_lists(tmp_path, capsys):
    fp32 = tmp_path / "f.txt"
    fp32.write_text("mm\n")
    script = tmp_path / "s.py"
    script.write_text("import torch\ntorch.mm(torch.ones(2, 2), torch.ones(2, 2))\n")
    assert _report_cli.main(["report", "--device-type", "cpu", "--fp32-list", str(fp32), str(script)]) == 0
    assert "aten.mm.default  fp32    f32,f32 -> f32" in capsys.readouterr().out

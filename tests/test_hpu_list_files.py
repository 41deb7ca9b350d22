"""Gaudi's list files (PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST, PT_HPU_AUTOCAST_FP32_OPS_LIST) read
as Gaudi's bridge reads them (gaudi's Note: list files as Gaudi's bridge reads them): each file
replaces its own list only, lower wins over FP32, and what the bridge drops, refuses or never
registers is dropped or ignored with a warning naming the file and the line. ``check --gaudi``
reports the same findings as errors. Each case failed on the strict reading these replaced."""

from __future__ import annotations

import warnings

import pytest
import torch

from hpu_autocast import CastPolicy, HpuAutocastMode, get_preset, with_lists
from hpu_autocast.builder import ENV_FP32, ENV_LOWER
from hpu_autocast.cli import main

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No list-file variable set, and nothing warned about yet (warnings are once per file and name)."""
    from hpu_autocast.policies import builder, gaudi

    for name in (ENV_LOWER, ENV_FP32, "LOWER_LIST", "FP32_LIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(builder, "_warned", set())
    monkeypatch.setattr(gaudi, "_warned_findings", set())
    monkeypatch.setattr(builder, "_warned_dropped", set())


def _replaced(record) -> list:
    """``record`` less the one warning that a list file replaced the preset's list (Note: a
    replacement says what it dropped), asserted there once; the file's own warnings stay."""
    said = [w for w in record if "its lists replace the ones it was made from" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in record]
    return [w for w in record if w not in said]


def _file(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode())
    return str(path)


def _dtypes():
    """What a default-policy region does with mm (lower by default) and exp (FP32 by default)."""
    a = torch.randn(3, 3)
    with HpuAutocastMode(device_type="cpu"):
        return torch.mm(a, a).dtype, torch.exp(a.bfloat16()).dtype


def test_an_fp32_file_alone_keeps_the_default_lower_list(tmp_path, monkeypatch):
    # Hpu_KERNEL tries the lower list first: mm, default lower, stays bfloat16 though the FP32
    # file names it. Was float32.
    monkeypatch.setenv(ENV_FP32, _file(tmp_path, "fp32.txt", "mm\ntanh\n"))
    a = torch.randn(3, 3)
    with pytest.warns(UserWarning, match="line 1: 'mm' stays in lower precision: it is on the default lower list"):
        mode = HpuAutocastMode(device_type="cpu")  # the shadowed entry says so (issue 37)
    with mode:
        assert torch.mm(a, a).dtype == torch.bfloat16
        assert torch.tanh(a.bfloat16()).dtype == torch.float32
    assert mode.policy.table[aten.exp.default] is CastPolicy.PROMOTE  # the file replaced the FP32 list


def test_a_lower_file_alone_keeps_the_default_fp32_list(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_LOWER, _file(tmp_path, "lower.txt", "mm\n"))
    assert _dtypes() == (torch.bfloat16, torch.float32)


def test_an_op_on_both_files_is_lower_precision(tmp_path, monkeypatch):
    # Gaudi's priority, Lower -> FP32 -> Promote. Was a PolicyError naming both files.
    monkeypatch.setenv(ENV_LOWER, _file(tmp_path, "lower.txt", "exp\n"))
    monkeypatch.setenv(ENV_FP32, _file(tmp_path, "fp32.txt", "exp\nlog\n"))
    x = torch.randn(3)
    # Issue 37: it was lower with no word; the warning names both files and lines, at the user's line.
    with pytest.warns(
        UserWarning,
        match=r"fp32.txt, line 1: 'exp' is also on the lower file \(.*lower.txt, line 1, "
        r"as 'exp'\): it runs in lower precision",
    ) as caught:
        mode = HpuAutocastMode(device_type="cpu")
    assert {w.filename for w in caught} == {__file__}
    with mode:
        exp, log = torch.exp(x), torch.log(x.abs().bfloat16())
    assert torch.equal(exp, torch.exp(x.bfloat16())) and log.dtype == torch.float32


def test_an_unknown_name_is_dropped_with_a_warning_naming_file_and_line(tmp_path, monkeypatch):
    # The newest bridge: "Discarded unregistered op at line: N". Was a PolicyError.
    path = _file(tmp_path, "lower.txt", "mm\nmmm\n")
    monkeypatch.setenv(ENV_LOWER, path)
    with pytest.warns(UserWarning) as record:
        mode = HpuAutocastMode(device_type="cpu")
    record = _replaced(record)
    assert [str(w.message).split(": not")[0] for w in record] == [f"{path}, line 2: 'mmm' is dropped, as on Gaudi"]
    assert "Discarded unregistered op at line" in str(record[0].message)
    assert set(mode.policy.ops(CastPolicy.LOWER)) >= {aten.mm.default}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HpuAutocastMode(device_type="cpu")  # once per file and name


@pytest.mark.parametrize("where", ["missing", "directory", "system folder"])
def test_a_file_gaudi_refuses_warns_and_keeps_the_defaults(tmp_path, monkeypatch, where):
    # validate_ops_list_path: missing, a directory, or under /etc, /usr, ... Was a PolicyError.
    path = {"missing": str(tmp_path / "nope.txt"), "directory": str(tmp_path), "system folder": "/etc/hostname"}[where]
    if where == "system folder" and not __import__("os").path.exists(path):
        pytest.skip("no /etc/hostname here")
    monkeypatch.setenv(ENV_LOWER, path)
    with pytest.warns(UserWarning, match=rf"^{path}: .*Gaudi's bridge warns and keeps the default list"):
        mode = HpuAutocastMode(device_type="cpu")
    assert mode.policy == get_preset("hpu")


def test_a_name_gaudi_never_registers_has_no_effect_and_warns(tmp_path, monkeypatch):
    # gen_op.py registers no autocast kernel for a name containing "backward": on Gaudi
    # gelu_backward on the lower list casts nothing. Was: cast to bfloat16 here.
    path = _file(tmp_path, "lower.txt", "mm\ngelu_backward\n")
    monkeypatch.setenv(ENV_LOWER, path)
    g, x = torch.randn(4), torch.randn(4)
    with pytest.warns(UserWarning, match=rf"'gelu_backward' \({path}, line 2\) on the lower list has no effect"):
        with HpuAutocastMode(device_type="cpu") as mode:
            out = aten.gelu_backward(g, x)
    assert aten.gelu_backward.default not in mode.policy.table
    assert torch.equal(out, aten.gelu_backward(g, x)) and out.dtype == torch.float32
    # The Python builders apply the hpu preset's names as Gaudi does too.
    with pytest.warns(UserWarning, match="'gelu_backward' on the fp32 list has no effect"):
        assert aten.gelu_backward.default not in with_lists(get_preset("hpu"), fp32=["gelu_backward"]).table


@pytest.mark.parametrize(
    "text, why",
    [
        ("mm\r\nbmm\r\n", "carriage return"),
        ("mm  # GEMM\nbmm\n", "comments"),
        (" mm\nbmm\n", "spaces"),
        ("aten::mm\nbmm\n", "ATen function names only: write mm"),
    ],
)
def test_a_line_gaudi_would_not_match_is_dropped_with_a_warning(tmp_path, monkeypatch, text, why):
    # The bridge compares whole lines (getline): a CRLF line, a comment or spaces after a name,
    # an aten:: spelling match no op there.
    path = _file(tmp_path, "lower.txt", text)
    monkeypatch.setenv(ENV_LOWER, path)
    with pytest.warns(UserWarning) as record:
        mode = HpuAutocastMode(device_type="cpu")
    crlf = text.endswith("\r\n")  # then bmm's line is dropped too (each warning asserted: none leaks)
    # The file replaces the lower list, so the preset's other lower ops are on no list now: that is
    # said once, after the file's own lines (Note: a replacement says what it dropped).
    record = _replaced(record)
    heads = [str(w.message).split(" (")[0] for w in record]
    first = f"{path}, line 1: '{'aten::mm' if 'aten' in text else 'mm'}' is dropped"
    assert [h[: len(first)] for h in heads[:1]] == [first] and why in str(record[0].message)
    assert [str(w.message).startswith(f"{path}, line 2: 'bmm' is dropped") for w in record[1:]] == [True] * crlf
    lower = set(mode.policy.ops(CastPolicy.LOWER))
    assert (aten.bmm.default in lower) != crlf and aten.mm.default not in lower


def test_a_list_warning_points_at_the_users_line(tmp_path, monkeypatch):
    # Was: policies/builder.py (a fixed stacklevel, counted for a caller the mode is not).
    monkeypatch.setenv(ENV_LOWER, _file(tmp_path, "lower.txt", "mm\nmmm\n"))
    with pytest.warns(UserWarning, match="'mmm' is dropped") as record:
        HpuAutocastMode(device_type="cpu")
    assert [w.filename for w in record] == [__file__] * 2  # the file's line, then what it replaced
    with pytest.warns(UserWarning, match="'gelu_backward' on the fp32 list has no effect") as record:
        with_lists(get_preset("hpu"), fp32=["gelu_backward"])
    assert [w.filename for w in record] == [__file__]


def test_check_with_gaudi_reports_every_finding_and_fails(tmp_path, capsys):
    from hpu_autocast.builder import check_findings

    bad = _file(tmp_path, "lower.txt", "mm\nmmm\ngelu_backward\nlog\r\n")
    good = _file(tmp_path, "fp32.txt", "# Gaudi's FP32 list\nexp\nlog\n")
    assert main(["check", "--gaudi", good]) == 0
    assert main(["check", "--gaudi", bad, str(tmp_path / "nope.txt")]) == 1
    out = capsys.readouterr().out
    assert [str(f) for f in check_findings(bad)] == [line[len("error: ") :] for line in out.splitlines()[1:4]]
    assert f"{bad}, line 2: 'mmm' is dropped" in out and f"{bad}, line 3: 'gelu_backward' has no effect" in out
    assert f"{bad}, line 4: 'log' is dropped" in out and "nope.txt: does not exist" in out

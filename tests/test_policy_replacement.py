"""A replaced list says what it dropped, Gaudi's two files are checked as a pair, and the three
spellings of the default policy read Gaudi's variables alike (issue 37, items 2 and 4; builder's
Notes: one effective policy, list files as Gaudi's bridge reads them). Each warning is checked
to point at the line of this file that made the region, not at the package."""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from hpu_autocast.builder import ENV_FP32, ENV_LOWER

from hpu_autocast import CastPolicy, HpuAutocastMode, get_preset, with_lists
from hpu_autocast.cli import main

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    from hpu_autocast.policies import builder, gaudi

    for name in (ENV_LOWER, ENV_FP32, "LOWER_LIST", "FP32_LIST"):
        monkeypatch.delenv(name, raising=False)
    for module, name in (
        (builder, "_warned"),
        (gaudi, "_warned_findings"),
        (builder, "_warned_dropped"),
        (builder, "_warned_unused"),
    ):
        monkeypatch.setattr(module, name, set())


def _file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_with_lists_names_what_its_lower_list_dropped_and_how_to_keep_it():
    policy = with_lists(get_preset("hpu"), lower=["gelu"])
    # The oracle: the preset's lower ops that the new table no longer has.
    gone = [op for op, a in get_preset("hpu").table.items() if a is CastPolicy.LOWER and op not in policy.table]
    names = list(dict.fromkeys(op.overloadpacket.__name__ for op in gone))
    assert len(names) > 20 and "linear" in names
    with pytest.warns(
        UserWarning,
        match=rf"{len(names)} ops of those \(lower\) are on no list now .*: "
        rf"{', '.join(names[:8])} and {len(names) - 8} more.*policy.edit",
    ) as w:
        HpuAutocastMode(torch.bfloat16, policy=policy, device_type="cpu")
    assert [x.filename for x in w] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per policy
        HpuAutocastMode(torch.bfloat16, policy=policy, device_type="cpu")
    assert policy == pickle.loads(pickle.dumps(policy))  # the record is no part of the value
    assert pickle.loads(pickle.dumps(policy)).record.dropped == policy.record.dropped


def test_an_edit_drops_nothing_and_an_edit_back_is_no_longer_dropped():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HpuAutocastMode(torch.bfloat16, policy=get_preset("hpu").edit(lower=["gelu"]), device_type="cpu")
    replaced = with_lists(get_preset("torch-cpu"), fp32=["exp"])
    fixed = replaced.edit(fp32=[op.split(".")[1] for op, _ in replaced.record.dropped])
    assert replaced.record.dropped and fixed.record.dropped == ()


def test_a_lower_file_alone_warns_of_the_lower_ops_it_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_LOWER, _file(tmp_path, "lower.txt", "gelu\n"))
    with pytest.warns(UserWarning, match=r"policy 'hpu\+lists': .* ops of those \(lower\) .*linear") as w:
        HpuAutocastMode(torch.bfloat16, device_type="cpu")
    assert {x.filename for x in w} == {__file__}


def test_an_fp32_entry_the_default_lower_list_shadows_warns(tmp_path, monkeypatch):
    # Gaudi keeps the default lower list when only the FP32 file is given, and tries it first.
    monkeypatch.setenv(ENV_FP32, _file(tmp_path, "fp32.txt", "tanh\nmm\n"))
    with pytest.warns(
        UserWarning,
        match=r"fp32.txt, line 2: 'mm' stays in lower precision: it is on the default "
        r"lower list",
    ) as w:
        mode = HpuAutocastMode(torch.bfloat16, device_type="cpu")
    assert __file__ in {x.filename for x in w}
    a = torch.randn(2, 2)
    with mode:
        assert torch.mm(a, a).dtype is torch.bfloat16  # as the warning says


@pytest.mark.parametrize("spelling", ["default", "name", "get_preset", "a pickled copy"])
def test_every_spelling_of_the_default_policy_reads_gaudis_variables(spelling, tmp_path, monkeypatch):
    # Was: policy=get_preset("hpu") ran the pristine preset, with no word.
    monkeypatch.setenv(ENV_LOWER, _file(tmp_path, "lower.txt", "exp\n"))
    policy = {
        "default": None,
        "name": "hpu",
        "get_preset": get_preset("hpu"),
        "a pickled copy": pickle.loads(pickle.dumps(get_preset("hpu"))),
    }[spelling]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dropped ops' warning, tested above
        mode = HpuAutocastMode(torch.bfloat16, device_type="cpu", **({} if policy is None else {"policy": policy}))
    assert mode.policy.name == "hpu+lists" and mode.policy.table[aten.exp.default] is CastPolicy.LOWER
    assert get_preset("hpu").name == "hpu"  # the preset itself stays the pristine data


def test_a_policy_of_ones_own_runs_as_it_is_and_says_the_variables_are_unused(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_LOWER, _file(tmp_path, "lower.txt", "exp\n"))
    edited = get_preset("hpu").edit(lower=["gelu"])
    with pytest.warns(
        UserWarning,
        match=rf"{ENV_LOWER}=.*lower.txt set, but unused: the region runs policy "
        r"'hpu\+edit' as it is.*policy_from_env\(\).edit",
    ) as w:
        mode = HpuAutocastMode(torch.bfloat16, policy=edited, device_type="cpu")
    assert mode.policy is edited and [x.filename for x in w] == [__file__]


def test_check_gaudi_reads_a_lower_and_an_fp32_file_as_a_pair(tmp_path, capsys):
    lower = _file(tmp_path, "lower.txt", "mm\nexp\n")
    fp32 = _file(tmp_path, "fp32.txt", "tanh\nexp\n")
    assert main(["check", "--gaudi", lower, fp32]) == 1  # was 0: each file alone is as written
    out = capsys.readouterr().out
    assert f"error: {fp32}, line 2: 'exp' is also on the lower file ({lower}, line 2, as 'exp')" in out
    assert "note: the files replace the hpu preset's lists and leave" in out and "linear" in out
    assert main(["check", "--gaudi", "--fp32", _file(tmp_path, "f.txt", "mm\n")]) == 1
    assert "'mm' stays in lower precision" in capsys.readouterr().out
    assert (
        main(
            [
                "check",
                "--gaudi",
                "--lower",
                _file(
                    tmp_path,
                    "l.txt",
                    "\n".join(op.overloadpacket.__name__ for op in get_preset("hpu").ops(CastPolicy.LOWER)) + "\n",
                ),
            ]
        )
        == 0
    )


def test_policy_prints_the_effective_table_and_the_files_it_read(tmp_path, monkeypatch, capsys):
    path = _file(tmp_path, "lower.txt", "exp\n")
    monkeypatch.setenv(ENV_LOWER, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["policy"]) == 0
    out, err = capsys.readouterr()
    assert f"policy 'hpu+lists': read {ENV_LOWER}={path}" in err
    rows = dict(line.split() for line in out.splitlines()[1:])
    assert rows["aten.exp.default"] == "lower" and "aten.linear.default" not in rows

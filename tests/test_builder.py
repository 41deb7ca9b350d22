"""The builder: policies from names, override lists from files (Gaudi's environment variables,
HMP's file arguments) and in code. Each error names its culprit."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from _parity import unnamed
from hpu_autocast import CastPolicy, HpuAutocastMode, PolicyError, build_policy, get_preset, with_lists
from hpu_autocast.policies.builder import policy_from_env, policy_from_files, read_list

MM, EXP, MUL = torch.ops.aten.mm.default, torch.ops.aten.exp.default, torch.ops.aten.mul.Tensor


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_read_list_skips_blanks_and_comments(tmp_path):
    path = _write(tmp_path, "l.txt", "# my list\nmm\n\n  addmm  # GEMM\n#exp\n")
    assert read_list(path) == [("mm", (path, 2)), ("addmm", (path, 4))]


def test_a_byte_order_mark_is_not_part_of_the_first_name(tmp_path):
    # Was: "unknown op '\ufeffmm'" for a UTF-8 file saved with a byte-order mark.
    p = tmp_path / "bom.txt"
    p.write_bytes("mm\r\nbmm\r\n".encode("utf-8-sig"))
    assert read_list(p) == [("mm", (str(p), 1)), ("bmm", (str(p), 2))]
    assert policy_from_files("hpu", lower=p).table[MM] is CastPolicy.LOWER


def test_files_replace_the_lists(tmp_path):
    lower = _write(tmp_path, "lower.txt", "mm\nexp\n")
    fp32 = _write(tmp_path, "fp32.txt", "linear\n")
    policy = policy_from_files("hpu", lower=lower, fp32=fp32)
    assert policy.table[MM] is CastPolicy.LOWER and policy.table[EXP] is CastPolicy.LOWER
    assert policy.table[torch.ops.aten.linear.default] is CastPolicy.FP32
    # mul was lower and promote; the new lower list drops it, so promote applies again.
    assert policy.table[MUL] is CastPolicy.PROMOTE
    assert torch.ops.aten.log.default not in policy.table  # the FP32 list was replaced
    x = torch.randn(3)
    with HpuAutocastMode(policy=policy, device_type="cpu"):
        assert torch.exp(x).dtype == torch.bfloat16
        assert torch.log(x.bfloat16()).dtype == torch.bfloat16


def test_empty_path_keeps_the_list():
    assert policy_from_files("hmp", lower="", fp32=None) is get_preset("hmp")


def test_with_lists_returns_a_new_policy():
    base = get_preset("hpu")
    policy = with_lists(base, fp32=["mm"], promote=["maximum"])
    assert policy is not base and policy.table[MM] is CastPolicy.FP32
    assert policy.table[torch.ops.aten.maximum.default] is CastPolicy.PROMOTE
    assert base.table[MM] is CastPolicy.LOWER  # untouched
    # Named on a new FP32 list, mm leaves the kept default lower list; exp leaves FP32 likewise.
    assert with_lists(get_preset("hpu"), lower=["exp"]).table[EXP] is CastPolicy.LOWER


@pytest.mark.parametrize("call", ["with_lists", "build_policy"])
def test_a_string_for_a_list_is_refused_with_the_fix(call):
    # with_lists(lower="mm") was read as the names "m", "m" (two unknown-op errors at best).
    from hpu_autocast import build_policy

    with pytest.raises(TypeError) as err:
        if call == "with_lists":
            with_lists(get_preset("hpu"), lower="mm")
        else:
            build_policy("x", fp32="mm, bmm")
    arg, fix = ("lower", '["mm"]') if call == "with_lists" else ("fp32", '["mm", "bmm"]')
    assert str(err.value).startswith(f"{arg}= takes a list of op names, not a string: ")
    assert str(err.value).endswith(f"; write {arg}={fix}")


def test_environment_variables(tmp_path, monkeypatch):
    lower = _write(tmp_path, "lower.txt", "mm\n")
    fp32 = _write(tmp_path, "fp32.txt", "addmm\n")
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", lower)
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", fp32)
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    with HpuAutocastMode(device_type="cpu"):
        assert torch.mm(a, b).dtype == torch.bfloat16
        assert torch.addmm(torch.randn(2, 2), a, b).dtype == torch.float32
        b3 = torch.randn(1, 3, 2)
        assert torch.bmm(a[None], b3).dtype == torch.float32  # no longer on the lower list
    assert policy_from_env() is policy_from_env()  # files read once while unchanged
    with HpuAutocastMode(policy="torch-cpu"):  # only the default policy reads them
        assert torch.addmm(torch.randn(2, 2), a, b).dtype == torch.bfloat16


def test_files_read_again_when_changed(tmp_path, monkeypatch):
    path = _write(tmp_path, "lower.txt", "mm\n")
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", path)
    first = policy_from_env()
    (tmp_path / "lower.txt").write_text("mm\nbmm\n")
    assert torch.ops.aten.bmm.default in policy_from_env().table
    assert torch.ops.aten.bmm.default not in first.table


def test_files_are_read_only_when_their_path_mtime_or_size_changes(tmp_path, monkeypatch):
    from hpu_autocast.policies import gaudi

    reads, read = [], gaudi.bridge_findings
    monkeypatch.setattr(gaudi, "bridge_findings", lambda path: reads.append(path) or read(path))
    path = _write(tmp_path, "lower.txt", "mm\n")
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", path)
    first = policy_from_env()
    assert policy_from_env() is first and policy_from_env() is first and len(reads) == 1
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same text, new mtime
    assert policy_from_env() == first and len(reads) == 2
    (tmp_path / "lower.txt").write_text("bmm\n")  # new size
    assert torch.ops.aten.bmm.default in policy_from_env().table and len(reads) == 3
    other = _write(tmp_path, "other.txt", "bmm\n")
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", other)  # new path, same stamp otherwise
    policy_from_env()
    assert reads[-1] == other and len(reads) == 4


def test_the_environments_policies_are_kept_only_for_the_files_as_they_are_now(tmp_path, monkeypatch):
    # Was: one policy kept for every version of the files ever read, for the life of the process.
    import gc
    import weakref

    path = _write(tmp_path, "lower.txt", "mm\n")
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", path)
    refs = []
    for text in ("mm\nbmm\n", "mm\nbmm\nbaddbmm\n", "bmm\n"):
        refs.append(weakref.ref(policy_from_env()))
        (tmp_path / "lower.txt").write_text(text)
    current = policy_from_env()
    gc.collect()
    assert [r() for r in refs] == [None, None, None] and policy_from_env() is current


def test_with_no_variable_set_the_environment_is_not_searched_name_by_name(monkeypatch):
    # The common case, every region entered with the default policy: os.environ.get of a
    # missing name raises a KeyError inside; four of them were most of a mode's creation.
    for name in (
        "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST",
        "PT_HPU_AUTOCAST_FP32_OPS_LIST",
        "LOWER_LIST",
        "FP32_LIST",
    ):
        monkeypatch.delenv(name, raising=False)

    def get(*args):
        raise AssertionError("os.environ.get called")

    monkeypatch.setattr(os.environ, "get", get, raising=False)
    assert policy_from_env() is get_preset("hpu")
    monkeypatch.undo()


def test_a_variable_set_to_nothing_is_unset(monkeypatch):
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", "")
    assert policy_from_env() is get_preset("hpu")


@pytest.mark.parametrize(
    "old, new",
    [("LOWER_LIST", "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"), ("FP32_LIST", "PT_HPU_AUTOCAST_FP32_OPS_LIST")],
)
def test_deprecated_variables_warn_and_work(tmp_path, monkeypatch, old, new):
    monkeypatch.delenv(new, raising=False)
    monkeypatch.setenv(old, _write(tmp_path, "l.txt", "log\n" if old == "LOWER_LIST" else "tanh\n"))
    with pytest.warns(DeprecationWarning, match=new):
        mode = HpuAutocastMode()
    expected = CastPolicy.LOWER if old == "LOWER_LIST" else CastPolicy.FP32
    op = torch.ops.aten.log.default if old == "LOWER_LIST" else torch.ops.aten.tanh.default
    assert mode.policy.table[op] is expected


# --- errors, each naming the culprit ------------------------------------------------------------


def test_unknown_op_names_file_line_and_suggestions(tmp_path):
    path = _write(tmp_path, "lower.txt", "mm\n\naddmmm\n")
    with pytest.raises(PolicyError, match=r"unknown op 'addmmm' \(.*lower.txt, line 3\); closest valid names: addmm"):
        policy_from_files("hpu", lower=path)


def test_missing_file(tmp_path):
    with pytest.raises(PolicyError, match=r"op list file '.*nope.txt' does not exist"):
        policy_from_files("hpu", fp32=str(tmp_path / "nope.txt"))


def test_unreadable_file(tmp_path):
    with pytest.raises(PolicyError, match="is a directory"):
        read_list(tmp_path)


def test_file_that_is_not_text(tmp_path):
    p = tmp_path / "model.bin"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(PolicyError, match=r"'.*model.bin' is not a text file"):
        read_list(p)
    q = tmp_path / "latin1.txt"
    q.write_bytes(b"mm\n\xe9\n")
    with pytest.raises(PolicyError, match=r"'.*latin1.txt' is not UTF-8 text"):
        read_list(q)


def test_op_on_both_lists(tmp_path):
    lower = _write(tmp_path, "lower.txt", "mm\nexp\n")
    fp32 = _write(tmp_path, "fp32.txt", "log\nexp\n")
    with pytest.raises(
        PolicyError,
        match=r"aten.exp.default is on both the lower-precision list, as 'exp' "
        r"\(.*lower.txt, line 2\), and the FP32 list, as 'exp' \(.*fp32.txt, line 2\)",
    ):
        policy_from_files("hpu", lower=lower, fp32=fp32)


def test_env_file_findings_surface_when_the_mode_is_created(fresh_warnings, tmp_path, monkeypatch):
    # Was a PolicyError: a file that runs on Gaudi stopped a run here. Gaudi drops the name.
    path = _write(tmp_path, "f.txt", "tanh\nnot_an_op_at_all\n")
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", path)
    with pytest.warns(UserWarning, match=rf"^{path}, line 2: 'not_an_op_at_all' is dropped, as on Gaudi"):
        mode = HpuAutocastMode()
    assert set(mode.policy.ops(CastPolicy.FP32)) == {torch.ops.aten.tanh.default}


def test_several_ops_on_both_lists_name_the_first_and_count_the_rest():
    from hpu_autocast import build_policy

    for _ in range(3):  # the same message every time: lower-list order, not set order
        with pytest.raises(PolicyError) as err:
            build_policy("x", lower=["mm", "exp", "log", "sin"], fp32=["sin", "log", "exp"])
        assert str(err.value) == (
            "aten.exp.default is on both the lower-precision list, as 'exp', and the FP32 list, as "
            "'exp'; remove it from one (and 2 more: aten.log.default, aten.sin.default)"
        )


# --- names Gaudi's bridge ignores (hpu: c_names_only) ----------------------------------------------

PYTHON_NAME = "a Python name, and Gaudi's bridge matches list names against C++ function names"
NOT_FUNCTIONAL = "it names in-place or out= overloads only, and Gaudi's bridge registers no such function"


@pytest.fixture
def fresh_warnings(monkeypatch):
    # Each name warns once per process; a test starts with none warned about yet.
    from hpu_autocast.policies import builder, gaudi

    monkeypatch.setattr(builder, "_warned", set())
    monkeypatch.setattr(gaudi, "_warned_findings", set())


def test_the_hpu_lists_own_python_names_are_recorded_without_a_warning(fresh_warnings):
    from hpu_autocast import build_policy
    from hpu_autocast.policies.presets import PRESETS

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy = build_policy("hpu", **PRESETS["hpu"])
    assert policy == get_preset("hpu") and policy.c_names_only
    assert policy.ignored == (
        ("truediv", "fp32", PYTHON_NAME),
        ("iadd", "promote", PYTHON_NAME),
        ("truediv", "promote", PYTHON_NAME),
    )
    assert not any(op.overloadpacket is torch.ops.aten.add_ for op in policy.table)


def test_iadd_on_a_users_list_does_nothing_as_on_gaudi_and_warns_once(fresh_warnings):
    # Was: add_ went on the lower list, so x += y rounded y to bfloat16 before adding; on Gaudi
    # the name has no effect.
    with pytest.warns(UserWarning) as record:
        policy = with_lists(get_preset("hpu"), lower=["mm", "iadd"])
    assert [str(w.message) for w in record] == [
        f"'iadd' on the lower list has no effect under policy 'hpu', as on Gaudi: {PYTHON_NAME}; its C++ "
        "function, add_, is in-place, and Gaudi's bridge casts no in-place function"
    ]
    assert ("iadd", "lower", PYTHON_NAME) in policy.ignored and policy.c_names_only
    assert not any(op.overloadpacket is torch.ops.aten.add_ for op in policy.table)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    ours, control = x.clone(), x.clone()
    with HpuAutocastMode(policy=policy, device_type="cpu"):
        ours += y
    control += y
    assert torch.equal(ours, control) and not torch.equal(ours, (x.bfloat16() + y.bfloat16()).float())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per name: no second warning
        with_lists(get_preset("hpu"), fp32=["iadd"])


@pytest.mark.parametrize(
    "name, why, hint",
    [
        ("truediv", PYTHON_NAME, "; its C++ name is div"),
        ("__matmul__", PYTHON_NAME, "; its C++ name is matmul"),
        ("add_", NOT_FUNCTIONAL, ""),
        ("addmm.out", NOT_FUNCTIONAL, ""),
        ("aten::mul_.Tensor", NOT_FUNCTIONAL, ""),
    ],
)
def test_names_gaudi_ignores(fresh_warnings, tmp_path, name, why, hint):
    path = _write(tmp_path, "lower.txt", f"mm\n{name}\n")
    with pytest.warns(UserWarning) as record:
        policy = policy_from_files("hpu", lower=path)
    assert [str(w.message) for w in record] == [
        f"{name!r} ({path}, line 2) on the lower list has no effect under policy 'hpu', as on Gaudi: {why}{hint}"
    ]
    assert policy.ignored[-1] == (name, "lower", why)
    # mm.default, and mm.dtype where this torch has it (2.9 and 2.13 do, 2.4 and 2.6 do not)
    mm = {getattr(torch.ops.aten.mm, o) for o in ("default", "dtype") if o in torch.ops.aten.mm.overloads()}
    assert policy.table[MM] is CastPolicy.LOWER and set(policy.ops(CastPolicy.LOWER)) == mm


def test_an_env_list_file_warns_when_the_mode_is_created(fresh_warnings, tmp_path, monkeypatch):
    # iadd is no ATen op: Gaudi's bridge drops the line; add_ is one, but Gaudi registers no kernel.
    path = _write(tmp_path, "fp32.txt", "# Gaudi list\nlog\niadd\nadd_\n")
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", path)
    with pytest.warns(UserWarning) as record:
        mode = HpuAutocastMode()
    messages = [str(w.message) for w in record]
    assert any(m.startswith(f"{path}, line 3: 'iadd' is dropped, as on Gaudi") and "write add_" in m for m in messages)
    assert any(m.startswith(f"'add_' ({path}, line 4) on the fp32 list has no effect") for m in messages)
    assert ("add_", "fp32", NOT_FUNCTIONAL) in mode.policy.ignored


def test_with_lists_keeps_the_records_of_the_lists_it_keeps(fresh_warnings):
    policy = with_lists(get_preset("hpu"), fp32=["log"], promote=["add", "cat"])
    assert policy.ignored == ()  # the fp32 and promote lists that named truediv and iadd are gone
    policy = with_lists(get_preset("hpu"), lower=["mm"])
    assert policy.ignored == get_preset("hpu").ignored


def test_other_presets_apply_every_name(fresh_warnings):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy = with_lists(get_preset("torch-cpu"), promote=["iadd", "truediv"])
    assert policy.table[torch.ops.aten.add_.Tensor] is CastPolicy.FIRST
    assert policy.table[torch.ops.aten.div.Tensor] is CastPolicy.PROMOTE
    assert not policy.c_names_only and policy.ignored == ()


def test_the_float32_dtype_lists_build_by_keyword_and_conflict_loudly():
    policy = build_policy("dtypes", fp32=["exp"], fp32_set_opt_dtype=["softmax"], fp32_append_dtype=["norm"])
    assert policy.table[torch.ops.aten.softmax.int] is CastPolicy.FP32_SET_OPT_DTYPE
    # Of norm's overloads, those ATen's redispatch table has: the dtype-taking ones cannot take it.
    assert unnamed(policy.ops(CastPolicy.FP32_APPEND_DTYPE)) == [
        torch.ops.aten.norm.Scalar,
        torch.ops.aten.norm.ScalarOpt_dim,
    ]
    with pytest.raises(
        PolicyError,
        match=r"^aten.softmax.int is on both the FP32 list, as 'softmax', and the "
        r"fp32_set_opt_dtype list, as 'softmax'; remove it from one",
    ):
        build_policy("both", fp32=["softmax"], fp32_set_opt_dtype=["softmax"])
    with pytest.raises(
        PolicyError,
        match=r"is on both the lower-precision list, as 'norm', and the "
        r"fp32_append_dtype list, as 'norm'",
    ):
        build_policy("both", lower=["norm"], fp32_append_dtype=["norm"])


def test_with_lists_replaces_a_float32_dtype_list_and_a_given_list_wins_over_a_kept_one():
    cuda = get_preset("torch-cuda")
    softmax, sum_op = torch.ops.aten.softmax.int, torch.ops.aten.sum.default
    moved = with_lists(cuda, fp32=[*map(str, cuda.ops(CastPolicy.FP32)), "aten.softmax.int"])
    assert moved.table[softmax] is CastPolicy.FP32 and moved.table[sum_op] is CastPolicy.FP32_SET_OPT_DTYPE
    only_sum = with_lists(cuda, fp32_set_opt_dtype=["sum"])
    assert unnamed(only_sum.ops(CastPolicy.FP32_SET_OPT_DTYPE)) == [sum_op, torch.ops.aten.sum.dim_IntList]
    assert softmax not in only_sum.table
    with pytest.raises(PolicyError, match="is on both the lower-precision list"):
        with_lists(cuda, lower=["sum"], fp32_set_opt_dtype=["sum"])

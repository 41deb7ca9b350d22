"""Op names as users write them, resolved to overloads; unknown names are errors naming them."""

from __future__ import annotations

import pytest
import torch

from hpu_autocast import HpuAutocastMode, PolicyError, build_policy, resolve
from hpu_autocast.policies.names import PYTHON_ALIASES, is_python_name

aten = torch.ops.aten

torch.library.define("hpu_autocast_test::scale_mm", "(Tensor x, Tensor w) -> Tensor")


@torch.library.impl("hpu_autocast_test::scale_mm", "CompositeExplicitAutograd")
def _scale_mm(x, w):
    return (x @ w) * 2


#: addmm's functional overloads: default, and dtype (out_dtype=) from torch 2.13 on.
ADDMM = {getattr(aten.addmm, o) for o in ("default", "dtype") if o in aten.addmm.overloads()}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("addmm", ADDMM),
        ("aten::addmm", ADDMM),
        ("aten.addmm", ADDMM),
        ("aten.addmm.default", {aten.addmm.default}),
        ("addmm.out", {aten.addmm.out}),
        ("aten::addmm.out", {aten.addmm.out}),
        ("  addmm  ", ADDMM),
        ("addmm_", {aten.addmm_.default}),
        ("truediv", {aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode}),
        ("iadd", {aten.add_.Tensor, aten.add_.Scalar}),
        ("cross_entropy_loss", {aten.cross_entropy_loss.default}),
        ("cross_entropy", {aten.cross_entropy_loss.default}),
        ("conv_transpose2d", {aten.conv_transpose2d.input}),
        ("__matmul__", {aten.matmul.default}),
        ("linear", {aten.linear.default}),
        ("hpu_autocast_test::scale_mm", {torch.ops.hpu_autocast_test.scale_mm.default}),
        ("hpu_autocast_test.scale_mm.default", {torch.ops.hpu_autocast_test.scale_mm.default}),
    ],
)
def test_spellings(name, expected):
    assert set(resolve(name)) == expected


def test_a_name_covers_functional_overloads_only():
    ops = resolve("add")
    assert aten.add.Tensor in ops and aten.add.Scalar in ops
    assert aten.add_.Tensor not in ops and aten.add.out not in ops


@pytest.mark.parametrize(
    "name, message",
    [
        ("adddmm", "unknown op 'adddmm'; closest valid names: addmm"),
        ("addmm.nope", "unknown overload 'addmm.nope'; aten::addmm has: " + ", ".join(sorted(aten.addmm.overloads()))),
        ("mylib_nowhere::op", "unknown op 'mylib_nowhere::op'"),
        ("", "op names must be non-empty strings"),
    ],
)
def test_unknown_names(name, message):
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(name)


@pytest.mark.parametrize(
    "name", ["mm.overloads", "mm.__name__", "aten.mm.__doc__", "aten::mm.__call__", "aten.mm.overloads"]
)
def test_attributes_of_a_packet_are_not_overloads(name):
    # Only the names packet.overloads() lists are overloads; resolve once returned the bound
    # method or string an attribute lookup gave (``mm.overloads`` -> [<bound method ...>]).
    valid = ", ".join(sorted(aten.mm.overloads()))
    with pytest.raises(PolicyError) as err:
        resolve(name, ("lower.txt", 3))
    assert str(err.value) == f"unknown overload {name!r} (lower.txt, line 3); aten::mm has: {valid}"


@pytest.mark.parametrize(
    "name, python",
    [
        ("iadd", True),
        ("truediv", True),
        ("aten::truediv", True),
        ("__matmul__", True),
        ("cross_entropy", True),
        ("add", False),
        ("add_", False),
        ("div", False),
        ("addmm.out", False),
        ("cross_entropy_loss", False),
    ],
)
def test_python_names(name, python):
    # Python-level spellings, which C++ code (Gaudi's bridge reading its lists) does not know.
    assert is_python_name(name) is python


def test_every_alias_is_a_python_name():
    assert all(is_python_name(name) for name in PYTHON_ALIASES)


def test_unknown_name_cites_its_source():
    with pytest.raises(
        PolicyError, match=r"unknown op 'softmaxx' \(lists/lower.txt, line 7\); closest valid names: softmax"
    ):
        resolve("softmaxx", ("lists/lower.txt", 7))


def test_custom_op_in_a_policy_is_cast():
    policy = build_policy("custom", lower=["hpu_autocast_test::scale_mm"])
    x, w = torch.randn(2, 3), torch.randn(3, 4)
    with HpuAutocastMode(policy=policy, device_type="cpu"):
        out = torch.ops.hpu_autocast_test.scale_mm(x, w)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, torch.ops.hpu_autocast_test.scale_mm(x.bfloat16(), w.bfloat16()))

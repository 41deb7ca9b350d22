"""Torch's dtype-mismatch errors inside a region carry a note naming the op, what the policy does
with it, the input dtypes and the edit that fixes it (_explain's Note: explaining a dtype error at
the region's exit); every other error is left exactly as it was."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from hpu_autocast import HpuAutocastMode, get_preset, with_lists

bf = torch.bfloat16


def _notes(exc) -> str:
    return "\n".join(getattr(exc, "__notes__", [])) if sys.version_info >= (3, 11) else str(exc)


def _replaced(**lists):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dropped ops' warning (test_policy_replacement.py)
        return with_lists(get_preset("hpu"), **lists)


def _raise(policy, fn):
    with pytest.raises(RuntimeError) as info:
        with HpuAutocastMode(bf, policy=policy, device_type="cpu"):
            fn()
    return info.value


def test_the_issues_model_names_linear_unlisted_and_the_edit_that_fixes_it():
    lin1, lin2, x = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.randn(2, 4)
    policy = _replaced(lower=["gelu"])
    exc = _raise(policy, lambda: lin2(F.gelu(lin1(x))))
    assert str(exc).startswith("mat1 and mat2 must have the same dtype")  # torch's message is kept
    note = _notes(exc)
    assert (
        "linear raised torch's dtype-mismatch error (inputs bfloat16 and float32) in a bfloat16 region of "
        "policy 'hpu+lists', where linear is unlisted"
    ) in note
    assert "policy.edit(lower=['linear'])" in note
    # The fix it names works, first try.
    with HpuAutocastMode(bf, policy=policy.edit(lower=["linear"]), device_type="cpu"):
        assert lin2(F.gelu(lin1(x))).dtype is bf


@pytest.mark.parametrize(
    "name, call",
    [
        ("mm", lambda a, w: torch.mm(a, w)),
        ("matmul", lambda a, w: torch.matmul(a, w)),
        ("conv2d", lambda a, w: F.conv2d(a.reshape(1, 1, 4, 4), w.reshape(1, 1, 4, 4))),
        ("lerp", lambda a, w: torch.lerp(a, w, 0.5)),  # an elementwise op
    ],
)
def test_each_kind_of_op_is_named_with_what_the_policy_does(name, call):
    # linear's output (lower under hpu) meets a float32 tensor in an op the edit takes off the
    # table (matmul's insides, mm, too: else matmul decomposes to a lower mm, which casts).
    policy = get_preset("hpu").edit(unlisted=["mm", "matmul", "conv2d", "lerp"])
    a, w = torch.randn(4, 4), torch.randn(4, 4)
    exc = _raise(policy, lambda: call(F.linear(a, torch.eye(4)), w))
    note = _notes(exc)
    assert (
        f"hpu_autocast: {name} raised torch's dtype-mismatch error (inputs bfloat16 and float32) in a "
        f"bfloat16 region of policy 'hpu+edit', where {name} is unlisted"
    ) in note
    assert f"Fix: policy.edit(lower=['{name}']) runs it in bfloat16" in note


def test_other_errors_are_left_exactly_as_they_were():
    boom = RuntimeError("shape mismatch: no dtype here")

    def raise_it():
        raise boom

    exc = _raise(get_preset("hpu"), raise_it)
    assert exc is boom and exc.args == ("shape mismatch: no dtype here",) and not hasattr(exc, "__notes__")
    exc = _raise(get_preset("hpu"), lambda: torch.mm(torch.randn(2, 3), torch.randn(2, 3)))  # a shape error
    assert not hasattr(exc, "__notes__")
    with pytest.raises(ValueError) as info:
        with HpuAutocastMode(bf, device_type="cpu"):
            raise ValueError("same dtype")  # not torch's RuntimeError
    assert not hasattr(info.value, "__notes__")


def test_nested_regions_note_once_with_the_innermost_policy():
    policy = _replaced(lower=["gelu"])
    with pytest.raises(RuntimeError) as info:
        with HpuAutocastMode(bf, device_type="cpu"):
            with HpuAutocastMode(bf, policy=policy, device_type="cpu"):
                F.linear(torch.randn(2, 4).to(bf), torch.randn(4, 4))
    notes = getattr(info.value, "__notes__", [str(info.value)])
    assert sum("hpu_autocast:" in n for n in notes) == 1 and "'hpu+lists'" in notes[-1]

"""``Policy.edit``: ops move between kinds one at a time and every other op stays where it was
(builder's Note: an edit moves ops, a list replaces lists). Each test states what it checks
against: the preset's own table (every other row unchanged), a hand-cast control run bit for
bit, or the error a user reads."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

from hpu_autocast import (
    CastPolicy,
    HpuAutocastMode,
    PolicyError,
    get_preset,
    with_lists,
)
from hpu_autocast.cli import policy_rows

aten = torch.ops.aten


def _rows(policy):
    return {r["op"]: r["action"] for r in policy_rows(policy)}


def _changed(before, after):
    a, b = _rows(before), _rows(after)
    return {op: (a.get(op), b.get(op)) for op in a.keys() | b.keys() if a.get(op) != b.get(op)}


def test_the_new_users_first_try_gelu_in_bfloat16_keeps_linear_lower():
    # The first task: with_lists(hpu, lower=["gelu"]) dropped linear and 26 other ops
    # from the lower list, and lin2(gelu(lin1(x))) then failed on a bf16 x f32 matmul.
    torch.manual_seed(0)
    lin1, lin2, x = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.randn(3, 8)
    hpu = get_preset("hpu")
    policy = hpu.edit(lower=["gelu"])
    with HpuAutocastMode(torch.bfloat16, policy=policy, device_type="cpu"):
        out = lin2(F.gelu(lin1(x)))
    # The control run, cast by hand: linear lower (hpu), gelu lower (the edit).
    bf = torch.bfloat16
    h = F.linear(x.to(bf), lin1.weight.to(bf), lin1.bias.to(bf))
    want = F.linear(F.gelu(h), lin2.weight.to(bf), lin2.bias.to(bf))
    assert out.dtype is bf and torch.equal(out, want)
    # gelu moved to lower, and nothing else moved: the rest of the table is hpu's, row for row.
    assert _changed(hpu, policy) == {"aten.gelu.default": (None, "lower")}
    assert policy.table[aten.linear.default] is CastPolicy.LOWER
    assert policy.name == "hpu+edit" and hpu.name == "hpu"  # a new value; the preset is untouched


def test_with_lists_replaces_where_edit_keeps():
    # The contrast the docs lead with: the same words, two meanings.
    hpu = get_preset("hpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        replaced = with_lists(hpu, lower=["gelu"])
    assert aten.linear.default not in replaced.table or replaced.table[aten.linear.default] is not CastPolicy.LOWER
    assert hpu.edit(lower=["gelu"]).table[aten.linear.default] is CastPolicy.LOWER


def test_every_kind_moves_its_ops_and_only_them():
    hpu = get_preset("hpu")
    edited = hpu.edit(
        lower=["gelu"],
        fp32=["mm"],
        fp32_set_opt_dtype=["cumsum"],
        fp32_append_dtype=["norm"],
        promote=["where"],
        first=["relu"],
        unlisted=["softmax"],
        name="mine",
    )
    changed = _changed(hpu, edited)
    assert changed.pop("aten.gelu.default") == (None, "lower")
    assert {changed.pop(op) for op in list(changed) if op.startswith("aten.mm.")} == {("lower", "fp32")}
    assert {changed.pop(op)[1] for op in list(changed) if op.startswith("aten.cumsum.")} == {"fp32_set_opt_dtype"}
    assert {changed.pop(op)[1] for op in list(changed) if op.startswith("aten.norm.")} == {"fp32_append_dtype"}
    assert {changed.pop(op)[1] for op in list(changed) if op.startswith("aten.where.")} == {"promote"}
    assert changed.pop("aten.relu.default")[1] == "promote"  # the CLI shows FIRST under promote
    assert edited.table[aten.relu.default] is CastPolicy.FIRST
    softmax = [op for op in changed if op.startswith("aten.softmax.")]
    assert softmax and all(changed.pop(op) == (_rows(hpu)[op], None) for op in softmax)  # off the table
    assert changed == {}  # nothing else moved
    assert edited.name == "mine"
    # fp32_append_dtype takes only the overloads with a sibling (norm.Scalar, norm.ScalarOpt_dim).
    assert all(op.overloadpacket is aten.norm for op in edited.ops(CastPolicy.FP32_APPEND_DTYPE))


def test_an_edit_runs_as_the_hand_cast_control_under_each_kind():
    # mm moved to fp32, exp to unlisted, on an otherwise hpu region: mm computes in float32 on
    # bf16 inputs, exp runs in the dtype it is given.
    a = torch.randn(4, 4).to(torch.bfloat16)
    policy = get_preset("hpu").edit(fp32=["mm"], unlisted=["exp"])
    with HpuAutocastMode(torch.bfloat16, policy=policy, device_type="cpu"):
        mm, exp = torch.mm(a, a), torch.exp(a)
    assert mm.dtype is torch.float32 and torch.equal(mm, torch.mm(a.float(), a.float()))
    assert exp.dtype is torch.bfloat16 and torch.equal(exp, torch.exp(a))


def test_in_place_ops_named_for_promote_keep_their_first_inputs_dtype():
    edited = get_preset("torch-cpu").edit(promote=["add_"])  # hpu applies no in-place name (Gaudi)
    assert {edited.table[op] for op in edited.table if op.overloadpacket is aten.add_} == {CastPolicy.FIRST}


def test_unknown_names_name_the_name_and_the_closest_valid_ones():
    with pytest.raises(PolicyError, match=r"unknown op 'gelux'; closest valid names: gelu"):
        get_preset("hpu").edit(lower=["gelux"])


def test_an_op_named_under_two_kinds_names_both_entries():
    # add.Tensor is one of add's functional overloads: the two spellings collide on it.
    with pytest.raises(
        PolicyError,
        match=r"aten.add.Tensor is named under two kinds of one edit: lower, as "
        r"'add', and fp32, as 'add.Tensor'",
    ):
        get_preset("torch-cpu").edit(lower=["add"], fp32=["add.Tensor"])


def test_a_kind_an_op_cannot_take_is_refused_with_the_kinds_it_can():
    with pytest.raises(
        PolicyError,
        match=r"'mm' cannot be moved to fp32_append_dtype: aten.mm.default cannot "
        r"take that cast policy .* the kinds it can take: lower, fp32, promote, "
        r"first, unlisted",
    ):
        get_preset("hpu").edit(fp32_append_dtype=["mm"])


def test_a_misspelt_kind_names_the_kinds():
    with pytest.raises(TypeError, match="unexpected keyword argument 'bf16'"):
        get_preset("hpu").edit(bf16=["gelu"])


def test_hpus_c_names_rule_applies_to_an_edit_as_to_a_build(monkeypatch):
    # iadd is a Python name: Gaudi's bridge matches C++ names, so under hpu it does nothing,
    # with a warning that points at the caller's line (this file), not at the package.
    from hpu_autocast.policies import builder, gaudi

    monkeypatch.setattr(builder, "_warned", set())
    hpu = get_preset("hpu")
    with pytest.warns(UserWarning, match="'iadd' on the lower list has no effect under policy 'hpu'") as w:
        edited = hpu.edit(lower=["iadd"])
    assert w[0].filename == __file__
    assert _changed(hpu, edited) == {}
    assert ("iadd", "lower", gaudi._PYTHON_NAME) in edited.ignored
    # Under torch-cpu every name applies: iadd is add_'s in-place overloads.
    cpu = get_preset("torch-cpu").edit(lower=["iadd"])
    assert cpu.table[aten.add_.Tensor] is CastPolicy.LOWER


def test_unlisted_hands_the_op_to_the_policys_rule_for_ops_on_no_list():
    # Under hmp an op on no list runs in its first input's dtype (unlisted=FIRST): an edit to
    # unlisted takes mm off the lower list, and the rule then applies.
    edited = get_preset("hmp").edit(unlisted=["mm"])
    a, b = torch.randn(2, 2), torch.randn(2, 2).to(torch.bfloat16)
    with HpuAutocastMode(torch.bfloat16, policy=edited, device_type="cpu"):
        assert torch.mm(a, b).dtype is torch.float32  # first input's dtype
    assert aten.mm.default not in edited.table and aten.mm.default not in edited.promoted


def test_an_edited_policy_is_a_value():
    edited = get_preset("hpu").edit(lower=["gelu"], unlisted=["mm"])
    assert pickle.loads(pickle.dumps(edited)) == edited == copy.deepcopy(edited)
    assert edited == get_preset("hpu").edit(lower=["gelu"], unlisted=["mm"])
    assert hash(edited) != hash(get_preset("hpu"))
    assert edited.edit(lower=["relu"]).name == "hpu+edit"  # edits compose; the name says it once
    # An edit of an edited policy keeps the first edit too.
    assert edited.edit(lower=["relu"]).table[aten.gelu.default] is CastPolicy.LOWER


def test_an_edit_lifts_a_ban_it_names():
    cuda = get_preset("torch-cuda")
    assert aten.binary_cross_entropy.default in cuda.banned
    edited = cuda.edit(fp32=["binary_cross_entropy"])
    assert aten.binary_cross_entropy.default not in edited.banned
    assert edited.table[aten.binary_cross_entropy.default] is CastPolicy.FP32

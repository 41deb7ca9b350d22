"""``Policy`` as a value: built by hand with clear errors, equal to its copies and pickles."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch

from hpu_autocast import CastPolicy, Policy, get_preset, preset_names
from hpu_autocast.policies.policy import BuildRecord

aten = torch.ops.aten
MM, EXP = aten.mm.default, aten.exp.default

torch.library.define("hpu_autocast_policy_test::twice", "(Tensor x) -> Tensor")


@torch.library.impl("hpu_autocast_policy_test::twice", "CompositeExplicitAutograd")
def _twice(x):
    return x * 2


@pytest.mark.parametrize("preset", preset_names())
def test_a_preset_survives_pickle_and_deepcopy(preset):
    # Both raised "cannot pickle 'mappingproxy' object"; torch cannot pickle an OpOverload
    # either, so overloads travel by name.
    policy = get_preset(preset)
    for other in (pickle.loads(pickle.dumps(policy)), copy.deepcopy(policy)):
        assert other == policy and hash(other) == hash(policy)
        assert dict(other.table) == dict(policy.table) and other.banned == policy.banned
        assert other.input_only == policy.input_only and other.promoted == policy.promoted


def test_a_custom_op_policy_pickles():
    policy = Policy(name="custom", table={torch.ops.hpu_autocast_policy_test.twice.default: CastPolicy.LOWER})
    assert pickle.loads(pickle.dumps(policy)) == policy


def test_actions_may_be_given_by_their_string_value():
    # Was: AttributeError "'str' object has no attribute 'value'".
    policy = Policy(name="x", table={MM: "lower", EXP: "fp32"}, unlisted="first")
    assert policy.table == {MM: CastPolicy.LOWER, EXP: CastPolicy.FP32}
    assert policy.unlisted is CastPolicy.FIRST
    assert policy == Policy(name="x", table={MM: CastPolicy.LOWER, EXP: CastPolicy.FP32}, unlisted=CastPolicy.FIRST)


def test_a_bad_action_names_the_key_the_value_and_the_accepted_values():
    with pytest.raises(ValueError) as err:
        Policy(name="x", table={MM: "low"})
    assert str(err.value) == (
        "Policy 'x': table[aten.mm.default] = 'low' is not a cast policy; accepted: CastPolicy.LOWER "
        "or 'lower', CastPolicy.FP32 or 'fp32', CastPolicy.FP32_SET_OPT_DTYPE or 'fp32_set_opt_dtype', "
        "CastPolicy.FP32_APPEND_DTYPE or 'fp32_append_dtype', CastPolicy.PROMOTE or 'promote', CastPolicy.FIRST or 'first'"
    )


@pytest.mark.parametrize(
    "key, kind", [("mm", "str"), (aten.mm, "OpOverloadPacket"), (torch.mm, "builtin_function_or_method")]
)
def test_a_key_that_is_not_an_overload_points_to_build_policy(key, kind):
    with pytest.raises(TypeError) as err:
        Policy(name="x", table={key: CastPolicy.LOWER})
    assert str(err.value) == (
        f"Policy 'x': table key: {key!r} is a {kind}, not an OpOverload such as torch.ops.aten.mm.default; "
        "to build a policy from op names use hpu_autocast.build_policy"
    )


def test_ops_named_outside_the_table_are_overloads_too():
    with pytest.raises(TypeError, match="Policy 'x': input_only: 'layer_norm' is a str"):
        Policy(name="x", table={}, input_only={"layer_norm"})
    with pytest.raises(TypeError, match="Policy 'x': banned key: 'binary_cross_entropy' is a str"):
        Policy(name="x", table={}, banned={"binary_cross_entropy": "no"})


def test_equal_policies_hash_alike_and_every_field_counts():
    a = Policy(name="x", table={MM: CastPolicy.LOWER})
    assert a == Policy(name="x", table={MM: "lower"}) and hash(a) == hash(Policy(name="x", table={MM: "lower"}))
    assert a != dataclasses.replace(a, device_type="cpu") and a != dataclasses.replace(a, explicit_dtype="cast")
    # What a rebuild needs (the promote list a replaced lower list falls back to, Gaudi's name rule)
    # is the build record's: it changes no cast, so it is no part of the value.
    rebuilt = dataclasses.replace(a, record=BuildRecord(promoted={MM}, c_names_only=True))
    assert rebuilt == a and hash(rebuilt) == hash(a) and rebuilt.promoted == {MM} and rebuilt.c_names_only


def test_the_build_record_travels_with_a_policy_but_is_not_its_value():
    # What a build let go of says how a policy was made, not what it does: a record of its own
    # made an equal policy unequal, so it took another compiled key (a recompilation) and
    # another kernel table for the same casts.
    from hpu_autocast._engine.compiled import compile_policy, policy_serial

    a = Policy(name="x", table={MM: CastPolicy.LOWER})
    record = BuildRecord(missing=["gone"], ignored=[["iadd", "lower", "a Python name"]], promoted={MM})
    b = dataclasses.replace(a, record=record)
    assert b == a and hash(b) == hash(a) and policy_serial(b) == policy_serial(a)
    assert compile_policy(b).key == compile_policy(a).key
    assert (b.missing, b.ignored) == (("gone",), (("iadd", "lower", "a Python name"),)) and a.missing == ()
    for other in (pickle.loads(pickle.dumps(b)), copy.deepcopy(b)):
        assert other.record == record
    with pytest.raises(TypeError, match="record must be a BuildRecord, got tuple"):
        Policy(name="x", table={}, record=("gone",))


def test_a_policy_is_frozen_all_the_way_down():
    policy = Policy(name="x", table={MM: CastPolicy.LOWER})
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.name = "y"
    with pytest.raises(TypeError):
        policy.table[EXP] = CastPolicy.FP32


def test_device_type_defaults_to_the_running_device():
    assert Policy(name="x", table={}).device_type is None
    # The torch and XPU presets name their device; Gaudi's leave it to the mode.
    device_types = {name: get_preset(name).device_type for name in preset_names()}
    assert device_types == {
        "hpu": None,
        "hmp": None,
        "hmp-O2": None,
        "xpu": "xpu",
        "torch-cpu": "cpu",
        "torch-cuda": "cuda",
    }


def test_the_new_cast_policies_and_explicit_dtype_are_part_of_the_value():
    # torch-cuda holds both float32 dtype policies and explicit_dtype="cast": they survive pickle
    # (checked above for every preset) and tell policies apart, in equality and the compiled key.
    from hpu_autocast._engine.compiled import compile_policy

    cuda = get_preset("torch-cuda")
    assert cuda.ops(CastPolicy.FP32_SET_OPT_DTYPE) and cuda.ops(CastPolicy.FP32_APPEND_DTYPE)
    other = pickle.loads(pickle.dumps(cuda))
    assert other.explicit_dtype == "cast" and other.ops(CastPolicy.FP32_APPEND_DTYPE) == cuda.ops(
        CastPolicy.FP32_APPEND_DTYPE
    )
    left = dataclasses.replace(cuda, explicit_dtype="leave")
    assert left != cuda and compile_policy(left).key != compile_policy(cuda).key
    sum_op = torch.ops.aten.sum.default
    as_fp32 = dataclasses.replace(cuda, table={**cuda.table, sum_op: CastPolicy.FP32})
    assert as_fp32 != cuda and compile_policy(as_fp32).key != compile_policy(cuda).key


def test_a_bad_explicit_dtype_names_the_accepted_values():
    with pytest.raises(ValueError) as err:
        Policy(name="x", table={MM: "lower"}, explicit_dtype="ignore")
    assert str(err.value) == "Policy 'x': explicit_dtype = 'ignore'; accepted: 'leave' or 'cast'"


def test_an_op_that_cannot_take_a_dtype_policy_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^Policy 'x': aten.mm.default cannot be fp32_append_dtype: "):
        Policy(name="x", table={MM: "fp32_append_dtype"})

"""The dtype rules as properties, over random shapes and input dtypes (hypothesis)."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpu_autocast import CastPolicy, HpuAutocastMode, build_policy
from hpu_autocast.rules import compute_dtype, is_eligible

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool]
LOWER_DTYPES = [torch.bfloat16, torch.float16]

POLICY = build_policy("properties", lower=["mul", "maximum"], fp32=["atan2", "hypot"],
                      promote=["add", "sub"])
ACTIONS = {"mul": CastPolicy.LOWER, "maximum": CastPolicy.LOWER, "atan2": CastPolicy.FP32,
           "hypot": CastPolicy.FP32, "add": CastPolicy.PROMOTE, "sub": CastPolicy.PROMOTE}
FLOAT_ONLY = {"atan2", "hypot"}  # no integer or bool kernels

settings.register_profile("suite", max_examples=60, deadline=None)
settings.load_profile("suite")


@st.composite
def broadcastable_shapes(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    other = [d if draw(st.booleans()) else 1 for d in shape]
    return tuple(shape), tuple(other[draw(st.integers(0, len(other))):])


def _tensor(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-4, 5, shape, generator=g, dtype=dtype)
    return torch.randn(shape, generator=g).to(dtype)


def _control(name, a, b, lower):
    """The hand-cast control: what the rule says the mode does, with no mode."""
    eligible = [t.dtype for t in (a, b) if is_eligible(t)]
    target = compute_dtype(ACTIONS[name], eligible, lower) if eligible else None
    cast = (lambda t: t.to(target) if target is not None and is_eligible(t) else t)
    return getattr(torch, name)(cast(a), cast(b))


@given(name=st.sampled_from(sorted(ACTIONS)), shapes=broadcastable_shapes(),
       da=st.sampled_from(DTYPES), db=st.sampled_from(DTYPES), lower=st.sampled_from(LOWER_DTYPES),
       seed=st.integers(0, 2**16))
def test_binary_op_follows_its_rule(name, shapes, da, db, lower, seed):
    if name in FLOAT_ONLY and not (da.is_floating_point or db.is_floating_point):
        return
    if name == "sub" and torch.bool in (da, db):
        return  # torch refuses bool subtraction with or without a mode
    a, b = _tensor(shapes[0], da, seed), _tensor(shapes[1], db, seed + 1)
    with HpuAutocastMode(lower, policy=POLICY):
        out = getattr(torch, name)(a, b)
    control = _control(name, a, b, lower)
    assert out.dtype == control.dtype and torch.equal(out, control)
    eligible = [t.dtype for t in (a, b) if is_eligible(t)]
    if eligible and torch.float64 not in (da, db):
        # The statements of the rules, in dtypes.
        action = ACTIONS[name]
        if action is CastPolicy.LOWER:
            assert out.dtype == lower
        elif action is CastPolicy.FP32:
            assert out.dtype == torch.float32
        else:
            assert out.dtype == functools.reduce(torch.promote_types, eligible)
    if not eligible:
        assert torch.equal(out, getattr(torch, name)(a, b))


@given(shapes=broadcastable_shapes(), da=st.sampled_from(DTYPES[:4]), db=st.sampled_from(DTYPES[:4]),
       lower=st.sampled_from(LOWER_DTYPES), seed=st.integers(0, 2**16),
       form=st.sampled_from(["inplace", "out", "dtype"]))
def test_ineligible_calls_equal_the_call_with_no_mode(shapes, da, db, lower, seed, form):
    a, b = _tensor(shapes[0], da, seed), _tensor(shapes[1], db, seed + 1)
    full = torch.broadcast_shapes(a.shape, b.shape)

    def call():
        if form == "inplace":
            x = a.expand(full).clone().to(torch.promote_types(da, db))
            return x.mul_(b)
        if form == "out":
            return torch.mul(a, b, out=torch.empty(full, dtype=torch.promote_types(da, db)))
        return torch.softmax(a, -1, dtype=db) if a.dim() else torch.softmax(a.reshape(1), -1, dtype=db)

    plain = call()
    with HpuAutocastMode(lower, policy=POLICY):
        ours = call()
    assert ours.dtype == plain.dtype and torch.equal(ours, plain)


@given(dtypes=st.lists(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), max_size=4),
       lower=st.sampled_from(LOWER_DTYPES))
def test_compute_dtype(dtypes, lower):
    assert compute_dtype(CastPolicy.LOWER, dtypes, lower) is lower
    assert compute_dtype(CastPolicy.FP32, dtypes, lower) is torch.float32
    widest = functools.reduce(torch.promote_types, dtypes) if dtypes else None
    assert compute_dtype(CastPolicy.PROMOTE, dtypes, lower) == widest
    assert compute_dtype(CastPolicy.FIRST, dtypes, lower) == (dtypes[0] if dtypes else None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_eligibility(dtype):
    assert is_eligible(torch.zeros(1, dtype=dtype)) == (dtype.is_floating_point and dtype is not torch.float64)

"""The dtype rules as properties, over random shapes and input dtypes (hypothesis).

The inputs and policies come from ``hpu_autocast.testing``'s public strategies, the ones users
write their own property tests with: ``inputs_for(op)``, ``eligible_tensors()``, ``policies()``.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch.nn.functional as F

from hpu_autocast import CastPolicy, HpuAutocastMode, build_policy, get_preset
from hpu_autocast.policies.rules import PromoteError, compute_dtype, has_explicit_dtype, is_eligible as _is_eligible
from hpu_autocast.testing import eligible_tensors, inputs_for, policies

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool]
LOWER_DTYPES = [torch.bfloat16, torch.float16]
#: hpu with torch.amp's documented rule for explicit dtypes (a call passing one runs unchanged).
HPU_LEAVE = dataclasses.replace(get_preset("hpu"), name="hpu (explicit dtype left)", explicit_dtype="leave")

POLICY = build_policy("properties", lower=["mul", "maximum"], fp32=["atan2", "hypot"], promote=["add", "sub"])
ACTIONS = {
    "mul": CastPolicy.LOWER,
    "maximum": CastPolicy.LOWER,
    "atan2": CastPolicy.FP32,
    "hypot": CastPolicy.FP32,
    "add": CastPolicy.PROMOTE,
    "sub": CastPolicy.PROMOTE,
}
FLOAT_ONLY = {"atan2", "hypot"}  # no integer or bool kernels
#: Each name's tensor-tensor overload (what ``torch.<name>(a, b)`` calls with two tensors).
OVERLOADS = {
    "mul": torch.ops.aten.mul.Tensor,
    "maximum": torch.ops.aten.maximum.default,
    "atan2": torch.ops.aten.atan2.default,
    "hypot": torch.ops.aten.hypot.default,
    "add": torch.ops.aten.add.Tensor,
    "sub": torch.ops.aten.sub.Tensor,
}


def pair(name):
    """Two tensors ``torch.<name>`` takes: the second broadcasts against the first; each of any
    dtype of DTYPES (float32, both lower dtypes, float64, int64, bool), shapes of 0 to 3
    dimensions of size 1 to 4. Unchecked: torch's refusals (bool subtraction) are outcomes here."""
    calls = inputs_for(OVERLOADS[name], dtypes=DTYPES, mixed=True, device="cpu", check=False)
    return calls.map(lambda call: call[0][:2])


def is_eligible(t) -> bool:
    return _is_eligible(t, "cpu")  # every tensor here is on the CPU, the regions' device


def _target(action, eligible, lower):
    """The rule's dtype for these eligible input dtypes, or PromoteError where the rule raises."""
    try:
        return compute_dtype(action, eligible, lower) if eligible else None
    except PromoteError:
        return PromoteError


# Explicit per test (a profile loaded here would change every other module's hypothesis tests).
FAST = settings(max_examples=60, deadline=None)


@st.composite
def broadcastable_shapes(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    other = [d if draw(st.booleans()) else 1 for d in shape]
    return tuple(shape), tuple(other[draw(st.integers(0, len(other))) :])


def _tensor(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-4, 5, shape, generator=g, dtype=dtype)
    return torch.randn(shape, generator=g).to(dtype)


def _control(name, a, b, lower, action):
    """The hand-cast control: what the rule says the mode does, with no mode (``action`` None:
    the op is on no list, and runs as it would)."""
    eligible = [t.dtype for t in (a, b) if is_eligible(t)]
    target = _target(action, eligible, lower) if action is not None else None
    if target is PromoteError:
        return target
    cast = lambda t: t.to(target) if target is not None and is_eligible(t) else t
    return getattr(torch, name)(cast(a), cast(b))


@pytest.mark.parametrize("name", sorted(ACTIONS))
@settings(max_examples=30, deadline=None)
@given(data=st.data(), lower=st.sampled_from(LOWER_DTYPES))
def test_binary_op_follows_its_rule(name, data, lower):
    a, b = data.draw(pair(name), label="a, b")
    _binary_op_follows_its_rule(name, a, b, lower, POLICY, ACTIONS[name])


@pytest.mark.parametrize("name", sorted(ACTIONS))
@settings(max_examples=20, deadline=None)
@given(
    data=st.data(),
    lower=st.sampled_from(LOWER_DTYPES),
    policy=policies(presets=[], ops=OVERLOADS.values(), max_changes=len(OVERLOADS)),
)
def test_binary_op_follows_any_drawn_policy(name, data, lower, policy):
    # The same statements for any valid policy over these ops, the op on any list or on none.
    a, b = data.draw(pair(name), label="a, b")
    _binary_op_follows_its_rule(name, a, b, lower, policy, policy.table.get(OVERLOADS[name]))


def _binary_op_follows_its_rule(name, a, b, lower, policy, action):
    da, db = a.dtype, b.dtype
    if name in FLOAT_ONLY and not (da.is_floating_point or db.is_floating_point):
        return
    if name == "sub" and torch.bool in (da, db):
        return  # torch refuses bool subtraction with or without a mode
    control = _control(name, a, b, lower, action)
    if control is PromoteError:
        # Promote met the other lower dtype before any float32: it raises, as native autocast does.
        with HpuAutocastMode(lower, policy=policy, device_type="cpu"), pytest.raises(PromoteError):
            getattr(torch, name)(a, b)
        return
    with HpuAutocastMode(lower, policy=policy, device_type="cpu"):
        out = getattr(torch, name)(a, b)
    assert out.dtype == control.dtype and torch.equal(out, control)
    eligible = [t.dtype for t in (a, b) if is_eligible(t)]
    if eligible and torch.float64 not in (da, db) and action is not None:
        # The statements of the rules, in dtypes.
        if action is CastPolicy.LOWER:
            assert out.dtype == lower
        elif action is CastPolicy.FP32:
            assert out.dtype == torch.float32
        else:
            assert out.dtype == functools.reduce(torch.promote_types, eligible)
    if not eligible or action is None:
        assert torch.equal(out, getattr(torch, name)(a, b))


@FAST
@given(
    shapes=broadcastable_shapes(),
    da=st.sampled_from(DTYPES[:4]),
    db=st.sampled_from(DTYPES[:4]),
    lower=st.sampled_from(LOWER_DTYPES),
    seed=st.integers(0, 2**16),
    form=st.sampled_from(["inplace", "out", "dtype"]),
    preset=st.booleans(),
)
def test_ineligible_calls_equal_the_call_with_no_mode(shapes, da, db, lower, seed, form, preset):
    # mul is LOWER in both policies; softmax is LOWER under hpu (so dtype= is tested there).
    # (hpu with torch.amp's documented rule for dtype=: test_explicit_dtype_cast has the bridge's.)
    policy, lower = (HPU_LEAVE, torch.bfloat16) if preset else (POLICY, lower)
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
    with HpuAutocastMode(lower, policy=policy, device_type="cpu"):
        ours = call()
    assert ours.dtype == plain.dtype and torch.equal(ours, plain)


@FAST
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    da=st.sampled_from(DTYPES[:4]),
    db=st.sampled_from(DTYPES[:4]),
    seed=st.integers(0, 2**16),
)
def test_explicit_dtype_cast(shape, da, db, seed):
    # Policy.explicit_dtype="cast" (hpu, as Gaudi's Hpu_WrapFunction_): softmax, LOWER under
    # hpu, reads its eligible input in bfloat16 whatever dtype= says; float64 is not eligible.
    a = _tensor(tuple(shape), da, seed)
    control = a.bfloat16() if da is not torch.float64 else a
    with HpuAutocastMode(torch.bfloat16, policy="hpu", device_type="cpu"):
        ours = torch.softmax(a, -1, dtype=db)
    expected = torch.softmax(control, -1, dtype=db)
    assert ours.dtype == expected.dtype and torch.equal(ours, expected)


# --- the hpu preset's elementwise-friendly ops ----------------------------------------------
# Seed 000's list for each (FP32 and lower win over promote: mul is LOWER, exp/div/pow FP32).
HPU_OPS = {
    "mul": (CastPolicy.LOWER, 2, torch.mul),
    "leaky_relu": (CastPolicy.LOWER, 1, lambda a: F.leaky_relu(a, 0.1)),
    "softmax": (CastPolicy.LOWER, 1, lambda a: torch.softmax(a, -1)),
    "mean": (CastPolicy.LOWER, 1, torch.mean),
    "exp": (CastPolicy.FP32, 1, torch.exp),
    "rsqrt": (CastPolicy.FP32, 1, torch.rsqrt),
    "tan": (CastPolicy.FP32, 1, torch.tan),
    "reciprocal": (CastPolicy.FP32, 1, torch.reciprocal),
    "atan2": (CastPolicy.FP32, 2, torch.atan2),
    "div": (CastPolicy.FP32, 2, torch.div),
    "pow": (CastPolicy.FP32, 2, torch.pow),
    "add": (CastPolicy.PROMOTE, 2, torch.add),
    "sub": (CastPolicy.PROMOTE, 2, torch.sub),
    "addcmul": (CastPolicy.PROMOTE, 3, lambda a, b, c: torch.addcmul(a, b, c, value=0.5)),
    "cat": (CastPolicy.PROMOTE, 2, lambda a, b: torch.cat([a, b.expand_as(a)])),
    "stack": (CastPolicy.PROMOTE, 2, lambda a, b: torch.stack([a, b.expand_as(a)])),
}


def _outcome(fn, tensors):
    """The call's result, or the type of the error it raises (torch refuses some dtypes with
    or without a mode: integer softmax, bool subtraction, integers to negative powers)."""
    try:
        return fn(*tensors)
    except (RuntimeError, TypeError) as e:
        return type(e)


def _same(out, control) -> bool:
    if not isinstance(out, torch.Tensor) or not isinstance(control, torch.Tensor):
        return out is control
    if out.dtype != control.dtype or out.shape != control.shape:
        return False
    # exp/rsqrt/pow give inf and NaN on some inputs: equal bit for bit, NaN where NaN.
    return torch.equal(out, control) or (
        out.is_floating_point() and bool(torch.all((out == control) | (out.isnan() & control.isnan())))
    )


@pytest.mark.parametrize("name", sorted(HPU_OPS))
@settings(max_examples=40, deadline=None)
@given(shapes=broadcastable_shapes(), data=st.data())
def test_hpu_preset_op_follows_its_seed_list(name, shapes, data):
    action, arity, fn = HPU_OPS[name]
    # Any dtype of DTYPES per input (eligible or not), alternating two broadcastable shapes.
    tensors = [
        data.draw(eligible_tensors(shapes[i % 2], dtypes=DTYPES, device="cpu"), label=f"input {i}")
        for i in range(arity)
    ]
    dtypes = [t.dtype for t in tensors]
    with HpuAutocastMode(device_type="cpu"):
        out = _outcome(fn, tensors)
    # The hand-cast control: each eligible input cast to the rule's dtype, no mode.
    eligible = [t.dtype for t in tensors if is_eligible(t)]
    target = _target(action, eligible, torch.bfloat16)
    control = (
        target
        if target is PromoteError
        else _outcome(fn, [t.to(target) if target is not None and is_eligible(t) else t for t in tensors])
    )
    assert _same(out, control), (out, control)
    if not eligible:
        # Nothing eligible (integers, bool, float64 only): exactly the call with no mode.
        assert _same(out, _outcome(fn, tensors))
    elif isinstance(out, torch.Tensor) and torch.float64 not in dtypes[:arity]:
        # The statements of seed 000's three registrations, in dtypes.
        expected = {CastPolicy.LOWER: torch.bfloat16, CastPolicy.FP32: torch.float32}.get(
            action, functools.reduce(torch.promote_types, eligible)
        )
        assert out.dtype == expected


PROMOTE_IADD = build_policy("promote-iadd", promote=["iadd"], dtypes=(torch.bfloat16,))


def _iadd(a, b):
    a += b
    return a


@settings(max_examples=80, deadline=None)
@given(
    shapes=broadcastable_shapes(), da=st.sampled_from(DTYPES), db=st.sampled_from(DTYPES), seed=st.integers(0, 2**16)
)
def test_iadd_on_a_promote_list_keeps_its_first_input_dtype(shapes, da, db, seed):
    # Seed 000 lists iadd under promote (Gaudi's bridge ignores the name, so hpu does too); an
    # in-place op cannot change its self's dtype, so the other operand is cast to self's dtype
    # (CastPolicy.FIRST) when both are eligible.
    full = torch.broadcast_shapes(*shapes)
    a, b = _tensor(full, da, seed), _tensor(shapes[1], db, seed + 1)
    with HpuAutocastMode(policy=PROMOTE_IADD, device_type="cpu"):
        out = _outcome(_iadd, [a.clone(), b])
    eligible = [t.dtype for t in (a, b) if is_eligible(t)]
    target = compute_dtype(CastPolicy.FIRST, eligible, torch.bfloat16) if eligible else None
    control = _outcome(_iadd, [a.clone(), b.to(target) if target is not None and is_eligible(b) else b])
    assert _same(out, control), (out, control)
    if isinstance(out, torch.Tensor):
        assert out.dtype == da


@FAST
@given(
    dtypes=st.lists(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), max_size=4),
    lower=st.sampled_from(LOWER_DTYPES),
)
def test_compute_dtype(dtypes, lower):
    assert compute_dtype(CastPolicy.LOWER, dtypes, lower) is lower
    assert compute_dtype(CastPolicy.FP32, dtypes, lower) is torch.float32
    # Native autocast's promote: float32 wins; another lower dtype before any float32 raises.
    before_f32 = dtypes[: dtypes.index(torch.float32)] if torch.float32 in dtypes else dtypes
    if any(d is not lower for d in before_f32):
        with pytest.raises(PromoteError, match="cannot promote"):
            compute_dtype(CastPolicy.PROMOTE, dtypes, lower)
    else:
        widest = functools.reduce(torch.promote_types, dtypes) if dtypes else None
        assert compute_dtype(CastPolicy.PROMOTE, dtypes, lower) == widest
    assert compute_dtype(CastPolicy.FIRST, dtypes, lower) == (dtypes[0] if dtypes else None)


@FAST
@given(
    args=st.lists(st.sampled_from(["t", 1, 2.5, None, "dtype"]), max_size=4),
    kw=st.dictionaries(
        st.sampled_from(["dim", "dtype", "out", "alpha"]), st.sampled_from(["t", 1, "dtype"]), max_size=3
    ),
)
def test_has_explicit_dtype(args, kw):
    def make(v):
        return torch.zeros(1) if v == "t" else torch.float32 if v == "dtype" else v

    expected = "dtype" in args or "dtype" in kw.values()
    assert has_explicit_dtype(tuple(map(make, args)), {k: make(v) for k, v in kw.items()}) is expected


@pytest.mark.parametrize("dtype", DTYPES)
def test_eligibility(dtype):
    floating = dtype.is_floating_point and dtype is not torch.float64
    assert _is_eligible(torch.zeros(1, dtype=dtype), "cpu") == floating
    assert not _is_eligible(torch.zeros(1, dtype=dtype), "cuda")  # a tensor of another device
    assert not _is_eligible(torch.zeros(1, dtype=dtype, device="meta"), "cpu")

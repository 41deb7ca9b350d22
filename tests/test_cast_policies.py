"""The cast spec: each cast policy (ATen's five and Gaudi's lower-first) and the explicit-dtype
rule, run against both engines in this process: a plain region (the C++ core where it is built)
and an observing region (whose calls the Python kernels always decide).

* ``torch-cuda`` against native CUDA autocast: the ATen calls that reach below autocast
  (overload, input dtypes, dtype arguments, ``_trace``) equal native's, on fake CUDA tensors, for
  the calls where the policies differ (issue 28): losses that decompose, reductions with an
  optional dtype (``fp32_set_opt_dtype``), norms that gain one (``fp32_append_dtype``), a
  lower-precision GEMM, a float32 norm.
* Every cast policy on CPU tensors against a hand-made control that applies ATen's rule
  (``WrapFunction_::call``) by hand: the same calls below autocast, and the same values bit for bit.
* Hypothesis properties for the two float32 dtype policies' dtype rules.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from _trace import native, trace_in
from hpu_autocast import HpuAutocastMode, build_policy, get_preset, with_lists
from hpu_autocast.policies.rules import PromoteError


def _x(dtype):
    return torch.randn(4, 6).to(dtype)


#: name -> (function, its tensor arguments as functions of the input dtype).
CASES = {
    "cross_entropy": (F.cross_entropy, lambda d: (_x(d), torch.tensor([0, 1, 2, 5]))),
    "sum": (lambda x: x.sum(), lambda d: (_x(d),)),
    "sum(0)": (lambda x: x.sum(0), lambda d: (_x(d),)),
    "prod": (lambda x: x.prod(), lambda d: (_x(d),)),
    "cumsum": (lambda x: x.cumsum(0), lambda d: (_x(d),)),
    "softmax": (lambda x: x.softmax(-1), lambda d: (_x(d),)),
    "log_softmax": (lambda x: x.log_softmax(-1), lambda d: (_x(d),)),
    "softmax(dtype=float64)": (lambda x: x.softmax(-1, dtype=torch.float64), lambda d: (_x(d),)),
    "vector_norm": (torch.linalg.vector_norm, lambda d: (_x(d),)),
    "norm": (lambda x: x.norm(), lambda d: (_x(d),)),
    "norm(2, dim=0)": (lambda x: x.norm(2, dim=0), lambda d: (_x(d),)),
    "norm.Scalar": (lambda x: torch.ops.aten.norm.Scalar(x, 3), lambda d: (_x(d),)),
    "norm.ScalarOpt_dim": (lambda x: torch.ops.aten.norm.ScalarOpt_dim(x, 2, [1]), lambda d: (_x(d),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), lambda d: (_x(d), torch.randn(6), torch.randn(6))),
    "linear": (F.linear, lambda d: (_x(d), torch.randn(3, 6), torch.randn(3))),
    "mm": (torch.mm, lambda d: (_x(d), torch.randn(6, 2))),
}


def _trace(fn, tensors, region) -> list:
    """The calls below autocast of ``fn`` on fake CUDA tensors made from ``tensors``, in ``region``."""
    log, error = trace_in(fn, tuple(tensors), {}, "cuda", region)
    assert error is None
    return log


#: The two engines in one process: a plain region (the C++ core, where built) and an observing
#: one (the Python kernels decide every call of an observing region).
ENGINES = {"core": {}, "python": {"observer": lambda event: None}}


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("inputs", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_cuda_reaches_below_autocast_as_native_does(name, dtype, inputs, engine):
    fn, make = CASES[name]
    torch.manual_seed(0)
    tensors = make(inputs)
    # Where native raises (layer_norm's float64 input beside the float32 weight it casts, on torch
    # 2.14's fake CUDA tensors), the region raises alike after the same calls.
    want = trace_in(fn, tuple(tensors), {}, "cuda", native("cuda", dtype))
    ours = trace_in(fn, tuple(tensors), {}, "cuda", HpuAutocastMode(dtype, policy="torch-cuda", **ENGINES[engine]))
    assert ours == want


def test_the_trace_tells_the_policies_apart():
    # Native passes dtype=float32 to sum (fp32_set_opt_dtype) and leaves its input alone; a policy
    # that casts the input to float32 instead (the old approximation) is seen in the trace.
    want = _trace(lambda x: x.sum(), (_x(torch.bfloat16),), native("cuda", torch.bfloat16))
    assert want == ["aten.sum.default(bf16[4, 6], dtype=torch.float32)"]
    cast = with_lists(get_preset("torch-cuda"), fp32=["sum"], name="sum as fp32")
    ours = _trace(lambda x: x.sum(), (_x(torch.bfloat16),), HpuAutocastMode(torch.bfloat16, policy=cast))
    assert ours[-1] == "aten.sum.default(f32[4, 6])"


# --- every cast policy on the CPU, against ATen's rule applied by hand ------------------------

F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64


#: An op with a keyword-only tensor input, where this torch has it (CPU flash attention, torch 2.3+).
_SDPA_NAME = [n for n in ("_scaled_dot_product_flash_attention_for_cpu",) if hasattr(torch.ops.aten, n)]


def _spec_policy(explicit_dtype: str):
    return build_policy(
        f"spec ({explicit_dtype})",
        lower=["mm", *_SDPA_NAME],
        fp32=["exp", "prod"],
        promote=["cat", "add_"],
        fp32_set_opt_dtype=["sum", "softmax", "cumsum"],
        fp32_append_dtype=["norm"],
        device_type="cpu",
        explicit_dtype=explicit_dtype,
    )


def _eligible(x: torch.Tensor) -> bool:
    return x.is_floating_point() and x.dtype is not F64


def _low(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) if _eligible(x) else x


_W, _Y = torch.randn(6, 3), torch.randn(4, 6)


def _promote_cat(x: torch.Tensor, d: torch.dtype) -> torch.Tensor:
    """PROMOTE by hand: float32 wins over the region's dtype; another lower dtype raises."""
    if _eligible(x) and x.dtype not in (F32, d):
        raise PromoteError(f"{x.dtype} in a {d} region")
    return torch.cat([_low(x, F32), _Y])


_NORM_SCALAR, _NORM_DIM = torch.ops.aten.norm.Scalar, torch.ops.aten.norm.ScalarOpt_dim
#: name -> (the call, ATen's rule for it by hand given the region's dtype, explicit_dtype rules
#: it holds under: "any", "leave" or "cast").
SPEC = {
    "lower mm": (lambda x: torch.mm(x, _W), lambda x, d: torch.mm(_low(x, d), _W.to(d)), "any"),
    "fp32 exp": (torch.exp, lambda x, d: torch.exp(_low(x, F32)), "any"),
    "promote cat": (lambda x: torch.cat([x, _Y]), lambda x, d: _promote_cat(x, d), "any"),
    "first add_": (
        lambda x: x.clone().add_(_Y),
        lambda x, d: x.clone().add_(_Y.to(x.dtype) if _eligible(x) else _Y),
        "any",
    ),
    "set_opt sum": (lambda x: x.sum(), lambda x, d: x.sum(dtype=F32) if _eligible(x) else x.sum(), "any"),
    "set_opt sum(0)": (lambda x: x.sum(0), lambda x, d: x.sum(0, dtype=F32) if _eligible(x) else x.sum(0), "any"),
    "set_opt softmax": (
        lambda x: torch.softmax(x, -1),
        lambda x, d: torch.softmax(x, -1, dtype=F32 if _eligible(x) else None),
        "any",
    ),
    "set_opt cumsum kept dtype": (lambda x: x.cumsum(0, dtype=F64), lambda x, d: x.cumsum(0, dtype=F64), "any"),
    "append norm.Scalar": (
        lambda x: _NORM_SCALAR(x, 3),
        lambda x, d: torch.ops.aten.norm.ScalarOpt_dtype(x, 3, dtype=F32 if _eligible(x) else x.dtype),
        "any",
    ),
    "append norm.ScalarOpt_dim": (
        lambda x: _NORM_DIM(x, 2, [1]),
        lambda x, d: torch.ops.aten.norm.ScalarOpt_dim_dtype(x, 2, [1], False, dtype=F32 if _eligible(x) else x.dtype),
        "any",
    ),
    "explicit dtype left": (lambda x: x.prod(dtype=F64), lambda x, d: x.prod(dtype=F64), "leave"),
    "explicit dtype cast": (lambda x: x.prod(dtype=F64), lambda x, d: _low(x, F32).prod(dtype=F64), "cast"),
}

if _SDPA_NAME:
    # A keyword-only tensor input (attn_mask): the walk finds it per call, after the positional ones.
    _SDPA = getattr(torch.ops.aten, _SDPA_NAME[0]).default
    _K, _V = torch.randn(1, 1, 4, 6), torch.randn(1, 1, 4, 6)

    def _sdpa(x: torch.Tensor, cast) -> torch.Tensor:
        q, mask = x.view(1, 1, 4, 6), x[:, :4].reshape(1, 1, 4, 4)
        mask, v, k, q = cast(mask), cast(_V), cast(_K), cast(q)  # last to first (Note [the order of casts])
        return _SDPA(q, k, v, attn_mask=mask)[0]

    SPEC["lower keyword-only attn_mask"] = (
        lambda x: _sdpa(x, lambda t: t),
        lambda x, d: _sdpa(x, lambda t: _low(t, d)),
        "any",
    )

if hasattr(torch.ops.aten.norm, "names_ScalarOpt_dim"):
    # The Dimname twin: an operator up to torch 2.11, registered for AutocastCUDA there (found on a
    # GPU machine); named tensors run on CPU only, so only this spec checks it.
    def _named(x: torch.Tensor) -> torch.Tensor:
        return x.refine_names("rows", "cols")

    SPEC["append norm.names_ScalarOpt_dim"] = (
        lambda x: torch.ops.aten.norm.names_ScalarOpt_dim(_named(x), 2, ["cols"]).rename(None),
        lambda x, d: torch.ops.aten.norm.names_ScalarOpt_dim_dtype(
            _named(x), 2, ["cols"], False, dtype=F32 if _eligible(x) else x.dtype
        ).rename(None),
        "any",
    )


def _spec_cases():
    for name, (_, _, rule) in sorted(SPEC.items()):
        for explicit in ("leave", "cast") if rule == "any" else (rule,):
            yield pytest.param(name, explicit, id=f"{name}-{explicit}")


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("inputs", [F32, BF16, torch.float16, F64], ids=str)
@pytest.mark.parametrize("name, explicit", list(_spec_cases()))
def test_each_cast_policy_follows_atens_rule(name, explicit, inputs, engine):
    fn, control, _ = SPEC[name]
    x = torch.randn(4, 6).to(inputs)
    policy = _spec_policy(explicit)
    ours_trace, err = trace_in(fn, (x,), {}, "cpu", HpuAutocastMode(BF16, policy=policy, **ENGINES[engine]))
    expected_trace, expected_err = trace_in(lambda t: control(t, BF16), (x,), {}, "cpu", _Nothing())
    assert (err, ours_trace) == (expected_err, expected_trace)
    if err is None:
        with HpuAutocastMode(BF16, policy=policy, **ENGINES[engine]):
            ours = fn(x)
        expected = control(x, BF16)
        assert ours.dtype == expected.dtype and torch.equal(ours, expected)


@pytest.mark.skipif(not _SDPA_NAME, reason="this torch has no CPU flash attention op")
def test_a_keyword_only_input_is_cast_and_reported_in_argument_order():
    # The keyword tensor is one more slot of the walk: cast through the cache like the others, and
    # named by its keyword in the event, after the positional ones.
    x = torch.randn(4, 6)
    events = []
    with HpuAutocastMode(BF16, policy=_spec_policy("cast"), observer=events.append):
        _sdpa(x, lambda t: t)
    (event,) = [e for e in events if e.op is _SDPA]
    assert [(c.arg, c.from_dtype, c.to_dtype) for c in event.casts] == [
        (name, F32, BF16) for name in ("query", "key", "value", "attn_mask")
    ]


class _Nothing:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        pass


def test_a_wrong_rule_would_show_in_the_spec():
    # sum as plain fp32 casts its input: its trace has the cast and no dtype argument.
    x = torch.randn(4, 6).bfloat16()
    wrong = with_lists(_spec_policy("leave"), fp32=["exp", "prod", "sum"], name="sum as fp32")
    ours, _ = trace_in(lambda t: t.sum(), (x,), {}, "cpu", HpuAutocastMode(BF16, policy=wrong))
    expected, _ = trace_in(lambda t: t.sum(dtype=F32), (x,), {}, "cpu", _Nothing())
    assert ours != expected


# --- properties of the two float32 dtype policies ---------------------------------------------

_DTYPES = st.sampled_from([F32, BF16, torch.float16, F64])
_POLICY = {explicit: _spec_policy(explicit) for explicit in ("leave", "cast")}


@settings(max_examples=40, deadline=None)
@given(
    x_dtype=_DTYPES,
    given_dtype=st.one_of(st.none(), _DTYPES),
    region=st.sampled_from([BF16, torch.float16]),
    explicit=st.sampled_from(["leave", "cast"]),
    dim=st.integers(0, 1),
)
def test_set_opt_dtype_sets_only_an_unset_dtype_and_casts_nothing(x_dtype, given_dtype, region, explicit, dim):
    # fp32_set_opt_dtype: dtype becomes float32 only if the call leaves it unset and the first
    # argument is eligible; the input is never cast (explicit_dtype does not apply to it).
    x = torch.randn(3, 5).to(x_dtype)
    with HpuAutocastMode(region, policy=_POLICY[explicit]):
        ours = torch.cumsum(x, dim, dtype=given_dtype)
    wanted = given_dtype if given_dtype is not None else F32 if _eligible(x) else None
    expected = torch.cumsum(x, dim, dtype=wanted)
    assert ours.dtype == expected.dtype and torch.equal(ours, expected)


@settings(max_examples=40, deadline=None)
@given(
    x_dtype=_DTYPES, region=st.sampled_from([BF16, torch.float16]), p=st.sampled_from([1, 2, 3]), keepdim=st.booleans()
)
def test_append_dtype_calls_the_dtype_overload_with_float32_or_the_inputs_dtype(x_dtype, region, p, keepdim):
    x = torch.randn(3, 5).to(x_dtype)
    with HpuAutocastMode(region, policy=_POLICY["leave"]):
        ours = (_NORM_SCALAR(x, p), _NORM_DIM(x, p, [0], keepdim))
    dtype = F32 if _eligible(x) else x_dtype
    expected = (
        torch.ops.aten.norm.ScalarOpt_dtype(x, p, dtype=dtype),
        torch.ops.aten.norm.ScalarOpt_dim_dtype(x, p, [0], keepdim, dtype=dtype),
    )
    for a, b in zip(ours, expected):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_a_kind_an_op_cannot_take_is_refused_by_name():
    with pytest.raises(
        ValueError,
        match=r"aten.mm.default cannot be fp32_set_opt_dtype: that cast policy needs "
        r"a functional overload with a first Tensor argument and an optional dtype argument",
    ):
        build_policy("bad", fp32_set_opt_dtype=["mm"])
    with pytest.raises(ValueError, match=r"aten.sum.\w+ cannot be fp32_append_dtype: .*aten::norm.Scalar"):
        build_policy("bad", fp32_append_dtype=["sum"])


# --- explicit dtype arguments: what native does, and torch-* with it -----------------------------


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("inputs", [F32, BF16, F64], ids=str)
def test_torch_cpu_casts_a_call_with_an_explicit_dtype_as_native_does(inputs, engine):
    # ATen's fp32 kernel casts every eligible tensor whatever the call's dtype= (WrapFunction_
    # applies cached_cast to each argument): CPU's prod(x, dtype=float64) reads x in float32.
    x = torch.randn(4, 6).to(inputs)
    fn = lambda t: t.prod(1, dtype=F64)  # noqa: E731
    want, _ = trace_in(fn, (x,), {}, "cpu", torch.autocast("cpu", dtype=BF16))
    ours, _ = trace_in(fn, (x,), {}, "cpu", HpuAutocastMode(BF16, policy="torch-cpu", **ENGINES[engine]))
    assert ours == want
    if inputs is BF16:
        assert want[0] == "aten._to_copy.default(bf16[4, 6], dtype=torch.float32)"

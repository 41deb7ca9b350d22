"""The default ``hpu`` policy against seed 000, op by op: each op of the three lists runs in the
dtype its list gives, with values equal bit for bit to a hand-cast control run with no mode."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_map

from _samples import SAMPLES, build
from hpu_autocast import HpuAutocastMode, PolicyError

# A copy of ../shared/seeds, so a clone on its own can run the suite (test_seed_copies_are_current).
SEED = pathlib.Path(__file__).resolve().parent / "seeds" / "000_6bf55abaf442eb78.txt"


def _seed_lists():
    text = SEED.read_text()

    def grab(label):
        m = re.search(rf"•\s*{label}:\s*(.+)", text)
        return [n.strip() for n in m.group(1).split(",")]

    return grab("Lower precision"), grab("FP32"), grab("Promote")


LOWER, FP32, PROMOTE = _seed_lists()
NORMS = {"batch_norm", "group_norm", "instance_norm", "layer_norm"}


def expected_list(name: str) -> str:
    # Seed 000: FP32 and lower-precision lists take precedence over promote.
    return "lower" if name in LOWER else "fp32" if name in FP32 else "promote"


def _floating(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype is not torch.float64


def _to(dtype):
    return lambda t: t.to(dtype) if _floating(t) else t


def _equal(a, b) -> bool:
    fa, sa = tree_flatten(a)
    fb, sb = tree_flatten(b)
    return sa == sb and all(
        (x.dtype == y.dtype and torch.equal(x, y)) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(fa, fb))


def _call(fn, args, kwargs):
    torch.manual_seed(0)
    return fn(*args, **kwargs)


def test_seed_copies_are_current():
    # /work/main/tests -> /work/shared; a worktree /work/wt/<name>/tests -> /work/shared too.
    here = pathlib.Path(__file__).resolve()
    found = [p / "shared" / "seeds" for p in here.parents[1:4] if (p / "shared" / "seeds").is_dir()]
    if not found:
        pytest.skip("no shared/seeds beside this checkout")
    shared = found[0]
    for f in SEED.parent.glob("*.txt"):
        assert f.read_text() == (shared / f.name).read_text(), f"tests/seeds/{f.name} is stale"


def test_seed_lists_parsed():
    assert len(LOWER) == 27 and len(FP32) == 49 and len(PROMOTE) == 12
    assert "cross_entropy_loss" in FP32 and "iadd" in PROMOTE
    assert LOWER[0] == "addmm" and LOWER[-1] == "scaled_dot_product_attention"
    assert FP32[-1] == "true_divide" and PROMOTE[-1] == "stack"


#: Seed names no sample can call on CPU, each with the reason. Every name of seed 000's lists
#: runs on CPU with torch 2.13, so this is empty; a name added here must say why.
EXCLUDED: dict = {}


def test_every_seed_name_has_a_sample_or_a_reasoned_exclusion():
    names = set(LOWER) | set(FP32) | set(PROMOTE)
    missing = sorted(n for n in names if n not in SAMPLES and n not in EXCLUDED)
    assert not missing, f"seed 000 names with no sample in tests/_samples.py: {missing}"
    assert all(isinstance(why, str) and len(why) > 10 for why in EXCLUDED.values())


def test_exclusions_are_few():
    assert len(EXCLUDED) <= 2, sorted(EXCLUDED)


def _mixed(args, kwargs):
    """The same inputs with the first floating tensor in bfloat16 and the others float32."""
    seen = []

    def one(t):
        if _floating(t):
            seen.append(t)
            return t.bfloat16() if len(seen) == 1 else t.float()
        return t

    return tree_map(one, args), tree_map(one, kwargs)


def _cast_all(dtype, args, kwargs):
    return tree_map(_to(dtype), args), tree_map(_to(dtype), kwargs)


def _floats_are(out, dtype) -> bool:
    floats = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return bool(floats) and all(t.dtype == dtype for t in floats)


# Each op is called as written (float32 inputs, as a model's would be) and with mixed inputs.
FORMS = ["float32", "mixed"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", sorted(set(LOWER) - NORMS))
def test_lower_op(name, form):
    fn, args, kwargs = build(name)
    if form == "mixed":
        args, kwargs = _mixed(args, kwargs)
    with HpuAutocastMode():
        out = _call(fn, args, kwargs)
    # Lower list: every floating input in bfloat16, whatever it was (seed 000).
    control = _call(fn, *_cast_all(torch.bfloat16, args, kwargs))
    assert _floats_are(out, torch.bfloat16)
    assert _equal(out, control)


@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_casts_only_its_input(name):
    fn, args, kwargs = build(name)
    args = list(args)
    # The control: only the input in bfloat16; weight, bias, running statistics float32.
    control_args = [args[0].bfloat16(), *[a.clone() if isinstance(a, torch.Tensor) else a for a in args[1:]]]
    with HpuAutocastMode():
        out = _call(fn, args, kwargs)
    control = _call(fn, control_args, kwargs)
    assert out.dtype == torch.bfloat16
    assert _equal(out, control)
    # Running statistics keep float32 and are updated like the control's.
    for a, c in zip(args[1:], control_args[1:]):
        if isinstance(a, torch.Tensor):
            assert a.dtype == torch.float32 and torch.equal(a, c)


# "bfloat16": what a lower-list op upstream would feed it; "mixed": bfloat16 beside float32.
@pytest.mark.parametrize("form", ["bfloat16", "mixed"])
@pytest.mark.parametrize("name", sorted(set(FP32) - set(LOWER)))
def test_fp32_op(name, form):
    fn, args, kwargs = build(name)
    args, kwargs = _cast_all(torch.bfloat16, args, kwargs) if form == "bfloat16" else _mixed(args, kwargs)
    with HpuAutocastMode():
        out = _call(fn, args, kwargs)
    # FP32 list (and FP32 wins over promote): every floating input in float32.
    control = _call(fn, *_cast_all(torch.float32, args, kwargs))
    assert _floats_are(out, torch.float32)  # topk: its values; the indices stay int64
    assert _equal(out, control)


@pytest.mark.parametrize("name", sorted(set(FP32) - set(LOWER)))
def test_fp32_op_leaves_its_insides_alone(name):
    # A composite on the FP32 list (cross_entropy_loss, cosine_similarity, kl_div, ...) calls
    # lower-list ops (log_softmax, mul, mean); native autocast applies the policy at its entry
    # only. The observer sees every decision the policy made: FP32 ones only (kl_div's
    # "batchmean" divides in F.kl_div's Python body, outside the composite: div, FP32 too).
    fn, args, kwargs = build(name)
    args, kwargs = _cast_all(torch.bfloat16, args, kwargs)
    decisions = []

    def observer(level, rule, func, reason, *_):
        if rule is not None:
            decisions.append(reason)

    with HpuAutocastMode(observer=observer):
        _call(fn, args, kwargs)
    assert decisions and set(decisions) == {"fp32"}


PROMOTE_ONLY = sorted(set(PROMOTE) - set(LOWER) - set(FP32) - {"iadd"})


@pytest.mark.parametrize("name", PROMOTE_ONLY)
def test_promote_op(name):
    fn, args, kwargs = build(name)
    seen = []

    def mixed(t):  # the first floating input in bfloat16, the others float32
        if _floating(t):
            seen.append(t)
            return t.bfloat16() if len(seen) == 1 else t
        return t

    args = tree_map(mixed, args)
    with HpuAutocastMode():
        out = _call(fn, args, kwargs)
    assert out.dtype == torch.float32
    assert _equal(out, _call(fn, tree_map(_to(torch.float32), args), kwargs))
    # All inputs in bfloat16: the widest is bfloat16.
    low = tree_map(_to(torch.bfloat16), args)
    with HpuAutocastMode():
        out = _call(fn, low, kwargs)
    assert out.dtype == torch.bfloat16 and _equal(out, _call(fn, low, kwargs))


def test_ops_on_two_lists_follow_the_stronger_one():
    # mul: lower and promote -> lower; div, exp, pow, addcdiv, truediv: fp32 and promote -> fp32.
    assert {"mul"} <= set(LOWER) & set(PROMOTE)
    assert {"div", "exp", "pow", "addcdiv", "truediv"} <= set(FP32) & set(PROMOTE)
    x = torch.randn(3, dtype=torch.bfloat16)
    with HpuAutocastMode():
        assert torch.mul(x.float(), x.float()).dtype == torch.bfloat16
        assert (x / x).dtype == torch.float32
        assert torch.exp(x).dtype == torch.float32


def test_iadd_keeps_the_dtype_of_its_first_input():
    a = torch.randn(3, 4, dtype=torch.bfloat16)
    b = torch.randn(3, 4)
    ours, control = a.clone(), a.clone()
    with HpuAutocastMode():
        ours += b
    control += b.bfloat16()
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, control)
    # float32 self: the other input is cast up, the sum lands in self.
    c = torch.randn(3, 4)
    ours, control = c.clone(), c.clone()
    with HpuAutocastMode():
        ours += a
    control += a.float()
    assert ours.dtype == torch.float32 and torch.equal(ours, control)


def test_cross_entropy_runs_wholly_in_float32():
    # log_softmax and mul inside cross_entropy are on the lower list; native autocast applies the
    # policy at the composite's entry and leaves its insides alone, and so must we.
    x = torch.randn(4, 5, dtype=torch.bfloat16)
    y = torch.tensor([0, 1, 2, 3])
    with HpuAutocastMode():
        loss = F.cross_entropy(x, y, label_smoothing=0.1)
    assert loss.dtype == torch.float32
    assert torch.equal(loss, F.cross_entropy(x.float(), y, label_smoothing=0.1))


def test_float16_is_refused_by_name():
    with pytest.raises((ValueError, PolicyError), match="float16"):
        HpuAutocastMode(dtype=torch.float16)


# --- calls that are not eligible run untouched ------------------------------------------------

def _untouched(fn):
    torch.manual_seed(0)
    plain = fn()
    torch.manual_seed(0)
    with HpuAutocastMode():
        ours = fn()
    assert _equal(ours, plain)
    return ours


def test_inplace_not_named_is_untouched():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = _untouched(lambda: a.clone().mul_(b))
    assert out.dtype == torch.float32


def test_out_overload_is_untouched():
    a, b = torch.randn(2, 4), torch.randn(4, 3)
    out = _untouched(lambda: torch.mm(a, b, out=torch.empty(2, 3)))
    assert out.dtype == torch.float32


def test_explicit_dtype_is_untouched():
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    assert _untouched(lambda: torch.softmax(x.float(), -1, dtype=torch.float32)).dtype == torch.float32
    assert _untouched(lambda: torch.softmax(x, -1, dtype=torch.float32)).dtype == torch.float32
    assert _untouched(lambda: torch.mean(x.float(), dtype=torch.float32)).dtype == torch.float32


def test_float64_is_untouched():
    a, b = torch.randn(2, 4, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    assert _untouched(lambda: torch.mm(a, b)).dtype == torch.float64
    assert _untouched(lambda: torch.exp(a)).dtype == torch.float64
    # float64 beside float32 under promote: float64 is not eligible, so nothing is cast and
    # torch's own type promotion decides.
    w = torch.randn(4, 3)
    assert _untouched(lambda: torch.add(b, w)).dtype == torch.float64


def test_integer_calls_are_untouched():
    a, b = torch.randint(-5, 5, (2, 4)), torch.randint(-5, 5, (4, 3))
    assert _untouched(lambda: torch.mm(a, b)).dtype == torch.int64
    assert _untouched(lambda: a * 3).dtype == torch.int64


def test_batchnorm_training_updates_running_statistics():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3).train()
    control = nn.BatchNorm2d(3).train()
    x = torch.randn(4, 3, 5, 5)
    with HpuAutocastMode():
        y = bn(x)
    z = control(x.bfloat16())
    assert y.dtype == torch.bfloat16 and torch.equal(y, z)
    assert bn.running_mean.dtype == torch.float32
    assert torch.count_nonzero(bn.running_mean) == 3 and bn.num_batches_tracked.item() == 1
    assert torch.equal(bn.running_mean, control.running_mean)
    assert torch.equal(bn.running_var, control.running_var)

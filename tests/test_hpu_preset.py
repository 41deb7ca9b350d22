"""The default ``hpu`` policy against seed 000, op by op: each op of the three lists runs in the
dtype its list gives, with values equal bit for bit to a hand-cast control run with no mode.

The lists are parsed from the seed's text (tests/seeds/000_gaudi_autocast.txt, a copy of
../shared/seeds, see _seeds.py), not taken from ``presets/gaudi_autocast.py``, so a drift between the document and the preset fails here. Sections:
the lists op by op (samples from ``_samples.py``); module, method, operator and namespace
spellings; calls that are not eligible (in-place, ``out=``, ``dtype=``, float64, integers);
``nn.BatchNorm2d`` running statistics. Known engine bugs are strict xfails with their cause.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_map

from _samples import SAMPLES, build
from _seeds import SEEDS, SHA256, SHARED
from hpu_autocast import CastPolicy, HpuAutocastMode
from hpu_autocast.events import Outcome

SEED = SEEDS / "000_gaudi_autocast.txt"


def _seed_lists():
    text = SEED.read_text()

    def grab(label):
        m = re.search(rf"•\s*{label}:\s*(.+)", text)
        return [n.strip() for n in m.group(1).split(",")]

    return grab("Lower precision"), grab("FP32"), grab("Promote")


LOWER, FP32, PROMOTE = _seed_lists()

#: The lower list's norms, input-only under ``hpu`` (weight and bias keep float32): tested apart.
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
        (x.dtype == y.dtype and torch.equal(x, y)) if isinstance(x, torch.Tensor) else x == y for x, y in zip(fa, fb)
    )


def _call(fn, args, kwargs):
    torch.manual_seed(0)
    return fn(*args, **kwargs)


def test_seed_copies_are_current():
    # Every copy is byte for byte the document it copies, by the digest recorded beside the names
    # (tests/_seeds.py), so this runs on a fresh clone, which has no ../shared beside it.
    assert sorted(f.name for f in SEEDS.glob("*.txt")) == sorted(SHARED) == sorted(SHA256)
    for ours, digest in SHA256.items():
        assert hashlib.sha256((SEEDS / ours).read_bytes()).hexdigest() == digest, f"tests/seeds/{ours} is stale"
    # Where the shared documents are beside this checkout (/work/main/tests -> /work/shared; a
    # worktree /work/wt/<name>/tests -> /work/shared too), the recorded digests are theirs.
    here = pathlib.Path(__file__).resolve()
    for shared in [p / "shared" / "seeds" for p in here.parents[1:4] if (p / "shared" / "seeds").is_dir()][:1]:
        assert sorted(f.name for f in shared.glob("*.txt")) == sorted(SHARED.values())
        for ours, theirs in SHARED.items():
            assert hashlib.sha256((shared / theirs).read_bytes()).hexdigest() == SHA256[ours], theirs


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
    with HpuAutocastMode(device_type="cpu"):
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
    with HpuAutocastMode(device_type="cpu"):
        out = _call(fn, args, kwargs)
    control = _call(fn, control_args, kwargs)
    assert out.dtype == torch.bfloat16
    assert _equal(out, control)
    # Running statistics keep float32 and are updated like the control's.
    for a, c in zip(args[1:], control_args[1:]):
        if isinstance(a, torch.Tensor):
            assert a.dtype == torch.float32 and torch.equal(a, c)


# "bfloat16": what a lower-list op upstream would feed it; "mixed": bfloat16 beside float32.
def _norm_by_keyword(name, x):
    w, b = torch.rand(4, generator=_g(1)) + 0.5, torch.randn(4, generator=_g(2))
    if name == "layer_norm":
        return torch.layer_norm(input=x, normalized_shape=(4,), weight=w, bias=b)
    if name == "group_norm":
        return torch.group_norm(input=x.view(2, 4, 1), num_groups=2, weight=w, bias=b)
    return torch.batch_norm(
        input=x,
        weight=w,
        bias=b,
        running_mean=torch.zeros(4),
        running_var=torch.ones(4),
        training=True,
        momentum=0.1,
        eps=1e-5,
        cudnn_enabled=False,
    )


@pytest.mark.parametrize("name", ["layer_norm", "group_norm", "batch_norm"])
def test_norm_with_its_input_by_keyword_casts_it(name):
    x = _t(2, 4)
    with HpuAutocastMode(device_type="cpu"):
        ours = _norm_by_keyword(name, x)
    assert ours.dtype == torch.bfloat16 and _equal(ours, _norm_by_keyword(name, x.to(torch.bfloat16)))


@pytest.mark.parametrize("form", ["bfloat16", "mixed"])
@pytest.mark.parametrize("name", sorted(set(FP32) - set(LOWER)))
def test_fp32_op(name, form):
    fn, args, kwargs = build(name)
    args, kwargs = _cast_all(torch.bfloat16, args, kwargs) if form == "bfloat16" else _mixed(args, kwargs)
    with HpuAutocastMode(device_type="cpu"):
        out = _call(fn, args, kwargs)
    # FP32 list (and FP32 wins over promote): every floating input in float32.
    control = _call(fn, *_cast_all(torch.float32, args, kwargs))
    assert _floats_are(out, torch.float32)  # topk: its values; the indices stay int64
    assert _equal(out, control)


@pytest.mark.parametrize("name", sorted(LOWER))
def test_lower_op_leaves_its_insides_alone(name):
    # The lower list's composites (linear, matmul, conv*, scaled_dot_product_attention, dropout,
    # softmax) decompose into other ops, some on the FP32 list (sdpa's math path divides):
    # one decision, at the entry, as native autocast makes.
    fn, args, kwargs = build(name)
    decisions = []

    def observer(event):
        if event.action is not None:
            decisions.append((event.outcome, event.action))

    with HpuAutocastMode(device_type="cpu", observer=observer):
        _call(fn, args, kwargs)
    assert decisions == [(Outcome.CAST, CastPolicy.LOWER)]


@pytest.mark.parametrize("name", sorted(set(FP32) - set(LOWER)))
def test_fp32_op_leaves_its_insides_alone(name):
    # A composite on the FP32 list (cross_entropy_loss, cosine_similarity, kl_div, ...) calls
    # lower-list ops (log_softmax, mul, mean); native autocast applies the policy at its entry
    # only. The observer sees every decision the policy made: FP32 ones only (kl_div's
    # "batchmean" divides in F.kl_div's Python body, outside the composite: div, FP32 too).
    fn, args, kwargs = build(name)
    args, kwargs = _cast_all(torch.bfloat16, args, kwargs)
    decisions = []

    def observer(event):
        if event.action is not None:
            decisions.append(event.action)

    with HpuAutocastMode(device_type="cpu", observer=observer):
        _call(fn, args, kwargs)
    assert decisions and set(decisions) == {CastPolicy.FP32}


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
    with HpuAutocastMode(device_type="cpu"):
        out = _call(fn, args, kwargs)
    assert out.dtype == torch.float32
    assert _equal(out, _call(fn, tree_map(_to(torch.float32), args), kwargs))
    # All inputs in bfloat16: the widest is bfloat16.
    low = tree_map(_to(torch.bfloat16), args)
    with HpuAutocastMode(device_type="cpu"):
        out = _call(fn, low, kwargs)
    assert out.dtype == torch.bfloat16 and _equal(out, _call(fn, low, kwargs))


def test_ops_on_two_lists_follow_the_stronger_one():
    # mul: lower and promote -> lower; div, exp, pow, addcdiv, truediv: fp32 and promote -> fp32
    # (truediv, a Python name, does nothing on Gaudi; x / y is div, which is listed).
    assert {"mul"} <= set(LOWER) & set(PROMOTE)
    assert {"div", "exp", "pow", "addcdiv", "truediv"} <= set(FP32) & set(PROMOTE)
    x = torch.randn(3, dtype=torch.bfloat16)
    with HpuAutocastMode(device_type="cpu"):
        assert torch.mul(x.float(), x.float()).dtype == torch.bfloat16
        assert (x / x).dtype == torch.float32
        assert torch.exp(x).dtype == torch.float32


def test_iadd_does_nothing_as_on_gaudi():
    # The seed's promote list names iadd, but Gaudi's bridge matches C++ function names and
    # registers no in-place function (docs/hpu.md): x += y runs as with no mode, computing in
    # float32 and rounding once into x, where casting y to bfloat16 first would round twice.
    a = torch.randn(3, 4, dtype=torch.bfloat16)
    b = torch.randn(3, 4)
    ours, control = a.clone(), a.clone()
    with HpuAutocastMode(device_type="cpu"):
        ours += b
    control += b
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, control)
    assert not torch.equal(ours, a + b.bfloat16())  # the cast would show
    c = torch.randn(3, 4)
    ours, control = c.clone(), c.clone()
    with HpuAutocastMode(device_type="cpu"):
        ours += a
    control += a
    assert ours.dtype == torch.float32 and torch.equal(ours, control)


def test_cross_entropy_runs_wholly_in_float32():
    # log_softmax and mul inside cross_entropy are on the lower list; native autocast applies the
    # policy at the composite's entry and leaves its insides alone, and so must we.
    x = torch.randn(4, 5, dtype=torch.bfloat16)
    y = torch.tensor([0, 1, 2, 3])
    with HpuAutocastMode(device_type="cpu"):
        loss = F.cross_entropy(x, y, label_smoothing=0.1)
    assert loss.dtype == torch.float32
    assert torch.equal(loss, F.cross_entropy(x.float(), y, label_smoothing=0.1))


def test_float16_is_accepted_off_gaudi():
    # Was refused by name (seed 000); the bridge takes any autocast dtype, and only a
    # first-generation Gaudi refuses float16 (test_hpu_glue). Off Gaudi the lists apply as in
    # bfloat16: mm lower, exp FP32.
    x = torch.randn(3, 3)
    with HpuAutocastMode(dtype=torch.float16, device_type="cpu"):
        assert torch.mm(x, x).dtype == torch.float16 and torch.exp(x.half()).dtype == torch.float32


# --- module, method and operator spellings ----------------------------------------------------
# Seed 002/003: listed ops are cast "whether they are invoked as part of a torch.nn.Module, as a
# function, or as a torch.Tensor method". Each case: (seed name, ours, hand-cast control); the
# expected dtype comes from the seed's lists through expected_list.


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _t(*shape, seed=0, dtype=torch.float32, positive=False):
    t = torch.rand(*shape, generator=_g(seed)) + 0.5 if positive else torch.randn(*shape, generator=_g(seed))
    return t.to(dtype)


def _module(cls, *args, **kwargs):
    torch.manual_seed(0)
    return cls(*args, **kwargs)


BF = torch.bfloat16
X, Y, W = _t(2, 4), _t(2, 4, seed=1), _t(4, 3, seed=2)
XB, YB, PB = X.to(BF), Y.to(BF), _t(2, 4, seed=3, positive=True).to(BF)
IMG = _t(1, 2, 5, 5, seed=4)
TARGET = torch.tensor([0, 3])
IDX = torch.tensor([[0, 2], [4, 1]])


# Module cases: called with ours=True under the mode, ours=False for the hand-cast control,
# each on a freshly built module from the same seed.


def _linear(ours):
    m = _module(nn.Linear, 4, 3)
    return m(X) if ours else F.linear(X.to(BF), m.weight.to(BF), m.bias.to(BF))


def _conv2d(ours):
    m = _module(nn.Conv2d, 2, 3, 3, padding=1)
    return m(IMG) if ours else F.conv2d(IMG.to(BF), m.weight.to(BF), m.bias.to(BF), padding=1)


def _conv_transpose1d(ours):
    m = _module(nn.ConvTranspose1d, 2, 3, 3)
    x = IMG[:, :, 0]
    return m(x) if ours else F.conv_transpose1d(x.to(BF), m.weight.to(BF), m.bias.to(BF))


def _layer_norm(ours):
    m = _module(nn.LayerNorm, 4)
    with torch.no_grad():
        m.weight.copy_(_t(4, seed=5))
    # Input only: weight and bias stay float32 in the control too.
    return m(X) if ours else F.layer_norm(X.to(BF), (4,), m.weight, m.bias)


def _group_norm(ours):
    m = _module(nn.GroupNorm, 1, 2)
    return m(IMG) if ours else F.group_norm(IMG.to(BF), 1, m.weight, m.bias)


def _dropout(ours):
    m = _module(nn.Dropout, 0.5).train()
    torch.manual_seed(1)
    return m(X) if ours else F.dropout(X.to(BF), 0.5, True)


def _cross_entropy(ours):
    logits = _t(2, 4, dtype=BF)
    return nn.CrossEntropyLoss()(logits, TARGET) if ours else F.cross_entropy(logits.float(), TARGET)


def _embedding(ours):
    m = _module(nn.Embedding, 5, 3).to(BF)
    return m(IDX) if ours else F.embedding(IDX, m.weight.float())


def _bilinear(ours):
    m = _module(nn.Bilinear, 4, 4, 2)
    return m(XB, YB) if ours else F.bilinear(XB.float(), YB.float(), m.weight, m.bias)


def _both(fn):
    return functools.partial(fn, True), functools.partial(fn, False)


SPELLINGS = {
    # lower precision
    "x @ w": ("matmul", lambda: X @ W, lambda: X.to(BF) @ W.to(BF)),
    "x.mm(w)": ("mm", lambda: X.mm(W), lambda: X.to(BF).mm(W.to(BF))),
    "x.matmul(w)": ("matmul", lambda: X.matmul(W), lambda: X.to(BF).matmul(W.to(BF))),
    "x * y": ("mul", lambda: X * Y, lambda: X.to(BF) * Y.to(BF)),
    "x.mul(yb)": ("mul", lambda: X.mul(YB), lambda: X.to(BF).mul(YB)),
    "x.mean()": ("mean", lambda: X.mean(), lambda: X.to(BF).mean()),
    "x.softmax(-1)": ("softmax", lambda: X.softmax(-1), lambda: X.to(BF).softmax(-1)),
    "nn.Softmax": ("softmax", lambda: nn.Softmax(-1)(X), lambda: torch.softmax(X.to(BF), -1)),
    "nn.LogSoftmax": ("log_softmax", lambda: nn.LogSoftmax(-1)(X), lambda: torch.log_softmax(X.to(BF), -1)),
    "nn.LeakyReLU": ("leaky_relu", lambda: nn.LeakyReLU(0.2)(X), lambda: F.leaky_relu(X.to(BF), 0.2)),
    "nn.Dropout": ("dropout", *_both(_dropout)),
    "nn.Linear": ("linear", *_both(_linear)),
    "nn.Conv2d": ("conv2d", *_both(_conv2d)),
    "nn.ConvTranspose1d": ("conv_transpose1d", *_both(_conv_transpose1d)),
    "nn.LayerNorm": ("layer_norm", *_both(_layer_norm)),
    "nn.GroupNorm": ("group_norm", *_both(_group_norm)),
    # FP32
    "xb / yb": ("truediv", lambda: XB / PB, lambda: XB.float() / PB.float()),
    "xb.div(yb)": ("div", lambda: XB.div(PB), lambda: XB.float().div(PB.float())),
    "pb ** yb": ("pow", lambda: PB**YB, lambda: PB.float() ** YB.float()),
    "2 ** xb": ("pow", lambda: 2**XB, lambda: 2 ** XB.float()),
    "xb.exp()": ("exp", lambda: XB.exp(), lambda: XB.float().exp()),
    "pb.log()": ("log", lambda: PB.log(), lambda: PB.float().log()),
    "pb.rsqrt()": ("rsqrt", lambda: PB.rsqrt(), lambda: PB.float().rsqrt()),
    "xb.logsumexp(-1)": ("logsumexp", lambda: XB.logsumexp(-1), lambda: XB.float().logsumexp(-1)),
    "nn.Softplus": ("softplus", lambda: nn.Softplus()(XB), lambda: F.softplus(XB.float())),
    "nn.MSELoss": ("mse_loss", lambda: nn.MSELoss()(XB, YB), lambda: F.mse_loss(XB.float(), YB.float())),
    "nn.CrossEntropyLoss": ("cross_entropy_loss", *_both(_cross_entropy)),
    "nn.CosineSimilarity": (
        "cosine_similarity",
        lambda: nn.CosineSimilarity()(XB, YB),
        lambda: F.cosine_similarity(XB.float(), YB.float()),
    ),
    "nn.Embedding": ("embedding", *_both(_embedding)),
    "nn.Bilinear": ("bilinear", *_both(_bilinear)),
    # other namespaces and aliases (seed 002/003: "regardless of the namespace")
    "torch.linalg.matmul": ("matmul", lambda: torch.linalg.matmul(X, W), lambda: torch.matmul(X.to(BF), W.to(BF))),
    "torch.multiply": ("mul", lambda: torch.multiply(X, Y), lambda: torch.mul(X.to(BF), Y.to(BF))),
    "torch.arccos": (
        "acos",
        lambda: torch.arccos(XB.clamp(-0.9, 0.9)),
        lambda: torch.acos(XB.clamp(-0.9, 0.9).float()),
    ),
    "torch.arctan2": ("atan2", lambda: torch.arctan2(XB, YB), lambda: torch.atan2(XB.float(), YB.float())),
    "torch.special.expm1": ("expm1", lambda: torch.special.expm1(XB), lambda: torch.expm1(XB.float())),
    "torch.special.logsumexp": (
        "logsumexp",
        lambda: torch.special.logsumexp(XB, -1),
        lambda: torch.logsumexp(XB.float(), -1),
    ),
    "torch.subtract": ("sub", lambda: torch.subtract(XB, Y), lambda: torch.sub(XB.float(), Y)),
    "torch.concat": ("cat", lambda: torch.concat([XB, Y]), lambda: torch.cat([XB.float(), Y])),
    "conv1d(padding='same')": (
        "conv1d",
        lambda: F.conv1d(IMG[:, :, 0], _t(3, 2, 3, seed=13), padding="same"),
        lambda: F.conv1d(IMG[:, :, 0].to(BF), _t(3, 2, 3, seed=13).to(BF), padding="same"),
    ),
    # promote: bfloat16 beside float32 runs in float32
    "xb + y": ("add", lambda: XB + Y, lambda: XB.float() + Y),
    "xb - y": ("sub", lambda: XB - Y, lambda: XB.float() - Y),
    "xb.addcmul(y, yb)": ("addcmul", lambda: XB.addcmul(Y, YB), lambda: XB.float().addcmul(Y, YB.float())),
    "torch.cat": ("cat", lambda: torch.cat([XB, Y]), lambda: torch.cat([XB.float(), Y])),
    "torch.stack": ("stack", lambda: torch.stack([XB, Y]), lambda: torch.stack([XB.float(), Y])),
}

_EXPECTED_DTYPE = {"lower": torch.bfloat16, "fp32": torch.float32, "promote": torch.float32}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_module_method_and_operator_spellings(spelling):
    name, ours_fn, control_fn = SPELLINGS[spelling]
    with HpuAutocastMode(device_type="cpu"):
        ours = ours_fn()
    control = control_fn()
    assert ours.dtype == _EXPECTED_DTYPE[expected_list(name)]
    assert _equal(ours, control)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_special_namespace_softmax_is_cast(name):
    special, plain = getattr(torch.special, name), getattr(torch, name)
    with HpuAutocastMode(device_type="cpu"):
        ours = special(X, -1)
    assert ours.dtype == torch.bfloat16 and _equal(ours, plain(X.to(BF), -1))


def test_reverse_division_is_reciprocal_then_mul():
    # Tensor.__rtruediv__ is Python, `self.reciprocal() * other`: two ATen calls, as Gaudi's C++
    # autocast sees them too. reciprocal is FP32, then mul is on the lower list: bfloat16.
    with HpuAutocastMode(device_type="cpu"):
        ours = 1 / PB
    assert ours.dtype == torch.bfloat16
    assert _equal(ours, PB.float().reciprocal().to(BF) * 1)


INPLACE_WRAPPERS = {
    "F.leaky_relu(inplace=True)": lambda x: F.leaky_relu(x, 0.1, inplace=True),
    "nn.LeakyReLU(inplace=True)": lambda x: nn.LeakyReLU(0.1, inplace=True)(x),
    "F.dropout(inplace=True)": lambda x: F.dropout(x, 0.5, True, inplace=True),
    "nn.Dropout(inplace=True)": lambda x: nn.Dropout(0.5, inplace=True)(x),
    "F.dropout1d(inplace=True)": lambda x: F.dropout1d(x, 0.5, True, inplace=True),
    "F.leaky_relu_": lambda x: F.leaky_relu_(x, 0.1),
}


@pytest.mark.parametrize("name", sorted(INPLACE_WRAPPERS))
def test_inplace_wrapper_writes_into_its_input(name):
    # Python wrappers of listed ops with inplace=True call the in-place op: not eligible, and the
    # caller's tensor is the one written.
    fn = INPLACE_WRAPPERS[name]
    x, plain_x = _t(2, 3, 4), _t(2, 3, 4)
    torch.manual_seed(0)
    plain = fn(plain_x)
    torch.manual_seed(0)
    with HpuAutocastMode(device_type="cpu"):
        ours = fn(x)
    assert ours is x and ours.dtype == torch.float32
    assert torch.equal(x, plain_x) and torch.equal(ours, plain)


# --- calls that are not eligible run untouched ------------------------------------------------
# Seeds 002/003: in-place ops (seed 000 names one, iadd, which Gaudi ignores), out= calls, calls with an explicit dtype=,
# and float64 or non-floating inputs run as they would with no mode. Each case: (thunk, the
# dtype it returns). Mixed inputs make a wrongful cast visible in the values.


def _ineligible_cases():
    x, y, w = _t(2, 4), _t(2, 4, seed=1), _t(4, 3, seed=2)
    xb, pb = x.to(BF), _t(2, 4, seed=3, positive=True).to(BF)
    d, dw = x.double(), w.double()
    i, iw = torch.randint(-5, 5, (2, 4), generator=_g(7)), torch.randint(-5, 5, (4, 3), generator=_g(8))
    f64 = torch.float64
    return {
        # in-place variants of listed ops (none is cast: iadd, the one the seed names, does nothing)
        "xb.mul_(y)": (lambda: xb.clone().mul_(y), BF),
        "x.div_(pb)": (lambda: x.clone().div_(pb), torch.float32),
        "xb.exp_()": (lambda: xb.clone().exp_(), BF),
        "pb.pow_(y)": (lambda: pb.clone().pow_(y), BF),
        "x.sub_(xb)": (lambda: x.clone().sub_(xb), torch.float32),
        "addmm_": (lambda: _t(2, 3).addmm_(x, w), torch.float32),
        "addcmul_": (lambda: x.clone().addcmul_(xb, y), torch.float32),
        "leaky_relu(inplace)": (lambda: F.leaky_relu(x.clone(), 0.1, inplace=True), torch.float32),
        "dropout(inplace)": (lambda: F.dropout(x.clone(), 0.5, True, inplace=True), torch.float32),
        # out=
        "mm(out=)": (lambda: torch.mm(x, w, out=torch.empty(2, 3)), torch.float32),
        "matmul(out=)": (lambda: torch.matmul(x, w, out=torch.empty(2, 3)), torch.float32),
        "mul(out=)": (lambda: torch.mul(x, y, out=torch.empty(2, 4)), torch.float32),
        "exp(out=)": (lambda: torch.exp(xb, out=torch.empty(2, 4, dtype=BF)), BF),
        "div(out=)": (lambda: torch.div(xb, pb, out=torch.empty(2, 4, dtype=BF)), BF),
        "add(out=)": (lambda: torch.add(xb, y, out=torch.empty(2, 4, dtype=BF)), BF),
        "cat(out=)": (lambda: torch.cat([xb, y], out=torch.empty(4, 4, dtype=BF)), BF),
        "mean(out=)": (lambda: torch.mean(x, 0, out=torch.empty(4)), torch.float32),
        # explicit dtype= on an input already in bfloat16 (test_explicit_dtype_is_cast_as_on_gaudi
        # has a float32 input)
        "softmax(bf16, dtype=f32)": (lambda: F.softmax(xb, -1, dtype=torch.float32), torch.float32),
        "mean(bf16, dtype=f64)": (lambda: torch.mean(xb, dtype=f64), f64),
        # float64
        "mm f64": (lambda: torch.mm(d, dw), f64),
        "linear f64": (lambda: F.linear(d, dw.T), f64),
        "layer_norm f64": (lambda: F.layer_norm(d, (4,), torch.ones(4, dtype=f64), None), f64),
        "softmax f64": (lambda: torch.softmax(d, -1), f64),
        "exp f64": (lambda: torch.exp(d), f64),
        "div f64": (lambda: d / 3, f64),
        "cross_entropy f64": (lambda: F.cross_entropy(d, torch.tensor([0, 3])), f64),
        "cat f64": (lambda: torch.cat([d, d]), f64),
        "add f64 + f32": (lambda: torch.add(d, x), f64),  # torch's own promotion decides
        # integer and bool
        "mm int": (lambda: torch.mm(i, iw), torch.int64),
        "i * 3": (lambda: i * 3, torch.int64),
        "i + i": (lambda: i + i, torch.int64),
        "i / 2": (lambda: i / 2, torch.float32),  # true division of integers: float by torch
        "pow int": (lambda: torch.pow(i, 2), torch.int64),
        "cat int": (lambda: torch.cat([i, i]), torch.int64),
        "topk int": (lambda: torch.topk(i, 2)[0], torch.int64),
        "mul bool": (lambda: torch.mul(i > 0, i < 3), torch.bool),
    }


INELIGIBLE = _ineligible_cases()


@pytest.mark.parametrize("case", sorted(INELIGIBLE))
def test_ineligible_call_is_untouched(case):
    fn, dtype = INELIGIBLE[case]
    torch.manual_seed(0)
    plain = fn()
    torch.manual_seed(0)
    with HpuAutocastMode(device_type="cpu"):
        ours = fn()
    assert ours.dtype == dtype
    assert _equal(ours, plain)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.softmax(x, -1, dtype=torch.float32),
        lambda x: F.log_softmax(x, -1, dtype=torch.float32),
        lambda x: x.mean(dtype=torch.float32),
    ],
    ids=["softmax", "log_softmax", "mean"],
)
def test_explicit_dtype_is_cast_as_on_gaudi(fn):
    # Gaudi's Hpu_WrapFunction_ casts every eligible tensor of a listed op whatever its dtype=
    # (issue 29): the float32 input is read rounded to bfloat16; the hand-cast control, bit for bit.
    x = _t(2, 4)
    with HpuAutocastMode(device_type="cpu"):
        ours = fn(x)
    control = fn(x.bfloat16())
    assert ours.dtype == control.dtype == torch.float32 and torch.equal(ours, control)
    assert not torch.equal(ours, fn(x))  # the cast shows


def test_a_wrongful_cast_would_show():
    # The cases above can fail: casting xb.mul_(y)'s float32 operand down changes the values.
    x, y = _t(2, 4).to(BF), _t(2, 4, seed=1)
    assert not torch.equal(x.clone().mul_(y), x.clone().mul_(y.to(BF)))


def test_batchnorm_training_updates_running_statistics():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3).train()
    control = nn.BatchNorm2d(3).train()
    x = torch.randn(4, 3, 5, 5)
    with HpuAutocastMode(device_type="cpu"):
        y = bn(x)
    z = control(x.bfloat16())
    assert y.dtype == torch.bfloat16 and torch.equal(y, z)
    assert bn.running_mean.dtype == torch.float32
    assert torch.count_nonzero(bn.running_mean) == 3 and bn.num_batches_tracked.item() == 1
    assert torch.equal(bn.running_mean, control.running_mean)
    assert torch.equal(bn.running_var, control.running_var)
    # A second step keeps them in step with the control (momentum over float32 statistics).
    x2 = torch.randn(4, 3, 5, 5)
    with HpuAutocastMode(device_type="cpu"):
        bn(x2)
    control(x2.bfloat16())
    assert bn.num_batches_tracked.item() == 2
    assert torch.equal(bn.running_mean, control.running_mean)
    assert torch.equal(bn.running_var, control.running_var)


def test_batchnorm_eval_uses_running_statistics_and_leaves_them():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(3))
        bn.running_var.copy_(torch.rand(3) + 0.5)
    bn.eval()
    before = (bn.running_mean.clone(), bn.running_var.clone())
    x = torch.randn(2, 3, 4, 4)
    with HpuAutocastMode(device_type="cpu"):
        y = bn(x)
    control = F.batch_norm(x.bfloat16(), bn.running_mean, bn.running_var, bn.weight, bn.bias, False)
    assert y.dtype == torch.bfloat16 and torch.equal(y, control)
    assert torch.equal(bn.running_mean, before[0]) and torch.equal(bn.running_var, before[1])

"""The decision log: one compact line per engine event, tested as whole text."""

import dataclasses
import logging

import torch
import torch.nn.functional as F

from hpu_autocast import HpuAutocastMode, get_preset
from hpu_autocast.log import LOGGER_NAME, combine_observers, make_log_observer


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3), torch.randn(2, 4), torch.tensor([0, 2])


def _lines(caplog, fn, **mode_kwargs):
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=LOGGER_NAME):
        with HpuAutocastMode(device_type="cpu", observer=make_log_observer(), **mode_kwargs):
            fn()
    return "\n".join(r.getMessage() for r in caplog.records if r.name == LOGGER_NAME)


def test_log_of_linear_relu_cross_entropy(caplog):
    lin, x, y = _model()
    text = _lines(caplog, lambda: F.cross_entropy(F.relu(lin(x)), y))
    assert text == "\n".join(
        [
            # linear is on hpu's lower list: input, weight and bias are cast to bf16.
            "aten.linear.default  lower  f32,f32,f32 -> bf16",
            # relu is on no list: it runs as its input is.
            "aten.relu.default  not listed  bf16 -> bf16",
            # cross_entropy_loss is on the fp32 list; the int64 target is not floating, not cast.
            "aten.cross_entropy_loss.default  fp32  bf16,i64 -> f32",
        ]
    )


def test_log_of_ineligible_calls(caplog):
    z = torch.ones(2, 2)
    b = torch.ones(2, 2, dtype=torch.bfloat16)
    d = torch.ones(2, 2, dtype=torch.float64)

    def body():
        torch.mm(d, d)  # float64 is never cast
        z.relu_()  # an in-place form no list names
        torch.add(z, b, out=torch.empty(2, 2))  # out= computes into its out tensor, on no list
        torch.softmax(z, 0, dtype=torch.float64)  # an explicit dtype wins (explicit_dtype="leave")
        torch.sum(z, dtype=torch.float64)  # unlisted, with a dtype: computes in it
        torch.arange(3) + 1  # no floating input: no decision, no line

    leave = dataclasses.replace(get_preset("hpu"), name="hpu (explicit dtype left)", explicit_dtype="leave")
    assert _lines(caplog, body, policy=leave) == "\n".join(
        [
            "aten.mm.default  ineligible: float64  f64,f64 -> f64",
            "aten.relu_.default  not listed  f32 -> f32",
            "aten.add.out  not listed  f32,bf16 -> f32",
            "aten.softmax.int  ineligible: explicit dtype  f32 -> f64",
            "aten.sum.default  not listed  f32 -> f64",
        ]
    )


def test_log_of_an_explicit_dtype_cast_as_on_gaudi(caplog):
    # hpu casts a dtype= call's eligible input as the bridge does: softmax is on its lower list.
    z = torch.ones(2, 2)
    assert _lines(caplog, lambda: torch.softmax(z, 0, dtype=torch.float64)) == "aten.softmax.int  lower  f32 -> f64"


def test_log_promote_and_mixed_unlisted(caplog):
    a = torch.ones(3)
    h = torch.ones(3, dtype=torch.bfloat16)

    def body():
        torch.add(a, h)  # promote list: the widest input dtype
        torch.maximum(h, a)  # on no list: torch's type promotion decides
        torch.maximum(h, torch.tensor(2.0))  # a 0-dim tensor does not promote

    assert _lines(caplog, body) == "\n".join(
        [
            "aten.add.Tensor  promote  f32,bf16 -> f32",
            "aten.maximum.default  not listed  bf16,f32 -> f32",
            "aten.maximum.default  not listed  bf16,f32 -> bf16",
        ]
    )


def test_nothing_logged_when_debug_is_off(caplog):
    lin, x, y = _model()
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        with HpuAutocastMode(device_type="cpu", observer=make_log_observer()):
            lin(x)
    assert not caplog.records


def test_custom_logger(caplog):
    lin, x, _ = _model()
    log = logging.getLogger("mine")
    with caplog.at_level(logging.DEBUG, logger="mine"):
        with HpuAutocastMode(device_type="cpu", observer=make_log_observer(log)):
            lin(x)
    assert [r.getMessage() for r in caplog.records] == ["aten.linear.default  lower  f32,f32,f32 -> bf16"]


def test_combine_observers():
    seen = []
    a = lambda e: seen.append(("a", str(e.action)))  # noqa: E731
    b = lambda e: seen.append(("b", str(e.action)))  # noqa: E731
    assert combine_observers() is None
    assert combine_observers(None, a, None) is a
    lin, x, _ = _model()
    with HpuAutocastMode(device_type="cpu", observer=combine_observers(a, b)):
        lin(x)
    assert seen == [("a", "lower"), ("b", "lower")]


def test_a_composite_is_one_line_and_its_unlisted_insides_are_lines_of_their_own(caplog):
    # layer_norm is on no torch-cpu list: the composite is not a decision, what it decomposes into
    # is (native_layer_norm, which runs as its input is). linear is on the list: one line, and its
    # insides are its own.
    lin, x, _ = _model()
    text = _lines(caplog, lambda: F.layer_norm(lin(x), (3,)), policy="torch-cpu")
    assert text == "\n".join(
        [
            "aten.linear.default  lower  f32,f32,f32 -> bf16",
            "aten.native_layer_norm.default  not listed  bf16 -> bf16",
        ]
    )


def test_first_on_inplace_follows_self(caplog):
    from hpu_autocast import build_policy

    z = torch.zeros(2, dtype=torch.bfloat16)
    o = torch.ones(2)

    def body():
        z.add_(o)

    # An in-place op on a promote list casts its inputs to its first input's dtype, which it
    # writes (as seed 000 lists iadd; Gaudi's bridge ignores that name, so not under hpu).
    policy = build_policy("promote-iadd", promote=["iadd"])
    assert _lines(caplog, body, policy=policy) == "aten.add_.Tensor  first  bf16,f32 -> bf16"


def test_policy_defaults_are_marked(caplog):
    # A policy whose functional ops not in its table run in their first input's dtype (HMP).
    import dataclasses

    from hpu_autocast import CastPolicy, get_preset

    policy = dataclasses.replace(get_preset("hpu"), name="first-default", unlisted=CastPolicy.FIRST)
    h, x = torch.ones(2, dtype=torch.bfloat16), torch.ones(2)
    assert (
        _lines(caplog, lambda: torch.maximum(h, x), policy=policy)
        == "aten.maximum.default  first (unlisted)  bf16,f32 -> bf16"
    )


def test_inplace_default_applies(caplog):
    import dataclasses

    from hpu_autocast import CastPolicy, get_preset

    policy = dataclasses.replace(get_preset("hpu"), name="inplace-default", inplace=CastPolicy.FIRST)
    z = torch.ones(2)
    assert _lines(caplog, lambda: z.relu_(), policy=policy) == "aten.relu_.default  first (in-place)  f32 -> f32"

"""The precision report: whole text on a fixed model, casts against the casts that ran, FLOPs
against a hand count, and its other renderings."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hpu_autocast import HpuAutocastMode, build_policy
from hpu_autocast import ENGINE, PrecisionReport, Recorder, op_graph, record


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3), torch.randn(2, 4), torch.tensor([0, 2])


class _CastsBelow(TorchDispatchMode):
    """The oracle for cast counts: the dtype-changing ``_to_copy`` calls that reach ATen
    below the engine, and the bytes they write."""

    def __init__(self):
        super().__init__()
        self.casts = self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and out.dtype != args[0].dtype:
            self.casts += 1
            self.bytes += out.numel() * out.element_size()
        return out


EXPECTED = """\
hpu_autocast precision report: policy hpu, dtype bf16, engine {engine}
op                               action      dtypes               calls  casts  cast bytes  FLOPs
aten.linear.default              lower       f32,f32,f32 -> bf16      1      3          46     48
aten.relu.default                not listed  bf16 -> bf16             1      0           0      -
aten.cross_entropy_loss.default  fp32        bf16,i64 -> f32          1      1          24      -

casts inserted: 4 (70 bytes)
matmul/conv FLOPs: 48 (bf16 100.0%)
warnings:
  - aten.cross_entropy_loss.default (fp32 list) got bf16 input: it computes in f32 from values already rounded; \
move their producer to the fp32 list if that matters""".replace("{engine}", ENGINE)


def test_report_text_of_linear_relu_cross_entropy():
    lin, x, y = _model()
    with record(policy="hpu", device_type="cpu") as rec:
        F.cross_entropy(F.relu(lin(x)), y)
    # linear: x [2,4], weight [3,4], bias [3] cast to bf16: (8 + 12 + 3) * 2 bytes = 46;
    #   FLOPs 2 * 2 * 4 * 3 = 48 (the addmm it decomposes into).
    # cross_entropy_loss: the bf16 logits [2,3] cast to f32: 6 * 4 bytes = 24.
    assert str(rec.report()) == EXPECTED


def test_report_markdown_and_json():
    lin, x, y = _model()
    with record(policy="hpu", device_type="cpu") as rec:
        F.cross_entropy(F.relu(lin(x)), y)
    r = rec.report()
    assert r.to_markdown().splitlines()[:6] == [
        f"**hpu_autocast precision report**: policy `hpu`, dtype `bf16`, engine `{ENGINE}`",
        "",
        "| op | action | dtypes | calls | casts | cast bytes | FLOPs |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
        "| `aten.linear.default` | lower | f32,f32,f32 -> bf16 | 1 | 3 | 46 | 48 |",
        "| `aten.relu.default` | not listed | bf16 -> bf16 | 1 | 0 | 0 | - |",
    ]
    data = json.loads(r.to_json())
    assert data["casts"] == 4 and data["cast_bytes"] == 70
    assert data["flops_by_dtype"] == {"bf16": 48} and data["lower_flop_share"] == 1.0
    assert data["rows"][2] == {
        "op": "aten.cross_entropy_loss.default",
        "action": "fp32",
        "inputs": "bf16,i64",
        "compute": "f32",
        "calls": 1,
        "casts": 1,
        "cast_bytes": 24,
        "flops": None,
    }
    assert r.by_op()["aten.linear.default"] == {
        "calls": 1,
        "by_action": {"lower": 1},
        "by_dtypes": {"f32,f32,f32 -> bf16": 1},
        "casts": 3,
        "cast_bytes": 46,
    }


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_casts_match_the_casts_that_ran(cache_enabled):
    lin, x, y = _model()
    a = torch.randn(3, 3)
    b = a.bfloat16()
    oracle = _CastsBelow()
    with oracle, record(policy="hpu", device_type="cpu", cache_enabled=cache_enabled) as rec:
        for _ in range(2):  # the second forward reuses the cached weight casts, if caching
            F.cross_entropy(F.relu(lin(x)), y)
        torch.mm(a, a)  # one tensor, two casts
        torch.add(a, b)  # promote: the bf16 one is cast to f32
    r = rec.report()
    assert (r.casts, r.cast_bytes) == (oracle.casts, oracle.bytes)
    # Two forwards: x (no gradient flows to it: never cached, as native) twice; the weight and
    # bias once each with the cache, twice without; the logits (not a leaf) twice; mm: the one
    # tensor twice (not a weight); add: 1.
    assert r.casts == (2 + 2 + 2 + 2 + 1 if cache_enabled else 2 + 4 + 2 + 2 + 1)


def test_flop_share_against_hand_count():
    # linear and conv2d run in bf16; bmm is on no list and runs in f32.
    policy = build_policy("t", lower=["linear", "conv2d", "scaled_dot_product_attention"])
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(5, 8), torch.randn(16, 8), torch.randn(4, 16)
    img, k = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    q = torch.randn(1, 2, 3, 4)
    with record(policy=policy, device_type="cpu") as rec:
        F.linear(F.linear(x, w1), w2)  # 2*5*8*16 + 2*5*16*4 = 1280 + 640
        F.conv2d(img, k)  # out [1,3,3,3]: 2 * 27 * (2*3*3) = 972
        F.scaled_dot_product_attention(q, q, q)  # QK^T and AV: 2 * (2 * 2*3*3*4) = 288
        torch.bmm(torch.randn(2, 3, 4), torch.randn(2, 4, 5))  # 2*2*3*4*5 = 240, f32
    r = rec.report()
    assert r.flops_by_dtype == {"bf16": 1280 + 640 + 972 + 288, "f32": 240}
    assert r.lower_flop_share == pytest.approx(3180 / 3420)
    assert "matmul/conv FLOPs: 3420 (bf16 93.0%, f32 7.0%)" in str(r)


def test_warnings_worth_acting_on():
    a = torch.randn(3)
    h = torch.randn(3, dtype=torch.bfloat16)
    # The cast cache off: with it, the repeated casts of m below would be served from it.
    with record(policy="hpu", device_type="cpu", cache_enabled=False) as rec:
        torch.maximum(h, a)  # on no list, mixed floating inputs
        torch.maximum(h, a)
        torch.log(torch.mm(torch.randn(2, 2), torch.randn(2, 2)))  # fp32 list fed by bf16 mm
        m = torch.randn(2, 2)
        torch.mm(m, torch.randn(2, 2))
        torch.mm(torch.randn(2, 2), m)  # m cast to bf16 again, unchanged
        m.add_(1)
        torch.mm(m, m)  # changed since: a fresh cast, then a repeat in the same call
    assert rec.report().warnings == [
        "aten.maximum.default is on no list and got mixed floating dtypes (bf16,f32): it runs in f32 by type "
        "promotion; list it to decide (2 calls)",
        "aten.log.default (fp32 list) got bf16 input: it computes in f32 from values already rounded; "
        "move their producer to the fp32 list if that matters",
        # m twice unchanged (one extra), then, after add_, twice within one mm (one more).
        "f32[2, 2] tensor cast to bf16 again while unchanged: 2 extra cast(s) (by aten.mm.default); cast it "
        "once and reuse the copy",
    ]


def test_recorder_is_an_observer_and_reports_snapshots():
    lin, x, _ = _model()
    rec = Recorder()
    with HpuAutocastMode(device_type="cpu", observer=rec):
        lin(x)
        first = rec.report()
        lin(x)
    assert isinstance(first, PrecisionReport)
    assert [r.calls for r in first.rows] == [1]
    assert [r.calls for r in rec.report().rows] == [2]


def test_empty_report():
    with record(enabled=False) as rec:
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))  # a disabled region observes nothing
    assert str(rec.report()) == "\n".join(
        [
            f"hpu_autocast precision report: policy hpu, dtype bf16, engine {ENGINE}",
            "op  action  dtypes  calls  casts  cast bytes  FLOPs",
            "",
            "casts inserted: 0 (0 bytes)",
            "matmul/conv FLOPs: none",
        ]
    )
    assert rec.report().lower_flop_share is None


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    lin, x, y = _model()
    with record(device_type="cpu") as rec:
        F.cross_entropy(F.relu(lin(x)), y)
    for name in ("r.png", "r.svg"):
        rec.report().plot(tmp_path / name)
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "r.svg").read_bytes()[:1000]


def test_op_graph_marks_casts():
    # The casts in the order they run: last argument first, as native casts them (_engine's
    # Note [the order of casts]).
    lin, x, _ = _model()
    model = torch.nn.Sequential(lin, torch.nn.ReLU())
    assert (
        op_graph(model, x, device_type="cpu")
        == """\
digraph ops {
  node [shape=box, fontname="monospace"];
  t0 [label="0.bias\\nf32[3]", shape=ellipse];
  n0 [label="cast f32 -> bf16\\nbf16[3]", style=filled, fillcolor="#f4a6a6"];
  t0 -> n0;
  t1 [label="0.weight\\nf32[3, 4]", shape=ellipse];
  n1 [label="cast f32 -> bf16\\nbf16[3, 4]", style=filled, fillcolor="#f4a6a6"];
  t1 -> n1;
  t2 [label="input0\\nf32[2, 4]", shape=ellipse];
  n2 [label="cast f32 -> bf16\\nbf16[2, 4]", style=filled, fillcolor="#f4a6a6"];
  t2 -> n2;
  n3 [label="t.default\\nbf16[4, 3]", style=filled, fillcolor="#a6c8f4"];
  n1 -> n3;
  n4 [label="addmm.default\\nbf16[2, 3]", style=filled, fillcolor="#a6c8f4"];
  n0 -> n4;
  n2 -> n4;
  n3 -> n4;
  n5 [label="relu.default\\nbf16[2, 3]", style=filled, fillcolor="#a6c8f4"];
  n4 -> n5;
}
"""
    )


_INTEGRATED = hasattr(HpuAutocastMode, "report")
_needs_integration = pytest.mark.skipif(not _INTEGRATED, reason="HpuAutocastMode(record=, verbose=) not integrated yet")


@_needs_integration
def test_mode_record_and_report():
    lin, x, y = _model()
    mode = HpuAutocastMode(device_type="cpu", record=True)
    with mode:
        F.cross_entropy(F.relu(lin(x)), y)
    assert str(mode.report()) == EXPECTED
    with mode:  # report() covers every region (issue 37); last=True is the last region's
        lin(x)
    assert [r.op for r in mode.report(last=True).rows] == ["aten.linear.default"]
    linear = [r for r in mode.report().rows if r.op == "aten.linear.default"]
    assert [r.calls for r in linear] == [2] and len(mode.report().rows) > 1


@_needs_integration
def test_record_keeps_every_region_of_a_loop_and_resets():
    # A training loop's steps: the oracle is one Recorder observing all of them (observer=).
    lin, x, y = _model()
    mode, rec = HpuAutocastMode(device_type="cpu", record=True), Recorder()
    watched = HpuAutocastMode(device_type="cpu", observer=rec)
    for _ in range(3):
        for m in (mode, watched):
            with m:
                loss = F.cross_entropy(F.relu(lin(x)), y)
            loss.backward()
    assert mode.report().to_dict()["rows"] == rec.report().to_dict()["rows"]
    assert {r.calls for r in mode.report().rows} == {3}
    assert {r.calls for r in mode.report(last=True).rows} == {1}
    mode.reset_report()
    with pytest.raises(RuntimeError, match="not been entered"):
        mode.report()
    with mode:
        lin(x)
    assert [(r.op, r.calls) for r in mode.report().rows] == [("aten.linear.default", 1)]
    with pytest.raises(RuntimeError, match=r"needs HpuAutocastMode\(..., record=True\)"):
        HpuAutocastMode().report()


@_needs_integration
def test_mode_verbose_logs(caplog):
    import logging

    lin, x, _ = _model()
    with caplog.at_level(logging.DEBUG, logger="hpu_autocast"):
        with HpuAutocastMode(device_type="cpu", verbose=True):
            lin(x)
    assert [r.getMessage() for r in caplog.records] == ["aten.linear.default  lower  f32,f32,f32 -> bf16"]


def _flop_counter_total(fn) -> int:
    """The oracle: ``FlopCounterMode``'s count for ``fn()``, the same calls cast by hand."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_flops_of_calls_fed_lower_beside_float32_weights_equal_torchs_counter():
    # Every conv after the first in a CNN gets the bf16 output of the one before beside its
    # float32 weight and bias; bmm/baddbmm/SDPA here get a bf16 operand beside a float32 one.
    # The meta rerun must see the arguments as cast, or the op raises on the dtype mismatch
    # and the FLOPs go uncounted (issue 31, item 1).
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)
    )
    img = torch.randn(2, 3, 12, 12)
    a, b, c = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(2, 3, 5)
    q = torch.randn(1, 2, 3, 4)
    conv = torch.nn.Conv2d(4, 2, 3)

    def calls(other=lambda t: t, attention_device="cpu"):
        lower = lambda t: t.to(torch.bfloat16)  # noqa: E731
        conv(lower(cnn(img)))  # the second conv2d has a bias and a bf16 input
        torch.bmm(lower(a), other(b))
        torch.baddbmm(other(c), lower(a), other(b))
        qd = q.to(attention_device)
        F.scaled_dot_product_attention(lower(qd), other(qd), other(qd))

    policy = build_policy("t", lower=["conv2d", "bmm", "baddbmm", "scaled_dot_product_attention"])
    with record(policy=policy, device_type="cpu") as rec:
        calls()
    r = rec.report()
    # The oracle runs the same calls cast by hand (module weights in bf16), SDPA on meta tensors:
    # on CPU tensors SDPA runs _scaled_dot_product_flash_attention_for_cpu, which flop_registry
    # has no formula for (FlopCounterMode counts it 0); on meta it decomposes into two bmm.
    cnn.to(torch.bfloat16), conv.to(torch.bfloat16)
    img = img.to(torch.bfloat16)
    oracle = _flop_counter_total(lambda: calls(lambda t: t.to(torch.bfloat16), "meta"))
    assert r.flops_by_dtype == {"bf16": oracle}
    assert r.lower_flop_share == 1.0
    assert not [w for w in r.warnings if "FLOPs unknown" in w]


def test_report_shows_the_float32_dtype_policies():
    # softmax (fp32_set_opt_dtype) reads its bf16 input and computes in f32 with no cast; norm
    # (fp32_append_dtype) likewise, through norm.ScalarOpt_dtype; neither is warned about: reading
    # the lower-precision input is what the policy is for.
    policy = build_policy(
        "dtype kinds", lower=["mm"], fp32_set_opt_dtype=["softmax"], fp32_append_dtype=["norm"], device_type="cpu"
    )
    x = torch.randn(2, 4)
    with record(policy=policy) as rec:
        y = torch.mm(x, x.t())
        torch.softmax(y, -1)
        torch.ops.aten.norm.Scalar(y, 2)
    lines = str(rec.report()).splitlines()
    assert lines[2:5] == [
        "aten.mm.default   lower               f32,f32 -> bf16      1      2          32     32",
        "aten.softmax.int  fp32_set_opt_dtype  bf16 -> f32          1      0           0      -",
        "aten.norm.Scalar  fp32_append_dtype   bf16 -> f32          1      0           0      -",
    ]
    assert "warnings" not in str(rec.report())


def test_report_script_covers_the_regions_the_script_opens_itself(tmp_path, capsys):
    # Was: the script's own region was the innermost, and its forward (linear) was missing from
    # the report with no note. The oracle: the same loop recorded by hand, record=True.
    from hpu_autocast.cli import main

    script = tmp_path / "loop.py"
    script.write_text(
        "import torch\nfrom hpu_autocast import HpuAutocastMode\n"
        "lin = torch.nn.Linear(4, 4)\n"
        "for _ in range(2):\n"
        "    with HpuAutocastMode(torch.bfloat16, policy='torch-cpu', device_type='cpu'):\n"
        "        torch.mm(torch.randn(2, 4), lin.weight)\n"
    )
    assert main(["report", "--device-type", "cpu", str(script)]) == 0
    out = capsys.readouterr().out
    mm = [line.split() for line in out.splitlines() if line.startswith("aten.mm.default")]
    assert mm and mm[0][1:4] == ["lower", "f32,f32", "->"] and mm[0][5] == "2"  # two calls, both regions
    assert "note: this report includes the 2 region(s) the script opened itself" in out
    assert "2 x torch-cpu (bfloat16)" in out

"""tune(per_module=True): the most modules in lower precision (or fp8) within the tolerance, as a
module map. Models with planted sensitive layers: the search must return exactly those layers,
and every result is measured again here with ``compare()`` (a fresh float32 run and a fresh
region with the returned map), independently of tune's own runs."""

from __future__ import annotations

import dataclasses
import fnmatch
import pathlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import _real_models
from hpu_autocast import HpuAutocastMode, compare, first_last, get_preset, tune
from hpu_autocast.cli import main
from hpu_autocast.policies.recipes import Tensorwise
from hpu_autocast.tuning import _exact, _Maps, _Unit

BF16, F32, E4 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
PLANTED = (2, 4)


class Offset(nn.Linear):
    """A linear layer that shifts its input by 256 first, with weight rows summing to zero: in
    float32 the shift cancels; in bfloat16, 256 + x keeps steps of 2, and x (about 1) is lost."""

    def forward(self, x):
        return F.linear(x + 256.0, self.weight, self.bias)


class Spike(nn.Linear):
    """A linear layer whose input gains an outlier of 1e7 on a feature its weight ignores: harmless
    in bfloat16; in fp8 the per-tensor scale is 448 / 1e7, and every other input flushes to 0."""

    def __init__(self, n: int) -> None:
        super().__init__(n, n)
        self.register_buffer("spike", torch.zeros(n))
        self.spike[0] = 1e7

    def forward(self, x):
        return F.linear(x + self.spike, self.weight, self.bias)


def _planted(kind, width=16):
    """Six linear layers in a Sequential (named "0".."5"), layers 2 and 4 of ``kind``."""
    torch.manual_seed(0)
    layers = []
    for i in range(6):
        layer = kind(width) if i in PLANTED and kind is Spike else (kind if i in PLANTED else nn.Linear)(width, width)
        with torch.no_grad():
            layer.weight.normal_(0, width**-0.5)
            if kind is Offset and i in PLANTED:
                layer.weight -= layer.weight.mean(1, keepdim=True)
            if kind is Spike and i in PLANTED:
                layer.weight[:, 0] = 0
        layers.append(layer)
    return nn.Sequential(*layers).eval()


def _error(model, x, dtype, policy, modules=None) -> float:
    with torch.no_grad():
        return compare(model, x, dtype=dtype, policy=policy, device_type="cpu", modules=modules).max_rel


# fp8 products emulated (dequantized float32 matmuls), the same on any CPU torch: torchao's emulate=True.
FP8_POLICY = dataclasses.replace(get_preset("torch-cpu"), fp8=Tensorwise(emulate=True))
CASES = {
    # (planted kind, region dtype, policy, tolerance, where the planted layers go)
    "bf16": (Offset, BF16, "torch-cpu", 0.05, F32),
    "fp8": (Spike, E4, FP8_POLICY, 0.1, BF16),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_per_module_tune_finds_exactly_the_planted_layers(case):
    kind, dtype, policy, tol, target = CASES[case]
    model, x = _planted(kind), torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    # The planted layers break the tolerance in a region that lowers everything.
    assert _error(model, x, dtype, policy) > 0.3  # 6 to 10 times the tolerance
    result = tune(model, x, dtype=dtype, policy=policy, device_type="cpu", tolerance=tol, per_module=True)
    # Exactly the planted layers leave the lower dtype; the map names nothing else.
    assert result.modules == {str(i): target for i in PLANTED}
    assert result.moved == tuple(str(i) for i in PLANTED)
    assert [r.op for r in result.rows] == [str(i) for i in range(6)]  # one unit per Linear, in call order
    assert [r.moved for r in result.rows] == [i in PLANTED for i in range(6)]
    assert result.met and result.policy is result.start  # the lists are the start's
    assert result.flops == (4 * 2 * 16**3, 6 * 2 * 16**3)  # four of six linears' FLOPs kept lower
    # Measured again: the map in a region meets the tolerance, and is what tune said.
    again = _error(model, x, dtype, policy, result.modules)
    assert again <= tol and again == pytest.approx(result.error, rel=1e-6)
    text = str(result)
    assert f"modules={{'2': {target}, '4': {target}}}" in text
    assert text.splitlines()[0].startswith("hpu_autocast tune per module:")
    assert "module  ops" in text


def test_the_fp8_planted_layers_alone_in_fp8_are_the_whole_error():
    # The sensitivity runs say why (the "alone lower" column): each planted layer alone in fp8,
    # the rest in bf16, is about the whole error; any other layer alone in fp8 a few percent.
    kind, dtype, policy, tol, _ = CASES["fp8"]
    model, x = _planted(kind), torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    result = tune(model, x, dtype=dtype, policy=policy, device_type="cpu", tolerance=tol, per_module=True)
    alone = {r.op: r.alone_lower for r in result.rows}
    assert all(alone[str(i)] > 0.5 for i in PLANTED)
    assert all(alone[str(i)] < 0.1 for i in range(6) if i not in PLANTED)
    assert "moved to bf16: 2, 4" in str(result) and "back in f8e4m3" in str(result)


def test_a_start_within_tolerance_maps_nothing():
    model, x = _planted(nn.Linear), torch.randn(16, 16)
    result = tune(model, x, dtype=BF16, policy="torch-cpu", device_type="cpu", tolerance=0.5, per_module=True)
    assert result.modules == {} and result.moved == () and result.met


class Block(nn.Module):
    """A block whose own forward runs a matmul (a unit of its own) around a child Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(16, 16)
        self.w = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        return self.inner(torch.matmul(x + 256.0, self.w - self.w.mean(0)))  # the block's own op loses


def test_a_block_moves_with_the_modules_inside_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), Block()).eval()
    x = torch.randn(16, 16)
    result = tune(model, x, dtype=BF16, policy="torch-cpu", device_type="cpu", tolerance=0.05, per_module=True)
    # The units: each module's own lower calls; the block's matmul is the block's, its Linear its child's.
    assert [r.op for r in result.rows] == ["0", "1", "1.inner"]
    # The block's own matmul needs float32; moving it moves its child (a module moves whole).
    assert result.modules == {"1": F32}
    rows = {r.op: r for r in result.rows}
    assert rows["1.inner"].moved and rows["1.inner"].why == "inside 1" and not rows["0"].moved
    assert result.flops == (2 * 16**3, 3 * 2 * 16**3)
    seen = []
    with (
        torch.no_grad(),
        HpuAutocastMode(BF16, policy="torch-cpu", device_type="cpu", observer=seen.append, modules=result.modules),
    ):
        model(x)
    assert [e.compute for e in seen if "linear" in str(e.op)] == [BF16]  # only "0"'s: the block's ran in fp32
    assert _error(model, x, BF16, "torch-cpu", result.modules) <= 0.05


def test_the_maps_name_modules_exactly():
    maps = _Maps([_Unit(n, "linear", 1, 1) for n in ("", "a", "a.b", "a.b.c", "ab", "x[0]*")], F32)
    assert maps(frozenset({"a"})) == {"a": F32}
    assert maps(frozenset({"a", "a.b.c", "ab"})) == {"a": F32, "ab": F32}
    assert maps.closure(frozenset({"a"})) == {"a", "a.b", "a.b.c"}
    assert maps(frozenset({"", "a"})) == {"": F32}
    assert maps(frozenset({"x[0]*"})) == {"x[[]0][*]": F32}
    # A name with glob characters is matched as itself alone.
    assert fnmatch.fnmatchcase("x[0]*", _exact("x[0]*")) and not fnmatch.fnmatchcase("x0", _exact("x[0]*"))


def test_bad_per_module_is_named():
    with pytest.raises(TypeError, match="per_module must be True"):
        tune(nn.Linear(2, 2), torch.ones(1, 2), per_module="yes")


def test_the_command_tunes_per_module(tmp_path, capsys):
    script = tmp_path / "planted.py"
    script.write_text(
        "import sys\nsys.path.insert(0, %r)\nimport test_tune_modules as t\nimport torch\n"
        "def tune_target():\n    return t._planted(t.Offset), torch.randn(16, 16)\n"
        % str(__import__("pathlib").Path(__file__).parent)
    )
    assert (
        main(
            [
                "tune",
                "--preset",
                "torch-cpu",
                "--device-type",
                "cpu",
                "--per-module",
                "--quiet",
                "--tolerance",
                "0.05",
                str(script),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "modules={'2': torch.float32, '4': torch.float32}" in out


@pytest.mark.skipif(_real_models.tf is None, reason="transformers is not installed")
def test_gpt2_in_fp8_per_module_is_the_documented_one():
    # docs/fp8.md: fp8 everywhere misses 2e-2; first_last meets it; per-module tune moves lm_head alone.
    tf = _real_models.tf
    config = tf.GPT2Config(
        vocab_size=64,
        n_positions=8,
        n_embd=16,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(config).eval()
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(0))

    def logits(ids):
        with torch.no_grad():
            return model(input_ids=ids).logits

    kw = dict(dtype=E4, policy="hpu", device_type="cpu")
    assert f"{compare(logits, ids, **kw).max_rel:.1e}" == "5.6e-02"
    assert f"{compare(logits, ids, modules=first_last(), **kw).max_rel:.1e}" == "1.0e-02"
    result = tune(logits, ids, tolerance=0.02, per_module=True, **kw)
    assert result.modules == {"lm_head": BF16}
    text = str(result)
    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "fp8.md").read_text()
    assert text in doc


def test_the_tuning_docs_per_module_example_prints_the_documented_table(capsys):
    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "tuning.md").read_text()
    section = doc[doc.index("## Per module") :]
    code = section[section.index("```python\n") + 10 :]
    code = code[: code.index("```")]
    exec(compile(code, "docs/tuning.md", "exec"), {"__name__": "doc"})
    printed = capsys.readouterr().out.strip()
    assert printed and printed in section


def test_a_function_running_no_module_is_refused_per_module():
    a = torch.randn(16, 16) + 256.0

    def fn(x):
        return (x + 256.0) @ a - 256.0 * a.sum(0)  # outside any module: no unit to move

    with pytest.raises(ValueError, match=r"no module ran calls in bf16 .* per_module=False"):
        tune(
            fn, torch.randn(16, 16), dtype=BF16, policy="torch-cpu", device_type="cpu", tolerance=1e-3, per_module=True
        )

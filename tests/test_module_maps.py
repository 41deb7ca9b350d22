"""``HpuAutocastMode(..., modules={...})``: per-module precision, checked bit for bit against the
same model edited by hand (each matched module's ``forward`` wrapped in the region its override
names, its lower floating inputs cast to float32 for ``float32``), in a train step."""

from __future__ import annotations

import copy
import fnmatch
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint

import _real_models
from hpu_autocast import HpuAutocastMode, get_dtype, get_preset, is_enabled

# torch warns that its global module hooks fire once more for torch.compile's OptimizedModule
# wrapper; the map skips that wrapper (its names are the model's: docs/modules.md), so here the
# extra call changes nothing, which the compiled train steps below check bit for bit.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Using `torch.compile.module.` when there are global hooks:UserWarning"),
]

BF16 = torch.bfloat16


# -- the oracle: the model edited by hand -------------------------------------------------------
def _to_f32(a):
    if isinstance(a, torch.Tensor) and a.is_floating_point() and a.element_size() < 4:
        return a.float()
    return a


def _wrapped(forward, value, outer: dict):
    """``forward`` run as the docs say ``value`` runs a module (written here without the package's
    module map: a plain region around the call)."""

    def run(*args, **kwargs):
        if value is torch.float32 or value == "fp32":
            with HpuAutocastMode(enabled=False):
                return forward(*map(_to_f32, args), **kwargs)
        if value is None:
            with HpuAutocastMode(enabled=False):
                return forward(*args, **kwargs)
        # The map's nested regions cast for the enclosing region's device (docs/modules.md), so the
        # oracle's do too (left out, a region's device is the machine's: cuda under --as-if-cuda).
        if isinstance(value, torch.dtype):
            region = HpuAutocastMode(value, policy=outer["policy"], device_type=outer["device_type"])
        else:
            region = HpuAutocastMode(outer["dtype"], policy=value, device_type=outer["device_type"])
        with region:
            return forward(*args, **kwargs)

    return run


def hand_edited(model: torch.nn.Module, modules: dict, outer: dict) -> torch.nn.Module:
    """``model`` with the forward of each module the map matches wrapped, in place (the last
    matching entry decides; the test maps use no exact-vs-glob tie)."""
    for name, mod in model.named_modules():
        hits = [v for p, v in modules.items() if fnmatch.fnmatchcase(name, p)]
        if hits:
            mod.forward = _wrapped(mod.forward, hits[-1], outer)
    return model


def _train_step(model, inputs, region_kwargs, compiled=False, edit=None):
    """Loss and gradients of one step of a copy of ``model`` (``edit``: a map to edit it by hand with)."""
    model = copy.deepcopy(model)
    if edit is not None:
        hand_edited(model, edit, region_kwargs)
    fn = torch.compile(model, backend="aot_eager") if compiled else model
    with HpuAutocastMode(**region_kwargs):
        out = fn(**inputs) if isinstance(inputs, dict) else fn(inputs)
        loss = out.loss if hasattr(out, "loss") else out.float().square().mean()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _assert_same(a, b):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert torch.equal(loss_a, loss_b), (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for n in grads_a:
        assert torch.equal(grads_a[n], grads_b[n]), n


class CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
        self.block = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.GroupNorm(2, 4), torch.nn.GELU())
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        x = self.block(self.stem(x))
        return self.head(x.mean((2, 3)))


def _models():
    g = torch.Generator().manual_seed(0)
    yield "cnn", CNN(), torch.randn(2, 3, 6, 6, generator=g), {"head": torch.float32, "block.1": "fp32", "stem.0": None}
    if _real_models.tf is not None:
        arch = _real_models.ARCHS["gpt2"]
        yield (
            "gpt2",
            arch.build(),
            arch.inputs(g),
            {
                "lm_head": torch.float32,
                "*.ln_*": "fp32",
                "transformer.wte": None,
                "transformer.h.0.mlp": "torch-cpu",
                "transformer.h.1": torch.float32,
                "transformer.h.1.mlp": BF16,
            },
        )
        arch = _real_models.ARCHS["bert"]
        yield (
            "bert",
            arch.build(),
            arch.inputs(g),
            {
                "classifier": torch.float32,
                "*.LayerNorm": "fp32",
                "bert.encoder.layer.1.*": "torch-cpu",
                "bert.pooler": None,
            },
        )


MODELS = list(_models())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name,model,inputs,modules", MODELS, ids=[m[0] for m in MODELS])
def test_module_map_matches_the_hand_edited_model(name, model, inputs, modules, compiled):
    outer = dict(dtype=BF16, policy="hpu", device_type="cpu")
    torch._dynamo.reset()
    mapped = _train_step(model, inputs, dict(outer, modules=modules), compiled)
    # The oracle runs eagerly: compiled, the hand-edited BERT (a region opened in each LayerNorm's
    # forward, inside the compiled frame) differs from its own eager run in the embeddings'
    # gradients by rounding, while the mapped model compiled equals it bit for bit.
    edited = _train_step(model, inputs, outer, False, edit=modules)
    _assert_same(mapped, edited)
    # The map changes something: without it the step differs (the oracle is not vacuous). Eager
    # suffices for that and saves a second compile of the model.
    plain = _train_step(model, inputs, outer, False)
    assert not torch.equal(plain[0], mapped[0]) or any(not torch.equal(plain[1][n], mapped[1][n]) for n in plain[1])


def test_a_compiled_model_recompiles_for_another_map():
    model, x = CNN(), torch.randn(2, 3, 6, 6)
    outer = dict(dtype=BF16, policy="hpu", device_type="cpu")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    for modules in ({"head": torch.float32}, {}, {"block.*": "fp32"}, {"head": torch.float32}):
        with torch.no_grad():
            with HpuAutocastMode(**outer, modules=modules or None):
                got = compiled(x)
            with HpuAutocastMode(**outer):
                want = hand_edited(copy.deepcopy(model), modules, outer)(x)
        assert torch.equal(got, want), modules


# -- what runs where ------------------------------------------------------------------------
class Probe(torch.nn.Module):
    """Records the region state its forward runs in."""

    def __init__(self, child=None) -> None:
        super().__init__()
        self.child = child
        self.seen = []

    def forward(self, x):
        self.seen.append((is_enabled(), get_dtype(), x.dtype))
        return self.child(x) if self.child is not None else x


def _probes():
    leaf = Probe()
    mid = Probe(leaf)
    return Probe(mid), mid, leaf


def test_innermost_match_wins_and_inputs_are_cast_for_float32():
    root, mid, leaf = _probes()
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"child": torch.float32, "child.child": torch.float16}):
        root(torch.ones(2, dtype=BF16))
    assert root.seen == [(True, BF16, BF16)]
    assert mid.seen == [(False, None, torch.float32)]  # casting off, its bf16 input cast to float32
    assert leaf.seen == [(True, torch.float16, torch.float32)]  # the deeper match's region inside it


def test_none_is_casting_off_without_input_casts():
    root, mid, leaf = _probes()
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"child": None}):
        root(torch.ones(2, dtype=BF16))
    assert mid.seen == leaf.seen == [(False, None, BF16)]


def test_an_exact_name_beats_a_glob_and_the_last_glob_wins():
    root, mid, leaf = _probes()
    # "child" exactly (given first) beats the globs; among the two globs for child.child, the last wins.
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"child": None, "child*": "fp32", "*child": torch.float16}):
        root(torch.ones(2))
    assert mid.seen == [(False, None, torch.float32)]
    assert leaf.seen == [(True, torch.float16, torch.float32)]


def test_the_root_is_named_empty_and_a_policy_runs_in_the_regions_dtype():
    root, mid, _ = _probes()
    with HpuAutocastMode(torch.float16, policy="hpu", device_type="cpu", modules={"": get_preset("torch-cpu")}):
        root(torch.ones(2))
        assert get_dtype() is torch.float16
    assert root.seen == [(True, torch.float16, torch.float32)]


def test_a_nested_region_inside_a_mapped_module_wins_there():
    class Inner(torch.nn.Module):
        def forward(self, x):
            with HpuAutocastMode(BF16, policy="torch-cpu"):
                return torch.mm(x, x)

    model = torch.nn.Sequential(Inner(), torch.nn.Linear(2, 2))
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"*": "fp32"}):
        out = model(torch.ones(2, 2))
    assert out.dtype == torch.float32  # the Linear ran in float32, its input cast up
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"": "fp32"}):
        assert model[0](torch.ones(2, 2)).dtype == BF16  # model[0] is the root here; the inner region casts


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputes_under_the_map(reentrant):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.head = Block(), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.head(checkpoint.checkpoint(self.block, x, use_reentrant=reentrant))

    model, x = Net(), torch.randn(3, 4, requires_grad=True)
    outer = dict(dtype=BF16, policy="torch-cpu")
    modules = {"block.b": torch.float32}
    mapped = _train_step(model, x, dict(outer, modules=modules))
    edited = _train_step(model, x, outer, edit=modules)
    _assert_same(mapped, edited)


def test_other_threads_are_not_mapped():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    seen = {}
    start = threading.Barrier(2)

    def plain():
        start.wait()
        with HpuAutocastMode(BF16, policy="torch-cpu"):
            for _ in range(50):
                seen.setdefault("plain", set()).add(model(torch.ones(1, 2)).dtype)

    t = threading.Thread(target=plain)
    t.start()
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"0": "fp32"}):
        start.wait()
        for _ in range(50):
            seen.setdefault("mapped", set()).add(model(torch.ones(1, 2)).dtype)
    t.join()
    assert seen == {"plain": {BF16}, "mapped": {torch.float32}}


def test_the_hooks_are_removed_with_the_last_region():
    from torch.nn.modules import module as nn_module

    before = (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks))
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"x": "fp32"}):
        with HpuAutocastMode(BF16, policy="torch-cpu", modules={"y": "fp32"}):
            assert len(nn_module._global_forward_pre_hooks) == before[0] + 1
    assert (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks)) == before


def test_a_forward_that_raises_closes_its_modules_region():
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    model = torch.nn.Sequential(Boom())
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"0": "fp32"}):
        with pytest.raises(ValueError, match="boom"):
            model(torch.ones(1))
        assert is_enabled() and get_dtype() is BF16  # the float32 region of "0" is closed


# -- the report ---------------------------------------------------------------------------------
def test_the_report_groups_by_module():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with HpuAutocastMode(BF16, policy="torch-cpu", record=True, modules={"0": "fp32", "1": torch.float16}) as mode:
        model(torch.ones(1, 2))
    report = mode.report()
    assert report.modules == {
        "0": {"override": "float32", "forwards": 1, "calls": {}},
        "1": {"override": "float16", "forwards": 1, "calls": {"f16": 1}},
    }
    text = str(report)
    assert "by module:" in text and "float16" in text


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "modules,error,match",
    [
        ({"a": torch.float64}, ValueError, "'a' maps to torch.float64"),
        ({"a": torch.int8}, ValueError, "'a' maps to torch.int8"),
        ({"a": "no-such-preset"}, ValueError, "'a' maps to 'no-such-preset'"),
        ({"a": 3}, TypeError, "'a' maps to 3 .int.; accepted: torch.float32"),
        ({1: "fp32"}, TypeError, "a pattern must be a string"),
        (["a"], TypeError, "modules must be a mapping"),
    ],
)
def test_bad_maps_are_clear_errors(modules, error, match):
    with pytest.raises(error, match=match):
        HpuAutocastMode(BF16, policy="torch-cpu", modules=modules)


def test_a_disabled_region_refuses_a_map():
    with pytest.raises(ValueError, match="enabled=False, modules"):
        HpuAutocastMode(enabled=False, modules={"a": "fp32"})


def test_a_pattern_matching_no_module_warns_once_naming_it():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    mode = HpuAutocastMode(BF16, policy="torch-cpu", modules={"lm_head": "fp32", "0": "fp32"})
    with pytest.warns(UserWarning, match=r"'lm_head' matched no module of the model .*e\.g\. '0'"):
        with mode:
            model(torch.ones(1, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with mode:
            model(torch.ones(1, 2))


def test_a_mode_with_a_map_copies_with_it():
    mode = HpuAutocastMode(BF16, policy="torch-cpu", modules={"0": "fp32"})
    assert copy.copy(mode).modules == mode.modules
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))

    @mode
    def run(x):
        return model(x)

    assert run(torch.ones(1, 2)).dtype == torch.float32
    F.relu  # noqa: B018 (imported for the models above)


# -- first and last layers: first_last() --------------------------------------------------------
def _fp8_events(model, inputs, modules):
    seen = []
    with HpuAutocastMode(torch.float8_e4m3fn, policy="hpu", device_type="cpu", observer=seen.append, modules=modules):
        model(**inputs).loss.backward()
    return seen


@pytest.mark.skipif(_real_models.tf is None, reason="transformers is not installed")
def test_first_last_keeps_gpt2s_first_linear_and_lm_head_in_bf16_and_equals_the_hand_edited_model():
    from hpu_autocast import first_last

    arch = _real_models.ARCHS["gpt2"]
    model, inputs = arch.build(), arch.inputs(torch.Generator().manual_seed(0))
    # GPT-2's linears are Conv1D (addmm) in registration order; the first is h.0's c_attn, the
    # last is lm_head (get_output_embeddings()).
    seen = _fp8_events(copy.deepcopy(model), inputs, first_last(BF16))
    gemms = [e for e in seen if e.op in (torch.ops.aten.addmm.default, torch.ops.aten.linear.default)]
    by_module = {}
    for e in gemms:
        by_module.setdefault(e.module, set()).add(e.compute)
    assert by_module == {"transformer.h.0.attn.c_attn": {BF16}, "lm_head": {BF16}, None: {torch.float8_e4m3fn}}
    assert sum(e.module is None for e in gemms) == 7  # h.0's other three, h.1's four: all fp8
    # Bit for bit the model with those two forwards wrapped in a bfloat16 region by hand.
    outer = dict(dtype=torch.float8_e4m3fn, policy="hpu", device_type="cpu")
    mapped = _train_step(model, inputs, dict(outer, modules=first_last(BF16)))
    edited = _train_step(model, inputs, outer, edit={"transformer.h.0.attn.c_attn": BF16, "lm_head": BF16})
    _assert_same(mapped, edited)
    plain = _train_step(model, inputs, outer)
    assert not torch.equal(plain[0], mapped[0])


def test_first_last_without_a_head_takes_the_last_leaf_linear_in_registration_order():
    from hpu_autocast import first_last

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.out = torch.nn.Linear(4, 2)  # registered first, called last
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))

        def forward(self, x):
            return self.out(self.body(x))

    seen = []
    with HpuAutocastMode(BF16, policy="torch-cpu", observer=seen.append, modules=first_last(torch.float32)):
        Net()(torch.ones(3, 4))
    # Registration order: "out" is the first, "body.2" the last; only body.0 is left to the region.
    assert [e.compute for e in seen if e.op is torch.ops.aten.linear.default] == [BF16]
    with HpuAutocastMode(BF16, policy="torch-cpu", record=True, modules=first_last(torch.float32)) as mode:
        Net()(torch.ones(3, 4))
    assert {n: m["override"] for n, m in mode.report().modules.items()} == {"out": "float32", "body.2": "float32"}


def test_an_unknown_selector_is_a_clear_error():
    with pytest.raises(ValueError, match="'<frist>' is no selector; accepted: '<first>', '<last>'"):
        HpuAutocastMode(BF16, policy="torch-cpu", modules={"<frist>": BF16})


def test_a_selector_a_model_lacks_warns_as_an_unmatched_pattern():
    from hpu_autocast import first_last

    with pytest.warns(UserWarning, match="matched no module of the model .the model has no leaf linear") as got:
        with HpuAutocastMode(BF16, policy="torch-cpu", modules=first_last()):
            torch.nn.Sequential(torch.nn.ReLU())(torch.ones(2))
    assert sorted(str(w.message).split("'")[1] for w in got) == ["<first>", "<last>"]


def test_a_submodule_added_or_replaced_between_calls_is_mapped():
    # Failed before: the names were resolved once per root and map, so a model that changed
    # between calls kept the modules it had at the first call.
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    mode = HpuAutocastMode(BF16, policy="torch-cpu", modules={"0": "fp32", "1": "fp32"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "1" matches nothing at the first call
        with mode:
            assert model(torch.ones(1, 2)).dtype == torch.float32
    model.append(torch.nn.Linear(2, 2))
    model[0] = torch.nn.Linear(2, 2)  # replaced: the same count of modules, another module
    seen = []
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"0": "fp32", "1": "fp32"}, observer=seen.append):
        assert model(torch.ones(1, 2)).dtype == torch.float32
    assert [e for e in seen if e.op is torch.ops.aten.linear.default] == []  # both linears in float32


class KwProbe(torch.nn.Module):
    """Records the dtypes of its keyword inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = []

    def forward(self, x, *, mask=None, extra=()):
        self.seen.append((x.dtype, mask.dtype, [t.dtype for t in extra]))
        return x * mask  # saves its inputs: a checkpoint recomputes it


class KwCaller(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.probe = KwProbe()

    def forward(self, x):
        return self.probe(x=x, mask=x, extra=[x, x.long()])


@pytest.mark.parametrize("reentrant", [None, False])
def test_keyword_inputs_of_a_float32_module_are_cast_too(reentrant):
    # Failed before: only positional inputs were cast (torch's global pre-hooks see no kwargs).
    model = KwCaller()
    x = torch.ones(2, dtype=BF16, requires_grad=True)
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"probe": torch.float32}):
        if reentrant is None:
            out = model(x)
        else:  # the recomputation casts them as the forward did
            out = checkpoint.checkpoint(model, x, use_reentrant=reentrant)
    out.float().sum().backward()
    want = (torch.float32, torch.float32, [torch.float32, torch.int64])
    assert model.probe.seen == [want] * (1 if reentrant is None else 2)
    assert not model.probe._forward_pre_hooks  # the map's hook is gone with the region
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"probe": None}):
        model(x)
    assert model.probe.seen[-1] == (BF16, BF16, [BF16, torch.int64])  # "off" casts nothing


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoint_of_the_whole_model_recomputes_under_the_map(reentrant):
    # Failed before (non-reentrant: "Recomputed values ... have different metadata"): a checkpoint
    # called with no module in flight recomputed without the map.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4, requires_grad=True)
    outer = dict(dtype=BF16, policy="torch-cpu")
    modules = {"2": torch.float32}

    def step(region, edit=None):
        m = copy.deepcopy(model)
        if edit is not None:
            hand_edited(m, edit, outer)
        with HpuAutocastMode(**region):
            loss = checkpoint.checkpoint(m, x, use_reentrant=reentrant).float().square().mean()
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in m.named_parameters()}

    _assert_same(step(dict(outer, modules=modules)), step(outer, edit=modules))


# -- the hot path (docs/performance.md, "Module maps: the hooks' cost") -------------------------
def test_the_roots_module_walk_is_modules_order_each_module_once():
    from hpu_autocast.module_map import _module_ids

    shared = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(shared, torch.nn.Sequential(torch.nn.ReLU(), shared), shared)
    model.add_module("gone", None)  # a None child is skipped, as modules() skips it
    assert _module_ids(model) == tuple(map(id, model.modules()))


def test_a_plain_map_is_parsed_once_and_a_bad_one_raises_each_time():
    from hpu_autocast.module_map import parse_modules

    plain = {"0": torch.float32, "1": None, "2": "off", "3": BF16}
    assert parse_modules(dict(plain), BF16) is parse_modules(dict(plain), BF16)
    assert parse_modules(dict(plain), BF16) is not parse_modules(dict(plain), torch.float16)
    # a preset is read each time (it may read PT_HPU_AUTOCAST_* files), so such a map is not kept
    assert parse_modules({"0": "torch-cpu"}, BF16) is not parse_modules({"0": "torch-cpu"}, BF16)
    for _ in range(2):
        with pytest.raises(ValueError, match="'0' maps to torch.float64"):
            parse_modules({"0": torch.float64}, BF16)


def test_unmatched_modules_are_not_pushed_and_roots_still_found():
    # Inside a root only the root and the matched modules are on the map's stack; the model
    # called twice in one region is a root each time (the stack empties after its forward).
    from hpu_autocast import module_map

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    depths = []
    model[1][0].register_forward_pre_hook(lambda m, a: depths.append(len(module_map._ACTIVE.get().stack)) and None)
    with HpuAutocastMode(BF16, policy="torch-cpu", modules={"1.0": "fp32"}):
        for _ in range(2):
            assert model(torch.ones(1, 2)).dtype == torch.float32
            assert module_map._ACTIVE.get().stack == []
    assert depths == [2, 2]  # the root and "1.0" itself ("1", unmatched, is not pushed)

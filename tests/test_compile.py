"""torch.compile inside a region: the graph holds the policy's casts, gives the eager values, is
reused while the region's state is the same, and traced again when it is not.

A backend that records the AOT forward graph and counts compilations stands in for the real ones
(``aot_eager`` semantics: the graph runs ATen op by op, so values compare bit for bit); inductor
is run once for the backend pass-through.
"""

import os
import pathlib
import subprocess
import sys
import threading
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hpu_autocast
from hpu_autocast import HpuAutocastMode, disable_casts

# Expected here and about nothing these tests check: torch deprecates torch.jit.script_method (the
# TorchScript cases). (Dynamo traces none of the package: test_once_dynamo_is_loaded_it_skips_the_whole_package.)
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

ROOT = pathlib.Path(__file__).resolve().parents[1]

_CAST = torch.ops.aten._to_copy.default


class Recording:
    """A torch.compile backend: AOT-traces the graph, keeps each forward graph, counts calls."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def keep(graph, _):
            self.graphs.append(graph)
            return graph

        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=lambda g, _: g)

    def casts(self, i=-1):
        """The dtypes the i-th forward graph casts to, in order."""
        return [n.kwargs.get("dtype") for n in self.graphs[i].graph.nodes if n.target is _CAST]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Every test compiles nn.Sequential.forward anew; Dynamo's caches are per code object, and a
    # test's graphs would count towards the next test's recompile limit.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def test_a_compiled_function_inside_a_region_holds_the_casts_and_compiles_once():
    model, x = _model(), torch.randn(4, 8)
    backend = Recording()
    compiled = torch.compile(lambda x: model(x).softmax(-1), backend=backend, fullgraph=True)
    with HpuAutocastMode(policy="torch-cpu"):
        eager = model(x).softmax(-1)
        first, second = compiled(x), compiled(x)
    assert len(backend.graphs) == 1  # the second call reused the graph
    # torch-cpu lists linear (not gelu, layer_norm, softmax): the first casts input, weight and
    # bias to bfloat16, the second its weight and bias (its input comes out of layer_norm in
    # bfloat16 already).
    assert backend.casts() == [torch.bfloat16] * 5
    assert first.dtype == torch.bfloat16 and torch.equal(first, eager) and torch.equal(second, eager)


def test_a_compiled_training_step_matches_eager_under_the_mode():
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])

    def step(model, fn):
        with HpuAutocastMode(policy="hpu", device_type="cpu"):
            loss = F.cross_entropy(fn(x), y)
        loss.backward()
        return [loss.detach()] + [p.grad for p in model.parameters()]

    eager_model, compiled_model = _model(), _model()
    eager = step(eager_model, eager_model)
    ours = step(compiled_model, torch.compile(compiled_model, backend="aot_eager", fullgraph=True))
    for a, b in zip(eager, ours):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("change", ["policy", "dtype", "device", "disabled", "outside"])
def test_a_new_region_state_traces_again_and_the_old_one_is_reused(change):
    model, x = _model(), torch.randn(4, 8)
    backend = Recording()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    other = {
        "policy": lambda: HpuAutocastMode(policy="hpu", device_type="cpu"),
        "dtype": lambda: HpuAutocastMode(torch.float16, policy="torch-cpu"),
        "device": lambda: HpuAutocastMode(policy="torch-cpu", device_type="meta"),
        "disabled": lambda: disable_casts(),
        "outside": _Nothing,
    }[change]
    with HpuAutocastMode(policy="torch-cpu"):
        ref = compiled(x)
    with other():
        out = compiled(x)
        eager = model(x)
    assert len(backend.graphs) == 2 and out.dtype == eager.dtype and torch.equal(out, eager)
    with HpuAutocastMode(policy="torch-cpu"):
        again = compiled(x)
    assert len(backend.graphs) == 2 and torch.equal(again, ref)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_compiled_outside_then_called_inside_casts():
    model, x = _model(), torch.randn(4, 8)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    assert compiled(x).dtype == torch.float32
    with HpuAutocastMode(policy="torch-cpu"):
        inside, eager = compiled(x), model(x)
    assert inside.dtype == torch.bfloat16 and torch.equal(inside, eager)
    assert compiled(x).dtype == torch.float32


def test_autocast_guards_and_opt_outs_inside_compiled_code():
    # What transformers' models do under torch.compile: ask torch whether autocast is on, and
    # turn it off for a block. fullgraph: neither breaks the graph.
    a, b = torch.randn(4, 4), torch.randn(4, 4)

    def f(a, b):
        scale = 2.0 if torch.is_autocast_enabled("cpu") else 1.0
        with torch.autocast("cpu", enabled=False):
            upcast = torch.mm(a, b)
        return torch.mm(a, b) * scale, upcast

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    with HpuAutocastMode(policy="torch-cpu"):
        low, high = compiled(a, b)
        eager_low, eager_high = f(a, b)
    assert (low.dtype, high.dtype) == (torch.bfloat16, torch.float32)
    assert torch.equal(low, eager_low) and torch.equal(high, eager_high)
    assert torch.equal(compiled(a, b)[0], torch.mm(a, b))  # outside: scale 1, float32


def test_a_rule_map_dynamo_rebuilt_is_settled_again():
    # torch.distributed.init_process_group clears Dynamo's trace-rule caches: the rule map built
    # again lacked the region's torch.is_autocast_enabled, a function of a package Dynamo skips,
    # and a fullgraph compile that asks it in a region was refused (after the FSDP2 tests).
    from torch._dynamo import trace_rules

    with HpuAutocastMode(policy="torch-cpu"):
        pass  # the tables settled
    trace_rules.clear_lru_cache()

    def f(a):
        return torch.mm(a, a) * (2.0 if torch.is_autocast_enabled("cpu") else 1.0)

    a = torch.randn(4, 4)
    with HpuAutocastMode(policy="torch-cpu"):
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(a)
        eager = f(a)
    assert out.dtype == torch.bfloat16 and torch.equal(out, eager)


def test_a_compiled_function_that_enters_a_region_itself():
    model, x = _model(), torch.randn(4, 8)

    def f(x):
        with HpuAutocastMode(policy="torch-cpu"):
            return model(x)

    out = torch.compile(f, backend="aot_eager")(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, f(x))


def test_once_dynamo_is_loaded_it_skips_the_whole_package():
    # The layout move put the skip in hpu_autocast._torch, whose __package__ it named: Dynamo then
    # traced the rest, mode.py's region entry in a compiled function that opens a region (torch
    # 2.14 warned of `_thread.get_ident`), the module map's hooks, the Python kernels after a break.
    from torch._dynamo import trace_rules

    with HpuAutocastMode(policy="torch-cpu"):
        torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    from hpu_autocast import mode, module_map
    from hpu_autocast._engine import kernels

    for module in (hpu_autocast, mode, module_map, kernels):
        assert trace_rules.check_file(module.__file__).skipped, module.__name__


def test_a_step_compiled_under_one_policy_is_not_served_under_another():
    # AOTAutograd's cache keyed the graph by Dynamo's graph and torch's autocast answers, which two
    # bfloat16 policies share: the graph compiled under torch-cpu (mm in bfloat16) was served to
    # a region whose policy leaves mm unlisted (float32). Note [AOTAutograd's cache and a region].
    lists = hpu_autocast.get_preset("torch-cpu")
    policies = (lists, lists.edit(unlisted=["mm"], name="torch-cpu-no-mm"))
    w, x = torch.randn(8, 8), torch.randn(4, 8)

    def f(x):
        return torch.mm(x, w) + 1

    for policy in policies:
        torch._dynamo.reset()
        with HpuAutocastMode(policy=policy, device_type="cpu"):
            got, eager = torch.compile(f, backend="inductor")(x), f(x)
        assert got.dtype == eager.dtype, policy.name
        torch.testing.assert_close(got, eager)


def test_aotautograds_cache_is_off_in_a_regions_thread_and_put_back_exactly():
    from torch._functorch import config

    if not hasattr(config, "enable_autograd_cache"):
        pytest.skip("this torch has no AOTAutograd cache")
    override = getattr(config._config["enable_autograd_cache"], "user_override", None)
    before = override.get() if hasattr(override, "get") else config.enable_autograd_cache
    seen = []

    def in_another_thread():
        other = threading.Thread(target=lambda: seen.append(config.enable_autograd_cache))
        other.start()
        other.join()
        return seen.pop()

    elsewhere = in_another_thread()
    with HpuAutocastMode(policy="torch-cpu", device_type="cpu"):
        with HpuAutocastMode(policy="hpu", device_type="cpu"):
            seen.append(config.enable_autograd_cache)
        seen.append(config.enable_autograd_cache)
        seen.append(in_another_thread())  # its own context: its own value (process-wide: off)
    per_context = hasattr(override, "get")
    assert seen == [False, False, elsewhere if per_context else False]
    after = override.get() if per_context else config.enable_autograd_cache
    assert after is before


def test_an_observing_region_runs_compiled_code_eagerly_so_it_sees_each_call():
    # A compiled graph runs without Python: the observer would see the calls traced on fake
    # tensors and none of the real ones. While such a region is open the stance is force_eager.
    model, x = _model(), torch.randn(4, 8)
    backend = Recording()
    compiled = torch.compile(model, backend=backend)
    events = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with HpuAutocastMode(policy="torch-cpu", observer=events.append):
            compiled(x)
            compiled(x)
    assert backend.graphs == []
    assert [e.name for e in events].count("aten.linear.default") == 4
    with HpuAutocastMode(policy="torch-cpu"):
        compiled(x)  # the stance was restored: it compiles now
    assert len(backend.graphs) == 1


def test_inductor_compiles_inside_a_region():
    # The backend passes through: inductor generates code from the graph with the casts in it.
    # Its fused kernels may round differently from eager op by op, so values to rounding.
    model, x = _model(), torch.randn(4, 8)
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    with HpuAutocastMode(policy="torch-cpu"):
        out, eager = compiled(x), model(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2)


def test_the_first_region_does_not_import_dynamo():
    # Importing torch._dynamo costs seconds; a process that compiles nothing must not pay it.
    # (A recording region's FLOP count runs torch's meta kernels, some of which import it.)
    code = (
        "import sys, torch, hpu_autocast\n"
        "with hpu_autocast.HpuAutocastMode(policy='torch-cpu'):\n"
        "    torch.mm(torch.randn(2, 2), torch.randn(2, 2))\n"
        "lin = torch.nn.Linear(2, 2)\n"
        "with hpu_autocast.HpuAutocastMode(policy='hpu', device_type='cpu'):\n"
        "    loss = lin(torch.randn(2, 2)).float().sum()\n"
        "loss.backward()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_eager_warning_comes_once_something_was_compiled():
    # torch.optim imports Dynamo with nothing compiled: an observing region then warns of nothing.
    # Once a frame was compiled, the first observing region says compiled code runs eagerly.
    code = (
        "import torch, warnings, hpu_autocast\n"
        "torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)\n"
        "def observe():\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        warnings.simplefilter('always')\n"
        "        with hpu_autocast.HpuAutocastMode(policy='torch-cpu', observer=lambda e: None):\n"
        "            pass\n"
        "    return [str(w.message) for w in seen]\n"
        "print(observe())\n"
        "torch.compile(lambda x: x * 2, backend='eager')(torch.ones(2))\n"
        "print(observe())\n"
        "print(observe())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    first, second, third = out.splitlines()
    assert first == "[]" and third == "[]"
    assert "compiled code runs eagerly" in second


_GUARDS_AFTER_DYNAMO = """
import sys, torch
from hpu_autocast import HpuAutocastMode
def f(a, b):
    scale = 2.0 if torch.is_autocast_enabled("cpu") else 1.0
    return torch.mm(a, b) * scale
a, b = torch.randn(4, 4), torch.randn(4, 4)
if sys.argv[1] == "inside":
    with HpuAutocastMode(policy="torch-cpu"):
        import torch._dynamo  # as torch.optim's first optimizer does, made inside a region
else:
    import torch._dynamo
compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
with HpuAutocastMode(policy="torch-cpu"):
    inside = compiled(a, b)
outside = compiled(a, b)
torch._dynamo.reset()
first_outside = compiled(a, b)
with HpuAutocastMode(policy="torch-cpu"):
    then_inside = compiled(a, b)
print(inside.dtype, outside.dtype, first_outside.dtype, then_inside.dtype,
      torch.equal(outside, torch.mm(a, b)))
"""


@pytest.mark.parametrize("loaded", ["before", "inside"])
def test_autocast_guards_compile_wherever_dynamo_was_loaded(loaded):
    # Dynamo builds its tables of torch functions at its import and at its first trace; with
    # Dynamo loaded inside a region, the first held the region's getter and the second torch's,
    # and a compile outside the region failed ("torch.* op returned non-Tensor"). Loaded before
    # and first traced inside a region, the reverse could happen (it did in this suite's order).
    # A fresh interpreter per case: this one has settled Dynamo's tables already.
    src = str(pathlib.Path(hpu_autocast.__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", _GUARDS_AFTER_DYNAMO, loaded],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["torch.bfloat16", "torch.float32", "torch.float32", "torch.bfloat16", "True"]


# -- the guard tells policies apart by every field -------------------------------------------
_LN = torch.ops.aten.layer_norm.default
_MM = torch.ops.aten.mm.default
_ADD = torch.ops.aten.add.Tensor


def _same_name_and_table(**changes):
    """Two policies of one name and table: the second differs only in ``changes``."""
    import dataclasses

    from hpu_autocast import CastPolicy, Policy

    base = Policy("twin", {_LN: CastPolicy.LOWER, _MM: CastPolicy.LOWER})
    return base, dataclasses.replace(base, **changes)


def _ln_then_add(model):
    def f(x, y):
        # layer_norm is on the list (its weight cast or not: input_only); add is on no list
        # (cast to its first input's dtype or not: HMP's unlisted default).
        return model(x) + y

    return f


@pytest.mark.parametrize(
    "changes", [dict(input_only=frozenset({_LN})), dict(unlisted="first")], ids=["input_only", "unlisted"]
)
def test_policies_of_one_name_and_table_each_get_their_own_graph(changes):
    # The guard was the name and a hash of the table: the second policy ran the first one's
    # graph (its casts) and gave the first one's values.
    model = nn.LayerNorm(16)
    torch.manual_seed(0)
    nn.init.normal_(model.weight)
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    f = _ln_then_add(model)
    backend = Recording()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    first, second = _same_name_and_table(**changes)
    results = []
    for policy in (first, second, first, second):
        with HpuAutocastMode(policy=policy, device_type="cpu"):
            out, eager = compiled(x, y), f(x, y)
        assert out.dtype == eager.dtype and torch.equal(out, eager), policy
        results.append(out)
    assert len(backend.graphs) == 2  # one per policy, each reused
    assert not torch.equal(results[0], results[1])  # the two policies do differ here


def test_every_field_of_a_policy_tells_its_compiled_key_apart():
    # Whatever a field changes, a policy that differs in it gets another key (the key is a
    # serial from a registry keyed by the whole policy, not a hash of some fields); an equal
    # policy, built again or pickled, gets the same key.
    import dataclasses
    import pickle

    from hpu_autocast import CastPolicy, Policy
    from hpu_autocast._engine.compiled import compile_policy
    from hpu_autocast.policies.recipes import Delayed

    variants = {
        "name": "other",
        "table": {_LN: CastPolicy.FP32, _MM: CastPolicy.LOWER},
        "input_only": frozenset({_LN}),
        "banned": {_ADD: "use something else"},
        "dtypes": (torch.bfloat16,),
        "unlisted": CastPolicy.FIRST,
        "inplace": CastPolicy.FIRST,
        "device_type": "cpu",
        "native": "AutocastCPU",
        "explicit_dtype": "cast",
        "fp8": Delayed(history=4),
        "bf16_gemms": frozenset({_MM}),
    }
    # A field added to Policy must be added here (and is covered by the key without more work);
    # the build record is no part of the value (test_policy.py: it changes neither equality nor key).
    assert set(variants) == {f.name for f in dataclasses.fields(Policy) if f.init and f.compare}
    base, _ = _same_name_and_table()
    keys = {compile_policy(base).key}
    for field, value in variants.items():
        keys.add(compile_policy(dataclasses.replace(base, **{field: value})).key)
    assert len(keys) == 1 + len(variants)
    assert compile_policy(pickle.loads(pickle.dumps(base))).key == compile_policy(base).key


def test_a_policy_dropped_from_the_compiled_cache_keeps_its_key_and_collides_with_none():
    # compile_policy keeps 64 compiled policies; one dropped and compiled again must get its
    # old key (its compiled graphs are still right for it), and never another policy's.
    import dataclasses

    from hpu_autocast._engine.compiled import _compiled, compile_policy

    base, twin = _same_name_and_table(input_only=frozenset({_LN}))
    first = compile_policy(base).key
    crowd = [dataclasses.replace(base, banned={_ADD: str(i)}) for i in range(_compiled.cache_info().maxsize + 1)]
    crowd_keys = {compile_policy(p).key for p in crowd}
    assert compile_policy(base).key == first  # evicted (the crowd overflowed it) and compiled again
    assert len(crowd_keys) == len(crowd) and first not in crowd_keys
    assert compile_policy(twin).key not in crowd_keys | {first}
    # A policy freed and built again gets a new key, never a freed one's.
    del crowd
    import gc

    gc.collect()
    fresh = {compile_policy(dataclasses.replace(base, banned={_ADD: f"{i} again"})).key for i in range(70)}
    assert not fresh & (crowd_keys | {first})

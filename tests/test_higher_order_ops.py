"""Higher-order operators in a region (``torch.cond``, ``while_loop``, ``map``, ``scan``,
``flex_attention``, one a user makes), against native autocast (``_hops``' Note: higher-order
operators on the borrowed keys). They skip the borrowed keys as they skip torch's autocast keys,
so the ops inside them are cast as native autocast casts them, eager and compiled; a backward that
traces their functions again runs them in the forward's region state, so gradients are native's;
``flex_attention``, which torch casts as a unit, is cast so under a policy reproducing native
autocast and left whole under the others, eager and compiled alike. Each used to raise in any
region ("could not find kernel for HigherOrderOperator cond at dispatch key
DispatchKey.AutocastIPU").
"""

import pytest
import torch
from torch._C import DispatchKey

from hpu_autocast import HpuAutocastMode

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),  # Dynamo's, compiling the operators
    # torch 2.13's higher-order operators import torch.jit code that warns at import
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


def _regions(observing: bool = True):
    """Native autocast, a region, and (``observing``) a recording region. A recording region runs
    compiled code eagerly (``torch.compiler.set_stance("force_eager")``), where torch's ``cond`` of
    branches returning one tensor fails in backward and its ``map`` returns a tuple, with no region
    at all: those cases leave it out."""
    regions = {
        "native": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        "ours": lambda: HpuAutocastMode(torch.bfloat16, policy="torch-cpu"),
    }
    if observing:
        regions["recorded"] = lambda: HpuAutocastMode(torch.bfloat16, policy="torch-cpu", record=True)
    return regions


def _same(a, b):
    if a is None or b is None:  # a gradient torch gives none of (compiled scan on torch 2.6)
        assert a is None and b is None
        return
    assert a.dtype == b.dtype and torch.equal(a, b)


def _forward_and_backward_as_native(fn, inputs, compiled: bool, observing: bool, errors):
    """Run ``fn`` on copies of ``inputs`` that require grad in each of ``_regions(observing)``
    (compiled with ``aot_eager`` if ``compiled``), then backward; every region's output and
    gradients must be native's bit for bit, or, where native raised one of ``errors``, each must
    raise one of them too (not always the same type: on torch 2.4, whose compiled cond has no
    autograd, native raises at backward and Dynamo wraps the region's failure in
    ``BackendCompilerFailed``, a ``RuntimeError``). Returns native's output (``None`` where it raised)."""
    results = {}
    for name, region in _regions(observing).items():
        torch._dynamo.reset()
        f = torch.compile(fn, backend="aot_eager", fullgraph=True) if compiled else fn
        args = [t.clone().requires_grad_() for t in inputs]
        try:
            with region():
                out = f(*args)
            out.float().sum().backward()
        except errors as e:
            results[name] = e
            continue
        results[name] = (out, *(a.grad for a in args))
    if not isinstance(results["native"], tuple):
        assert all(isinstance(r, errors) for r in results.values()), results
        return None
    assert all(isinstance(r, tuple) for r in results.values()), f"native ran, a region raised: {results}"
    for name in results:
        for x, y in zip(results[name], results["native"]):
            _same(x, y)
    return results["native"][0]


def _cond(a, b):
    return torch.cond(a.sum() > 0, lambda a, b: (torch.mm(a, b).relu(),), lambda a, b: (torch.mm(b, a),), (a, b))[0]


def _cond_one_tensor(a, b):
    return torch.cond(a.sum() > 0, lambda a, b: torch.mm(a, b).relu(), lambda a, b: torch.mm(b, a), (a, b))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("cond", [_cond, _cond_one_tensor], ids=["tuple", "tensor"])
def test_cond_casts_its_branches_as_native_autocast_forward_and_backward(cond, compiled):
    # The backward traces the branches again after the region exited (materialize_as_graph under
    # the forward's keys): they run in a region with the forward's state, so the gradients are
    # native's bit for bit, not those of a float32 recomputation.
    torch.manual_seed(0)
    native = _forward_and_backward_as_native(
        cond, (torch.randn(4, 4), torch.randn(4, 4)), compiled, observing=cond is _cond, errors=RuntimeError
    )  # torch 2.4: "Autograd not implemented for cond"
    if native is not None:
        assert native.dtype == torch.bfloat16


def _cond_opted_out(a, b):
    def opted_out(a, b):
        with torch.autocast("cpu", enabled=False):
            x = torch.mm(a, b).relu()  # float32, and so its backward in eager code
        return (torch.mm(x, b),)

    return torch.cond(a.sum() > 0, opted_out, lambda a, b: (torch.mm(b, a),), (a, b))[0]


#: torch before 2.9 (seen on 2.6.0): aot_eager refuses the differentiated branch graph the region
#: traces ("Unexpected fake buffer true_graph_0._tensor_constant0"), where native compiles it;
#: 2.9.1, 2.11, 2.13 and 2.14.1 pass, and on 2.4 both raise (its cond has no autograd).
_OLD_COMPILED_COND = torch.__version__ < (2, 9)  # torch's TorchVersion compares with a tuple


@pytest.mark.parametrize(
    "compiled",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.xfail(
                _OLD_COMPILED_COND, reason="torch < 2.9: aot_eager refuses the region's branch graph", strict=False
            ),
        ),
    ],
    ids=["eager", "compiled"],
)
def test_cond_with_an_opt_out_in_a_branch_differentiated_after_the_region_is_native(compiled):
    # Native traces the branch's backward again with its autocast key on, the backward formulas
    # included: the opted-out mm's backward mm computes in bf16. Failed before (issue 31, item
    # 3): the region's replay ran the branch alone in a region, its backward in float32
    # (a.grad.sum() 16.9605 against native's 16.9531).
    torch.manual_seed(0)
    a, b = torch.randn(4, 4).abs(), torch.randn(4, 4)  # a.sum() > 0: the opted-out branch
    # A recording region runs compiled code eagerly (_regions' docstring), and native's compiled
    # gradient differs from its eager one here (b.grad): the recording region is compared eagerly.
    native = _forward_and_backward_as_native(
        _cond_opted_out, (a, b), compiled, observing=not compiled, errors=RuntimeError
    )
    assert native is None or native.dtype == torch.bfloat16


def test_while_loop_casts_its_body_as_native_autocast():
    from torch._higher_order_ops.while_loop import while_loop

    a = torch.randn(4, 4)
    results = {}
    for name, region in _regions().items():
        with region():
            results[name] = while_loop(
                lambda i, x: i < 3, lambda i, x: (i + 1, torch.mm(x, x).float() / 4), (torch.tensor(0), a)
            )[1]
    assert not torch.equal(
        results["native"],
        while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, torch.mm(x, x) / 4), (torch.tensor(0), a))[1],
    )  # it did cast
    _same(results["ours"], results["native"])
    _same(results["recorded"], results["native"])


def _map(xs, w):
    from torch._higher_order_ops.map import map as hop_map

    return hop_map(lambda x, w: torch.mm(x, w), xs, w)


def _scan(xs, w):
    from torch._higher_order_ops.scan import scan

    def combine(carry, x):
        new = torch.mm(carry, x).tanh().float()
        return new, new.clone()

    return scan(combine, w, xs)[1]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("fn", [_map, _scan], ids=["map", "scan"])
def test_map_and_scan_cast_their_bodies_as_native_autocast_forward_and_backward(fn, compiled):
    pytest.importorskip(f"torch._higher_order_ops.{fn.__name__[1:]}")
    torch.manual_seed(0)
    # A recording region runs compiled code eagerly: compiled, it would meet torch's eager scan
    # where native meets the compiled one (torch 2.6's eager scan has no autograd).
    _forward_and_backward_as_native(
        fn,
        (torch.randn(3, 4, 4), torch.randn(4, 4)),
        compiled,
        observing=fn is _scan and not compiled,
        errors=Exception,
    )  # an older torch without the operator's autograd, or without it


def _flex_attention():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    op = torch._ops._higher_order_ops.get("flex_attention")
    if op is None or DispatchKey.AutocastCPU not in op.py_kernels:
        # Before torch cast it as a unit, it skipped autocast's keys as any other operator does,
        # and skips the borrowed keys the same way.
        pytest.skip("this torch's flex_attention has no kernel on autocast's key")
    return flex.flex_attention


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_flex_attention_is_cast_as_native_casts_it_under_torch_cpu(compiled):
    flex_attention = _flex_attention()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))

    def score_mod(score, b, h, qi, ki):
        return score + (qi - ki).to(score.dtype) * 0.1

    results = {}
    for name, region in _regions().items():
        torch._dynamo.reset()
        f = torch.compile(flex_attention, backend="aot_eager") if compiled else flex_attention
        with region():
            results[name] = f(q, k, v, score_mod=score_mod)
    assert results["native"].dtype == torch.bfloat16
    _same(results["ours"], results["native"])
    _same(results["recorded"], results["native"])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_flex_attention_is_left_whole_under_a_policy_of_its_own(compiled):
    # Under hpu, no list names it; cast op by op in eager code only (a compiled graph runs it as
    # one node, autocast off), eager and compiled would differ: it runs uncast in both.
    flex_attention = _flex_attention()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    torch._dynamo.reset()
    f = torch.compile(flex_attention, backend="aot_eager") if compiled else flex_attention
    plain = flex_attention(q, k, v)
    with HpuAutocastMode(torch.bfloat16, policy="hpu", device_type="cpu"):
        out = f(q, k, v)
    assert out.dtype == torch.float32 and torch.allclose(out, plain, atol=1e-6)


def test_a_higher_order_operator_made_after_the_first_region_skips_the_keys_at_the_next():
    from torch._ops import HigherOrderOperator

    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
        pass

    class Twice(HigherOrderOperator):
        def __init__(self):
            super().__init__("hpu_autocast_test_twice")

        def __call__(self, fn, x):
            return super().__call__(fn, x)

    twice = Twice()

    @twice.py_impl(DispatchKey.CompositeExplicitAutograd)
    def _twice(fn, x):
        return fn(fn(x))

    twice.fallthrough(DispatchKey.AutogradCPU)
    a = torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = twice(lambda t: torch.mm(t, t), a)
    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
        ours = twice(lambda t: torch.mm(t, t), a)
    _same(ours, native)
    assert native.dtype == torch.bfloat16


def test_compiled_cond_is_traced_again_for_each_policy_and_outside():
    # The policy's casts are in the branches' traced graphs: a frame compiled under one policy
    # must not serve another (hpu has exp on its float32 list, torch-cpu does not list it).
    x = torch.randn(4, dtype=torch.bfloat16)

    def f(x):
        return torch.cond(x.sum() > -100, lambda x: (torch.exp(x),), lambda x: (torch.exp(x) + 1,), (x,))[0]

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for policy, dtype in (
        ("torch-cpu", torch.bfloat16),
        ("hpu", torch.float32),
        ("torch-cpu", torch.bfloat16),
        (None, torch.bfloat16),
        ("hpu", torch.float32),
    ):
        if policy is None:
            out = compiled(x)
        else:
            with HpuAutocastMode(torch.bfloat16, policy=policy, device_type="cpu"):
                out = compiled(x)
        assert out.dtype == dtype, policy
        _same(out, torch.exp(x) if dtype == torch.bfloat16 else torch.exp(x.float()))

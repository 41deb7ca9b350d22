"""Issue 29: on HPU tensors, an ``hpu`` region makes the ATen calls that Gaudi's bridge makes.

The oracle is the bridge's own autocast: its ``AutocastHPU`` kernels (``Hpu_KERNEL`` over its
default lists, ``hpu_ops/autocast_helpers.h``), switched on by ``torch.autocast("hpu")``. Off
Gaudi they are the stand-in's (``_fake_habana.bridge_table``, registered as the bridge registers
them); on a Gaudi, where ``import torch`` loads the bridge, they are the bridge's own, so
``python -m hpu_autocast gaudi-check`` runs this file against the real kernels.

The tensors are fake HPU tensors (``_fake_habana.fake_hpu``: HPU-keyed, meta kernels), so both
autocasts see HPU tensors and nothing computes. Each call is recorded where it reaches *below*
autocast: the tensors are wrapped in ``_trace.Recorded``, a wrapper subclass whose ``__torch_dispatch__``
writes one line per ATen call (overload, input dtypes and shapes, dtype arguments) and runs it
on the fake tensor inside, autocast keys excluded. A subclass rather than a dispatch mode: the
C++ core hands every call to Python while a dispatch mode is active, so a mode would test the
Python kernels under either engine.

The three explicit-dtype cases (``softmax(x, -1, dtype=torch.float32)`` and kin) hold because
``hpu`` casts as the bridge does (``Policy.explicit_dtype = "cast"``): a float32 input is rounded
to the region's dtype whatever ``dtype=`` says.

Limits of fake HPU tensors on a CPU build: no autograd (it asks for HPU's device guard, which a
CPU build lacks, and aborts), and no Python indexing (``x[:, :1]``, for the same reason); the
models below use neither. Batch norm's composite asks for the device guard after its
``native_batch_norm`` call: its calls are compared up to there, and both sides raise alike.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree

import _fake_habana
from _samples import SAMPLES, build
from _trace import SHORT, Recorded, describe
from hpu_autocast import HpuAutocastMode
from hpu_autocast.policies.presets import gaudi_autocast

DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="f16")]


# --- the recorder (tests/_trace.py's, on fake HPU tensors) ----------------------------------


def _calls(fn: Callable, args, kwargs, context) -> List[str]:
    """The calls ``fn`` makes below autocast on fake HPU copies of its tensors inside
    ``context``, then its outcome: the results' dtypes and shapes, or the error's type."""
    log: List[str] = []
    args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: Recorded(_fake_habana.fake_hpu(t), log), (args, kwargs))
    try:
        with context:
            out = fn(*args, **kwargs)
        outcome = "-> " + describe(pytree.tree_leaves(out))
    except Exception as e:  # noqa: BLE001  (both sides must fail alike)
        outcome = f"raised {type(e).__name__}"
    return _casts_sorted(log) + [outcome]


def _casts_sorted(log: List[str]) -> List[str]:
    """``log`` with each run of consecutive casts sorted: the order in which one call's arguments
    are cast is not a behaviour (C++ leaves argument evaluation order unspecified; GCC's is right
    to left, so the bridge casts the last argument first)."""
    out: List[str] = []
    run: List[str] = []
    for line in log + [""]:
        if line.startswith("aten._to_copy.default("):
            run.append(line)
            continue
        out += sorted(run) + ([line] if line else [])
        run = []
    return out


def native(dtype: torch.dtype):
    """The bridge's autocast for HPU tensors: its AutocastHPU kernels, on for this block."""
    return torch.autocast("hpu", dtype=dtype)


def ours(dtype: torch.dtype):
    return HpuAutocastMode(dtype, policy="hpu", device_type="hpu")


@pytest.fixture
def bridge(monkeypatch, request):
    """The bridge's kernels: Gaudi's own where it is loaded, else the stand-in's (a Gaudi 2, which
    takes float16)."""
    if _fake_habana.real_bridge_loaded():
        dtype = getattr(request.node, "callspec", None) and request.node.callspec.params.get("dtype")
        if dtype == torch.float16 and torch.hpu.get_device_name() == "GAUDI":
            pytest.skip("first-generation Gaudi: no float16")
        return None
    return _fake_habana.install(monkeypatch, device_name="GAUDI2")


# --- the ops of the lists, with tests/_samples.py's calls -------------------------------------


def _retyped(tree, first: torch.dtype, rest: torch.dtype):
    """The floating tensors of ``tree`` in ``first`` (the first one) and ``rest`` (the others)."""
    count = [0]

    def retype(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        count[0] += 1
        return t.to(first if count[0] == 1 else rest)

    return pytree.tree_map_only(torch.Tensor, retype, tree)


def _explicit_dtype(name: str):
    x = torch.randn(3, 5)
    fn = {"softmax": torch.softmax, "log_softmax": torch.log_softmax}.get(name)
    if fn is not None:
        return fn, (x, -1), {"dtype": torch.float32}
    return torch.mean, (x,), {"dtype": torch.float32}


_NAMES = sorted({n for n in gaudi_autocast.LOWER + gaudi_autocast.FP32 + gaudi_autocast.PROMOTE if n in SAMPLES})
#: Inputs per case: float32 (as the sample has them), all in the region's dtype, or the first
#: in the region's dtype and the rest float32 (what promote decides on).
_INPUTS = ("f32", "lowp", "mixed")


def _case(name: str, inputs: str, dtype: torch.dtype):
    if name.endswith("(dtype=)"):
        fn, args, kwargs = _explicit_dtype(name[: -len("(dtype=)")])
    else:
        fn, args, kwargs = build(name)
    first = torch.float32 if inputs == "f32" else dtype
    rest = dtype if inputs == "lowp" else torch.float32
    args, kwargs = _retyped((args, kwargs), first, rest)
    return fn, args, kwargs


def _params():
    names = _NAMES + ["softmax(dtype=)", "log_softmax(dtype=)", "mean(dtype=)"]
    for name in names:
        for inputs in _INPUTS:
            yield pytest.param(name, inputs, id=f"{name}-{inputs}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,inputs", list(_params()))
def test_op_calls_below_autocast_are_the_bridges(bridge, name, inputs, dtype):
    fn, args, kwargs = _case(name, inputs, dtype)
    expected = _calls(fn, args, kwargs, native(dtype))
    assert _calls(fn, args, kwargs, ours(dtype)) == expected


# --- small models ------------------------------------------------------------------------------


class MLPLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.fc2(F.gelu(self.fc1(x))), target)


class AttentionBlock(nn.Module):
    """Pre-norm self-attention by hand (matmul, softmax), then SDPA on the same projections."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.norm, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        return x + self.proj(weights @ v) + F.scaled_dot_product_attention(q, k, v)


MODELS: Dict[str, Callable[[], tuple]] = {
    "mlp-loss": lambda: (MLPLoss(), (torch.randn(4, 8), torch.tensor([0, 3, 1, 2]))),
    "attention": lambda: (AttentionBlock(), (torch.randn(2, 5, 8),)),
    "layer-norm": lambda: (nn.LayerNorm(8), (torch.randn(4, 8),)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_model_calls_below_autocast_are_the_bridges(bridge, model_name, dtype):
    torch.manual_seed(0)
    model, inputs = MODELS[model_name]()
    params = {k: v.detach() for k, v in model.state_dict().items()}  # fake HPU tensors take no grad

    def forward(params, *inputs):
        return torch.func.functional_call(model, params, inputs)

    expected = _calls(forward, (params, *inputs), {}, native(dtype))
    assert any(f"{SHORT[dtype]}[" in line for line in expected)  # the bridge cast something
    assert _calls(forward, (params, *inputs), {}, ours(dtype)) == expected


# --- the stand-in's kernels are the bridge's, and the fake tensors are HPU tensors ------------


def test_stand_in_kernels_are_registered_as_the_bridge_registers_them(bridge):
    if bridge is None:
        pytest.skip("Gaudi's own bridge is loaded")
    table = _fake_habana.bridge_table()
    aten = torch.ops.aten
    # lower wins over promote (mul), FP32 over promote (div, exp), norms cast their input alone,
    # no in-place or out= overload, no Python name.
    assert table[aten.mul.Tensor] == _fake_habana.LOWER and table[aten.div.Tensor] == _fake_habana.FP32
    assert table[aten.layer_norm.default] == _fake_habana.LOWER_FIRST
    assert table[aten.cat.default] == _fake_habana.PROMOTE
    assert aten.add_.Tensor not in table and aten.mm.out not in table
    registered = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastHPU"))
    assert {
        op._schema.name + ("" if op._overloadname == "default" else "." + op._overloadname) for op in table
    } <= registered


def test_fake_hpu_tensors_reach_the_bridges_kernel_and_a_region(bridge):
    a, b = (_fake_habana.fake_hpu(torch.randn(2, 3)) for _ in range(2))
    assert a.device.type == "hpu" and "AutocastHPU" in repr(torch._C._dispatch_keys(a))
    with native(torch.bfloat16):
        assert torch.mm(a, b.t()).dtype == torch.bfloat16
        assert torch.softmax(a, -1, dtype=torch.float32).dtype == torch.float32
    with ours(torch.bfloat16):
        assert torch.mm(a, b.t()).dtype == torch.bfloat16
    assert torch.mm(a, b.t()).dtype == torch.float32  # neither: no cast
    with HpuAutocastMode(torch.bfloat16, policy="hpu", device_type="cpu"):
        assert torch.mm(a, b.t()).dtype == torch.float32  # a CPU region leaves HPU tensors alone


# --- torch.compile(backend="hpu_backend") -------------------------------------------------------


@pytest.fixture
def stand_in(monkeypatch):
    bridge = _fake_habana.install(monkeypatch, device_name="GAUDI2")
    torch._dynamo.reset()
    yield bridge
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_with_hpu_backend_in_a_region_equals_eager(stand_in, dtype):
    # On CPU tensors (the stand-in has no device), in a region casting them: the backend's
    # AOTAutograd trace records the region's casts, its propagation pass runs with autocast off
    # (else it would see other dtypes than the graph's: it raises then), and the graph runs as a
    # recipe, with no autocast. Forward and backward equal eager under the region, bit for bit.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4), nn.Softmax(-1))
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="hpu_backend")
    results = []
    for run in (model, compiled):
        model.zero_grad()
        with HpuAutocastMode(dtype, policy="hpu", device_type="cpu"):
            out = run(x)
        out.float().pow(2).sum().backward()
        results.append((out, [p.grad.clone() for p in model.parameters()]))
    (eager, eager_grads), (comp, comp_grads) = results
    assert comp.dtype == eager.dtype == dtype and torch.equal(comp, eager)  # softmax: lower
    assert all(torch.equal(a, b) for a, b in zip(comp_grads, eager_grads))
    compiles = [c for c in stand_in.calls if c[0] == "compile"]
    assert [c[1] for c in compiles] == ["forward", "backward"] and compiles[0][2] > 0  # casts traced in

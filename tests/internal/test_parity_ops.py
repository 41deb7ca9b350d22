"""``policy="torch-cpu"`` against ``torch.autocast("cpu")``, op by op, bit for bit.

Every overload of the preset (enumerated from the policy object, so a new entry is covered, or
fails the coverage test, as soon as it lands) is called

* as the ``OpOverload`` itself (``torch.ops.aten.conv1d.padding(...)``),
* as a ``Tensor`` method where there is one (``x.mm(y)``), and
* through the public torch function (``torch.conv1d``, ``F.cross_entropy``, ``torch.linalg.qr``),
  composites included,

once under native autocast and once under ``HpuAutocastMode(dtype, policy="torch-cpu")``, in
bfloat16 and float16, with float32 inputs, inputs already in the lower dtype, (for ops with two
or more floating inputs) mixed inputs, and (directly) float64 inputs. Outputs must agree in
structure, types, dtypes, shapes and values, bit for bit (NaN-aware); where native raises, ours
must raise the same type. A backward pass (outside the region) compares input gradients too.

The preset must equal what torch registers for ``AutocastCPU``. The tests at the end cover what
lies outside those per-op calls: promote with the other lower dtype, and listed ops called from
inside unlisted C++ kernels.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from _parity import ATEN, VARIANTS, aten_call, differences, run, run_with_grad
from _samples import SAMPLES, build
from hpu_autocast import HpuAutocastMode, get_preset
from hpu_autocast._engine import core as _core
from hpu_autocast._facts.ops import all_overloads, has_kernel, op_base_name

# torch deprecates these listed ops; the suite still checks them, as long as torch has them.
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated in favor of:UserWarning")

POLICY = get_preset("torch-cpu")
DTYPES = [torch.bfloat16, torch.float16]
OPS = sorted(POLICY.table, key=str)
PACKETS = sorted({op_base_name(op) for op in OPS})

#: Packets of the preset with no public torch function, each with its reason. Their overloads
#: are still called directly (test_overload_matches_native).
NO_PUBLIC = {
    # The oneDNN LSTM's per-layer kernel: only aten::lstm calls it, from C++, under oneDNN.
    # nn.LSTM is the public way in; test_parity_models.py runs it.
    "mkldnn_rnn_layer",
}

#: Packets whose native autocast call raises on this CPU, in every variant: ours must raise the
#: same exception type. Listed so that a test where both sides raise is a decision, not an
#: accident of a bad sample.
NATIVE_RAISES = {
    # oneDNN has no bf16/fp16 LSTM primitive on CPUs without AVX512-BF16/AMX ("could not create
    # a primitive descriptor for the LSTM forward propagation primitive").
    "mkldnn_rnn_layer",
}


#: Outputs that are scratch memory, not values, by packet: compared by dtype and shape only.
#: oneDNN's LSTM workspace holds uninitialized padding, so native autocast differs from itself
#: run to run (seen on CPUs with AVX512-BF16, where the bf16 primitive exists).
SCRATCH_OUTPUTS = {"mkldnn_rnn_layer": 3}


def _blank_scratch(label: str, result: object) -> object:
    i = SCRATCH_OUTPUTS.get(label.split(".")[0])
    if i is None or result is None:
        return result
    flat, spec = tree_flatten(result)
    flat[i] = torch.zeros_like(flat[i])
    return tree_unflatten(flat, spec)


#: Keyword arguments added to a public sample of ``tests/_samples.py``, each with its reason.
PUBLIC_KWARGS = {
    # torch.linalg.lstsq's default CPU driver, gelsy, differs run to run in the last bits even
    # in plain float32 without any autocast (seen: 18 of 50 calls equal the first); gelsd is
    # deterministic, so the comparison can stay bit for bit.
    "linalg_lstsq": {"driver": "gelsd"},
}


def _n_floating(args, kwargs) -> int:
    return sum(isinstance(t, torch.Tensor) and t.is_floating_point() for t in tree_flatten((args, kwargs))[0])


def _variants(call) -> list:
    # Mixed inputs differ from "all lower" only where there are two floating inputs or more.
    return ["f32", "lower", "mixed"] if _n_floating(*call) >= 2 else ["f32", "lower"]


def _overload_params() -> list:
    params = []
    for op in OPS:
        packet = op_base_name(op)
        if packet not in ATEN or op._overloadname not in ATEN[packet]():
            continue  # test_aten_table_covers_every_overload names it
        # float64 inputs too, directly: autocast never casts them.
        for variant in _variants(aten_call(packet, op._overloadname)) + ["f64"]:
            for dtype in DTYPES:
                params.append(pytest.param(op, dtype, variant, id=f"{op}-{str(dtype)[6:]}-{variant}"))
    return params


def _method_params() -> list:
    params = []
    for op in OPS:
        packet = op_base_name(op)
        if hasattr(torch.Tensor, packet) and packet in ATEN and op._overloadname in ATEN[packet]():
            for variant in _variants(aten_call(packet, op._overloadname)):
                params += [pytest.param(op, dtype, variant, id=f"{op}-{str(dtype)[6:]}-{variant}") for dtype in DTYPES]
    return params


def _public_params() -> list:
    params = []
    for packet in PACKETS:
        if packet in NO_PUBLIC or packet not in SAMPLES:
            continue  # test_public_table_covers_every_packet names it
        _, args, kwargs = build(packet)
        for variant in _variants((args, kwargs)):
            for dtype in DTYPES:
                params.append(pytest.param(packet, dtype, variant, id=f"{packet}-{str(dtype)[6:]}-{variant}"))
    return params


def _compare(fn, args, kwargs, dtype, label, observer=None):
    with torch.autocast("cpu", dtype=dtype):
        ref, ref_err = run(fn, args, kwargs)
    with HpuAutocastMode(dtype, policy="torch-cpu", observer=observer):
        out, err = run(fn, args, kwargs)
    assert err == ref_err, f"{label}: native raised {ref_err}, ours {err}"
    if ref_err is not None:
        # Either a listed autocast failure, or the op rejects these inputs with no autocast at
        # all (_grid_sampler_2d_cpu_fallback has no float64 kernel).
        assert label.split(".")[0] in NATIVE_RAISES or run(fn, args, kwargs)[1] is ref_err, (
            f"{label}: native autocast raised {ref_err.__name__}, a plain call does not"
        )
        return
    diff = differences(_blank_scratch(label, out), _blank_scratch(label, ref))
    assert not diff, f"{label}: ours differs from native autocast:\n" + "\n".join(diff)


# --- the preset is what torch registers --------------------------------------------------------


def _registered_for_autocast_cpu() -> set:
    # Note: from the dispatcher's table of every op, not dir(torch.ops.aten), which lists only
    # the packets looked up so far in this process (building the preset looks up its own, so
    # an op the preset misses would go unseen).
    return {op for op in all_overloads("aten") if has_kernel(op, "AutocastCPU")}


def test_preset_equals_what_torch_registers():
    # The seed's list lacks smooth_l1_loss, which torch registers for AutocastCPU (the list
    # gave 126 of the 127 overloads); the preset adds it, so the two sets are equal.
    registered = _registered_for_autocast_cpu()
    preset = set(POLICY.table)
    assert not preset - registered, f"in the preset, not registered: {sorted(map(str, preset - registered))}"
    assert not registered - preset, f"registered, not in the preset: {sorted(map(str, registered - preset))}"


#: Libraries that register AutocastCPU kernels for ops of their own once imported (torchvision:
#: nms, roi_align; the real-model suite imports it): a torch-cpu region leaves such an op to its
#: kernel (Policy.native), so they are not the table's.
OTHER_LIBRARIES = ("torchvision::",)


def test_preset_equals_the_autocast_cpu_registrations():
    # The same, from the dispatcher's own list (every namespace torch registers in, not only aten).
    names = {
        str(op._schema.name) + ("" if op._overloadname == "default" else "." + op._overloadname) for op in POLICY.table
    }
    registered = torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU")
    assert names == {n for n in registered if not n.startswith(OTHER_LIBRARIES)}


# --- coverage: every overload is tested, or excluded with a reason -----------------------------


def test_aten_table_covers_every_overload():
    # Exactly the preset's overloads: none untested, none stale.
    tabled = {f"aten.{p}.{o}" for p in ATEN for o in ATEN[p]()}
    assert tabled == {str(op) for op in OPS}, (
        f"untested: {sorted({str(op) for op in OPS} - tabled)}; not in the preset: "
        f"{sorted(tabled - {str(op) for op in OPS})}"
    )


def test_public_table_covers_every_packet():
    assert set(PACKETS) - NO_PUBLIC <= set(SAMPLES), sorted(set(PACKETS) - NO_PUBLIC - set(SAMPLES))


def test_exclusions_are_few_and_real():
    # Each exclusion names a packet of the preset, and they stay the exception.
    assert NO_PUBLIC <= set(PACKETS) and NATIVE_RAISES <= set(PACKETS) and set(PUBLIC_KWARGS) <= set(PACKETS)
    assert len(NO_PUBLIC) <= 2 and len(NATIVE_RAISES) <= 2 and len(PUBLIC_KWARGS) <= 2


def test_the_comparison_catches_a_wrong_policy():
    # torch-cpu less aten.mm: the direct call then runs in float32 and must fail the comparison.
    table = {op: a for op, a in POLICY.table.items() if str(op) != "aten.mm.default"}
    args, kwargs = aten_call("mm", "default")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = torch.ops.aten.mm.default(*args, **kwargs)
    with HpuAutocastMode(torch.bfloat16, policy=dataclasses.replace(POLICY, table=table, name="no-mm")):
        out = torch.ops.aten.mm.default(*args, **kwargs)
    assert differences(out, ref) and not differences(ref, ref.clone())
    nan = torch.tensor([float("nan"), 1.0])
    assert not differences(nan, nan.clone()) and differences(nan, torch.tensor([float("nan"), 2.0]))


# --- op by op ----------------------------------------------------------------------------------


@pytest.mark.parametrize("op, dtype, variant", _overload_params())
def test_overload_matches_native(op, dtype, variant):
    args, kwargs = aten_call(op_base_name(op), op._overloadname)
    f = VARIANTS[variant](dtype)
    args, kwargs = tree_map(f, args), tree_map(f, kwargs)
    _compare(op, args, kwargs, dtype, f"{op_base_name(op)}.{op._overloadname}")


#: Named tensors (torch before 2.13, which removed them) never reach a Python kernel: torch hands
#: a kernel its arguments as TorchScript values, which refuse them ("NYI: Named tensors are
#: currently unsupported in TorchScript"), where native autocast's C++ kernel takes them.
NAMED_TENSORS = hasattr(torch.Tensor, "has_names")


@pytest.mark.parametrize("op, dtype, variant", _method_params())
def test_tensor_method_matches_native(op, dtype, variant):
    # x.mm(y), x.prod(1), x.index_copy(...): the Tensor method with the overload's arguments.
    packet = op_base_name(op)
    args, kwargs = aten_call(packet, op._overloadname)
    f = VARIANTS[variant](dtype)
    args, kwargs = tree_map(f, args), tree_map(f, kwargs)
    method = lambda self, *a, **k: getattr(self, packet)(*a, **k)  # noqa: E731
    # Before torch 2.13 a named tensor cannot reach a Python kernel; the C++ core's kernel takes it.
    if NAMED_TENSORS and _core.core is None and any(isinstance(a, torch.Tensor) and a.has_names() for a in args):
        with torch.autocast("cpu", dtype=dtype):
            native_err = run(method, args, kwargs)[1]
        if native_err is None:
            with HpuAutocastMode(dtype, policy="torch-cpu"), pytest.raises(RuntimeError, match="Named tensors"):
                method(*args, **kwargs)
            pytest.xfail("named tensors never reach a Python kernel before torch 2.13")
    _compare(method, args, kwargs, dtype, f"{packet}.{op._overloadname} (Tensor method)")


@pytest.mark.parametrize("packet, dtype, variant", _public_params())
def test_public_function_matches_native(packet, dtype, variant):
    fn, args, kwargs = build(packet)
    kwargs = {**kwargs, **PUBLIC_KWARGS.get(packet, {})}
    f = VARIANTS[variant](dtype)
    args, kwargs = tree_map(f, args), tree_map(f, kwargs)
    hit = []

    def observer(event):
        if event.action is not None and op_base_name(event.op) == packet:
            hit.append(event)

    _compare(fn, args, kwargs, dtype, packet, observer)
    # The sample really reaches the op under test, or it tests nothing.
    assert hit, f"{packet}: the public call {getattr(fn, '__name__', fn)} never reached aten.{packet}"


# --- backward ------------------------------------------------------------------------------------


def _backward_params() -> list:
    params = []
    for op in OPS:
        packet = op_base_name(op)
        if packet in ATEN and op._overloadname in ATEN[packet]():
            params += [pytest.param("aten", op, dtype, id=f"{op}-{str(dtype)[6:]}") for dtype in DTYPES]
    for packet in PACKETS:
        if packet not in NO_PUBLIC and packet in SAMPLES:
            params += [pytest.param("public", packet, dtype, id=f"{packet}-{str(dtype)[6:]}") for dtype in DTYPES]
    return params


@pytest.mark.parametrize("level, op, dtype", _backward_params())
def test_backward_matches_native(level, op, dtype):
    # float32 inputs that require grad; forward inside the region, backward outside it. The
    # direct OpOverload call is cast below autograd (the autograd bridge recasts its saved
    # inputs), the public call above it: both must give native's input gradients bit for bit.
    if level == "aten":
        fn, label = op, f"{op_base_name(op)}.{op._overloadname}"
        args, kwargs = aten_call(op_base_name(op), op._overloadname)
    else:
        (fn, args, kwargs), label = build(op), op
        kwargs = {**kwargs, **PUBLIC_KWARGS.get(op, {})}
    ref, ref_err = run_with_grad(fn, args, kwargs, torch.autocast("cpu", dtype=dtype))
    out, err = run_with_grad(fn, args, kwargs, HpuAutocastMode(dtype, policy="torch-cpu"))
    # Native raises for inputs it cannot differentiate (a loss's target), for ops without a
    # derivative (geqrf) and for oneDNN's LSTM layer: ours must raise the same.
    assert err == ref_err, f"{label}: native raised {ref_err}, ours {err}"
    diff = differences(_blank_scratch(label, out), _blank_scratch(label, ref))
    assert not diff, f"{label}: ours differs from native autocast:\n" + "\n".join(diff)


# --- keyword calls -------------------------------------------------------------------------------
# Tensors passed by keyword (a list of them for cat/stack), at both levels, mixed dtypes.


def _keyword_calls(dtype):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    low = lambda *shape: r(*shape).to(dtype)  # noqa: E731
    return {
        "cat": (torch.cat, dict(tensors=[low(2, 3), r(1, 3)], dim=0)),
        "aten.cat": (torch.ops.aten.cat.default, dict(tensors=[low(2, 3), r(1, 3)])),
        "stack": (torch.stack, dict(tensors=[low(2, 3), r(2, 3)])),
        "aten.stack": (torch.ops.aten.stack.default, dict(tensors=[low(2, 3), r(2, 3)], dim=1)),
        "index_copy": (torch.index_copy, dict(input=low(4, 3), dim=0, index=torch.tensor([0, 2]), source=r(2, 3))),
        "aten.index_copy": (
            torch.ops.aten.index_copy.default,
            dict(self=low(4, 3), dim=0, index=torch.tensor([0, 2]), source=r(2, 3)),
        ),
        "mm": (torch.mm, dict(input=r(2, 4), mat2=low(4, 3))),
        "aten.mm": (torch.ops.aten.mm.default, dict(self=r(2, 4), mat2=low(4, 3))),
        "linear": (torch.nn.functional.linear, dict(input=low(2, 4), weight=r(3, 4), bias=r(3))),
        "conv2d": (torch.nn.functional.conv2d, dict(input=r(1, 2, 4, 4), weight=low(3, 2, 2, 2), bias=r(3))),
        "mse_loss": (torch.nn.functional.mse_loss, dict(input=low(3, 4), target=r(3, 4))),
    }


@pytest.mark.parametrize("name", sorted(_keyword_calls(torch.bfloat16)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_keyword_call_matches_native(dtype, name):
    fn, kwargs = _keyword_calls(dtype)[name]
    _compare(fn, (), kwargs, dtype, name)


# --- promote with the other lower-precision dtype --------------------------------------------------
# Native autocast's promote (at::autocast::promote_type) starts from the region's dtype and walks
# the eligible inputs in order: float32 anywhere so far gives float32, the region's dtype keeps
# it, and any other floating dtype (bfloat16 in a float16 region, float16 in a bfloat16 region)
# seen before a float32 raises "Unexpected floating ScalarType in at::autocast::prioritize".
# Ours (rules.compute_dtype, PROMOTE) follows the same walk and raises rules.PromoteError (a
# RuntimeError) naming the op and the dtypes.


def _other(dtype):
    return torch.float16 if dtype is torch.bfloat16 else torch.bfloat16


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_promote_float32_before_the_other_lower_dtype_matches_native(dtype):
    # float32 first: native is already at float32 when the other dtype comes, so it does not raise.
    args = ([torch.ones(1, 3), torch.ones(2, 3, dtype=_other(dtype))],)
    _compare(torch.cat, args, {}, dtype, "cat")


@pytest.mark.parametrize("case", ["cat_other_then_f32", "stack_other_only", "direct_cat_other_then_f32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_promote_the_other_lower_dtype_matches_native(dtype, case):
    other = torch.ones(2, 3, dtype=_other(dtype))
    fn, args = {
        "cat_other_then_f32": (torch.cat, ([other, torch.ones(1, 3)],)),
        "stack_other_only": (torch.stack, ([other, other],)),
        "direct_cat_other_then_f32": (torch.ops.aten.cat.default, ([other, torch.ones(1, 3)],)),
    }[case]
    with torch.autocast("cpu", dtype=dtype):
        assert run(fn, args, {})[1] is RuntimeError  # native raises
    with HpuAutocastMode(dtype, policy="torch-cpu"):
        assert issubclass(run(fn, args, {})[1], RuntimeError), "ours promotes instead of raising"


# --- unlisted C++ kernels that call listed ops ---------------------------------------------------
# Native autocast sits in the C++ dispatcher, so a listed op called from inside another op's C++
# kernel is cast too. So do the engine's kernels, which sit on an autocast key of their own (these
# were strict xfails while the engine was a dispatch mode, which saw only the outer, unlisted op).


def test_linalg_pinv_matches_native():
    # at::matmul inside linalg_pinv.atol_rtol_tensor runs in bfloat16 and the result is bfloat16.
    args = (torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),)
    _compare(torch.linalg.pinv, args, {}, torch.bfloat16, "linalg_pinv")


def test_bilinear_matches_native():
    # bilinear's _trilinear kernel calls listed GEMMs from C++.
    g = torch.Generator().manual_seed(0)
    args = tuple(torch.randn(*s, generator=g) for s in ((2, 3), (2, 4), (5, 3, 4), (5,)))
    _compare(torch.nn.functional.bilinear, args, {}, torch.bfloat16, "bilinear")

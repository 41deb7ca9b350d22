"""Drift: the presets that reproduce native autocast (``torch-cpu``, ``torch-cuda``) against what
the installed torch's own autocast registers and does.

The presets' lists are the union over torch versions; the loader keeps what this torch registers
(builder's Note: a native registration the lists do not name). Here, on every build:

* every aten overload the installed torch registers for ``AutocastCPU`` / ``AutocastCUDA`` is on
  the preset's lists (or banned), and the preset holds nothing else but composite entries (the
  CPU wheels register the CUDA kernels too, so this needs no GPU);
* an overload the lists do not name fails that check, and building the preset warns about it;
* ``torch-cuda`` casts as ``torch.autocast("cuda")`` does, sample by sample, by the dtypes and
  shapes of the outputs, on fake CUDA tensors (``FakeTensorMode`` makes them without a GPU, and
  they reach the ``AutocastCUDA`` kernels), and bit for bit on real ones where CUDA is present;
* each registered op gets the cast policy native applies: the ATen calls that reach below
  autocast (overload, input dtypes, dtype arguments) equal native's, on fake CUDA tensors for
  ``torch-cuda`` and real CPU ones for ``torch-cpu``.

For ``torch-cpu`` the parity suite (test_parity_ops) also runs every entry bit for bit.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException
from torch.utils._pytree import tree_flatten, tree_map

from _trace import native, trace_in
from _parity import VARIANTS
from _samples import SAMPLES, build
from hpu_autocast import HpuAutocastMode, build_policy, get_preset
from hpu_autocast._facts.ops import all_overloads, has_kernel, is_composite, op_base_name, registered_for
from hpu_autocast.policies.presets import PRESETS

# torch deprecates these listed ops; the suite still checks them, as long as torch has them.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is deprecated in favor of:UserWarning"),
    pytest.mark.filterwarnings("ignore:A window was not provided:UserWarning"),
]  # stft's sample

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

#: The presets that reproduce a native autocast, and the dispatch key of its kernels.
NATIVE = {"torch-cpu": "AutocastCPU", "torch-cuda": "AutocastCUDA"}


def _registered(key: str) -> set:
    # From the dispatcher's table of every op, not the preset's own lookups (an op the preset
    # misses would go unseen).
    return {op for op in all_overloads("aten") if has_kernel(op, key)}


def _unnamed(policy, key: str) -> list:
    """The overloads ``key`` registers that ``policy`` neither casts nor bans."""
    return sorted(str(op) for op in _registered(key) - set(policy.table) - set(policy.banned))


# --- the presets name what torch registers -------------------------------------------------------


@pytest.mark.parametrize("preset", sorted(NATIVE))
def test_native_preset_names_every_registered_overload(preset):
    policy, key = get_preset(preset), NATIVE[preset]
    assert not _unnamed(policy, key), (
        f"torch {torch.__version__} registers for {key} what {preset} does not name: {_unnamed(policy, key)}; "
        f"add each to the list native autocast gives it"
    )
    # Nothing extra: what torch-cuda adds are composite entries whose insides native casts.
    extra = sorted(str(op) for op in set(policy.table) - _registered(key) if not is_composite(op))
    assert not extra, f"in {preset}, not registered for {key}: {extra}"


@pytest.mark.parametrize("preset", sorted(NATIVE))
def test_native_preset_builds_without_a_warning(preset):
    # The warning of the next test, on this torch: none (a fresh name, since each policy name
    # warns once per overload).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_policy(f"{preset} (rebuilt)", **PRESETS[preset])


@pytest.fixture
def sinh_registered_for_autocast_cpu():
    """A torch newer than the preset, simulated: aten::sinh, on no CPU list, gets an AutocastCPU
    kernel that runs it in float32, as torch 2.14 registered linalg_matrix_sqrth."""
    op = torch.ops.aten.sinh.default
    assert not has_kernel(op, "AutocastCPU")
    autocast_cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def sinh_in_float32(x):
        with torch._C._ExcludeDispatchKeyGuard(autocast_cpu):
            return op(x.float() if x.dtype in (torch.bfloat16, torch.float16) else x)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("sinh", sinh_in_float32, "AutocastCPU")
    try:
        yield op
    finally:
        lib._destroy()
    assert not has_kernel(op, "AutocastCPU")


def test_an_unnamed_registration_fails_the_check_and_warns_when_the_preset_is_built(sinh_registered_for_autocast_cpu):
    # What the two tests above see on a torch that registers an op the lists do not name.
    with pytest.warns(UserWarning) as seen:
        policy = build_policy("torch-cpu (newer torch)", **PRESETS["torch-cpu"])
    assert _unnamed(policy, "AutocastCPU") == ["aten.sinh.default"]
    assert [str(w.message) for w in seen] == [
        f"torch {torch.__version__} registers for AutocastCPU 1 overload that policy 'torch-cpu (newer torch)' "
        "does not name, aten.sinh.default: native autocast casts it, this policy leaves it alone, so results "
        "can differ from native autocast's where it runs"
    ]
    # The difference the warning names: native runs sinh in float32, the policy leaves it alone.
    x = torch.randn(4).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.sinh(x).dtype == torch.float32
    with HpuAutocastMode(torch.bfloat16, policy=policy):
        assert torch.sinh(x).dtype == torch.bfloat16
    # Once per policy name and overload.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_policy("torch-cpu (newer torch)", **PRESETS["torch-cpu"])


# --- torch-cuda casts as native, on fake CUDA tensors -------------------------------------------

#: What a call on fake CUDA tensors may raise with no GPU (ours must then raise the same): a kernel
#: that asks for the driver or for cuDNN (GRUCell's fused cell; on torch 2.4 also convolutions,
#: grid_sample and scaled_dot_product_attention), or, on a CPU build, for CUDA itself.
NO_GPU = ("NVIDIA driver", "CUDA driver", "not compiled with CUDA", "not linked with support for cuda")
CUDA_NAMES = sorted({op_base_name(op) for op in get_preset("torch-cuda").table} & set(SAMPLES))


def _on_fake_cuda(mode: FakeTensorMode, tree):
    """Fake CUDA tensors of the tensors' dtypes, shapes and strides (their values are not read)."""
    with mode:
        return tree_map(
            lambda t: (
                torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
                if isinstance(t, torch.Tensor)
                else t
            ),
            tree,
        )


def _signature(result) -> list:
    return [
        (type(t).__name__, getattr(t, "dtype", None), tuple(getattr(t, "shape", ()))) for t in tree_flatten(result)[0]
    ]


def _run(fn, args, kwargs):
    """``(result, None)`` or ``(None, the exception)``."""
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001  (callers compare it)
        return None, e


def _native_and_ours(fn, args, kwargs, dtype, policy="torch-cuda"):
    # No fallback kernels: where a GPU is, an op with no fake implementation would run its real
    # CUDA kernel (as _trace.Inputs says); here it raises on both sides and skips, as without one.
    mode = FakeTensorMode(allow_fallback_kernels=False)
    args, kwargs = _on_fake_cuda(mode, (args, kwargs))
    with mode:
        enabled, before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        # torch.autocast("cuda") turns itself off where CUDA is unavailable; its state is set here.
        torch._C.set_autocast_enabled("cuda", True)
        torch._C.set_autocast_dtype("cuda", dtype)
        try:
            ref = _run(fn, args, kwargs)
        finally:
            torch._C.set_autocast_enabled("cuda", enabled)
            torch._C.set_autocast_dtype("cuda", before)
        with HpuAutocastMode(dtype, policy=policy):
            out = _run(fn, args, kwargs)
    return ref, out


@pytest.mark.parametrize("variant", ["f32", "lower", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", CUDA_NAMES)
def test_torch_cuda_casts_as_native_on_fake_cuda_tensors(name, dtype, variant):
    # float32 inputs show a lower-precision entry, inputs in the lower dtype a float32 one, mixed
    # inputs a promote one (where the op would not promote anyway).
    fn, args, kwargs = build(name)
    args, kwargs = tree_map(VARIANTS[variant](dtype), (args, kwargs))
    (ref, ref_err), (out, err) = _native_and_ours(fn, args, kwargs, dtype)
    assert type(err) is type(ref_err), f"{name}: native raised {ref_err!r}, ours {err!r}"
    if ref_err is not None:
        assert isinstance(ref_err, UnsupportedOperatorException) or any(s in str(ref_err) for s in NO_GPU), (
            f"{name}: native raised {ref_err!r} on fake CUDA tensors"
        )
        pytest.skip(f"needs a GPU on this build: {str(ref_err).splitlines()[0]}")
    assert _signature(out) == _signature(ref)


def test_the_fake_cuda_comparison_catches_a_wrong_policy():
    # torch-cuda less linalg_matrix_sqrth (or, before torch 2.14, less softmax): float16 input
    # then stays float16, where native runs the op in float32.
    policy = get_preset("torch-cuda")
    name = "linalg_matrix_sqrth" if hasattr(torch.ops.aten, "linalg_matrix_sqrth") else "softmax"
    fn, args, kwargs = build(name)
    args, kwargs = tree_map(VARIANTS["lower"](torch.float16), (args, kwargs))
    less = dataclasses.replace(
        policy, name="less", table={op: a for op, a in policy.table.items() if op_base_name(op) != name}
    )
    (ref, _), (out, err) = _native_and_ours(fn, args, kwargs, torch.float16, policy=less)
    assert _signature(ref)[0][1] == torch.float32
    assert err is not None or _signature(out) != _signature(ref)


# --- torch-cuda casts as native, on a GPU -------------------------------------------------------


@cuda
@pytest.mark.parametrize("name", CUDA_NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_torch_cuda_matches_native(name, dtype):
    fn, args, kwargs = build(name)
    to_cuda = lambda t: t.cuda() if isinstance(t, torch.Tensor) else t
    args, kwargs = tree_map(to_cuda, args), tree_map(to_cuda, kwargs)
    torch.manual_seed(0)
    try:
        with torch.autocast("cuda", dtype=dtype):
            ref = fn(*args, **kwargs)
    except RuntimeError as e:
        with pytest.raises(type(e)), HpuAutocastMode(dtype, policy="torch-cuda"):
            torch.manual_seed(0)
            fn(*args, **kwargs)
        return
    torch.manual_seed(0)
    with HpuAutocastMode(dtype, policy="torch-cuda"):
        out = fn(*args, **kwargs)
    a, b = tree_flatten(ref)[0], tree_flatten(out)[0]
    assert [getattr(t, "dtype", None) for t in a] == [getattr(t, "dtype", None) for t in b]
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(y, x, rtol=0, atol=0, equal_nan=True)


# --- each registered op gets the kind native applies: the calls below autocast -------------------
# The output dtypes above cannot tell fp32 from fp32_set_opt_dtype (both compute in float32);
# the calls that reach below autocast can (the input cast, or a dtype argument): overload, input
# dtypes and dtype arguments, recorded by a wrapper subclass (tests/_trace.py). Mixed inputs only:
# float32 inputs and inputs in the lower dtype, of these same samples and both dtypes, are
# test_trace_oracle's cases (it traces every op torch registers for the key, and each name here
# is one: test_the_trace_oracle_runs_every_name_here), which has no mixed variant.

CPU_NAMES = sorted({op_base_name(op) for op in get_preset("torch-cpu").table} & set(SAMPLES))


def test_the_trace_oracle_runs_every_name_here():
    for names, key in ((CUDA_NAMES, "AutocastCUDA"), (CPU_NAMES, "AutocastCPU")):
        assert set(names) <= {op_base_name(op) for op in registered_for(key)}, key


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", CUDA_NAMES)
def test_torch_cuda_reaches_below_autocast_as_native_on_fake_cuda_tensors(name, dtype):
    fn, args, kwargs = build(name)
    args, kwargs = tree_map(VARIANTS["mixed"](dtype), (args, kwargs))
    want, native_err = trace_in(fn, args, kwargs, "cuda", native("cuda", dtype))
    ours, err = trace_in(fn, args, kwargs, "cuda", HpuAutocastMode(dtype, policy="torch-cuda"))
    assert err == native_err, f"{name}: native raised {native_err}, ours {err}"
    assert ours == want


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", CPU_NAMES)
def test_torch_cpu_reaches_below_autocast_as_native(name, dtype):
    fn, args, kwargs = build(name)
    args, kwargs = tree_map(VARIANTS["mixed"](dtype), (args, kwargs))
    want, native_err = trace_in(fn, args, kwargs, "cpu", torch.autocast("cpu", dtype=dtype))
    ours, err = trace_in(fn, args, kwargs, "cpu", HpuAutocastMode(dtype, policy="torch-cpu"))
    assert err == native_err, f"{name}: native raised {native_err}, ours {err}"
    assert ours == want

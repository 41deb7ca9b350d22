"""Code written for ``torch.autocast`` runs unchanged inside a region (src/hpu_autocast/_torch/
autocast.py): what such code asks torch and what it turns off, answered for the region,
with native ``torch.autocast("cpu")`` as the oracle wherever it has an answer. Sections:
opt-outs, guards, RNNs without oneDNN, custom ops of ``torch.library.register_autocast``, the
patches (installed only while a region is open), native autocast around a region, and the limits
(``torch.amp.custom_fwd``/``custom_bwd``, the deprecated per-device getters).

Pinned elsewhere: ``torch.utils.checkpoint`` recomputing under the forward's region
(test_training_graph; GPT-2's ``gradient_checkpointing`` in test_real_models), transformers'
``maybe_autocast`` opt-out (test_real_models), guards and opt-outs inside compiled code
(test_compile), optimizer steps inside a region (test_edges).

"Failed with ..." below names the change to src that the test was checked to fail on.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint
from torch.optim import optimizer as torch_optimizer

import hpu_autocast
from hpu_autocast import HpuAutocastMode, build_policy, get_preset, with_lists
from hpu_autocast.mode import default_device_type

SRC = pathlib.Path(hpu_autocast.__file__).resolve().parents[1]  # this checkout's src, for fresh interpreters

#: Policies a region is opened with: one that mirrors torch's CPU lists, one that does not.
POLICIES = ["torch-cpu", "hpu"]


def _ab():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.dtype == y.dtype and torch.equal(x, y)


def _in_another_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn()))
    t.start()
    t.join(timeout=60)
    assert not t.is_alive()
    return out["value"]


@pytest.fixture(autouse=True)
def no_leak():
    yield
    # Native state of the CPU (these tests' oracle) and of the default device (a GPU's, where
    # there is one): a region or a torch.autocast of either left on fails here.
    devices = {"cpu", default_device_type()}
    assert not hpu_autocast.is_enabled() and not any(map(torch.is_autocast_enabled, devices)), (
        "casting outlived its test"
    )
    assert torch.mm(*_ab()).dtype == torch.float32


# --- opt-outs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_an_opt_out_turns_casting_off_for_its_body_and_its_exit_back_on(policy):
    # Failed with set_autocast_enabled left unpatched: the opt-out set native state only, and
    # the body's mm stayed bfloat16.
    a, b = _ab()
    plain = torch.mm(a, b)
    with HpuAutocastMode(policy=policy, device_type="cpu"):
        before = torch.mm(a, b)
        with torch.autocast("cpu", enabled=False):
            off = torch.mm(a, b)
        after = torch.mm(a, b)
    assert _same(off, plain)  # bit for bit the float32 run
    assert before.dtype == torch.bfloat16 and _same(after, before)


def _levels(outer) -> list:
    # Opt-outs and opt-ins nested in each other; each mm's dtype says which state it ran in.
    a, b = _ab()
    seen = []
    with outer:
        seen.append(torch.mm(a, b))  # on
        with torch.autocast("cpu", enabled=False):
            seen.append(torch.mm(a, b))  # off
            with torch.autocast("cpu"):
                seen.append(torch.mm(a, b))  # on, inside the opt-out
                with torch.autocast("cpu", enabled=False):
                    seen.append(torch.mm(a, b))  # off
                seen.append(torch.mm(a, b))  # on
            seen.append(torch.mm(a, b))  # off
        seen.append(torch.mm(a, b))  # on
    seen.append(torch.mm(a, b))  # outside
    return seen


@pytest.mark.parametrize("policy", POLICIES)
def test_opt_outs_nested_in_several_levels_follow_native(policy):
    # mm is on both policies' lower lists, so every level has native's dtype and bits.
    native = _levels(torch.autocast("cpu", dtype=torch.bfloat16))
    ours = _levels(HpuAutocastMode(policy=policy, device_type="cpu"))
    assert [t.dtype for t in native] == [torch.bfloat16, torch.float32] * 3 + [torch.bfloat16, torch.float32]
    assert all(_same(x, y) for x, y in zip(ours, native)), [(x.dtype, y.dtype) for x, y in zip(ours, native)]


def test_a_region_entered_inside_an_opt_out_casts_and_its_exit_returns_to_the_opt_out():
    a, b = _ab()
    with HpuAutocastMode(policy="hpu", device_type="cpu"):
        with torch.autocast("cpu", enabled=False):
            with HpuAutocastMode(policy="torch-cpu"):
                inner = torch.mm(a, b).dtype
            off = torch.mm(a, b).dtype
        on = torch.mm(a, b).dtype
    assert (inner, off, on) == (torch.bfloat16, torch.float32, torch.bfloat16)


@pytest.mark.parametrize("policy", POLICIES)
def test_an_opt_out_for_another_device_type_leaves_cpu_casting_on(policy):
    # Autocast state is per device type: natively, torch.autocast("cuda", enabled=False) leaves
    # "cpu" casting on (checked here); a region of device "cpu" keeps casting the same way.
    # Failed with _frame_for ignoring the device: the "cuda" opt-out turned the region off.
    a, b = _ab()

    def run(outer):
        with outer:
            with torch.autocast("cuda", enabled=False):
                return torch.mm(a, b), torch.is_autocast_enabled("cpu")

    native = run(torch.autocast("cpu", dtype=torch.bfloat16))
    ours = run(HpuAutocastMode(policy=policy, device_type="cpu"))
    assert native[0].dtype == torch.bfloat16 and native[1] is True
    assert _same(ours[0], native[0]) and ours[1] is True


# --- guards --------------------------------------------------------------------------------------


def _getter_devices() -> tuple:
    """Every device type torch's ``is_autocast_enabled`` accepts (asked outside any region)."""
    accepted = []
    for device in ("cpu", "cuda", "xpu", "ipu", "hpu", "xla", "mps", "mtia", "maia", "privateuseone"):
        try:
            torch.is_autocast_enabled(device)
        except RuntimeError:
            continue
        accepted.append(device)
    return tuple(accepted)


GETTER_DEVICES = _getter_devices()


def _guards() -> tuple:
    """What code written for torch.autocast asks, and what an mm gives here."""
    return (
        *(torch.is_autocast_enabled(d) for d in GETTER_DEVICES),
        torch.is_autocast_enabled("cpu"),
        torch.is_autocast_enabled(device_type="cpu"),
        torch.is_autocast_enabled(),  # no argument: "cuda", as in torch
        torch.get_autocast_dtype("cpu"),
        torch._C._is_any_autocast_enabled(),
        torch.mm(*_ab()).dtype,
    )


def _outside(open_):
    return _guards()


def _inside(open_):
    with open_():
        return _guards()


def _disabled(open_):
    with open_(enabled=False):
        return _guards()


def _opted_out(open_):
    with open_(), torch.autocast("cpu", enabled=False):
        return _guards()


def _opted_out_and_in_again(open_):
    with open_(), torch.autocast("cpu", enabled=False), torch.autocast("cpu"):
        return _guards()


def _after_an_opt_out(open_):
    with open_():
        with torch.autocast("cpu", enabled=False):
            pass
        return _guards()


def _another_thread(open_):
    # Autocast state is per thread: a thread with no region of its own reads torch's answers.
    with open_():
        return _in_another_thread(_guards)


SITUATIONS = [_outside, _inside, _disabled, _opted_out, _opted_out_and_in_again, _after_an_opt_out, _another_thread]


@pytest.mark.parametrize(
    "policy, dtype", [("torch-cpu", torch.bfloat16), ("torch-cpu", torch.float16), ("hpu", torch.bfloat16)], ids=str
)
@pytest.mark.parametrize("situation", SITUATIONS, ids=lambda s: s.__name__.strip("_"))
def test_guards_answer_as_native_autocast_does(situation, policy, dtype):
    # Failed with is_autocast_enabled unpatched (inside: False, native True), with get_autocast_dtype
    # unpatched (float16 inside: bfloat16), with _is_any_autocast_enabled unpatched (inside an
    # opt-out: True, counting the engine's own key), and with _frame_for reading any thread's
    # region (another thread: True).
    def native(enabled=True):
        return torch.autocast("cpu", dtype=dtype, enabled=enabled)

    def ours(enabled=True):
        return HpuAutocastMode(dtype, policy=policy, device_type="cpu", enabled=enabled)

    expected = situation(native)
    n = len(GETTER_DEVICES)  # every device type's is_autocast_enabled first (ipu: issue 31, item 4)
    if situation is _disabled:
        # Not faithful: natively a disabled torch.autocast still sets its dtype; a disabled
        # region owns no autocast state, so torch answers with its own (its default, bfloat16).
        expected = expected[: n + 3] + (torch.bfloat16,) + expected[n + 4 :]
    assert situation(ours) == expected
    on = situation in (_inside, _opted_out_and_in_again, _after_an_opt_out)
    assert expected[n] is on and expected[n + 4] is on  # the oracle: on exactly where casting is


@pytest.mark.parametrize("observing", [False, True], ids=["plain", "recording"])
def test_no_borrowed_key_shows_through_torchs_getter(observing):
    # The engine's keys are AutocastIPU (every region) and AutocastHPU (observing regions);
    # torch's getter reads their exclusion, which a region clears. Failed before: "ipu" True in
    # every region, "hpu" True in a recording one (native: both False).
    with torch.autocast("cpu"):
        expected = {d: torch.is_autocast_enabled(d) for d in GETTER_DEVICES}
    with HpuAutocastMode(policy="torch-cpu", record=observing):
        inside = {d: torch.is_autocast_enabled(d) for d in GETTER_DEVICES}
        assert hpu_autocast.is_enabled()
    assert "ipu" in GETTER_DEVICES and inside == expected


def test_the_no_argument_guard_asks_about_cuda():
    # torch.is_autocast_enabled() is the CUDA state (torch's own default), so a region of device
    # "cuda" answers it and a region of device "cpu" does not. Failed with _frame_for taking a
    # missing device for "cpu".
    with HpuAutocastMode(torch.float16, policy="torch-cuda"):
        cuda = torch.is_autocast_enabled(), torch.is_autocast_enabled("cuda"), torch.is_autocast_enabled("cpu")
        dtype = torch.get_autocast_dtype("cuda")
    with HpuAutocastMode(policy="torch-cpu"):
        cpu = torch.is_autocast_enabled(), torch.is_autocast_enabled("cpu")
    assert cuda == (True, True, False) and dtype == torch.float16
    assert cpu == (False, True)


# --- torch.clear_autocast_cache -------------------------------------------------------------------


def _update_and_clear(open_, clear: bool = True):
    """A weight used, updated in place, the cache cleared (or not), used again; and its gradient."""
    torch.manual_seed(0)
    lin, x = nn.Linear(4, 4), torch.randn(2, 4)
    with open_():
        first = lin(x)
        with torch.no_grad():
            lin.weight.mul_(2)
        if clear:
            torch.clear_autocast_cache()
        second = lin(x)
        with torch.autocast("cpu", enabled=False):  # its exit leaves the region's cache alone
            pass
        third = lin(x)
    (second.float().sum() + third.float().sum()).backward()
    return first, second, third, lin.weight.grad


@pytest.mark.parametrize("clear", [True, False], ids=["cleared", "kept"])
def test_clear_autocast_cache_inside_a_region_clears_its_cache(clear):
    # Failed before (issue 31, item 2): the region kept serving the copy of the weight made
    # before the update (second output up to 1.95 off native's). Native keeps serving it when
    # the cache is not cleared, and a torch.autocast nested in the region does not clear it:
    # the third use shares the second's copy, so the gradient meets in bf16 as native's does.
    native = _update_and_clear(lambda: torch.autocast("cpu"), clear)
    ours = _update_and_clear(lambda: HpuAutocastMode(policy="torch-cpu"), clear)
    assert all(_same(a, b) for a, b in zip(ours, native))
    assert torch.equal(native[1], native[0]) is not clear  # the oracle: the clear changes the value


# --- RNNs without oneDNN -------------------------------------------------------------------------
# Without oneDNN, aten::lstm and aten::gru run their cells in C++ and call at::linear from there;
# a GRU fed an LSTM's output gets what the LSTM's casts made (bfloat16 under hpu).


def _lstm_then_gru(region) -> list:
    torch.manual_seed(0)
    lstm, gru = nn.LSTM(8, 8), nn.GRU(8, 8)
    x = torch.randn(5, 2, 8, requires_grad=True)
    with torch.backends.mkldnn.flags(enabled=False):
        with region:
            out, _ = gru(lstm(x)[0])
        out.float().pow(2).sum().backward()
    return [out.detach(), x.grad] + [p.grad for p in (*lstm.parameters(), *gru.parameters())]


# Turning oneDNN off tells of oneDNN's TF32 on Intel GPUs, which no test here uses.
@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN:UserWarning")
def test_a_gru_after_an_lstm_without_onednn_matches_native():
    # Failed with the engine's kernel for linear removed (linear off the table): the cells'
    # at::linear ran in float32 where native's kernel lowered it.
    native = _lstm_then_gru(torch.autocast("cpu", dtype=torch.bfloat16))
    ours = _lstm_then_gru(HpuAutocastMode(policy="torch-cpu"))
    assert not _same(native[0], _lstm_then_gru(torch.autocast("cpu", enabled=False))[0])  # native casts
    assert all(_same(x, y) for x, y in zip(ours, native))


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN:UserWarning")
def test_a_gru_after_an_lstm_without_onednn_trains_under_hpu():
    out, *grads = _lstm_then_gru(HpuAutocastMode(policy="hpu", device_type="cpu"))
    assert out.dtype == torch.bfloat16  # the cells' GEMMs and gate products are lowered
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


# --- custom ops of torch.library.register_autocast -----------------------------------------------
# Natively, torch.autocast("cpu") runs an op registered with register_autocast(op, "cpu", dtype)
# on inputs cast to dtype. Presets that mirror torch (torch-cpu) leave such ops to that kernel;
# other policies apply their own lists, which do not name them.

NS = "hpu_autocast_interop_test"


def _mul_add(x, y):
    # One op whose inputs share a dtype (addcmul is only on Gaudi's promote list), so the body
    # computes the same in any region: the op's registered kernel alone decides its dtype.
    return torch.addcmul(torch.ones_like(x), x, y)


@pytest.fixture(scope="module")
def lib():
    """The custom ops, registered for this module's tests only: test_parity_ops compares torch's
    AutocastCPU registrations with the torch-cpu preset, and these would be among them."""
    if not hasattr(torch.library, "register_autocast"):  # torch 2.6 and older
        pytest.skip("this torch has no torch.library.register_autocast")
    lib = torch.library.Library(NS, "FRAGMENT")
    for name, dtype in (("to_f32", torch.float32), ("to_bf16", torch.bfloat16)):
        torch.library.define(f"{NS}::{name}", "(Tensor x, Tensor y) -> Tensor", lib=lib)
        torch.library.impl(f"{NS}::{name}", "CompositeExplicitAutograd", _mul_add, lib=lib)
        torch.library.register_autocast(f"{NS}::{name}", "cpu", dtype, lib=lib)

    @torch.library.custom_op(f"{NS}::custom_bf16", mutates_args=())
    def custom_bf16(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _mul_add(x, y)

    custom_bf16.register_autocast("cpu", torch.bfloat16)  # the custom_op spelling
    yield lib
    lib._destroy()
    custom_bf16._lib._destroy()


OPS = torch.ops.hpu_autocast_interop_test


def _custom_calls() -> list:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, generator=g), torch.randn(8, generator=g)
    return [OPS.to_f32(x.bfloat16(), y.bfloat16()), OPS.to_bf16(x, y), OPS.custom_bf16(x, y)]


def test_register_autocast_ops_under_torch_cpu_match_native(lib):
    # Failed with Policy.native dropped from torch-cpu: the ops ran uncast (bfloat16, float32, float32).
    plain = _custom_calls()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = _custom_calls()
    with HpuAutocastMode(policy="torch-cpu"):
        ours = _custom_calls()
    assert [t.dtype for t in plain] == [torch.bfloat16, torch.float32, torch.float32]
    assert [t.dtype for t in native] == [torch.float32, torch.bfloat16, torch.bfloat16]
    assert all(_same(x, y) for x, y in zip(ours, native))


def test_register_autocast_ops_under_a_policy_that_does_not_mirror_torch_run_uncast(lib):
    plain = _custom_calls()
    with HpuAutocastMode(policy="hpu", device_type="cpu"):
        ours = _custom_calls()
    assert all(_same(x, y) for x, y in zip(ours, plain))  # Gaudi's lists name none of them


def test_an_op_only_torch_cpu_names_is_passed_on_as_if_it_had_no_kernel(lib):
    # An op on no list of hpu's: its body's mul (on Gaudi's lower list) is cast by the region, as
    # a fallthrough lets it. Once a torch-cpu region has taken the op on (its register_autocast
    # kernel), the engine's kernel for it is there in hpu regions too; it must pass the op on
    # below its key, not run it with the key off (which hid the body: float32, before the fix).
    name = f"{NS}::fresh"
    torch.library.define(name, "(Tensor x, Tensor y) -> Tensor", lib=lib)
    torch.library.impl(name, "CompositeExplicitAutograd", lambda x, y: torch.mul(x, y), lib=lib)
    torch.library.register_autocast(name, "cpu", torch.float32, lib=lib)
    x, y = torch.randn(4), torch.randn(4)
    with HpuAutocastMode(policy="hpu", device_type="cpu"):
        before = OPS.fresh(x, y)
    with HpuAutocastMode(policy="torch-cpu"):
        OPS.fresh(x, y)
    with HpuAutocastMode(policy="hpu", device_type="cpu"):
        after = OPS.fresh(x, y)
    assert before.dtype == torch.bfloat16
    assert _same(after, before)


_MHA_AFTER_TORCH_CPU = """
import torch
from hpu_autocast import HpuAutocastMode
torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
q = torch.randn(2, 5, 16)
def run(policy):
    with torch.no_grad(), HpuAutocastMode(policy=policy, device_type="cpu"):
        return mha(q, q, q, need_weights=False)[0]
before = run("hpu")
run("torch-cpu")
after = run("hpu")
print(before.dtype, after.dtype, torch.equal(before, after))
"""


def test_an_hpu_region_casts_the_same_after_a_torch_cpu_region():
    # MultiheadAttention's fast path (_native_multi_head_attention) under hpu: once its insides
    # were cast in a fresh process and not after a torch-cpu region had registered a kernel for
    # it. Now hpu runs the fused op whole, promoted (Note [fused fast paths] in _ops), before and
    # after alike. A fresh process: this one has run torch-cpu already.
    out = subprocess.run(
        [sys.executable, "-c", _MHA_AFTER_TORCH_CPU],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    ).stdout
    assert out.split() == ["torch.float32", "torch.float32", "True"]


def test_a_custom_op_on_a_policy_list_follows_the_list(lib):
    # A list entry wins over the op's registered autocast kernel, under a preset mirroring torch
    # too; under hpu the op is cast like an aten op.
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, generator=g), torch.randn(8, generator=g)
    with HpuAutocastMode(policy=with_lists(get_preset("torch-cpu"), fp32=[f"{NS}::to_bf16"])):
        kept = OPS.to_bf16(x.bfloat16(), y.bfloat16())  # its own kernel would keep bfloat16
    with HpuAutocastMode(policy=with_lists(get_preset("hpu"), lower=[f"{NS}::to_f32"]), device_type="cpu"):
        lowered = OPS.to_f32(x, y)
    assert _same(kept, _mul_add(x.bfloat16().float(), y.bfloat16().float()))
    assert _same(lowered, _mul_add(x.bfloat16(), y.bfloat16()))


def test_an_op_registered_after_a_region_opened_is_honoured_by_the_next(lib):
    # torch-cpu's native ops are looked up as regions open, again when torch.library has new
    # registrations. Failed with the lookup done once per policy: the op ran uncast.
    torch.library.define(f"{NS}::late", "(Tensor x) -> Tensor", lib=lib)
    torch.library.impl(f"{NS}::late", "CompositeExplicitAutograd", lambda x: x + 1, lib=lib)
    x = torch.randn(4)
    with HpuAutocastMode(policy="torch-cpu"):
        before = OPS.late(x)
    torch.library.register_autocast(f"{NS}::late", "cpu", torch.bfloat16, lib=lib)
    with HpuAutocastMode(policy="torch-cpu"):
        after = OPS.late(x)
    assert (before.dtype, after.dtype) == (torch.float32, torch.bfloat16)


# --- the patches, installed only while a region is open -------------------------------------------
#: The generator non-reentrant checkpoint calls (torch 2.14 added ``_impl``; the old name became
#: a shim it no longer calls), read from torch, not from the package.
_GENERATOR = (
    "_checkpoint_without_reentrant_generator_impl"
    if hasattr(torch_checkpoint, "_checkpoint_without_reentrant_generator_impl")
    else "_checkpoint_without_reentrant_generator"
)
#: What is patched while a region is open, as torch had it when this module was imported (no
#: region is open at collection; _torch_autocast.PATCHED must name no more than this).
TORCH_OWN = {
    (torch, "is_autocast_enabled"): torch.is_autocast_enabled,
    (torch, "get_autocast_dtype"): torch.get_autocast_dtype,
    (torch, "set_autocast_enabled"): torch.set_autocast_enabled,
    (torch, "set_autocast_dtype"): torch.set_autocast_dtype,
    (torch._C, "_is_any_autocast_enabled"): torch._C._is_any_autocast_enabled,
    (torch, "clear_autocast_cache"): torch.clear_autocast_cache,
    (torch_checkpoint, _GENERATOR): getattr(torch_checkpoint, _GENERATOR),
    (torch_checkpoint, "CheckpointFunction"): torch_checkpoint.CheckpointFunction,
}
#: The deprecated per-device spellings, which are not patched (see the limits below).
NOT_PATCHED = {
    (torch, name): getattr(torch, name)
    for name in (
        "is_autocast_cpu_enabled",
        "get_autocast_cpu_dtype",
        "get_autocast_gpu_dtype",
        "is_autocast_cache_enabled",
    )
}


def _torchs_own() -> bool:
    """Whether every patched name is torch's own object again, and no optimizer hook is left."""
    return all(getattr(owner, name) is own for (owner, name), own in TORCH_OWN.items()) and not any(
        "hpu_autocast" in hooks
        for hooks in (torch_optimizer._global_optimizer_pre_hooks, torch_optimizer._global_optimizer_post_hooks)
    )


def _patched() -> bool:
    """Whether every patched name is replaced (and the deprecated getters are not)."""
    return all(getattr(owner, name) is not own for (owner, name), own in TORCH_OWN.items()) and all(
        getattr(owner, name) is own for (owner, name), own in NOT_PATCHED.items()
    )


def test_torch_is_patched_only_while_a_region_is_open():
    # Failed with _release emptied (the patches stayed after the region).
    assert _torchs_own()
    with HpuAutocastMode():
        assert _patched()
    assert _torchs_own()


def test_nested_regions_keep_the_patches_until_the_outermost_exits():
    # Failed with the count of open regions dropped (the inner exit restored torch's, and the
    # outer region's opt-out then set native state only: mm stayed bfloat16).
    a, b = _ab()
    with HpuAutocastMode(device_type="cpu"):
        with HpuAutocastMode(policy="torch-cpu"):
            pass
        assert _patched()
        with torch.autocast("cpu", enabled=False):
            assert torch.mm(a, b).dtype == torch.float32
    assert _torchs_own()


@pytest.mark.parametrize("first", ["other thread", "this thread"])
def test_regions_in_two_threads_keep_the_patches_until_the_last_exits(first):
    opened, release, done = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def other():
        with HpuAutocastMode(device_type="cpu"):
            opened.set()
            release.wait(timeout=30)
            seen["other"] = torch.is_autocast_enabled("cpu")
        done.set()

    t = threading.Thread(target=other)
    t.start()
    assert opened.wait(timeout=30)
    with HpuAutocastMode(device_type="cpu"):
        if first == "other thread":
            release.set()
            assert done.wait(timeout=30)
            assert _patched() and torch.is_autocast_enabled("cpu")  # this region still answers
        else:
            assert _patched()
    if first == "this thread":
        assert _patched()  # the other thread's region is still open
        release.set()
    t.join(timeout=60)
    assert not t.is_alive() and seen == {"other": True}
    assert _torchs_own()


def test_an_exception_inside_a_region_restores_torchs_own():
    with pytest.raises(ZeroDivisionError):
        with HpuAutocastMode(device_type="cpu"):
            with torch.autocast("cpu", enabled=False):
                1 / 0
    assert _torchs_own()


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_recomputation_after_the_region_counts_as_an_open_region(reentrant):
    # Backward runs after the forward's region exited: the recomputation's region is then the
    # only one open, and must install the patches itself (acquire) and restore torch's after
    # (release). Without them its torch.autocast(enabled=False) set native state only: the
    # recomputed mm stayed bfloat16, and torch's metadata check failed.
    seen = []

    def f(x):
        seen.append((torch.is_autocast_enabled("cpu"), _patched()))
        with torch.autocast("cpu", enabled=False):
            return torch.mm(x, x.t())

    x = torch.randn(3, 4, requires_grad=True)
    with HpuAutocastMode(policy="torch-cpu"):
        y = torch_checkpoint.checkpoint(f, x, use_reentrant=reentrant)
    assert _torchs_own() and y.dtype == torch.float32
    y.sum().backward()
    assert seen == [(True, True), (True, True)] and x.grad is not None
    assert _torchs_own()


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoint_recomputes_under_the_regions_policy_not_natives(reentrant):
    # mm on the policy's fp32 list (native CPU autocast lowers it): the recomputation, in
    # backward after the region exited, must run mm in float32 again. On torch 2.14 the patched
    # generator was a shim checkpoint no longer called: the recomputation ran under native
    # autocast (mm in bfloat16) and torch's metadata check raised.
    mm_fp32 = build_policy("mm-fp32", fp32=["mm"], device_type="cpu")
    x = torch.randn(4, 4, requires_grad=True)

    def f(t):
        return torch.relu(torch.mm(t, t.t()))

    grads = []
    for run in (f, lambda t: torch_checkpoint.checkpoint(f, t, use_reentrant=reentrant)):
        with HpuAutocastMode(torch.bfloat16, policy=mm_fp32):
            y = run(x)
        assert y.dtype == torch.float32
        y.sum().backward()
        grads.append(x.grad)
        x.grad = None
    assert torch.equal(grads[0], grads[1])


# --- native autocast around a region -------------------------------------------------------------


def test_native_autocast_is_suspended_inside_a_region_and_back_after_it():
    # mm on the region's fp32 list, on native's lower list: the region decides inside, native
    # after. Failed with the suspension removed from _regions.enter (mm lowered inside).
    a, b = _ab()
    mm_fp32 = build_policy("mm-fp32", fp32=["mm"], device_type="cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        before = torch.mm(a, b)
        with HpuAutocastMode(torch.bfloat16, policy=mm_fp32):
            inside = torch.mm(a, b)
            inside_guards = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
        after = torch.mm(a, b)
        after_guards = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    assert _same(inside, torch.mm(a, b))
    assert before.dtype == torch.float16 and _same(after, before)
    assert inside_guards == (True, torch.bfloat16) and after_guards == (True, torch.float16)


def test_under_hpu_ops_follow_gaudis_lists_not_natives_inside_native_autocast():
    # prelu: on native's lower list, on none of Gaudi's; exp: on Gaudi's fp32 list, on none of
    # native's. A torch.autocast("cpu") inside the region is the region's too.
    a, w, half = torch.randn(4, 4), torch.tensor([0.25]), torch.randn(4).bfloat16()

    def ops():
        return torch.nn.functional.prelu(a, w).dtype, torch.exp(half).dtype

    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = ops()
        with HpuAutocastMode(policy="hpu", device_type="cpu"):
            ours = ops()
            with torch.autocast("cpu"):
                nested = ops()
        back = ops()
    assert native == back == (torch.bfloat16, torch.bfloat16)
    assert ours == nested == (torch.float32, torch.float32)


# --- limits --------------------------------------------------------------------------------------
# torch.amp.custom_fwd/custom_bwd work inside a region through the guards above, but custom_bwd
# re-enters torch.autocast with the recorded dtype: a backward run after the region re-enters
# native autocast, with torch's lists. hpu_autocast.amp's decorators re-enter the region's policy.


def _function(fwd, bwd):
    class Scale(torch.autograd.Function):
        @staticmethod
        @fwd
        def forward(ctx, x):
            return x * 2

        @staticmethod
        @bwd
        def backward(ctx, grad):
            Scale.seen = torch.is_autocast_enabled("cpu"), torch.mul(grad, torch.ones(grad.shape)).dtype
            return grad * 2

    return Scale


TORCH_AMP = (torch.amp.custom_fwd(device_type="cpu"), torch.amp.custom_bwd(device_type="cpu"))
OURS_AMP = (hpu_autocast.amp.custom_fwd, hpu_autocast.amp.custom_bwd)


@pytest.mark.parametrize("decorators", ["torch.amp", "hpu_autocast.amp"])
@pytest.mark.parametrize("backward", ["inside", "after"])
def test_custom_bwd_after_the_region_re_enters_native_autocast(decorators, backward):
    # mul is on Gaudi's lower list and on none of torch's: its dtype says whose lists ran.
    fn = _function(*(TORCH_AMP if decorators == "torch.amp" else OURS_AMP))
    x = torch.randn(4, requires_grad=True)
    with HpuAutocastMode(policy="hpu", device_type="cpu"):
        y = fn.apply(x)
        if backward == "inside":
            y.sum().backward()
    if backward == "after":
        y.sum().backward()
    native_lists = decorators == "torch.amp" and backward == "after"
    assert fn.seen == (True, torch.float32 if native_lists else torch.bfloat16)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch deprecates them (FutureWarning before 2.13)
@pytest.mark.filterwarnings("ignore:torch.*is deprecated. Please use:DeprecationWarning")
def test_deprecated_per_device_getters_read_torchs_state_not_the_regions():
    # Not patched: inside a region they read native autocast's state, which the region keeps off.
    # (Natively torch.is_autocast_cpu_enabled() is True inside torch.autocast("cpu").)
    with torch.autocast("cpu"):
        native = torch.is_autocast_cpu_enabled()
    with HpuAutocastMode(torch.float16, policy="torch-cpu"):
        ours = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    assert native is True
    assert ours == (False, torch.bfloat16)  # torch's default dtype, not the region's float16

"""The presets against their source documents (tests/seeds, see _seeds.py): each
preset's lists equal the document's, and each listed op runs as its list says, bit for bit
against a hand-cast control run with no mode. Plus the rules particular to a preset."""

from __future__ import annotations

import re

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_map

from _samples import SAMPLES, build
from _seeds import seed_text
from hpu_autocast import CastPolicy, HpuAutocastMode, get_preset, resolve
from hpu_autocast.policies.presets import gaudi_hmp as hmp_data
from hpu_autocast.policies.presets import torch_amp_cpu as cpu_data
from hpu_autocast.policies.presets import xpu_amp as xpu_data


def _names(text: str):
    return [n.strip() for n in text.split(",") if n.strip()]


def hmp_lists():
    text = seed_text("001_gaudi_hmp.txt")
    bf16 = _names(re.search(r"Default BF16 list = \[(.*?)\]", text).group(1))
    fp32 = _names(re.search(r"Default FP32 list = \[(.*?)\]", text).group(1))
    return bf16, fp32


def xpu_lists():
    lines = seed_text("002_xpu_amp.txt").splitlines()

    def after(heading):
        i = lines.index(heading)
        return _names(next(x for x in lines[i + 1 :] if re.fullmatch(r"\s*\w+(\s*,\s*\w+)+\s*", x)))

    return (
        after("Ops that can autocast to bfloat16"),
        after("Ops that can autocast to float16"),
        after("Ops that can autocast to float32"),
        after("Ops that promote to the widest input type"),
    )


def torch_doc_lists(which: str):
    """Seed 003's lists for "cuda" (the first block) or "cpu" (the second): in the text each name
    is a line and names are separated by "," lines, so a list ends where two names meet."""
    lines = [x.strip() for x in seed_text("003_torch_amp.txt").splitlines()]
    if which == "cuda":
        start = lines.index("please file an issue.")
    else:  # "please file an issue. float16 / shares the lists of bfloat16 / ."
        start = lines.index("shares the lists of bfloat16") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("These ops don't require"))
    # Split where two names are adjacent (no "," line between them).
    lists, current, prev_comma = [], [], True
    for x in lines[start + 1 : end]:
        if x == ",":
            prev_comma = True
            continue
        if not prev_comma and current:
            lists.append(current)
            current = []
        current.append(x)
        prev_comma = False
    lists.append(current)
    p0 = next(i for i in range(end, len(lines)) if lines[i] == "and runs the op in float32") + 2
    p1 = next(i for i in range(p0, len(lines)) if lines[i].startswith("Some ops not listed"))
    promote = [x for x in lines[p0:p1] if x != ","]
    return lists[0], lists[1], promote


def _ops(names):
    out = set()
    for n in names:
        try:
            out.update(resolve(n))
        except Exception:  # noqa: BLE001  (a name this torch lacks; presets record it in `missing`)
            pass
    return out


# --- the lists ---------------------------------------------------------------------------------


def test_hmp_lists_are_seed_001s():
    bf16, fp32 = hmp_lists()
    assert hmp_data.BF16 == bf16 and hmp_data.FP32 == fp32
    policy = get_preset("hmp")
    assert set(policy.ops(CastPolicy.LOWER)) == _ops(bf16)
    assert set(policy.ops(CastPolicy.FP32)) == _ops(fp32)
    assert policy.unlisted is CastPolicy.FIRST and policy.inplace is CastPolicy.FIRST


def test_xpu_lists_are_seed_002s():
    bf16, fp16, fp32, promote = xpu_lists()
    assert bf16 == fp16  # one list for both dtypes
    # The document repeats conv_transpose1d where conv_transpose2d is meant (see presets/xpu_amp.py).
    assert bf16.count("conv_transpose1d") == 2 and "conv_transpose2d" not in bf16
    expected = [
        n if not (n == "conv_transpose1d" and i == bf16.index(n) + 1) else "conv_transpose2d"
        for i, n in enumerate(bf16)
    ]
    assert set(xpu_data.LOWER) == set(expected)
    assert xpu_data.FP32 == [n.strip() for n in fp32] and xpu_data.PROMOTE == promote
    policy = get_preset("xpu")
    assert set(policy.ops(CastPolicy.LOWER)) == _ops(expected)
    assert set(policy.missing) <= {"_convolution_nogroup", "frobenius_norm", "_thnn_fused_gru_cell"}


def test_torch_cpu_lists_are_seed_003s():
    lower, fp32, promote = torch_doc_lists("cpu")
    # The preset is the document's lists plus what torch registers beyond them, marked as such.
    assert set(lower) <= set(cpu_data.LOWER) and set(fp32) <= set(cpu_data.FP32)
    assert set(promote) == set(cpu_data.PROMOTE)
    extra = (set(cpu_data.LOWER) - set(lower)) | (set(cpu_data.FP32) - set(fp32))
    assert extra == {"_addmm_activation", "smooth_l1_loss", "linalg_matrix_sqrth"}


# --- op by op ----------------------------------------------------------------------------------


def _floating(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype is not torch.float64


def _to(dtype):
    return lambda t: t.to(dtype) if _floating(t) else t


def _call(fn, args, kwargs):
    torch.manual_seed(0)
    return fn(*args, **kwargs)


def _equal(a, b) -> bool:
    fa, sa = tree_flatten(a)
    fb, sb = tree_flatten(b)
    return sa == sb and all(
        (x.dtype == y.dtype and torch.equal(x, y)) if isinstance(x, torch.Tensor) else x == y for x, y in zip(fa, fb)
    )


def _cases():
    bf16, fp32 = hmp_lists()
    x_low, _, x_fp32, x_promote = xpu_lists()
    c_low, c_fp32, c_promote = torch_doc_lists("cuda")
    sources = {
        "hmp": (bf16, fp32, hmp_data.PROMOTE, set(hmp_data.INPUT_ONLY)),
        "xpu": (xpu_data.LOWER, x_fp32, x_promote, set()),
        "torch-cuda": (c_low, c_fp32, c_promote, set()),
    }
    for preset, (low, f32, pro, only) in sources.items():
        table = get_preset(preset).table
        for name in dict.fromkeys(low + f32 + pro):
            if name not in SAMPLES or (preset == "torch-cuda" and name == "binary_cross_entropy"):
                continue
            kind = "lower" if name in low else "fp32" if name in f32 else "promote"
            kinds = {table[op].value for op in _ops([name]) if op in table}
            if preset == "torch-cuda" and (not kinds or not kinds <= {kind, "first"}):
                # The document lists it as fp32, torch registers it as fp32_set_opt_dtype or
                # fp32_append_dtype (or lets it decompose): test_cast_policies and test_drift
                # compare those with native CUDA autocast.
                continue
            yield pytest.param(preset, name, kind, name in only, id=f"{preset}-{name}")


@pytest.mark.parametrize("preset, name, kind, input_only", list(_cases()))
@pytest.mark.filterwarnings("ignore:at..nuclear_norm is deprecated:UserWarning")  # listed ops torch deprecates
def test_op_runs_as_its_list_says(preset, name, kind, input_only):
    fn, args, kwargs = build(name)
    if kind == "lower":
        if input_only:
            control = (args[0].bfloat16(), *args[1:]), kwargs
        else:
            control = tree_map(_to(torch.bfloat16), args), tree_map(_to(torch.bfloat16), kwargs)
    elif kind == "fp32":
        args, kwargs = tree_map(_to(torch.bfloat16), args), tree_map(_to(torch.bfloat16), kwargs)
        control = tree_map(_to(torch.float32), args), tree_map(_to(torch.float32), kwargs)
    else:
        seen = []

        def mixed(t):
            if _floating(t):
                seen.append(t)
                return t.bfloat16() if len(seen) == 1 else t
            return t

        args = tree_map(mixed, args)
        control = tree_map(_to(torch.float32), args), kwargs
    # The tensors are on the CPU; each preset's lists are checked there, whatever its own device.
    with HpuAutocastMode(torch.bfloat16, policy=preset, device_type="cpu"):
        out = _call(fn, args, kwargs)
    assert _equal(out, _call(fn, *control))


# --- rules particular to a preset --------------------------------------------------------------


def test_hmp_unlisted_ops_run_in_the_first_inputs_dtype():
    a, b = torch.randn(3, dtype=torch.bfloat16), torch.randn(3)
    with HpuAutocastMode(policy="hmp", device_type="cpu"):
        assert torch.equal(torch.maximum(a, b), torch.maximum(a, b.bfloat16()))
        assert torch.maximum(b, a).dtype == torch.float32
        assert torch.sigmoid(a).dtype == torch.bfloat16


def test_hmp_promote_list_and_precedence():
    a, b = torch.randn(3, dtype=torch.bfloat16), torch.randn(3)
    with HpuAutocastMode(policy="hmp", device_type="cpu"):
        assert torch.add(a, b).dtype == torch.float32  # widest
        assert torch.cat([a, b]).dtype == torch.float32
        assert torch.mul(b, b).dtype == torch.bfloat16  # BF16 list wins over the first input
        assert torch.div(a, a).dtype == torch.float32  # FP32 list wins


def test_hmp_inplace_ops_cast_to_their_first_input():
    a, b = torch.randn(3), torch.randn(3, dtype=torch.bfloat16)
    ours, control = a.clone(), a.clone()
    with HpuAutocastMode(policy="hmp", device_type="cpu"):
        ours.mul_(b)
    control.mul_(b.float())
    assert ours.dtype == torch.float32 and torch.equal(ours, control)
    low, high = b.clone(), torch.randn(3)
    with HpuAutocastMode(policy="hmp", device_type="cpu"):
        low.sub_(high)
    assert torch.equal(low, b - high.bfloat16())


def test_hmp_O2_runs_gemms_in_bf16_and_the_rest_in_fp32():
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    with HpuAutocastMode(policy="hmp-O2", device_type="cpu"):
        assert torch.mm(x.float(), x.float().T).dtype == torch.bfloat16
        assert torch.relu(x).dtype == torch.float32
        assert torch.add(x, x).dtype == torch.float32


def test_torch_cuda_bans_binary_cross_entropy_by_name():
    p, t = torch.rand(3), torch.rand(3)
    with HpuAutocastMode(torch.float16, policy="torch-cuda", device_type="cpu"):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p, t)
        F.binary_cross_entropy_with_logits(p, t)  # the safe one runs
    with HpuAutocastMode(policy="hpu", device_type="cpu"):  # on HPU's FP32 list, it runs
        assert F.binary_cross_entropy(p.bfloat16(), t).dtype == torch.float32


def test_xpu_casts_a_call_with_an_explicit_dtype_as_its_kernels_do():
    # Failed before ("leave": the call ran uncast): XPU's autocast kernels are ATen's
    # WrapFunction for DeviceType::XPU (IPEX's, then torch's own AutocastXPU), which casts every
    # eligible tensor of a listed op whatever its dtype= argument, as the CPU kernels do.
    x = torch.randn(4, 4).bfloat16()
    events = []
    with HpuAutocastMode(torch.bfloat16, policy="xpu", device_type="cpu", observer=events.append):
        torch.log_softmax(x, -1, dtype=torch.bfloat16)  # on xpu's FP32 list
    (event,) = events
    assert event.op is torch.ops.aten.log_softmax.int and [c.tensor for c in event.casts] == [x]
    assert get_preset("xpu").explicit_dtype == get_preset("torch-cpu").explicit_dtype == "cast"


@pytest.mark.parametrize("preset", ["hpu", "hmp", "hmp-O2", "xpu", "torch-cuda", "torch-cpu"])
def test_presets_taking_float16(preset):
    with HpuAutocastMode(torch.float16, policy=preset, device_type="cpu"):
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.float16


@pytest.mark.parametrize("preset, device", [("torch-cpu", "cpu"), ("torch-cuda", "cuda"), ("xpu", "xpu")])
def test_a_region_casts_tensors_of_its_presets_device_only(preset, device):
    # As torch.autocast(device): tensors of other devices (here the CPU's, and meta) pass through.
    mode = HpuAutocastMode(policy=preset)
    assert mode.device_type == device
    a, m = torch.randn(2, 2), torch.randn(2, 2, device="meta")
    with mode:
        cpu_out, meta_out = torch.mm(a, a), torch.mm(m, m)
    with torch.autocast(device, dtype=torch.bfloat16) if device != "xpu" else contextlib.nullcontext():
        native_cpu, native_meta = torch.mm(a, a), torch.mm(m, m)
    assert cpu_out.dtype == native_cpu.dtype == (torch.bfloat16 if device == "cpu" else torch.float32)
    assert meta_out.dtype == native_meta.dtype == torch.float32

"""Drift: the torch-* presets against what the installed torch's own autocast does.

For ``torch-cpu`` the parity suite (test_parity_ops) already asserts the table equals the
AutocastCPU registrations and that every entry behaves as native autocast. Here: the same for
``torch-cuda`` where CUDA is present, probing each registered op's category with a small call."""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from _samples import SAMPLES, build
from hpu_autocast import HpuAutocastMode, get_preset
from hpu_autocast._ops import all_overloads, is_composite, op_base_name

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _registered(key: str) -> set:
    out = set()
    for op in all_overloads("aten"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
            out.add(op)
    return out


@cuda
def test_torch_cuda_preset_covers_what_torch_registers():
    policy = get_preset("torch-cuda")
    registered = _registered("AutocastCUDA")
    missing = {str(op) for op in registered - set(policy.table) - set(policy.banned)}
    assert not missing, sorted(missing)
    # Nothing extra: what the preset adds are composite entries whose insides native casts.
    extra = {str(op) for op in set(policy.table) - registered if not is_composite(op)}
    assert not extra, sorted(extra)


@cuda
@pytest.mark.parametrize("name", sorted({op_base_name(op) for op in get_preset("torch-cuda").table} & set(SAMPLES)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_torch_cuda_matches_native(name, dtype):
    fn, args, kwargs = build(name)
    to_cuda = (lambda t: t.cuda() if isinstance(t, torch.Tensor) else t)
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

"""The torch-cuda preset against seed 003, with what torch registers for ``AutocastCUDA``
(``hpu_autocast._facts.ops``)."""

from __future__ import annotations

import torch

from hpu_autocast import CastPolicy, get_preset
from hpu_autocast.policies.presets import torch_amp_cuda as cuda_data
from _parity import unnamed
from test_presets import _ops, torch_doc_lists


def test_torch_cuda_lists_are_seed_003s():
    lower, fp32, promote = torch_doc_lists("cuda")
    assert cuda_data.LOWER == lower and cuda_data.FP32 == fp32 and cuda_data.PROMOTE == promote
    policy = get_preset("torch-cuda")
    # Of each name, what torch registers for AutocastCUDA (composites it lets decompose are not
    # cast at their entry); plus what it registers beyond the document (test_drift checks those
    # against native where CUDA is), and the float32 ops torch registers with its two float32
    # dtype policies on those lists instead.
    from hpu_autocast._facts.ops import has_kernel

    def kept(names):
        out = set()
        for name in names:
            ops = _ops([name])
            out |= {op for op in ops if has_kernel(op, "AutocastCUDA")}
        return out

    assert set(policy.ops(CastPolicy.LOWER)) == kept(lower + cuda_data.REGISTERED_LOWER)
    set_opt, append = kept(cuda_data.FP32_SET_OPT_DTYPE), kept(cuda_data.FP32_APPEND_DTYPE)
    assert set(policy.ops(CastPolicy.FP32)) == kept(fp32 + cuda_data.REGISTERED_FP32) - set_opt - append
    # Up to torch 2.11 the Dimname twins (prod.dim_Dimname, norm.names_ScalarOpt_dim, ...) are
    # operators too, registered beside the others: counted apart.
    assert set(policy.ops(CastPolicy.FP32_SET_OPT_DTYPE)) == set_opt and len(unnamed(set_opt)) == 11
    assert set(policy.ops(CastPolicy.FP32_APPEND_DTYPE)) == append
    assert set(unnamed(append)) == {torch.ops.aten.norm.Scalar, torch.ops.aten.norm.ScalarOpt_dim}
    assert torch.ops.aten.div.Tensor not in policy.table  # __rdiv__ is reciprocal(self) * other
    assert torch.ops.aten.reciprocal.default in policy.table

"""A parity comparison that must fail: torch-cpu less one entry (found with ``hpu_autocast._facts.ops``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hpu_autocast import HpuAutocastMode, get_preset
from hpu_autocast._facts.ops import op_base_name
from test_parity_models import _assert_steps_equal, _pair, _step


def test_a_policy_one_entry_off_is_caught():
    # The same step under torch-cpu less conv2d (the conv then runs in float32; the head's
    # linear still lowers, so the output dtype agrees) must fail the comparison, or the
    # comparison proves nothing.
    policy = get_preset("torch-cpu")
    table = {op: a for op, a in policy.table.items() if op_base_name(op) != "conv2d"}
    ours, native, x = _pair("cnn_batchnorm")
    a = _step(
        ours, x, HpuAutocastMode(torch.bfloat16, policy=dataclasses.replace(policy, table=table, name="no-conv2d"))
    )
    b = _step(native, x, torch.autocast("cpu", dtype=torch.bfloat16))
    assert a[0].dtype == b[0].dtype
    with pytest.raises(AssertionError):
        _assert_steps_equal(ours, native, a, b)

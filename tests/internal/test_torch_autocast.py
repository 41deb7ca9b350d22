"""The list of what _torch_autocast patches, against the names the public tests in
tests/test_torch_autocast.py check for identity before, during and after regions."""

import torch
import torch.utils.checkpoint as torch_checkpoint

from hpu_autocast._engine import torch_autocast as _torch_autocast

from test_torch_autocast import TORCH_OWN


def test_the_patched_names_are_the_ones_listed_here():
    assert {(owner, name) for owner, name, _ in _torch_autocast.PATCHED} == set(TORCH_OWN)
    assert TORCH_OWN[(torch, "is_autocast_enabled")] is torch._C.is_autocast_enabled  # imported unpatched
    assert TORCH_OWN[(torch_checkpoint, "CheckpointFunction")].__module__ == "torch.utils.checkpoint"

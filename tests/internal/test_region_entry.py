"""A region's entry is composed in one place (``_engine.entry``'s Note): register, the core's
tables, the patches, the frame, in that order, for the mode's regions and a checkpoint's
recomputation alike; an entry that fails before its frame leaves no patch installed."""

import contextlib

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint

from hpu_autocast import HpuAutocastMode
from hpu_autocast._engine import core as _core, dispatch as _dispatch, entry as _entry, regions as _regions
from hpu_autocast._engine import torch_autocast as _torch_autocast


@pytest.fixture
def steps(monkeypatch):
    """The entry steps as they run: each of the four parts wrapped to record its name."""
    seen = []

    def record(owner, name, step):
        real = getattr(owner, name)

        def wrapped(*args, **kwargs):
            seen.append(step)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)

    record(_entry, "_register", "register")
    record(_core, "region_for", "tables")
    record(_torch_autocast, "acquire", "patches")
    record(_regions, "push", "frame")
    return seen


def test_a_region_enters_in_the_order_register_tables_patches_frame(steps):
    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
        pass
    assert steps == ["register", "tables", "patches", "frame"]


def test_a_checkpoints_recomputation_enters_the_same_way(steps):
    w = torch.randn(4, 4, requires_grad=True)
    with HpuAutocastMode(torch.bfloat16, policy="torch-cpu"):
        y = torch_checkpoint.checkpoint(lambda x: torch.mm(x, w).relu(), torch.randn(2, 4), use_reentrant=False)
    del steps[:]
    y.float().sum().backward()  # recomputes in a region reproducing the forward's, outside any
    assert steps == ["register", "tables", "patches", "frame"]


@pytest.mark.parametrize("failing", [(_core, "region_for"), (_regions, "push")])
@pytest.mark.parametrize("nested", [False, True])
def test_an_entry_that_fails_gives_back_what_it_took(monkeypatch, failing, nested):
    # Before the entry was composed here, the patches were acquired first and a later step that
    # raised left them counted (torch's functions replaced for the rest of the process), and a
    # failure after the thread's keys were switched on left them on.
    def fail(*args, **kwargs):
        raise RuntimeError("the step fails")

    own, cache_flag = torch.is_autocast_enabled, torch.is_autocast_cache_enabled()
    with HpuAutocastMode(torch.float16, policy="torch-cpu", cache_enabled=True) if nested else contextlib.nullcontext():
        switch = _dispatch.thread_switch()
        before = (switch.ops, _torch_autocast._open, torch.is_autocast_cache_enabled(), _regions.innermost())
        with monkeypatch.context() as m:
            m.setattr(*failing, fail)
            with pytest.raises(RuntimeError, match="the step fails"):
                with HpuAutocastMode(torch.bfloat16, policy="torch-cpu", cache_enabled=False):
                    pass
        assert (switch.ops, _torch_autocast._open, torch.is_autocast_cache_enabled(), _regions.innermost()) == before
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == (torch.float16 if nested else torch.float32)
    assert _torch_autocast._open == 0 and _dispatch.thread_switch().ops == 0
    assert torch.is_autocast_enabled is own and torch.is_autocast_cache_enabled() == cache_flag

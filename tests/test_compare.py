"""compare(): errors of the mixed run against the float32 run, checked against hand-cast runs."""

import pytest
import torch

from hpu_autocast import compare


def test_errors_match_a_hand_cast_run():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    c = compare(torch.mm, a, b, dtype=torch.bfloat16, policy="hpu", device_type="cpu")
    # The oracle: mm on hand-cast inputs, as the hpu policy's lower list does it.
    ref = torch.mm(a, b).double()
    mixed = torch.mm(a.bfloat16(), b.bfloat16()).double()
    err = (mixed - ref).abs().max().item()
    assert c["out"].dtype == torch.bfloat16
    assert c["out"].max_abs == err > 0
    assert c["out"].max_rel == err / ref.abs().max().item()
    assert not c.nonfinite


def test_structured_outputs_and_text():
    torch.manual_seed(0)
    a = torch.randn(2, 2)

    def fn(x):
        return {"y": torch.mm(x, x), "z": (x.sum(), torch.arange(2))}

    c = compare(fn, a, device_type="cpu")
    # sum is on no list: it runs in f32 on f32 input, exactly as without the mode.
    assert [o.name for o in c.outputs] == ["out['y']", "out['z'][0]"]
    assert c["out['z'][0]"].max_abs == 0.0
    lines = str(c).splitlines()
    assert lines[0].split() == ["output", "dtype", "max", "abs", "err", "max", "rel", "err", "inf/nan"]
    assert lines[2].split() == ["out['z'][0]", "f32", "0.000e+00", "0.000e+00", "no"]


def test_overflow_is_flagged():
    # 300 * 300 * 2 = 180000 exceeds float16's largest finite value, 65504.
    c = compare(torch.mm, torch.full((2, 2), 300.0), torch.full((2, 2), 300.0), dtype=torch.float16, policy="torch-cpu")
    assert c["out"].nonfinite and not c["out"].ref_nonfinite and c.nonfinite
    assert str(c).splitlines()[1].split()[-1] == "yes"


def test_same_rng_state_for_both_runs():
    # Dropout draws the same mask in both runs; only the bf16 rounding differs.
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    c = compare(lambda t: torch.nn.functional.dropout(t, 0.5) * 1.0, x, policy="torch-cpu")
    assert c["out"].max_abs == 0.0  # dropout and mul are not on torch-cpu's lists: run in f32


def test_errors():
    with pytest.raises(ValueError, match="no floating tensor"):
        compare(lambda: torch.arange(3))
    with pytest.raises(KeyError, match="no output named 'nope'; outputs: out"):
        compare(torch.mm, torch.ones(2, 2), torch.ones(2, 2))["nope"]

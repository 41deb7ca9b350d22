"""The builder's list files against the resolver's own list of known names (``names._known_names``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpu_autocast import CastPolicy, PolicyError
from hpu_autocast.policies.builder import policy_from_files
from test_builder import _write

VALID = [
    "mm",
    "aten::addmm",
    "aten.bmm",
    "aten.mv.default",
    "addmm.out",
    "truediv",
    "iadd",
    "cross_entropy_loss",
    "conv_transpose2d",
    "__matmul__",
    "relu",
    "softmax",
]
name_chars = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=4, max_size=12)


@pytest.mark.filterwarnings("ignore:.*has no effect under policy 'hpu'")  # Gaudi's names: tested below
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    valid=st.lists(st.sampled_from(VALID), max_size=5, unique=True),
    invalid=st.lists(name_chars.filter(lambda n: n not in VALID), max_size=3, unique=True),
    data=st.data(),
)
def test_generated_list_files(tmp_path, valid, invalid, data):
    from hpu_autocast.policies.names import _known_names

    invalid = [n for n in invalid if n not in _known_names() and not n.startswith("_")]
    lines = data.draw(st.permutations(valid + invalid))
    path = _write(tmp_path, "gen.txt", "# generated\n" + "\n".join(lines) + "\n")
    if invalid:
        first_bad = next(n for n in lines if n in invalid)
        with pytest.raises(PolicyError, match=rf"'{first_bad}' \(.*gen.txt, line {lines.index(first_bad) + 2}\)"):
            policy_from_files("hpu", lower=path)
    else:
        policy = policy_from_files("hpu", lower=path)
        ignored = {n for n, lst, _ in policy.ignored if lst == "lower"}
        for name in valid:
            from hpu_autocast import resolve

            if name in {"truediv", "iadd", "__matmul__", "addmm.out"}:  # no effect on Gaudi
                assert name in ignored
            else:
                assert all(policy.table[op] is CastPolicy.LOWER for op in resolve(name))

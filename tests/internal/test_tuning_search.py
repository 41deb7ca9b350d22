"""tune's search (``tuning._Search``) on error functions written down, no model run: which set it
finds, how many runs it spends, and what it does out of runs. And the start policy's lists as
names (``tuning._Lists``) for every preset."""

from __future__ import annotations

import itertools

import pytest
import torch

from hpu_autocast import get_preset, preset_names, with_lists
from hpu_autocast.tuning import _Lists, _OutOfRuns, _Search, _Unit

TOL = 0.01


def _units(*names, gemms=()):
    """Units named ``names`` (no FLOPs) and ``gemms`` as ``(name, flops)``."""
    return [_Unit(n, "lower", 1, None) for n in names] + [_Unit(n, "lower", 1, f) for n, f in gemms]


class Counted:
    """An error function of moved sets that counts its calls and may run out."""

    def __init__(self, fn, budget=10_000):
        self.fn, self.budget, self.calls = fn, budget, []

    def __call__(self, moved):
        if len(self.calls) >= self.budget:
            raise _OutOfRuns
        self.calls.append(moved)
        return self.fn(moved)

    def left(self):
        return self.budget - len(self.calls)


def _search(units, fn, budget=10_000):
    error = Counted(fn, budget)
    search = _Search(units, error, TOL, error.left)
    return search, search.run(fn(frozenset())), error


def test_a_pair_that_only_works_together_is_found_and_nothing_else_moves():
    # c and e only matter together: moving either alone leaves the error where it was.
    units = _units("a", "b", "c", "d", "e", "f")
    search, moved, error = _search(units, lambda m: 1e-3 if {"c", "e"} <= m else 1.0)
    assert moved == {"c", "e"}
    assert all(search.alone_moved[n] == 1.0 for n in "abcdef")  # no single move helps
    # Alone in lower precision (everything else moved), each of the pair breaks it: the signal.
    assert search.alone_lower == {"a": 1e-3, "b": 1e-3, "c": 1.0, "d": 1e-3, "e": 1.0, "f": 1e-3}
    assert not search.exhausted
    assert len(set(error.calls)) == len(error.calls)  # no set is run twice


def test_one_op_at_a_time_would_have_to_move_everything_here():
    # The greedy fallback (move the op whose move helps most, repeat) has nothing to choose by
    # when no single move helps; the search still ends at the pair.
    units = _units(*"abcdefgh")
    _, moved, _ = _search(units, lambda m: 1e-3 if {"b", "g"} <= m else 0.5)
    assert moved == {"b", "g"}


def test_a_triple_and_an_op_that_alone_suffices_are_both_minimal_answers():
    units = _units(*"abcdef")
    _, moved, _ = _search(units, lambda m: 1e-3 if ({"a", "b", "c"} <= m or "f" in m) else 1.0)
    assert moved == {"f"}  # the fewest ops


def test_gemms_stay_lower_when_the_others_suffice():
    units = _units("add", "mean", gemms=[("linear", 1000), ("matmul", 10)])
    # Moving a GEMM would fix it alone, but so do the two cheaper ops: the GEMMs stay.
    fn = lambda m: 1e-3 if ("linear" in m or {"add", "mean"} <= m) else 1.0  # noqa: E731
    _, moved, _ = _search(units, fn)
    assert moved == {"add", "mean"}


def test_the_cheapest_gemm_moves_when_one_must():
    units = _units("add", gemms=[("big", 1000), ("small", 10)])
    fn = lambda m: 1e-3 if ("big" in m or "small" in m) else 1.0  # noqa: E731
    _, moved, _ = _search(units, fn)
    assert moved == {"small"}


def test_the_start_within_tolerance_costs_no_run():
    _, moved, error = _search(_units("a", "b"), lambda m: 1e-3)
    assert moved == frozenset() and error.calls == []


def test_out_of_reach_returns_the_least_error_measured():
    units = _units("a", "b", "c")
    search, moved, _ = _search(units, lambda m: 1.0 - 0.1 * len(m) - (0.05 if "b" in m else 0))
    assert moved == {"a", "b", "c"} and search.errors[moved] > TOL


def test_out_of_runs_returns_the_best_set_within_tolerance_so_far():
    units = _units(*"abcdefgh")
    fn = lambda m: 1e-3 if {"c", "e"} <= m else 1.0  # noqa: E731
    # Everything moved (the first run) meets it; the budget ends before the search does.
    search, moved, error = _search(units, fn, budget=3)
    assert search.exhausted and len(error.calls) == 3
    assert fn(moved) <= TOL and {"c", "e"} <= moved


def test_without_the_budget_for_sensitivity_the_search_still_finds_the_pair():
    units = _units(*"abcdefghijkl")
    fn = lambda m: 1e-3 if {"d", "k"} <= m else 1.0  # noqa: E731
    # 2n + n + log2(n) + 2 = 42 runs for sensitivity; 30 leaves it out.
    search, moved, error = _search(units, fn, budget=30)
    assert search.alone_moved == {} and not search.exhausted
    assert moved == {"d", "k"} and len(error.calls) <= 30


def test_deterministic():
    units = _units(*"abcdef", gemms=[("g", 5)])
    fn = lambda m: 1e-3 if ({"b", "d"} <= m or {"a", "e", "f"} <= m) else 0.5 - 0.01 * len(m)  # noqa: E731
    runs = [_search(units, fn)[2].calls for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("pair", list(itertools.combinations("abcdefg", 2)))
def test_every_pair_is_found(pair):
    units = _units(*"abcdefg")
    _, moved, error = _search(units, lambda m: 1e-3 if set(pair) <= m else 1.0)
    assert moved == set(pair)
    # Sensitivity (2n + 1 + 1 cached) plus a few searches and prunes.
    assert len(error.calls) <= 2 * 7 + 1 + 10


def test_the_result_is_1_minimal_when_errors_add_up():
    # Each op in lower precision adds its share; together 0.0215, over the tolerance.
    share = {"a": 0.004, "b": 0.003, "c": 0.007, "d": 0.002, "e": 0.005, "f": 0.0005}
    units = _units(*share)
    fn = lambda m: sum(v for n, v in share.items() if n not in m)  # noqa: E731
    _, moved, _ = _search(units, fn)
    assert fn(moved) <= TOL
    assert all(fn(moved - {n}) > TOL for n in moved)  # no moved op can go back
    # 1-minimal, not the fewest there are: here it is, the two largest shares (most helpful
    # when moved alone, first in the order).
    assert moved == {"c", "e"}


@pytest.mark.parametrize("name", preset_names())
def test_the_start_lists_name_exactly_the_start_table(name):
    # The names tune writes for an unchanged policy load back to the same table.
    start = get_preset(name)
    lower, fp32 = _Lists(start).names(frozenset())
    again = with_lists(start, lower=lower, fp32=fp32)
    assert again.table == start.table
    assert again.input_only == start.input_only and again.promoted == start.promoted


def test_a_moved_op_leaves_the_lower_list_for_the_fp32_list():
    start = get_preset("hpu")
    lists = _Lists(start)
    lower, fp32 = lists.names(frozenset({"mean", "add"}))
    assert "mean" not in lower and {"mean", "add"} <= set(fp32)
    policy = lists.policy(frozenset({"mean", "add"}))
    aten = torch.ops.aten
    assert str(policy.table[aten.mean.dim]) == "fp32" and str(policy.table[aten.add.Tensor]) == "fp32"
    assert str(policy.table[aten.mm.default]) == "lower"

"""Tune a policy: the most lower-precision work whose outputs stay within a tolerance of float32.

    >>> result = tune(model, x, dtype=torch.bfloat16, policy="hpu", tolerance=0.01)
    >>> print(result)                        # the error before and after, and a row per op
    >>> with HpuAutocastMode(torch.bfloat16, policy=result.policy):
    ...     y = model(x)
    >>> result.write_lists("lists")          # Gaudi's list files
    >>> result.write_gaudi_config("gaudi_config.json")

``tune`` runs ``fn(*inputs)`` in float32 once, then under candidate policies, each the start
policy with some ops moved to its FP32 list (a lowered op, a promote op, or an op on no list
that ran in the lower dtype), and measures each run against the float32 one. The ops it may
move are those the start policy ran in the lower dtype; it never moves an op the other way.

[Note: the search]
An op is a "unit" here: an op name as a list file holds it (``mean``, ``add``), all its
functional overloads at once, which is what Gaudi's bridge reads. ``E(S)`` is the error of
the run with the units of ``S`` moved to float32. Units with matmul/conv FLOPs (the report's
FLOPs, ``report.py``) are "GEMMs"; the "floor" is every other unit moved, the GEMMs alone in
lower precision.

1. Sensitivity (when the budget allows, 2n + 2 runs for n units): ``E(all)``, ``E(floor)``,
   and per unit ``moved alone``, ``E({u})``, and ``alone lower``, the error with ``u`` the only
   op in lower precision besides the GEMMs (``E(floor - {u})``; for a GEMM, ``E(all - {u})``).
   ``alone lower`` is what finds ops that matter only together: a promote op that keeps a
   value in bfloat16 and a lowered reduction after it each leave the error as it was when
   moved alone, but each alone in bfloat16, with everything else in float32, brings it back.
2. Reach: the units in order, every non-GEMM first (most harmful alone in lower precision
   first, then most helpful moved alone), then the GEMMs (most harm per FLOP first); a binary
   search for the shortest prefix within tolerance, where a prefix no longer than the floor is
   looked for first when the floor meets it. So whenever keeping only the GEMMs in lower
   precision meets the tolerance, no GEMM is moved.
3. Prune: put moved units back while the tolerance holds: the GEMMs one at a time, most FLOPs
   first, then the others by delta debugging (ddmin: halves, quarters, ... single units, least
   harmful first), again until nothing changes. What is left is 1-minimal: putting back any
   one moved unit breaks the tolerance, so a pair that only works together stays together.

Every run counts against ``max_runs`` (the float32 reference, its rerun, the start policy
included); a set measured once is never run again. Out of runs, the search stops with the best
policy that met the tolerance so far. Nothing is random: ties are broken by name.

[Note: per module]
``tune(per_module=True)`` runs the same search (``_Search``) with modules as units and ``E(S)``
the error of the start policy in a region whose module map sends the modules of ``S`` to float32
(in an fp8 region: to bfloat16). A module's unit holds the calls of the start run that computed
in the lower dtype (fp8: in fp8) with that module the innermost one in flight (``_ModuleCalls``:
its own hooks, names as a module map gives them): a leaf's own work, or what a block's forward
runs outside its children. A map entry acts on a module, and the innermost module covers each
lower call inside the model once, so this is the finest grain a map can express. A module moves
with every module inside it (``_Maps.closure``): a child kept lower inside a float32 parent would
hand its lower output to code where casting is off. Calls outside any module, and backward calls
(no module in flight), are no unit. The result is the start policy and the map
(``TuneResult.modules``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import dataclasses
from dataclasses import dataclass
from typing import Callable, Collection, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch

from . import _torch, module_map as _module_map
from ._torch import OpOverload
from ._facts import ops as _ops
from .policies.builder import as_policy, with_lists
from .policies.gaudi import ENV_FP32, ENV_LOWER
from .events import short_dtype
from .log import combine_observers
from .policies.names import PolicyError, resolve
from .numerics import compare_outputs
from .policies.policy import CastPolicy, Policy
from .policies.recipes import is_fp8
from .mode import HpuAutocastMode
from .report import Recorder, _table

__all__ = ["tune", "TuneResult", "TuneRow", "LOWER_FILE", "FP32_FILE"]

#: The names ``TuneResult.write_lists`` gives its files (optimum-habana's own are
#: ``bf16_ops.txt`` / ``fp32_ops.txt``; the lists are for any lower dtype).
LOWER_FILE = "lower_ops.txt"
FP32_FILE = "fp32_ops.txt"

#: Ops that ran in the lower dtype but are never moved: ``_to_copy`` is a cast (autograd's
#: casting gradients back, a user's ``.to()``), and on the FP32 list it would cast to what its
#: ``dtype`` says all the same.
_NEVER_MOVED = frozenset({"_to_copy"})

_LOG = logging.getLogger("hpu_autocast.tune")

Moved = FrozenSet[str]


# --- what may move -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Unit:
    """An op name the search may move to the FP32 list, and how the start policy ran it."""

    name: str  #: as a list file holds it: ``mean``, ``mylib::op``
    ran_as: str  #: the start run's decision: ``lower``, ``promote``, ``not listed``, ...
    calls: int  #: calls that computed in the lower dtype
    flops: Optional[int]  #: matmul/conv FLOPs of those calls; ``None``: not matmul/conv-like

    @property
    def gemm(self) -> bool:
        return self.flops is not None


def _unit_name(op: OpOverload) -> str:
    """The list name covering ``op``'s packet: ``mean`` (aten), ``mylib::op`` (others)."""
    base = _ops.op_base_name(op)
    return base if op.namespace == "aten" else f"{op.namespace}::{base}"


def _units(report, dtype: torch.dtype, fp8_only: bool = False) -> List[_Unit]:
    """The units of a start run's ``PrecisionReport``, in order of first call: every functional
    op that computed in ``dtype`` by the policy's decision or by its inputs (not listed); in an
    fp8 region also those in bfloat16, unless ``fp8_only``."""
    low = {short_dtype(dtype)}
    if is_fp8(dtype) and not fp8_only:
        low.add("bf16")  # fp8: its other ops in bf16
    found: Dict[str, list] = {}
    for row in report.rows:
        if row.compute not in low or row.action.startswith("ineligible") or row.action == "native":
            continue
        op = _ops.overload_named(row.op)
        if op is None or not _ops.is_functional(op) or _ops.op_base_name(op) in _NEVER_MOVED:
            continue
        entry = found.setdefault(_unit_name(op), [[], 0, None])
        if row.action not in entry[0]:
            entry[0].append(row.action)
        entry[1] += row.calls
        if row.flops is not None:
            entry[2] = (entry[2] or 0) + row.flops
    return [_Unit(name, "/".join(actions), calls, flops) for name, (actions, calls, flops) in found.items()]


# --- modules as units ----------------------------------------------------------------------------


class _ModuleCalls:
    """Which module each call of the start run ran in, as a module map names it: global forward
    hooks keep the stack of modules in flight; the first one called with none in flight is a
    root (``torch.compile``'s wrapper skipped), named ``""``, the others by their names in it
    (``module_map``'s rule). Each event goes to a ``Recorder`` of the innermost named module in
    flight; events with no module in flight (``fn``'s own code, a backward) go nowhere."""

    def __init__(self, policy: str, dtype: torch.dtype) -> None:
        self.policy, self.dtype = policy, dtype
        self.stack: List[Tuple[object, Optional[str]]] = []
        self.names: Dict[int, str] = {}
        self.recorders: Dict[str, Recorder] = {}
        self._handles: list = []

    def _pre(self, module, args) -> None:
        if not self.stack:
            if _module_map._is_compiled_wrapper(module):
                return
            self.names = {}
            for name, m in module.named_modules(remove_duplicate=False):
                self.names.setdefault(id(m), name)
        self.stack.append((module, self.names.get(id(module))))

    def _post(self, module, args, out) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] is module:
                del self.stack[i:]
                return

    def __call__(self, event) -> None:
        if _torch.current_autograd_node() is not None:
            return  # a backward: no module runs it
        for _, name in reversed(self.stack):
            if name is not None:
                rec = self.recorders.get(name)
                if rec is None:
                    rec = self.recorders[name] = Recorder(self.policy, self.dtype)
                rec(event)
                return

    def __enter__(self) -> "_ModuleCalls":
        from torch.nn.modules import module as nn_module

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc) -> None:
        while self._handles:
            self._handles.pop().remove()
        self.stack.clear()


def _module_units(calls: _ModuleCalls, dtype: torch.dtype) -> List[_Unit]:
    """A unit per module that ran calls in the lower dtype (in fp8: in fp8) itself, in order of
    first call: its ops as ``ran_as``, their calls and matmul/conv FLOPs."""
    out = []
    for name, rec in calls.recorders.items():
        ops = _units(rec.report(), dtype, fp8_only=is_fp8(dtype))
        if ops:
            flops = [u.flops for u in ops if u.flops is not None]
            out.append(
                _Unit(name, ", ".join(u.name for u in ops), sum(u.calls for u in ops), sum(flops) if flops else None)
            )
    return out


def _exact(name: str) -> str:
    """A pattern matching the module ``name`` alone: the name, its ``*?[`` bracketed."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _inside(name: str, outer: str) -> bool:
    """Whether the module ``name`` is inside the module ``outer`` (the root ``""`` holds all)."""
    return outer == "" or name.startswith(outer + ".")


class _Maps:
    """The module map of each moved set: each moved module not inside another moved one to
    ``target``. A module moves with everything inside it (Note: per module)."""

    def __init__(self, units: Sequence[_Unit], target: torch.dtype) -> None:
        self.names = [u.name for u in units]
        self.target = target

    def closure(self, moved: Moved) -> Moved:
        """The units ``moved`` moves: those and every unit inside one of them."""
        return frozenset(n for n in self.names if any(n == m or _inside(n, m) for m in moved))

    def outermost(self, moved: Moved) -> List[str]:
        """The moved units no other moved unit holds, in call order."""
        return [n for n in self.names if n in moved and not any(m != n and _inside(n, m) for m in moved)]

    def __call__(self, moved: Moved) -> Dict[str, torch.dtype]:
        return {_exact(name): self.target for name in self.outermost(moved)}


# --- policies as list names ----------------------------------------------------------------------


def _spelled(op: OpOverload) -> str:
    """``aten::add.Tensor``: one overload, as a list file may name it."""
    return f"{_torch.schema(op).name}.{_torch.overload_name(op)}"


def _applied(name: str, policy: Policy) -> FrozenSet[OpOverload]:
    """The overloads a list name puts on ``policy``'s lists (``with_lists``' rule)."""
    ops = resolve(name)
    if policy.c_names_only:
        ops = [op for op in ops if not (_ops.is_inplace(op) or _ops.is_out(op))]
    return frozenset(ops)


def _list_names(policy: Policy, action: CastPolicy) -> List[Tuple[str, str]]:
    """``policy``'s list of ``action`` as ``(name, unit)`` pairs whose names give back exactly its
    overloads: a packet's name where the policy lists all the overloads it stands for
    (``mean``), else each overload spelled out (``aten::add.Tensor``)."""
    groups: Dict[str, List[OpOverload]] = {}
    for op in policy.ops(action):
        groups.setdefault(_unit_name(op), []).append(op)
    out = []
    for unit, ops in sorted(groups.items()):
        try:
            whole = _applied(unit, policy)
        except PolicyError:
            whole = frozenset()
        out += [(unit, unit)] if whole == frozenset(ops) else [(_spelled(op), unit) for op in ops]
    return out


class _Lists:
    """The start policy's lower and FP32 lists, and the policy with units moved."""

    def __init__(self, start: Policy) -> None:
        self.start = start
        self.lower = _list_names(start, CastPolicy.LOWER)
        self.fp32 = _list_names(start, CastPolicy.FP32)
        self._policies: Dict[Moved, Policy] = {}

    def names(self, moved: Moved) -> Tuple[List[str], List[str]]:
        """The lower and FP32 lists with ``moved`` on the FP32 one, each sorted by name."""
        lower = [n for n, unit in self.lower if unit not in moved]
        fp32 = [n for n, unit in self.fp32 if unit not in moved] + list(moved)
        return sorted(lower), sorted(fp32)

    def policy(self, moved: Moved) -> Policy:
        if not moved:
            return self.start
        if moved not in self._policies:
            lower, fp32 = self.names(moved)
            self._policies[moved] = with_lists(self.start, lower=lower, fp32=fp32)
        return self._policies[moved]


# --- runs ----------------------------------------------------------------------------------------


class _OutOfRuns(Exception):
    """``max_runs`` runs were made."""


class _Runner:
    """Runs ``fn(*inputs)`` (each run from the same RNG state), counts the runs, and measures
    a run's outputs against the float32 reference with the metric."""

    def __init__(
        self,
        fn: Callable,
        inputs: tuple,
        dtype: torch.dtype,
        device_type: Optional[str],
        metric: Optional[Callable],
        max_runs: int,
        progress: Optional[Callable[[str], None]],
    ) -> None:
        self.fn, self.inputs, self.dtype, self.device_type = fn, inputs, dtype, device_type
        self.metric, self.max_runs, self.progress = metric, max_runs, progress
        self.runs = 0
        self.ref = None
        self._rng = torch.random.get_rng_state()

    def call(self, policy: Optional[Policy], observer=None, modules=None):
        if self.runs >= self.max_runs:
            raise _OutOfRuns
        self.runs += 1
        torch.random.set_rng_state(self._rng)
        if policy is None:
            return self.fn(*self.inputs)
        with HpuAutocastMode(
            self.dtype, policy=policy, device_type=self.device_type, observer=observer, modules=modules or None
        ):
            return self.fn(*self.inputs)

    def error(self, out) -> float:
        """The metric of ``out`` against the reference; an inf or nan the reference does not
        have (default metric) or a nan metric is an infinite error."""
        if self.metric is None:
            c = compare_outputs(self.ref, out)
            return math.inf if c.nonfinite else c.max_rel
        value = self.metric(self.ref, out)
        try:
            value = float(value)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"tune: metric must return a float (smaller is better), got {value!r}") from None
        return math.inf if math.isnan(value) else value

    def say(self, line: str) -> None:
        _LOG.info("%s", line)
        if self.progress is not None:
            self.progress(line)


# --- the search ----------------------------------------------------------------------------------


class _Search:
    """The search of the module's Note over units and an error function of moved sets."""

    def __init__(
        self,
        units: Sequence[_Unit],
        error: Callable[[Moved], float],
        tolerance: float,
        runs_left: Callable[[], int],
        say: Callable[[str], None] = lambda line: None,
        noun: str = "ops",
        target: str = "float32",
        closure: Callable[[Moved], Moved] = lambda moved: moved,
    ) -> None:
        self.noun, self.target = noun, target  # the progress lines' words: "ops" / "modules", "float32"
        self.closure = closure  # the units a moved set moves (per module: a module moves what it holds)
        self.units = list(units)
        self.by_name = {u.name: u for u in self.units}
        self._error = error
        self.tolerance = tolerance
        self.runs_left = runs_left
        self.say = say
        self.errors: Dict[Moved, float] = {}
        self.alone_moved: Dict[str, float] = {}
        self.alone_lower: Dict[str, float] = {}
        self.best: Optional[Moved] = None  # the best set within tolerance so far
        self.reached: Optional[Moved] = None  # the prefix the reach phase found
        self.exhausted = False

    def error(self, moved: Moved, phase: str, what: Optional[str] = None) -> float:
        """``E(moved)``, run once; ``phase`` and ``what`` (default: the moved ops) name the run
        in the progress line."""
        if moved not in self.errors:
            e = self.errors[moved] = self._error(moved)
            if what is None:
                what = "moved " + (", ".join(sorted(moved)) if len(moved) <= 4 else f"{len(moved)} {self.noun}")
            self.say(f"{phase}: {what} -> error {e:.3e}")
            if e <= self.tolerance and (self.best is None or self._cost(moved) < self._cost(self.best)):
                self.best = moved
        return self.errors[moved]

    def ok(self, moved: Moved, phase: str) -> bool:
        return self.error(moved, phase) <= self.tolerance

    def _cost(self, moved: Moved) -> tuple:
        """Lower is better: matmul/conv FLOPs moved, then units moved, then the error."""
        flops = sum(self.by_name[n].flops or 0 for n in self.closure(moved))
        return flops, len(moved), self.errors.get(moved, math.inf), sorted(moved)

    def run(self, start_error: float) -> Moved:
        self.errors[frozenset()] = start_error
        if start_error <= self.tolerance:
            return frozenset()
        try:
            order = self._order()
            self.reached = self._reach(order)
            # Prune what the reach found, then whatever cheaper set within tolerance the runs
            # met on the way, until the best set is one the prune has been through.
            pruned = set()
            candidate = self.reached
            while candidate is not None and candidate not in pruned:
                pruned |= {candidate, self._prune(candidate, order)}
                candidate = self.best
        except _OutOfRuns:
            self.exhausted = True
        if self.best is not None:
            return self.best
        # Nothing met the tolerance: the least error measured.
        return min(self.errors, key=lambda m: (self.errors[m], self._cost(m)))

    def _order(self) -> List[_Unit]:
        units = self.units
        n = len(units)
        everything = frozenset(u.name for u in units)
        floor = frozenset(u.name for u in units if not u.gemm)
        self.error(everything, "all moved", f"all {n} {self.noun} in {self.target}")
        if floor != everything:
            self.error(floor, "floor", f"only the matmul/conv {self.noun} in lower precision")
        # Sensitivity takes 2n runs, and leaves room for the reach and the prune (about
        # n + log2(n) + 2), or is left out.
        if self.runs_left() >= 2 * n + n + n.bit_length() + 2:
            for u in units:
                self.alone_moved[u.name] = self.error(frozenset({u.name}), "moved alone", u.name)
            for u in units:
                # Everything else moved: every unit whose move does not move u (per module: not
                # a module holding it).
                rest = frozenset(
                    v for v in (everything if u.gemm else floor) if u.name not in self.closure(frozenset({v}))
                )
                with_gemms = "" if u.gemm or floor == everything else f" (and the matmul/conv {self.noun})"
                self.alone_lower[u.name] = self.error(rest, "alone lower", u.name + with_gemms)
        harm = lambda u: self.alone_lower.get(u.name, 0.0)  # noqa: E731
        helped = lambda u: self.alone_moved.get(u.name, 0.0)  # noqa: E731
        others = sorted((u for u in units if not u.gemm), key=lambda u: (-harm(u), helped(u), -u.calls, u.name))
        gemms = sorted((u for u in units if u.gemm), key=lambda u: (-harm(u) / max(u.flops, 1), u.flops, u.name))
        return others + gemms

    def _reach(self, order: List[_Unit]) -> Optional[Moved]:
        """The shortest prefix of ``order`` within tolerance (a binary search; the prefix with
        nothing moved is known to fail), or ``None`` when moving everything does not reach it."""
        prefix = lambda k: frozenset(u.name for u in order[:k])  # noqa: E731
        k_floor = sum(1 for u in order if not u.gemm)
        if self.ok(prefix(k_floor), "search"):
            lo, hi = 0, k_floor
        elif self.ok(prefix(len(order)), "search"):
            lo, hi = k_floor, len(order)
        else:
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.ok(prefix(mid), "search"):
                hi = mid
            else:
                lo = mid
        return prefix(hi)

    def _prune(self, moved: Moved, order: List[_Unit]) -> Moved:
        rank = {u.name: i for i, u in enumerate(order)}
        while True:
            before = moved
            for g in sorted((self.by_name[n] for n in moved if self.by_name[n].gemm), key=lambda u: (-u.flops, u.name)):
                if self.ok(moved - {g.name}, "prune"):
                    moved = moved - {g.name}
            others = sorted((n for n in moved if not self.by_name[n].gemm), key=lambda n: -rank[n])
            moved = self._ddmin(moved, others)
            if moved == before:
                return moved

    def _ddmin(self, moved: Moved, items: List[str]) -> Moved:
        """Put back as many of ``items`` (units of ``moved``, the first the first to try) as the
        tolerance allows: chunks of halves, quarters, ... down to single units."""
        n = 2
        while items:
            size = math.ceil(len(items) / min(n, len(items)))
            chunks = [items[i : i + size] for i in range(0, len(items), size)]
            for chunk in chunks:
                candidate = moved - frozenset(chunk)
                if self.ok(candidate, "prune"):
                    moved, items = candidate, [i for i in items if i not in chunk]
                    n = max(n - 1, 2)
                    break
            else:
                if size == 1:
                    return moved
                n = min(2 * n, len(items))
        return moved


# --- the result ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneRow:
    """One op the search could move: how the start policy ran it, what the sensitivity runs
    measured, and what the search did with it."""

    op: str  #: the list name: ``mean``
    ran_as: str  #: the start run's decision: ``lower``, ``promote``, ``not listed``
    calls: int  #: calls that computed in the lower dtype in the start run
    flops: Optional[int]  #: their matmul/conv FLOPs (``None``: not matmul/conv-like)
    moved_alone: Optional[float]  #: error with only this op moved to float32
    alone_lower: Optional[float]  #: error with only this op (and the matmul/conv ops) lower
    moved: bool  #: on the tuned policy's FP32 list
    why: str


def _fmt(e: Optional[float]) -> str:
    return "-" if e is None else f"{e:.1e}"


class TuneResult:
    """What ``tune`` found: ``policy`` (a ``Policy``), its measured ``error``, the ops it
    ``moved`` to float32, a row per op it could move (``rows``, printed by ``str()``), the
    number of ``runs``, and writers for Gaudi's list files and optimum-habana's
    ``gaudi_config.json``."""

    def __init__(
        self,
        *,
        policy: Policy,
        start: Policy,
        dtype: torch.dtype,
        tolerance: float,
        error: float,
        start_error: float,
        moved: Tuple[str, ...],
        rows: Tuple[TuneRow, ...],
        lower: Tuple[str, ...],
        fp32: Tuple[str, ...],
        runs: int,
        max_runs: int,
        exhausted: bool,
        flops: Tuple[int, int],
        bf16_gemms: Tuple[str, ...] = (),
        modules: Optional[Dict[str, torch.dtype]] = None,
    ) -> None:
        self.policy = policy
        #: ``tune(per_module=True)``: the module map found, ``{module name: dtype}``, for
        #: ``HpuAutocastMode(dtype, policy=result.policy, modules=result.modules)``; ``None`` for
        #: an op-level tune. ``moved`` and ``rows`` are then by module.
        self.modules = modules
        #: In an fp8 region, the GEMMs moved from fp8 to bfloat16 (``Policy.bf16_gemms``) before the
        #: float32 search.
        self.bf16_gemms = bf16_gemms
        self.start = start
        self.dtype = dtype
        self.tolerance = tolerance
        self.error = error
        self.start_error = start_error
        self.moved = moved
        self.rows = rows
        #: The tuned policy's lists, as list files hold them (sorted names).
        self.lower_list = lower
        self.fp32_list = fp32
        self.runs = runs
        self.max_runs = max_runs
        #: The search ran out of runs before it finished (the result is the best found).
        self.exhausted = exhausted
        #: ``(kept lower, ran lower at the start)``: matmul/conv FLOPs.
        self.flops = flops

    @property
    def met(self) -> bool:
        """Whether ``error`` is within the tolerance."""
        return self.error <= self.tolerance

    def gaudi_config(self) -> dict:
        """optimum-habana's ``GaudiConfig`` fields for this policy: autocast on, with its lists."""
        return {
            "use_torch_autocast": True,
            "autocast_bf16_ops": list(self.lower_list),
            "autocast_fp32_ops": list(self.fp32_list),
        }

    def write_gaudi_config(self, path: "os.PathLike[str] | str") -> str:
        """Write ``gaudi_config()`` as JSON to ``path`` (a ``gaudi_config.json``); returns the path."""
        path = os.fspath(path)
        with open(path, "w") as f:
            f.write(json.dumps(self.gaudi_config(), indent=2) + "\n")
        return path

    def write_lists(self, directory: "os.PathLike[str] | str" = ".") -> Tuple[str, str]:
        """Write the lower and FP32 lists, one op per line, as ``lower_ops.txt`` and
        ``fp32_ops.txt`` in ``directory`` (made if missing); returns the two paths. Point
        ``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` and ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` at them
        (``environment``): on Gaudi, and here for a mode with the default policy, they replace
        the ``hpu`` lists."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        paths = os.path.join(directory, LOWER_FILE), os.path.join(directory, FP32_FILE)
        for path, names in zip(paths, (self.lower_list, self.fp32_list)):
            with open(path, "w") as f:
                f.writelines(n + "\n" for n in names)
        return paths

    @staticmethod
    def environment(lower_path: str, fp32_path: str) -> Dict[str, str]:
        """The variables that make Gaudi (and the ``hpu`` preset here) read the two list files."""
        return {ENV_LOWER: os.path.abspath(lower_path), ENV_FP32: os.path.abspath(fp32_path)}

    @property
    def target(self) -> str:
        """Where moved units went: ``fp32``; ``bf16`` for the modules of a per-module fp8 tune."""
        return "bf16" if self.modules is not None and is_fp8(self.dtype) else "fp32"

    def _summary(self) -> List[str]:
        low = short_dtype(self.dtype)
        state = "within" if self.met else "NOT within"
        how = " per module" if self.modules is not None else ""
        lines = [
            f"hpu_autocast tune{how}: policy {self.start.name} -> {self.policy.name}, dtype {low}, "
            f"tolerance {self.tolerance:.1e}",
            f"error: {self.start_error:.3e} at the start -> {self.error:.3e}, {state} tolerance",
            f"moved to {self.target}: {', '.join(self.moved) if self.moved else 'nothing'}",
        ]
        if self.modules is not None:
            lines.append(f"modules={_map_repr(self.modules)}")
        kept, total = self.flops
        if total:
            lines.append(f"matmul/conv FLOPs in {low}: {kept} of {total} ({100 * kept / total:.1f}%)")
        budget = " (out of runs: the best found so far)" if self.exhausted else ""
        lines.append(f"runs: {self.runs} of max_runs={self.max_runs}{budget}")
        return lines

    _HEADER = ["op", "ran as", "calls", "FLOPs", "moved alone", "alone lower", "result", "why"]
    _MODULE_HEADER = ["module", "ops", "calls", "FLOPs", "moved alone", "alone lower", "result", "why"]

    def __str__(self) -> str:
        cells = [
            [
                r.op if r.op or self.modules is None else "(root)",
                r.ran_as,
                str(r.calls),
                "-" if r.flops is None else str(r.flops),
                _fmt(r.moved_alone),
                _fmt(r.alone_lower),
                self.target if r.moved else "kept",
                r.why,
            ]
            for r in self.rows
        ]
        lines = self._summary()
        if cells:
            header = self._HEADER if self.modules is None else self._MODULE_HEADER
            lines += ["", *_table(header, cells, {2, 3, 4, 5})]
        return "\n".join(lines)

    def __repr__(self) -> str:
        mods = "" if self.modules is None else f", modules={_map_repr(self.modules)}"
        return (
            f"TuneResult(policy={self.policy.name!r}, error={self.error:.3e}, tolerance={self.tolerance:.1e}, "
            f"moved={list(self.moved)}{mods}, runs={self.runs})"
        )


def _map_repr(modules: Dict[str, torch.dtype]) -> str:
    """``{'2': torch.float32, ...}``: the map as Python reads it back."""
    return "{" + ", ".join(f"{k!r}: {v}" for k, v in modules.items()) + "}"


def _why(search: _Search, unit: _Unit, moved: Moved, low: str) -> str:
    """The why column: what the runs said about moving ``unit``."""
    if search.errors[frozenset()] <= search.tolerance:
        return "the start is within tolerance"
    if search.errors[moved] > search.tolerance:
        return "tolerance not met: this is the least error measured"
    if unit.name in moved:
        back = search.errors.get(moved - {unit.name})
        return "moved; not tried back (out of runs)" if back is None else f"needed: back in {low}, error {back:.1e}"
    if search.reached is not None and unit.name in search.reached:
        return "not needed (put back)"
    return "not needed"


# --- the entry point -----------------------------------------------------------------------------


def _start(runner: "_Runner", start: Policy, recorder: Recorder, calls: Optional[_ModuleCalls]) -> float:
    """The start policy's run (recorded; per module, with the module of each call) and its error."""
    with calls if calls is not None else contextlib.nullcontext():
        error = runner.error(runner.call(start, observer=combine_observers(recorder, calls)))
    recipe = f", {start.fp8}" if is_fp8(runner.dtype) else ""  # an fp8 region's: its scaling recipe
    runner.say(f"run {runner.runs}/{runner.max_runs}: start ({start.name}{recipe}) -> error {error:.3e}")
    return error


def _check_args(fn, tolerance, metric, max_runs, progress, dtype, per_module) -> float:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"tune: dtype must be a torch.dtype, got {dtype!r}")
    if not isinstance(per_module, bool):
        raise TypeError(
            f"tune: per_module must be True (tune a module map) or False (tune the policy's lists), got {per_module!r}"
        )
    if not callable(fn):
        raise TypeError(f"tune: fn must be callable, got {fn!r}")
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, (int, float))
        or not math.isfinite(tolerance)
        or tolerance < 0
    ):
        raise ValueError(f"tune: tolerance must be a finite number >= 0 (an error such as 0.01), got {tolerance!r}")
    if metric is not None and not callable(metric):
        raise TypeError(
            f"tune: metric must be None (the max normwise relative error) or a callable "
            f"metric(reference_outputs, outputs) -> float, got {metric!r}"
        )
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 3:
        raise ValueError(
            f"tune: max_runs must be an int >= 3 (the float32 reference, its rerun and the "
            f"start policy take three), got {max_runs!r}"
        )
    if progress is not None and not callable(progress):
        raise TypeError(f"tune: progress must be None or a callable taking one line of text, got {progress!r}")
    return float(tolerance)


def _floating_elements(out) -> int:
    """How many floating elements the outputs ``out`` (tensors, nested in lists, tuples, dicts) hold."""
    return sum(t.numel() for t in _torch.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())


def _reference(runner: "_Runner", metric: Optional[Callable]):
    """The float32 run's outputs; refused when the default metric would have nothing to compare."""
    ref = runner.call(None)
    if metric is None and not _floating_elements(ref):
        raise ValueError(
            "tune: fn's float32 outputs hold no floating element (an empty batch?), so every policy "
            "would be within any tolerance (error 0): give inputs with at least one sample, or a metric"
        )
    return ref


def tune(
    fn: Callable,
    *inputs,
    dtype: torch.dtype = torch.bfloat16,
    policy="hpu",
    tolerance: float = 0.01,
    metric: Optional[Callable] = None,
    max_runs: int = 200,
    device_type: Optional[str] = None,
    progress: Optional[Callable[[str], None]] = None,
    per_module: bool = False,
) -> TuneResult:
    """Find the policy, starting from ``policy`` (a preset name or a ``Policy``, resolved as a
    mode resolves it: ``"hpu"`` takes Gaudi's list variables), that keeps the most work in
    ``dtype`` while ``fn(*inputs)`` stays within ``tolerance`` of its float32 run.

    Ops move only to float32 (the policy's FP32 list), the matmul/conv ops last, as few as the
    search can (Note: the search in this module); in an fp8 region, GEMMs move from fp8 to
    bfloat16 first (``_fp8_stage``). ``metric(reference, outputs) -> float``
    (smaller is better) compares the float32 outputs with a candidate's; ``None`` means the
    largest normwise relative error over the floating outputs (``compare_outputs``), infinite
    when an inf or nan appears that float32 does not have. ``fn`` runs up to ``max_runs`` times
    from the same RNG state: it must not change state between runs (``model.eval()``, no
    optimizer step). ``progress`` gets one line per run (also logged at INFO to
    ``hpu_autocast.tune``). ``device_type`` is the mode's.

    ``per_module=True`` tunes over the model's modules instead of its ops (Note: per module, below):
    the policy stays the start's, and ``result.modules`` is the module map found.

    Returns a ``TuneResult``; a start already within tolerance is returned unchanged
    (``result.policy`` is the start policy).
    """
    tolerance = _check_args(fn, tolerance, metric, max_runs, progress, dtype, per_module)
    start = as_policy(policy)
    start.check_dtype(dtype)
    runner = _Runner(fn, inputs, dtype, device_type, metric, max_runs, progress)
    low = short_dtype(dtype)

    _check_noise(runner, metric, tolerance)
    recorder = Recorder(start.name, dtype)
    calls = _ModuleCalls(start.name, dtype) if per_module else None
    start_error = _start(runner, start, recorder, calls)

    def say(line: str) -> None:
        runner.say(f"run {runner.runs}/{max_runs}: {line}")

    if calls is not None:
        return _tune_modules(runner, start, start_error, _module_units(calls, dtype), tolerance, say)
    report = recorder.report()
    units = _units(report, dtype)
    begin, begin_error, bf16_gemms = _fp8_stage(runner, start, report, tolerance, start_error, say)
    lists = _Lists(begin)

    def error(moved: Moved) -> float:
        return runner.error(runner.call(lists.policy(moved)))

    search = _Search(units, error, tolerance, lambda: max_runs - runner.runs, say)
    moved = search.run(begin_error)
    names = sorted(moved, key=[u.name for u in units].index)
    rows, flops = _rows(units, search, moved, lambda u: _why(search, u, moved, low))
    lower, fp32 = lists.names(moved)
    return TuneResult(
        policy=lists.policy(moved),
        start=start,
        dtype=dtype,
        tolerance=tolerance,
        error=search.errors[moved],
        start_error=start_error,
        moved=tuple(names),
        rows=rows,
        lower=tuple(lower),
        fp32=tuple(fp32),
        runs=runner.runs,
        max_runs=max_runs,
        exhausted=search.exhausted,
        flops=flops,
        bf16_gemms=bf16_gemms,
    )


def _rows(units: Sequence[_Unit], search: _Search, moved: Collection[str], why: Callable[[_Unit], str]):
    """The result's table, a ``TuneRow`` per unit (``moved``: the units that ended out of lower
    precision; ``why``: each row's reason), and its FLOPs ``(kept in lower precision, total)``."""
    rows = tuple(
        TuneRow(
            u.name,
            u.ran_as,
            u.calls,
            u.flops,
            search.alone_moved.get(u.name),
            search.alone_lower.get(u.name),
            u.name in moved,
            why(u),
        )
        for u in units
    )
    total = sum(u.flops or 0 for u in units)
    kept = sum(u.flops or 0 for u in units if u.name not in moved)
    return rows, (kept, total)


def _tune_modules(
    runner: _Runner, start: Policy, start_error: float, units: List[_Unit], tolerance: float, say: Callable[[str], None]
) -> TuneResult:
    """``tune(per_module=True)``: the search over module units (Note: per module)."""
    dtype = runner.dtype
    if not units and start_error > tolerance:
        raise ValueError(
            f"tune(per_module=True): no module ran calls in {short_dtype(dtype)} in fn(*inputs) (the "
            f"units are the modules fn calls, by the calls each runs itself); the error "
            f"{start_error:.3e} comes from code outside modules: tune its ops with per_module=False"
        )
    target = torch.bfloat16 if is_fp8(dtype) else torch.float32
    maps = _Maps(units, target)

    measured: Dict[Tuple[str, ...], float] = {}

    def error(moved: Moved) -> float:
        # Sets that name one map (a module and modules inside it) are run once.
        key = tuple(maps.outermost(moved))
        if key not in measured:
            measured[key] = runner.error(runner.call(start, modules=maps(moved)))
        return measured[key]

    search = _Search(
        units,
        error,
        tolerance,
        lambda: runner.max_runs - runner.runs,
        say,
        noun="modules",
        target=short_dtype(target),
        closure=maps.closure,
    )
    moved = search.run(start_error)
    low = short_dtype(dtype)
    names = tuple(maps.outermost(moved))
    went = maps.closure(moved)

    def why(u: _Unit) -> str:
        holder = next((m for m in names if m != u.name and _inside(u.name, m)), None)
        return _why(search, u, moved, low) if holder is None else f"inside {holder or '(root)'}"

    rows, flops = _rows(units, search, went, why)
    lower, fp32 = _Lists(start).names(frozenset())
    return TuneResult(
        policy=start,
        start=start,
        dtype=dtype,
        tolerance=tolerance,
        error=search.errors[moved],
        start_error=start_error,
        moved=names,
        rows=rows,
        lower=tuple(lower),
        fp32=tuple(fp32),
        runs=runner.runs,
        max_runs=runner.max_runs,
        exhausted=search.exhausted,
        flops=flops,
        modules=maps(moved),
    )


def _check_noise(runner: _Runner, metric: Optional[Callable], tolerance: float) -> None:
    """Run the float32 reference twice; ``ValueError`` where the two differ beyond ``tolerance``."""
    runner.ref = _reference(runner, metric)
    noise = runner.error(runner.call(None))
    runner.say(f"run {runner.runs}/{runner.max_runs}: float32 reference, run twice (difference {noise:.1e})")
    if noise > tolerance:
        raise ValueError(
            f"tune: two float32 runs of fn differ by {noise:.3e}, more than the tolerance "
            f"{tolerance:.1e}: fn must give the same result each run (model.eval(), no "
            f"optimizer step, no state kept between calls)"
        )


def _fp8_stage(
    runner: _Runner, start: Policy, report, tolerance: float, start_error: float, say: Callable[[str], None]
) -> Tuple[Policy, float, Tuple[str, ...]]:
    """In an fp8 region, tune's first step (issue 32): GEMMs that ran in fp8 move to bfloat16
    (``Policy.bf16_gemms``) before anything moves to float32. Each is measured alone in bfloat16,
    then the shortest prefix of them, most helpful first, that meets the tolerance is taken; where
    none does, all of them, and the float32 search goes on from that policy. Returns the policy
    the search starts from, its error and the GEMMs moved."""
    names = sorted({_unit_name(_ops.overload_named(r.op)) for r in report.rows if r.compute == "f8e4m3"})
    if start_error <= tolerance or not names:
        return start, start_error, ()

    def with_bf16(moved) -> Policy:
        ops = frozenset(op for n in moved for op in _applied(n, start))
        return dataclasses.replace(start, name=f"{start.name}+bf16-gemms", bf16_gemms=start.bf16_gemms | ops)

    try:
        alone = {n: runner.error(runner.call(with_bf16([n]))) for n in names}
        order = sorted(names, key=lambda n: (alone[n], n))
        for i in range(1, len(order) + 1):
            policy = with_bf16(order[:i])
            error = alone[order[0]] if i == 1 else runner.error(runner.call(policy))
            say(f"fp8 -> bf16: {', '.join(order[:i])} -> error {error:.3e}")
            if error <= tolerance:
                break
    except _OutOfRuns:
        return start, start_error, ()
    return policy, error, tuple(order[:i])

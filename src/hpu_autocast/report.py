"""What ran in which dtype: a ``Recorder`` of engine events and the ``PrecisionReport`` it builds.

    >>> with HpuAutocastMode(torch.bfloat16, policy="hpu", record=True) as mode:
    ...     loss = model(x).sum()
    >>> print(mode.report())

The report has one row per (op overload, decision, input dtypes -> compute dtype), with the calls,
the casts the engine made and the bytes they wrote, and the matmul/conv FLOPs; then the share of
those FLOPs that ran in lower precision, and warnings worth acting on. Every figure comes from the
engine's events (``events.py``): the casts are the ones the engine reports having made, a copy
served from the cast cache counts once, where it was made.

[Note: counting FLOPs] FLOPs are those ``torch.utils.flop_counter`` counts, from its own formula
registry (``flop_registry``: mm, addmm, bmm, baddbmm, convolution, attention). The engine reports
composites (``linear``, ``matmul``, ``conv2d``, ``scaled_dot_product_attention``) whose insides it
leaves alone, so the recorder runs each matmul/conv-like call once more on ``meta`` tensors
(shapes only, no data, no compute) under a small dispatch mode that applies the registry's
formulas to what the composite decomposes into. The event carries the arguments as the caller
passed them, before the engine's casts, so the rerun gives its floating tensors the call's compute
dtype, as the call ran: a conv fed a bf16 activation beside float32 weights would otherwise raise
on the mismatch and go uncounted (the formulas read shapes alone, so the dtype changes no count).
The call's FLOPs are attributed to its compute dtype. Ops the registry has no formula for (``dot``, ``mv``) count zero, as in
``FlopCounterMode``.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch.utils.flop_counter import flop_registry

from ._engine import core as _core, fp8 as _fp8
from . import _torch
from ._torch import TorchDispatchMode, tree_map
from ._facts import ops as _ops
from .policies.recipes import is_fp8
from .events import Event, Outcome, short_dtype
from .log import decision
from .policies.policy import CastPolicy

__all__ = ["Recorder", "PrecisionReport", "Row"]

_LOWER_DTYPES = (torch.bfloat16, torch.float16)
_PRUNE_AT = 4096

#: Composites that decompose into the registry's matmul/conv/attention ops. Packets the
#: registry names directly (mm, addmm, bmm, convolution, ...) are added below.
_FLOP_COMPOSITES = frozenset(
    {
        "linear",
        "matmul",
        "bilinear",
        "einsum",
        "tensordot",
        "addbmm",
        "chain_matmul",
        "linalg_multi_dot",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "conv_tbc",
        "scaled_dot_product_attention",
    }
)
_FLOP_OPS = _FLOP_COMPOSITES | frozenset(
    getattr(p, "_qualified_op_name", str(p)).split("::")[-1] for p in flop_registry
)


@dataclass
class Row:
    """Calls of one op overload with one decision and one dtype signature."""

    op: str
    action: str
    inputs: str  #: ``f32,f32``
    compute: str  #: ``bf16``
    calls: int = 0
    casts: int = 0
    cast_bytes: int = 0
    flops: Optional[int] = None  #: ``None`` for ops that are not matmul/conv-like

    @property
    def dtypes(self) -> str:
        return f"{self.inputs} -> {self.compute}"


class _FlopCounter(TorchDispatchMode):
    """Sums ``flop_registry``'s formulas over the ATen calls it sees (run on meta tensors)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # No torch._dynamo.disable wrapper around the handler (it imports Dynamo, seconds, at the
        # first call): it runs inside an observer, and observing regions run compiled code
        # eagerly (_compile_guard), so Dynamo never traces it.
        return False

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(_torch.overload_packet(func))
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def _meta(x, dtype: Optional[torch.dtype] = None):
    """A meta tensor of ``x``'s shape; floating ones in ``dtype`` where given (the compute dtype)."""
    if not isinstance(x, torch.Tensor):
        return x
    if dtype is not None and x.is_floating_point():
        return torch.empty_like(x, device="meta", dtype=dtype)
    return torch.empty_like(x, device="meta")


def _signature(x):
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape))
    if isinstance(x, (list, tuple)):
        return tuple(_signature(a) for a in x)
    return x


def _flops(op, args: tuple, kwargs: dict, compute: Optional[torch.dtype] = None) -> Optional[int]:
    """FLOPs of ``op(*args, **kwargs)`` by the registry's formulas, from shapes alone, with its
    floating arguments in ``compute`` (the dtype the call ran in). Observers run with the engine
    switched off, so this meta run is not cast or reported."""
    dtype = compute if compute is not None and compute.is_floating_point else None
    margs, mkwargs = tree_map(lambda x: _meta(x, dtype), (args, kwargs))
    try:
        with _FlopCounter() as counter:
            op(*margs, **mkwargs)
    except Exception:  # a kernel with no meta implementation: the FLOPs are unknown
        return None
    return counter.total


class Recorder:
    """An observer that tallies engine events into a report. Pass it as
    ``HpuAutocastMode(observer=...)`` (``record=True`` does) and call ``report()`` afterwards.

    Cheap: a dictionary update per event, and a shapes-only rerun for matmul/conv-like calls
    (see the note at the top of this module)."""

    def __init__(self, policy: Optional[str] = None, dtype: Optional[torch.dtype] = None, recipe=None) -> None:
        self.rows: Dict[tuple, Row] = {}
        self.policy = policy
        self.dtype = dtype
        self.recipe = recipe  # an fp8 region's scaling recipe (Policy.fp8), shown beside its dtype
        self._fp8_products: Dict[str, None] = {}  # which fp8 products ran: "emulated", "_scaled_mm"
        self._warnings: Dict[tuple, list] = {}  # key -> [message, count, {op: None}]
        self._casts: Dict[Tuple[int, torch.dtype], list] = {}  # (id, dtype) -> [ref, count, ops, version]
        self._prune_at = _PRUNE_AT
        self._flop_cache: Dict[tuple, Optional[int]] = {}
        #: Per module a ``modules=`` map matched: its override, forward calls, op calls by compute dtype.
        self.modules: Dict[str, dict] = {}

    def note_module(self, name: str, override: str) -> None:
        """A forward of the module ``name``, which a ``modules=`` map runs under ``override``."""
        entry = self.modules.get(name)
        if entry is None:
            entry = self.modules[name] = {"override": override, "forwards": 0, "calls": {}}
        entry["forwards"] += 1

    def __call__(self, event: Event) -> None:
        name = event.name
        if event.module is not None:
            calls = self.modules.setdefault(event.module, {"override": "?", "forwards": 0, "calls": {}})["calls"]
            compute = short_dtype(event.compute)
            calls[compute] = calls.get(compute, 0) + 1
        action = decision(event)
        key = (name, action, event.inputs, event.compute)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = Row(
                name, action, ",".join(map(short_dtype, event.inputs)), short_dtype(event.compute)
            )
        row.calls += 1
        row.casts += event.new_casts
        row.cast_bytes += event.cast_bytes
        for c in event.casts:
            if not c.cached:
                self._note_cast(c.tensor, c.to_dtype, name)
        if _ops.op_base_name(event.op) in _FLOP_OPS:
            f = self._flops_of(event.op, event.args, event.kwargs, event.compute)
            if f is not None:
                row.flops = (row.flops or 0) + f
            else:
                self._warn(("flops", name), f"{name}: FLOPs unknown (no meta kernel); not counted")
        if event.compute is torch.float8_e4m3fn:  # _fp8.route's reason says an emulated product
            self._fp8_products["emulated" if event.reason == _fp8.EMULATED else "_scaled_mm"] = None
        if event.reason and event.reason.startswith("fp8 fallback"):  # _fp8.route: a GEMM in bf16
            self._warn(
                ("fp8", name, event.reason),
                f"{name} ran in {short_dtype(event.compute)}, not fp8: {event.reason[len('fp8 fallback: ') :]}",
            )
        self._check(event, action)

    def _flops_of(self, op, args, kwargs, compute: Optional[torch.dtype]) -> Optional[int]:
        # FLOPs depend on shapes and the non-tensor arguments alone: one shape run per signature.
        try:
            key = (op, _signature(args), _signature(tuple(kwargs.items())))
            hash(key)
        except TypeError:
            return _flops(op, args, kwargs, compute)
        if key not in self._flop_cache:
            self._flop_cache[key] = _flops(op, args, kwargs, compute)
        return self._flop_cache[key]

    def _note_cast(self, t: torch.Tensor, target: torch.dtype, op: str) -> None:
        # A repeat is the same tensor, unchanged since (same version), cast again: weights
        # that an optimizer step updated in between are cast anew, rightly.
        key = (id(t), target)
        entry = self._casts.get(key)
        if entry is None or entry[0]() is not t or entry[3] != _torch.version_counter(t):
            if len(self._casts) >= self._prune_at:  # long recordings: forget freed tensors
                self._casts = {k: v for k, v in self._casts.items() if v[0]() is not None}
                self._prune_at = max(_PRUNE_AT, 2 * len(self._casts))
            self._casts[key] = [weakref.ref(t), 1, [op], _torch.version_counter(t)]
            return
        entry[1] += 1
        # One warning per kind of tensor, not per tensor: a training loop repeats its casts.
        desc = f"{short_dtype(t.dtype)}{list(t.shape)}"
        self._warn(
            ("recast", desc, target),
            f"{desc} tensor cast to {short_dtype(target)} again while unchanged: "
            "{n} extra cast(s) (by {ops}); cast it once and reuse the copy",
            entry[2][0],
            op,
        )
        entry[2].append(op)

    def _check(self, event: Event, action: str) -> None:
        if event.outcome is Outcome.UNLISTED:
            # Zero-dimensional tensors do not take part in promotion against dimensioned ones.
            mixed = {t.dtype for t in _tensors(event.args, event.kwargs) if t.is_floating_point() and t.dim() > 0}
            if len(mixed) > 1:
                names = ",".join(short_dtype(t) for t in sorted(mixed, key=str))
                self._warn(
                    ("mixed", event.name),
                    f"{event.name} is on no list and got mixed floating dtypes "
                    f"({names}): it runs in {short_dtype(event.compute)} by type promotion; list it to decide",
                )
        elif event.action is CastPolicy.FP32 and event.outcome is Outcome.CAST:
            low = sorted({short_dtype(t) for t in event.inputs if t in _LOWER_DTYPES})
            if low:
                self._warn(
                    ("fp32-fed", event.name),
                    f"{event.name} (fp32 list) got {','.join(low)} input: it "
                    "computes in f32 from values already rounded; move their producer to the fp32 list "
                    "if that matters",
                )

    def _warn(self, key: tuple, message: str, *ops: str) -> None:
        # message may name {n} (how many times) and {ops} (the ops involved); otherwise a
        # count above one is appended at report time.
        entry = self._warnings.get(key)
        if entry is None:
            entry = self._warnings[key] = [message, 0, {}]
        entry[1] += 1
        entry[2].update(dict.fromkeys(ops))

    def report(self) -> "PrecisionReport":
        """What was recorded so far, as a ``PrecisionReport`` (a snapshot)."""
        rows = [Row(**asdict(r)) for r in self.rows.values()]
        warnings = []
        for m, n, ops in self._warnings.values():
            if "{n}" in m:
                warnings.append(m.format(n=n, ops=", ".join(ops)))
            else:
                warnings.append(m if n == 1 else f"{m} ({n} calls)")
        dtype = short_dtype(self.dtype) if self.dtype else None
        if dtype and self.recipe is not None:
            ran = "; " + ", ".join(self._fp8_products) if self._fp8_products else ""
            dtype = f"{dtype} ({self.recipe}{ran})"
        # The C++ core decides no call of an fp8 region (its GEMMs are _fp8's), so the Python
        # kernels run that region whatever engine this process has.
        engine = "python" if is_fp8(self.dtype) else None
        report = PrecisionReport(rows, warnings, self.policy, dtype, engine)
        report.modules = {k: {**v, "calls": dict(v["calls"])} for k, v in self.modules.items()}
        return report


def _tensors(args: tuple, kwargs: dict):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, torch.Tensor))
    for k, v in kwargs.items():
        if k != "out" and isinstance(v, torch.Tensor):
            yield v


def _table(header: List[str], rows: List[List[str]], right: set) -> List[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for r in [header, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
    return out


class PrecisionReport:
    """What ran in which dtype in one recording. ``str()`` is a readable table;
    ``to_json()``, ``to_markdown()`` and ``plot(path)`` give the same data in other forms."""

    def __init__(
        self,
        rows: List[Row],
        warnings: List[str],
        policy: Optional[str],
        dtype: Optional[str],
        engine: Optional[str] = None,
    ) -> None:
        self.rows = rows
        self.warnings = warnings
        self.policy = policy
        self.dtype = dtype
        #: Which engine runs this process's regions that do not observe (``hpu_autocast.ENGINE``):
        #: ``"c++"`` or ``"python"``. A recording observes, so the Python kernels decided its calls
        #: (the same rules either way).
        self.engine = engine if engine is not None else _core.ENGINE
        #: Per module a ``modules=`` map matched (``Recorder.modules``); empty without a map.
        self.modules: Dict[str, dict] = {}

    # -- totals -------------------------------------------------------------------------
    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.rows)

    @property
    def casts(self) -> int:
        return sum(r.casts for r in self.rows)

    @property
    def cast_bytes(self) -> int:
        return sum(r.cast_bytes for r in self.rows)

    @property
    def flops_by_dtype(self) -> Dict[str, int]:
        """Matmul/conv FLOPs per compute dtype (``{"bf16": 48}``)."""
        out: Dict[str, int] = {}
        for r in self.rows:
            if r.flops:
                out[r.compute] = out.get(r.compute, 0) + r.flops
        return out

    @property
    def lower_flop_share(self) -> Optional[float]:
        """The share of matmul/conv FLOPs that ran in bfloat16, float16 or fp8 (``None``: no FLOPs)."""
        by = self.flops_by_dtype
        total = sum(by.values())
        if not total:
            return None
        return sum(v for k, v in by.items() if k in ("bf16", "f16", "f8e4m3")) / total

    def by_op(self) -> Dict[str, dict]:
        """Per op overload: calls, and calls by action and by dtype signature."""
        out: Dict[str, dict] = {}
        for r in self.rows:
            e = out.setdefault(r.op, {"calls": 0, "by_action": {}, "by_dtypes": {}, "casts": 0, "cast_bytes": 0})
            e["calls"] += r.calls
            e["by_action"][r.action] = e["by_action"].get(r.action, 0) + r.calls
            e["by_dtypes"][r.dtypes] = e["by_dtypes"].get(r.dtypes, 0) + r.calls
            e["casts"] += r.casts
            e["cast_bytes"] += r.cast_bytes
        return out

    # -- renderings ---------------------------------------------------------------------
    def _summary(self) -> List[str]:
        lines = [f"casts inserted: {self.casts} ({self.cast_bytes} bytes)"]
        by = self.flops_by_dtype
        if by:
            total = sum(by.values())
            parts = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
            lines.append(f"matmul/conv FLOPs: {total} ({parts})")
        else:
            lines.append("matmul/conv FLOPs: none")
        return lines

    def _cells(self) -> List[List[str]]:
        return [
            [
                r.op,
                r.action,
                r.dtypes,
                str(r.calls),
                str(r.casts),
                str(r.cast_bytes),
                "-" if r.flops is None else str(r.flops),
            ]
            for r in self.rows
        ]

    _HEADER = ["op", "action", "dtypes", "calls", "casts", "cast bytes", "FLOPs"]

    def __str__(self) -> str:
        head = (
            f"hpu_autocast precision report: policy {self.policy or '?'}, dtype {self.dtype or '?'}, "
            f"engine {self.engine}"
        )
        lines = [head, *_table(self._HEADER, self._cells(), {3, 4, 5, 6}), "", *self._summary()]
        if self.modules:
            lines += ["", *self._module_lines()]
        if self.warnings:
            lines += ["warnings:", *(f"  - {w}" for w in self.warnings)]
        return "\n".join(lines)

    def _module_lines(self) -> List[str]:
        """The by-module section: each module a ``modules=`` map matched, its override, forwards
        and the policy calls decided in it by compute dtype (a float32 or off module decides none)."""
        cells = [
            [
                name or "(model)",
                e["override"],
                str(e["forwards"]),
                ", ".join(f"{d} {n}" for d, n in sorted(e["calls"].items())) or "-",
            ]
            for name, e in self.modules.items()
        ]
        return ["by module:", *_table(["module", "runs as", "forwards", "calls by dtype"], cells, {2})]

    def to_markdown(self) -> str:
        lines = [
            f"**hpu_autocast precision report**: policy `{self.policy}`, dtype `{self.dtype}`, engine `{self.engine}`",
            "",
            "| " + " | ".join(self._HEADER) + " |",
            "| " + " | ".join("---:" if i >= 3 else "---" for i in range(len(self._HEADER))) + " |",
        ]
        for c in self._cells():
            c = [f"`{c[0]}`", *c[1:]]
            lines.append("| " + " | ".join(x.replace("|", "\\|") for x in c) + " |")
        lines += ["", *(f"- {s}" for s in self._summary())]
        if self.warnings:
            lines += ["", "Warnings:", "", *(f"- {w}" for w in self.warnings)]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "dtype": self.dtype,
            "engine": self.engine,
            "rows": [asdict(r) for r in self.rows],
            "casts": self.casts,
            "cast_bytes": self.cast_bytes,
            "flops_by_dtype": self.flops_by_dtype,
            "lower_flop_share": self.lower_flop_share,
            "warnings": list(self.warnings),
            **({"modules": self.modules} if self.modules else {}),
        }

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def plot(self, path) -> None:
        """Write a PNG or SVG (by ``path``'s suffix): matmul/conv FLOPs and op calls by compute
        dtype, and the ops that cast most. Needs matplotlib (``pip install matplotlib``)."""
        try:
            from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
        except ImportError:
            raise ImportError("PrecisionReport.plot needs matplotlib: pip install matplotlib") from None
        calls: Dict[str, int] = {}
        for r in self.rows:
            calls[r.compute] = calls.get(r.compute, 0) + r.calls
        casts: Dict[str, int] = {}
        for r in self.rows:
            casts[r.op] = casts.get(r.op, 0) + r.casts
        top = sorted(((n, op) for op, n in casts.items() if n), reverse=True)[:10]
        flops = self.flops_by_dtype
        fig = Figure(figsize=(13, 3.8))
        axes = fig.subplots(1, 3)
        axes[0].bar(list(flops), list(flops.values()), color="#4c72b0")
        axes[0].set_title("matmul/conv FLOPs by dtype")
        axes[1].bar(list(calls), list(calls.values()), color="#55a868")
        axes[1].set_title("op calls by compute dtype")
        axes[2].barh([op for _, op in top][::-1], [n for n, _ in top][::-1], color="#c44e52")
        axes[2].set_title("top ops by casts inserted")
        fig.suptitle(f"hpu_autocast: policy {self.policy}, dtype {self.dtype}")
        fig.tight_layout()
        fig.savefig(str(path))

    def __repr__(self) -> str:
        return f"PrecisionReport({len(self.rows)} rows, {self.casts} casts, {len(self.warnings)} warnings)"

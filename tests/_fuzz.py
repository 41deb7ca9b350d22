"""The differential fuzzer's programs, their interpreter and the comparison of two runs
(tests/test_fuzz_differential.py draws the programs and runs each twice).

A program is a short list of steps over a pool of 4x4 tensors: ops and module calls (each an
expression over operands ``a``, ``b``, ``c`` picked from the pool, its result appended to it),
events (statements: ``.data`` and NumPy writes, ``requires_grad_`` toggles, backward, guard
queries) and blocks (``no_grad``, ``inference_mode``, nested ``torch.autocast``,
``disable_casts``, a worker thread) holding steps of their own. It runs twice from identical
initial tensors: once inside native ``torch.autocast("cpu", dtype=...)`` and once inside
``HpuAutocastMode(dtype, policy="torch-cpu")``, the blocks spelled each side's way (``SPELLINGS``).
Every step leaves a record in a trace (the result's dtype, shape, strides, autograd metadata and
bits; the exception type it raised; the guards' answers), and after the program the final value
and ``.grad`` of every leaf. Two traces must be equal, bit for bit.

[Note: the program text is what runs]
Ops, events and block openers are Python source templates, evaluated with the operands bound to
their names. The text a failure prints (``Run.lines``, operands named ``t0``, ``t5``, ...) is
therefore exactly what ran, and a shrunk example pastes into a script as it is (after
``setup_source()``), but for ``with worker_thread(...):``, which stands for its body run in a
new thread started and joined there.

[Note: operands by position in the live pool]
A step names its operands by integers: 0 to 5 are the six starting tensors, -1 to -3 the three
latest results (an op that raised adds none; before there are any, the starting tensors from the
last). So every drawn program is runnable, results feed later steps, and hypothesis shrinks
operands towards the first tensor, ``w0``. The pool grows the same way in both runs until they
differ, which is the first difference reported.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
import threading
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint

import hpu_autocast
from hpu_autocast import HpuAutocastMode

NATIVE, OURS = "native", "ours"
DTYPES = (torch.bfloat16, torch.float16)
_DTYPE_NAMES = {torch.bfloat16: "torch.bfloat16", torch.float16: "torch.float16", None: "None"}

# --- ops: expressions over the operands a, b, c --------------------------------------------------
# Every operand is 4x4; every op gives a 4x4 result (views and expands bring other shapes back),
# so any op composes with any other. Groups follow torch-cpu's lists (presets/torch_amp_cpu.py).
# Excluded: ops whose CPU kernels are not deterministic run to run (none of these are: 4x4 GEMMs
# and convolutions run single-threaded through oneDNN/MKL, the same code path each time) and
# random ops (dropout, which would need the RNG state copied between the runs).
LOWER_OPS: Dict[str, str] = {
    # lower (GEMMs, convolutions, attention): what the cast cache serves
    "mm": "torch.mm(a, b)",
    "mm_slices": "torch.mm(a[:, :2], b[:2])",
    "mm_t": "torch.mm(a.t(), b)",
    "addmm": "torch.addmm(c, a, b)",
    "addmm_row": "torch.addmm(c[0], a, b)",
    "linear": "F.linear(a, b)",
    "linear_bias": "F.linear(a, b, c[0])",
    "matmul": "a @ b",
    "matmul_t": "torch.matmul(a, b.t())",
    "bmm": "torch.bmm(a[None], b[None])[0]",
    "baddbmm": "torch.baddbmm(c[None], a[None], b[None])[0]",
    "addbmm": "torch.addbmm(c, a[None], b[None])",
    "conv1d": "F.conv1d(a[None], b[:, :, None])[0]",
    "conv2d": "F.conv2d(a[None, None], b[:3, :3][None, None], padding=1)[0, 0]",
    "prelu": "F.prelu(a, b[0])",
    "sdpa": "F.scaled_dot_product_attention(a[None], b[None], c[None])[0]",
    "vecdot": "torch.linalg.vecdot(a, b).expand(4, 4)",
    "lin": "lin(a)",
    "conv": "conv(a[None])[0]",
}

OPS: Dict[str, str] = {
    **LOWER_OPS,
    # fp32 (losses, reductions)
    "mse": "F.mse_loss(a, b, reduction='none')",
    "mse_mean": "F.mse_loss(a, b).expand(4, 4)",
    "smooth_l1": "F.smooth_l1_loss(a, b, reduction='none')",
    "bce_logits": "F.binary_cross_entropy_with_logits(a, b.sigmoid(), reduction='none')",
    "prod": "torch.prod(a, 1, keepdim=True).expand(4, 4)",
    "cdist": "torch.cdist(a, b)",
    "trace": "torch.trace(a).expand(4, 4)",
    # promote
    "cat": "torch.cat([a[:2], b[2:]])",
    "stack": "torch.stack([a[0], b[1], c[2], a[3]])",
    "index_copy": "a.index_copy(0, IDX, b[:2])",
    # on no list
    "add": "a + b",
    "mul": "a * b",
    "relu": "torch.relu(a)",
    "tanh": "a.tanh()",
    "softmax": "F.softmax(a, -1)",
    "log_softmax": "F.log_softmax(a, -1)",
    "layer_norm": "F.layer_norm(a, (4,))",
    "layer_norm_affine": "F.layer_norm(a, (4,), b[0], c[0])",
    "ln": "ln(a)",
    "gelu": "F.gelu(a)",
    "where": "torch.where(M, a, b)",
    "sum": "a.sum(0, keepdim=True).expand(4, 4)",
    "float": "a.float()",
    "bfloat16": "a.bfloat16()",
    "half": "a.half()",
    "double": "a.double()",
    "clone": "a.clone()",
    "detach": "a.detach()",
    # views
    "t": "a.t()",
    "transpose": "a.transpose(0, 1)",
    "view": "a.view(16).view(4, 4)",
    "expand_row": "a[0].expand(4, 4)",
    "unsqueeze": "a.unsqueeze(0).squeeze(0)",
    "data": "a.data",
    # in-place and out=
    "add_": "a.add_(b)",
    "mul_": "a.mul_(b)",
    "scale_": "a.mul_(0.5)",
    "addmm_": "a.addmm_(b, c)",
    "copy_": "a.copy_(b)",
    "relu_": "a.relu_()",
    "clamp_": "a.clamp_(-1, 1)",
    "t_": "a.t_()",
    "view_add_": "(a[:2].add_(b[:2]), a)[1]",  # in place through a view; the result is a
    "mm_out": "torch.mm(a, b, out=c)",
    "add_out": "torch.add(a, b, out=c)",
    # compiled functions (a fixed few, shared by all examples: see COMPILED)
    "compiled_mm": "compiled_mm(a, b)",
    "compiled_linear": "compiled_linear(a, b)",
    "compiled_guarded": "compiled_guarded(a, b)",
    # TorchScript: scripted afresh for each run (so both runs meet the profiling executor at
    # the same calls); the JIT casts with its own lists (mv lowered) and rewrites addmm
    "scripted": "scripted(a, b)",
    # checkpointing: recomputed in backward, maybe after the region has exited
    "checkpoint": "checkpoint(mm_relu, a, b, use_reentrant=False)",
    "checkpoint_reentrant": "checkpoint(mm_relu, a, b, use_reentrant=True)",
    # higher-order operators: a branch, a loop body. Their operands are detached: their backward
    # traces them again when it runs, under native autocast's dtype of that moment (bfloat16
    # after a float16 block), where a region's takes the forward's: a departure docs/design.md
    # documents (Higher-order operators); tests/test_higher_order_ops.py checks their backward.
    # And copied: Dynamo refuses operands that alias (a is b), but only when it traces, so a
    # side whose call it had cached from other operands would run while the other raised.
    "cond": "torch.cond(a.sum() > 0, branch_mm, branch_mm_t, (a.detach().clone(), b.detach().clone()))[0]",
    "map": "hop_map(row_mm, a.detach().clone(), b.detach().clone())",
}

# --- events: statements over the operands --------------------------------------------------------
EVENTS: Dict[str, str] = {
    # writes that bypass the version counter, and writes that do not
    "data_mul": "a.data.mul_(2)",
    "data_assign": "a.data = b.detach().clone()",
    "numpy_fill": "a.detach().numpy()[:] = 1.5",
    "numpy_add": "a.detach().numpy()[:] += 1",
    "dlpack_mul": "torch.from_dlpack(a.detach()).mul_(3)",
    "detach_mul": "a.detach().mul_(2)",
    # autograd
    "freeze": "a.requires_grad_(False)",
    "unfreeze": "a.requires_grad_(True)",
    "backward": "a.sum().backward(retain_graph=True)",
    "zero_grad": "a.grad = None",
    # an optimizer step inside the region (in place, under no_grad; casting off under the package)
    "sgd_step": "torch.optim.SGD([a], lr=0.5).step()",
    # the guards code written for torch.autocast asks (the deprecated per-device getters
    # are left out: docs/design.md lists them as not faithful, by design)
    "guards": "GUARDS()",
}

#: Block openers for each side; ``{dtype}``, ``{enabled}``, ``{cache}`` are the block's parameters.
SPELLINGS: Dict[str, Dict[str, str]] = {
    "no_grad": {NATIVE: "torch.no_grad()", OURS: "torch.no_grad()"},
    "enable_grad": {NATIVE: "torch.enable_grad()", OURS: "torch.enable_grad()"},
    "inference_mode": {NATIVE: "torch.inference_mode()", OURS: "torch.inference_mode()"},
    # native autocast nested in the region (on, off, cache on or off), the same text both sides
    "autocast": {
        NATIVE: 'torch.autocast("cpu", dtype={dtype}, enabled={enabled}, cache_enabled={cache})',
        OURS: 'torch.autocast("cpu", dtype={dtype}, enabled={enabled}, cache_enabled={cache})',
    },
    # the package's opt-outs: native's is torch.autocast(enabled=False)
    "disable_casts": {NATIVE: 'torch.autocast("cpu", enabled=False)', OURS: "hpu_autocast.disable_casts()"},
    "mode_off": {NATIVE: 'torch.autocast("cpu", enabled=False)', OURS: "HpuAutocastMode(enabled=False)"},
    # a region nested in the region (or opened after it): native's is torch.autocast
    "region": {
        NATIVE: 'torch.autocast("cpu", dtype={dtype}, cache_enabled={cache})',
        OURS: 'HpuAutocastMode({dtype}, policy="torch-cpu", cache_enabled={cache})',
    },
    # the deprecated per-device spelling (torch.autocast underneath), and an opt-out for another
    # device type, which leaves CPU casting on
    "cpu_amp": {
        NATIVE: "torch.cpu.amp.autocast(dtype={dtype}, cache_enabled={cache})",
        OURS: "torch.cpu.amp.autocast(dtype={dtype}, cache_enabled={cache})",
    },
    "cuda_off": {NATIVE: 'torch.autocast("cuda", enabled=False)', OURS: 'torch.autocast("cuda", enabled=False)'},
    # a worker thread started in the block and joined at its end; `copy` runs it in a copy of
    # the spawning context (as asyncio.to_thread and contextvars-aware pools do)
    "thread": {NATIVE: "worker_thread(copy_context={copy})", OURS: "worker_thread(copy_context={copy})"},
}

_OPERAND = re.compile(r"\b[abc]\b")


def _operands(template: str) -> List[str]:
    return sorted(set(_OPERAND.findall(template)))


# --- steps and programs --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Op:
    """``t<n> = <OPS[name]>``: the result joins the pool."""

    name: str
    args: Tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Event:
    """``<EVENTS[name]>``: a statement; ``guards`` records the guards' answers."""

    name: str
    args: Tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Block:
    """``with <SPELLINGS[kind][side]>:`` over ``body``."""

    kind: str
    params: Tuple[Tuple[str, Any], ...]
    body: Tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Program:
    """``body`` runs inside the region (``dtype``, ``cache``), ``after`` after it has exited."""

    seed: int
    dtype: torch.dtype
    cache: bool
    body: Tuple[Any, ...]
    after: Tuple[Any, ...]


# --- what runs around the steps ------------------------------------------------------------------
def mm_relu(a, b):
    return torch.mm(a, b).relu()


def branch_mm(a, b):
    return (torch.mm(a, b).relu(),)


def branch_mm_t(a, b):
    return (torch.mm(b, a),)


def row_mm(x, b):
    return torch.mm(x[None], b)[0]


def _compiled_mm(a, b):
    return torch.mm(a, b).relu()


def _compiled_linear(a, b):
    return F.linear(a, b).softmax(-1)


def _compiled_guarded(a, b):
    # A branch on the guards: compiled code must be guarded on the region's state.
    if torch.is_autocast_enabled("cpu"):
        return torch.mm(a, b) * 2
    return torch.mm(a, b)


def _hop_map(fn, xs, *args):
    from torch._higher_order_ops.map import map as hop_map

    return hop_map(fn, xs, *args)


_compiled: Dict[str, Any] = {}


def compiled_functions() -> Dict[str, Any]:
    """The compiled functions, made once per process (dynamic=False). Each meets a handful of
    guard states per dtype (grad mode, inference mode, the region's state, its inputs' dtypes and
    requires_grad): runs raise Dynamo's recompile limit of 8, past which it would run them
    eagerly, silently (both sides alike, but then nothing compiled is compared)."""
    if not _compiled:
        _compiled.update(
            compiled_mm=torch.compile(_compiled_mm, backend="eager", dynamic=False),
            compiled_linear=torch.compile(_compiled_linear, backend="aot_eager", dynamic=False),
            compiled_guarded=torch.compile(_compiled_guarded, backend="eager", dynamic=False),
        )
    return _compiled


def _scripted_body(a, b):
    return torch.addmm(a, a, b) + torch.mv(b, a[0]).unsqueeze(0) + F.linear(a, b)


class _ScriptedOnFirstCall:
    """``torch.jit.script`` of a new copy of ``_scripted_body``, made at the run's first call: a
    fresh executor per run (torch.jit.script caches by function object)."""

    def __init__(self) -> None:
        self.fn = None

    def __call__(self, a, b):
        if self.fn is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                body = _scripted_body
                self.fn = torch.jit.script(type(body)(body.__code__, body.__globals__, body.__name__))
        return self.fn(a, b)


def _recompile_limits():
    """Raise Dynamo's recompile limits in this thread (see ``compiled_functions``)."""
    import torch._dynamo

    config = torch._dynamo.config
    if hasattr(config, "recompile_limit"):
        return config.patch(recompile_limit=256, accumulated_recompile_limit=4096)
    return config.patch(cache_size_limit=256, accumulated_cache_size_limit=4096)  # torch < 2.6's names


#: Blocks that set autocast state; the package's disabled regions among them.
_OWNERS = ("region", "autocast", "disable_casts", "mode_off", "cpu_amp")
_DISABLED = ("disable_casts", "mode_off")
# docs/design.md, "three cases are not [faithful]": a disabled region owns no autocast state, so
# get_autocast_dtype there is torch's, where native's disabled torch.autocast reports its dtype.
_NOT_COMPARED = "(not compared: a disabled region's dtype, docs/design.md)"


def GUARDS() -> Tuple[Tuple[str, Any], ...]:  # noqa: N802 (it is a name in the program text)
    """The answers of the guards that code written for torch.autocast asks."""
    return (
        ("is_autocast_enabled('cpu')", torch.is_autocast_enabled("cpu")),
        ("get_autocast_dtype('cpu')", torch.get_autocast_dtype("cpu")),
        ("is_autocast_cache_enabled()", torch.is_autocast_cache_enabled()),
        ("is_autocast_enabled()", torch.is_autocast_enabled()),
        ("_is_any_autocast_enabled()", torch._C._is_any_autocast_enabled()),
    )


LEAVES = ("w0", "w1", "x", "buf", "xd", "h")


def initial_state(seed: int) -> Tuple[Dict[str, torch.Tensor], Dict[str, nn.Module]]:
    """The program's starting tensors (weights w0, w1 that require grad; an input x; a buffer buf;
    a float64 input xd; a bfloat16 weight h) and modules (lin, conv, ln), from ``seed``. ``w0`` is
    ``lin``'s weight: a weight used both by a module call and directly, which the steps can
    freeze or write."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    tensors = {
        "w0": randn(4, 4),
        "w1": randn(4, 4).requires_grad_(),
        "x": randn(4, 4),
        "buf": randn(4, 4),
        "xd": randn(4, 4).double(),
        "h": randn(4, 4).bfloat16().requires_grad_(),
    }
    modules = {"lin": nn.Linear(4, 4), "conv": nn.Conv1d(4, 4, 1), "ln": nn.LayerNorm(4)}
    with torch.no_grad():
        for m in modules.values():
            for p in m.parameters():
                p.copy_(randn(*p.shape))
    modules["lin"].weight = tensors["w0"] = nn.Parameter(tensors["w0"])
    return tensors, modules


def setup_source(program: Program) -> str:
    """The lines that make a program's initial state, for a pasted repro."""
    return (
        f"tensors, modules = initial_state({program.seed})  # tests/_fuzz.py\n"
        "t0, t1, t2, t3, t4, t5 = tensors.values()  # w0, w1, x, buf, xd, h\n"
        "lin, conv, ln = modules.values()"
    )


# --- the records of a run ------------------------------------------------------------------------
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclasses.dataclass(frozen=True)
class Seen:
    """A tensor as a step left it: metadata and a copy of its bits."""

    dtype: torch.dtype
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    requires_grad: bool
    is_leaf: bool
    grad_fn: Optional[str]
    is_inference: bool
    bits: torch.Tensor = dataclasses.field(repr=False, compare=False)

    @classmethod
    def of(cls, t: torch.Tensor) -> "Seen":
        with torch.inference_mode(False), torch.no_grad():
            bits = t.detach().clone().contiguous()
        bits = bits.view(_BITS[bits.element_size()]) if bits.dtype != torch.bool else bits
        try:  # autograd refuses to say for a no_grad view whose base was changed in place since
            grad_fn = type(t.grad_fn).__name__ if t.grad_fn is not None else None
        except RuntimeError:
            grad_fn = "(raises RuntimeError)"
        return cls(
            t.dtype, tuple(t.shape), t.stride(), t.requires_grad, grad_fn is None, grad_fn, t.is_inference(), bits
        )

    def same(self, other: "Seen") -> bool:
        return self == other and torch.equal(self.bits, other.bits)

    def describe(self) -> str:
        values = self.bits.view(self.dtype) if self.dtype != torch.bool else self.bits
        return f"{self} values={values.flatten()[:6].tolist()}"


@dataclasses.dataclass
class Record:
    where: str  # the step's text (side-neutral: blocks by kind)
    what: Any  # a Seen, a Raised, guard answers, or None


@dataclasses.dataclass(frozen=True)
class Raised:
    """A step raised an exception of this type."""

    type: type

    def __repr__(self) -> str:
        return f"raises {self.type.__module__}.{self.type.__qualname__}"


def same(native: Any, ours: Any) -> bool:
    """Whether ours is what native gave: the same guard answer, the same tensor bit for bit, or
    an exception that every ``except`` clause catching native's catches (its type or a subclass:
    the package raises ``PromoteError(RuntimeError)`` with a message that says what to do where
    torch raises a bare ``RuntimeError``)."""
    if isinstance(native, Seen) and isinstance(ours, Seen):
        return native.same(ours)
    if isinstance(native, Raised) and isinstance(ours, Raised):
        return issubclass(ours.type, native.type)
    if isinstance(native, tuple) and isinstance(ours, tuple):
        return len(native) == len(ours) and all(same(n, o) for n, o in zip(native, ours))
    return type(native) is type(ours) and native == ours


def _show(x: Any) -> str:
    if isinstance(x, Seen):
        return x.describe()
    if isinstance(x, tuple):
        return "(" + ", ".join(_show(v) for v in x) + ")"
    return repr(x)


def first_difference(native: List[Record], ours: List[Record]) -> Optional[str]:
    """Where two traces first differ, said in full; None if they are equal bit for bit."""
    found = _first(native, ours)
    return found[1] if found else None


def _first(native: List[Record], ours: List[Record]) -> Optional[Tuple[str, str]]:
    """(what kind of difference, where and what) of the first difference, or None."""
    for i, (n, o) in enumerate(zip(native, ours)):
        if n.where != o.where:
            return "order", f"record {i}: native ran {n.where!r}, ours {o.where!r}"
        if not same(n.what, o.what):
            return _kind(n.what, o.what), (
                f"record {i}, {n.where}:\n  native: {_show(n.what)}\n"
                f"  ours:   {_show(o.what)}{_where_bits_differ(n.what, o.what)}"
            )
    if len(native) != len(ours):
        return "length", f"native left {len(native)} records, ours {len(ours)}"
    return None


def _where_bits_differ(native: Any, ours: Any) -> str:
    if not (isinstance(native, Seen) and isinstance(ours, Seen) and native == ours):
        return ""
    i = int((native.bits.flatten() != ours.bits.flatten()).nonzero()[0])
    n, o = (
        x.bits.view(x.dtype).flatten()[i].item() if x.dtype != torch.bool else bool(x.bits.flatten()[i])
        for x in (native, ours)
    )
    return f"\n  first differing element: [{i}] native {n!r}, ours {o!r}"


def _kind(native: Any, ours: Any) -> str:
    if isinstance(native, Seen) and isinstance(ours, Seen):
        fields = [
            f.name for f in dataclasses.fields(Seen) if f.compare and getattr(native, f.name) != getattr(ours, f.name)
        ]
        return "tensor " + (",".join(fields) or "bits")
    if isinstance(native, tuple) and isinstance(ours, tuple) and len(native) == len(ours):
        return "guards " + ",".join(n[0] for n, o in zip(native, ours) if not same(n, o))
    return f"{type(native).__name__} vs {type(ours).__name__}"


def difference(program: "Program") -> Optional[Tuple[str, str, "Run"]]:
    """Run ``program`` both ways: (kind, description, our run) of the first difference, or None."""
    native, ours = run_both(program)
    found = _first(native.trace, ours.trace)
    return (*found, ours) if found else None


def _variants(steps: tuple):
    """``steps`` with one step dropped, or one block replaced by its body, or one block's body
    so changed: the candidates of one minimisation round."""
    for i, step in enumerate(steps):
        yield steps[:i] + steps[i + 1 :]
        if isinstance(step, Block):
            yield steps[:i] + step.body + steps[i + 1 :]
            for body in _variants(step.body):
                if body:
                    yield steps[:i] + (dataclasses.replace(step, body=body),) + steps[i + 1 :]


def minimise(program: "Program", kind: str) -> "Program":
    """The smallest program reached by dropping steps and unwrapping blocks one at a time
    while its first difference stays of ``kind`` (hypothesis's shrinker leaves steps whose
    deletion renames the pool behind; this pass does not care)."""
    changed = True
    while changed:
        changed = False
        candidates = [dataclasses.replace(program, after=v) for v in _variants(program.after)]
        candidates += [dataclasses.replace(program, body=v) for v in _variants(program.body)]
        for candidate in candidates:
            found = difference(candidate)
            if found and found[0] == kind:
                program, changed = candidate, True
                break
    return program


# --- the interpreter -----------------------------------------------------------------------------
def _param_text(value: Any) -> str:
    return _DTYPE_NAMES[value] if value is None or isinstance(value, torch.dtype) else repr(value)


class Run:
    """One run of a program on one side; ``trace`` and ``lines`` are what it did."""

    def __init__(self, program: Program, side: str) -> None:
        self.program, self.side = program, side
        tensors, self.modules = initial_state(program.seed)
        self.leaves = dict(tensors)
        self.pool: List[Tuple[str, torch.Tensor]] = [(f"t{i}", t) for i, t in enumerate(tensors.values())]
        self.count = len(self.pool)
        self.trace: List[Record] = []
        self.lines: List[str] = []
        self.names: Dict[str, Any] = {
            "torch": torch,
            "F": F,
            "hpu_autocast": hpu_autocast,
            "HpuAutocastMode": HpuAutocastMode,
            "IDX": torch.tensor([0, 2]),
            "M": torch.arange(16).view(4, 4) % 3 == 0,
            "GUARDS": GUARDS,
            "mm_relu": mm_relu,
            "checkpoint": torch_checkpoint.checkpoint,
            "branch_mm": branch_mm,
            "branch_mm_t": branch_mm_t,
            "row_mm": row_mm,
            "hop_map": _hop_map,
            "scripted": _ScriptedOnFirstCall(),
            **self.modules,
            **compiled_functions(),
        }
        self._lock = threading.Lock()

    # The region around the body, spelled as a block of kind "region".
    def run(self) -> "Run":
        p = self.program
        region = Block("region", (("dtype", p.dtype), ("cache", p.cache)), p.body)
        with warnings.catch_warnings(), _recompile_limits():
            warnings.simplefilter("ignore")
            self._block(region, 0, "", None)
            self._steps(p.after, 0, "after the region", None)
            self._backward_all()
            for name, t in self.leaves.items():
                self._record(f"{name}.grad", t.grad)
                self._record(f"{name} (final)", t)
            for mname, m in self.modules.items():
                for pname, t in m.named_parameters():
                    self._record(f"{mname}.{pname}.grad", t.grad)
            for name, t in self.pool[len(self.leaves) :]:
                self._record(f"{name} (final)", t)
        return self

    def _backward_all(self) -> None:
        """Backward from every result that requires grad, so each program's gradients are
        compared (a copy saved under inference mode, two uses of one cast)."""
        names = [name for name, t in self.pool[len(self.leaves) :] if t.requires_grad and not t.is_inference()]
        if not names:
            return
        text = f"sum(t.float().sum() for t in [{', '.join(names)}]).backward()"
        self.lines.append(text)
        tensors = dict(self.pool)
        try:
            sum(tensors[n].float().sum() for n in names).backward()
        except Exception as e:  # noqa: BLE001
            self._record(f"after the region: {text}", Raised(type(e)))
            return
        self._record(f"after the region: {text}", None)

    def _record(self, where: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            value = Seen.of(value)
        with self._lock:
            self.trace.append(Record(where, value))

    def _bind(self, template: str, args: Tuple[int, int, int]) -> Tuple[str, Dict[str, Any]]:
        with self._lock:
            pool = list(self.pool)
        bound, text = {}, template
        for letter, k in zip("abc", args):
            if letter in _operands(template):
                name, t = pool[k]
                bound[letter] = t
                text = re.sub(rf"\b{letter}\b", name, text)
        return text, bound

    # `context` names the blocks a step runs in; `owner` is the kind of the innermost block that
    # sets autocast state in this thread (region, autocast, disable_casts, mode_off), or None.
    def _steps(self, steps, depth: int, context: str, owner: Optional[str]) -> None:
        for step in steps:
            if isinstance(step, Block):
                self._block(step, depth, context, owner)
            else:
                self._simple(step, depth, context, owner)

    def _simple(self, step, depth: int, context: str, owner: Optional[str]) -> None:
        template = OPS[step.name] if isinstance(step, Op) else EVENTS[step.name]
        text, bound = self._bind(template, step.args)
        if isinstance(step, Op):
            with self._lock:
                name = f"t{self.count}"
                self.count += 1
            text = f"{name} = {text}"
        self.lines.append("    " * depth + text)
        where = f"{context}: {text}"
        try:
            if isinstance(step, Op) or step.name == "guards":
                result = eval(_code(template, "eval"), self.names, bound)
            else:
                result = exec(_code(template, "exec"), self.names, bound)
        except Exception as e:  # noqa: BLE001 (the exception type is the record)
            self._record(where, Raised(type(e)))
            return
        if isinstance(step, Op):
            with self._lock:
                self.pool.append((name, result))
        elif step.name == "guards" and owner in _DISABLED:
            result = tuple((k, _NOT_COMPARED if k.startswith("get_autocast_dtype") else v) for k, v in result)
        self._record(where, result)

    def _block(self, block: Block, depth: int, context: str, owner: Optional[str]) -> None:
        params = dict(block.params)
        opener = SPELLINGS[block.kind][self.side].format(**{k: _param_text(v) for k, v in params.items()})
        neutral = f"{block.kind}({', '.join(f'{k}={_param_text(v)}' for k, v in block.params)})"
        inside = f"{context}/{neutral}" if context else neutral
        shown = f"with {opener}:" + (
            ""
            if self.side == NATIVE
            else f"  # native: {SPELLINGS[block.kind][NATIVE].format(**{k: _param_text(v) for k, v in params.items()})}"
            if SPELLINGS[block.kind][NATIVE] != SPELLINGS[block.kind][OURS]
            else ""
        )
        self.lines.append("    " * depth + shown)
        if block.kind == "thread":
            self._record(f"enter {inside}", None)
            self._thread(block.body, depth + 1, inside, params["copy"])  # a new thread: no owner
            return
        try:
            cm = eval(opener, self.names)
            cm.__enter__()
        except Exception as e:  # noqa: BLE001
            self._record(f"enter {inside}", Raised(type(e)))
            return
        self._record(f"enter {inside}", None)
        if not block.body:  # the region of a minimised program may be left empty
            self.lines.append("    " * (depth + 1) + "pass")
        try:
            self._steps(block.body, depth + 1, inside, block.kind if block.kind in _OWNERS else owner)
        finally:
            try:
                cm.__exit__(None, None, None)
            except Exception as e:  # noqa: BLE001
                self._record(f"exit {inside}", Raised(type(e)))

    def _thread(self, body, depth: int, context: str, copy: bool) -> None:
        failed: List[BaseException] = []

        def target():
            try:
                with _recompile_limits():  # Dynamo's config is per thread
                    self._steps(body, depth, context, None)
            except BaseException as e:  # noqa: BLE001 (re-raised in the spawning thread)
                failed.append(e)

        run = contextvars.copy_context().run if copy else (lambda fn: fn())
        worker = threading.Thread(target=run, args=(target,))
        worker.start()
        worker.join()
        if failed:
            raise failed[0]


_codes: Dict[Tuple[str, str], Any] = {}


def _code(source: str, mode: str):
    key = (source, mode)
    if key not in _codes:
        _codes[key] = compile(source, f"<fuzz {mode}>", mode)
    return _codes[key]


# --- the strategies ------------------------------------------------------------------------------
#: Block kinds, simplest first (hypothesis shrinks a choice towards the first).
KINDS = (
    "no_grad",
    "autocast",
    "disable_casts",
    "inference_mode",
    "thread",
    "region",
    "mode_off",
    "enable_grad",
    "cpu_amp",
    "cuda_off",
)


#: Each block kind's parameters: (name, the values it takes, simplest first).
PARAMS: Dict[str, Tuple[Tuple[str, tuple], ...]] = {
    "autocast": (("dtype", (None, *DTYPES)), ("enabled", (True, False)), ("cache", (True, False))),
    "region": (("dtype", DTYPES), ("cache", (True, False))),
    "cpu_amp": (("dtype", (None, *DTYPES)), ("cache", (True, False))),
    "thread": (("copy", (False, True)),),
}


def _raw_steps(depth: int, min_size: int, max_size: int):
    """Steps as plain integers, resolved against a program's swarm by ``_resolve``: ``(0, which,
    name, a, b, c)`` is an op (which 0 or 1) or an event (2); ``(1, kind, p0, p1, p2, body)`` a
    block. Made of a few fixed strategies, so drawing a program builds none (building and
    validating strategies per draw cost more than running the program)."""
    from hypothesis import strategies as st

    small = st.integers(0, 7)
    simple = st.tuples(st.just(0), st.integers(0, 2), small, small, small, small)
    if depth == 0:
        step = simple
    else:
        flag = st.integers(0, 2)
        block = st.tuples(st.just(1), small, flag, flag, flag, _raw_steps(depth - 1, 1, 4))
        step = st.one_of(simple, simple, block)
    return st.lists(step, min_size=min_size, max_size=max_size)


def _resolve(raw, swarm) -> tuple:
    operands, ops, events, kinds = swarm
    steps = []
    for tag, x, y, *rest in raw:
        if tag == 0 or not kinds:
            if tag == 1:  # a block drawn where no kind is allowed: an op instead
                x, y, rest = 0, x, [y, *rest[:2]]
            names, cls = (ops, Op) if x < 2 or not events else (events, Event)
            # An event may also act on the latest result (backward of what was just computed).
            pick = operands if cls is Op or -1 in operands else [*operands, -1]
            steps.append(cls(names[y % len(names)], tuple(pick[i % len(pick)] for i in rest[:3])))
        else:
            kind = kinds[x % len(kinds)]
            params = tuple(
                (name, values[p % len(values)]) for (name, values), p in zip(PARAMS.get(kind, ()), (y, *rest[:2]))
            )
            steps.append(Block(kind, params, _resolve(rest[2], swarm)))
    return tuple(steps)


def programs(exclude=(), depth: int = 2, max_steps: int = 10):
    """Programs (hypothesis strategy): up to ``max_steps`` steps in the region, blocks nested
    ``depth`` deep, up to 4 steps after it (blocks there too: torch.autocast outside any region). ``exclude`` names ops, events or block kinds to
    leave out (for hunting differences other than known ones).

    [Note: swarm testing] Each program draws the few operand positions, ops, events and block
    kinds it may use (up to 3; 1 or 2 ops of torch's lower list and up to 3 others; 1 to 3
    events; up to 3 block kinds), then its steps from those: a bug that needs a cast of a
    tensor, a write to that tensor and the same cast again is then met in a few dozen programs,
    not a few thousand, and a shrunk program uses only what its failure needs."""
    from hypothesis import strategies as st

    lower = tuple(n for n in OPS if n in LOWER_OPS and n not in exclude)
    others = tuple(n for n in OPS if n not in LOWER_OPS and n not in exclude)
    all_events = tuple(n for n in EVENTS if n not in exclude)
    all_kinds = tuple(k for k in KINDS if k not in exclude)
    # Mostly the weights, the input, the buffer and the latest two results; at times the float64
    # input, the bfloat16 weight and the third latest result.
    operands = st.lists(
        st.one_of(st.integers(-2, 3), st.integers(-3, len(LEAVES) - 1)), min_size=1, max_size=3, unique=True
    )
    swarm = st.tuples(
        operands,
        st.lists(st.sampled_from(lower), min_size=1, max_size=2, unique=True) if lower else st.just([]),
        st.lists(st.sampled_from(others), min_size=0 if lower else 1, max_size=3, unique=True)
        if others
        else st.just([]),
        st.lists(st.sampled_from(all_events), min_size=1, max_size=3, unique=True) if all_events else st.just([]),
        st.lists(st.sampled_from(all_kinds), max_size=3, unique=True) if all_kinds else st.just([]),
    )
    body, after = _raw_steps(depth, 1, max_steps), _raw_steps(depth, 0, 4)

    @st.composite
    def program(draw):
        operands, lower_ops, other_ops, events, kinds = draw(swarm)
        chosen = (operands, lower_ops + other_ops, events, kinds)
        p = Program(
            draw(st.integers(0, 255)),
            draw(st.sampled_from(DTYPES)),
            draw(st.booleans()),
            _resolve(draw(body), chosen),
            _resolve(draw(after), chosen),
        )
        if _switches_dtype(p.body + p.after, p.dtype) or _autocast_in_thread(p.body + p.after):
            p = dataclasses.replace(p, cache=False, body=_no_cache(p.body), after=_no_cache(p.after))
        return p

    return program()


# docs/design.md, the cast cache: entries are keyed by the dtype too, so a nested torch.autocast of
# another dtype never receives the first dtype's copy, where native's does (its cache is keyed by
# the tensor alone: a bfloat16 copy served in a float16 block, a mixed-dtype matmul that raises).
# A program that changes the dtype inside its region therefore runs with every cache off.
def _switches_dtype(steps: tuple, dtype: torch.dtype) -> bool:
    return any(
        isinstance(s, Block) and (dict(s.params).get("dtype") not in (None, dtype) or _switches_dtype(s.body, dtype))
        for s in steps
    )


# Native's cast cache is one for the process, not one per thread: a worker thread's
# torch.autocast reads the copies the spawning thread's region made (its gradients meet theirs in
# the lower dtype) and its exit clears them all (ATen's autocast_mode.cpp: a global map under a
# mutex, a nesting count per thread). The package's cache is its region's, in its thread. A
# program with autocast blocks inside a worker thread therefore runs with every cache off.
def _autocast_in_thread(steps: tuple, in_thread: bool = False) -> bool:
    return any(
        isinstance(s, Block)
        and (
            (in_thread and s.kind in (*_OWNERS, "cuda_off"))
            or _autocast_in_thread(s.body, in_thread or s.kind == "thread")
        )
        for s in steps
    )


def _no_cache(steps: tuple) -> tuple:
    return tuple(
        dataclasses.replace(
            s, params=tuple((k, False if k == "cache" else v) for k, v in s.params), body=_no_cache(s.body)
        )
        if isinstance(s, Block)
        else s
        for s in steps
    )


def _global_state() -> tuple:
    return (
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
        torch.is_autocast_cache_enabled(),
        torch._C._is_any_autocast_enabled(),
        hpu_autocast.is_enabled(),
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
    )


def _compiles(steps: tuple) -> bool:
    return any(_compiles(s.body) if isinstance(s, Block) else s.name.startswith("compiled_") for s in steps)


def run_both(program: Program) -> Tuple[Run, Run]:
    """The program's native run, then ours; each must leave the process's autocast and grad
    state as it found it (a leak would also change every later comparison).

    A program that calls a compiled function runs once each way first, unrecorded: a call that
    compiles traces the function in the calling thread, which advances that thread's autograd
    sequence numbers, and the backward engine orders nodes by them. Two native runs, the first
    compiling, then gave gradients apart in the last bit (where a worker thread's nodes meet the
    main thread's). Warm, each run meets compiled graphs only."""
    before = _global_state()
    runs = []
    if _compiles(program.body + program.after):
        for side in (NATIVE, OURS):
            Run(program, side).run()
    for side in (NATIVE, OURS):
        runs.append(Run(program, side).run())
        after = _global_state()
        assert after == before, f"the {side} run left {after}, found {before}:\n{describe(program, runs[-1])}"
    return runs[0], runs[1]


def describe(program: Program, ours: Run) -> str:
    """The program as it ran under the package (its region first), ready to paste after
    ``setup_source``."""
    head = [f'# seed={program.seed}: native ran the first block as torch.autocast("cpu", ...)']
    if any("worker_thread(" in line for line in ours.lines):
        head.append("# with worker_thread(...): its body ran in a new thread, started and joined there")
    return "\n".join([*head, setup_source(program), *ours.lines])

"""The ATen calls that reach below autocast, recorded, for the trace oracle (test_trace_oracle.py).

A region reproduces a native autocast when the calls its kernels make below the autocast keys are
the calls native's kernels make: the same overloads, in the same order, on arguments of the same
dtypes and shapes, with the same dtype and scalar arguments. That is a stronger check than equal
values, and it needs no GPU: fake CUDA tensors reach torch's ``AutocastCUDA`` kernels.

[Note: a wrapper subclass records, not a dispatch mode] The inputs are wrapped in ``Recorded``, a
wrapper tensor subclass whose ``__torch_dispatch__`` logs each call and runs it on the wrapped
(fake CUDA or real CPU) tensors. Its dispatch runs on the Python key, below every autocast key, so
it sees what native's kernels and the region's kernels (C++ core or Python) call. A
``TorchDispatchMode`` would see the same calls, but while a mode is active the C++ core hands every
call to the Python kernels (_kernels' Note on modes): a mode would only ever test the Python
kernels. For the same reason the ``FakeTensorMode`` that owns the fake tensors is entered only
around each recorded call, below the region's kernels, never around the region.

A trace is a list of lines such as ``aten.sum.default(f16[2, 4], dtype=torch.float32)``: tensors
as dtype and shape (their identities may differ: the cast cache, views), everything else as its
``repr`` (dtype arguments, scalars, lists), so any difference that could change a number shows.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterator, List, Optional, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

from hpu_autocast import HpuAutocastMode

#: Short dtype names, as in subclass_zoo's logging mode.
SHORT = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
    torch.complex64: "c64",
    torch.complex128: "c128",
    torch.complex32: "c32",
}


#: Every autocast dispatch key (native ones and those the engine borrows).
AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
for _name in dir(torch._C.DispatchKey):
    if _name.startswith("Autocast"):
        AUTOCAST_KEYS = AUTOCAST_KEYS | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _name))


def describe(x: object) -> str:
    """``f16[2, 4]`` for a tensor, its ``repr`` for anything else (lists and tuples element-wise)."""
    if isinstance(x, torch.Tensor):
        return f"{SHORT.get(x.dtype, str(x.dtype))}[{', '.join(map(str, x.shape))}]"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(describe(a) for a in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
    return repr(x)


def call_line(func, args: tuple, kwargs: dict) -> str:
    """One trace line: the overload and its arguments, as ``describe`` writes them."""
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return f"{func}({', '.join(parts)})"


class Recorded(torch.Tensor):
    """A tensor that logs every ATen call made on it below autocast, then runs the call on the
    tensor it wraps; results come back wrapped, so later calls on them are logged too."""

    inner: torch.Tensor
    log: List[str]
    mode: Optional[FakeTensorMode]

    @staticmethod
    def __new__(
        cls, inner: torch.Tensor, log: List[str], mode: Optional[FakeTensorMode] = None, requires_grad: bool = False
    ):
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            dtype=inner.dtype,
            device=inner.device,
            requires_grad=requires_grad,
        )
        r.inner, r.log, r.mode = inner, log, mode
        return r

    def __repr__(self) -> str:
        return f"Recorded({describe(self)}, {self.device})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = next(a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Recorded))
        first.log.append(call_line(func, args, kwargs))
        unwrap = lambda a: a.inner if isinstance(a, Recorded) else a
        # Below every autocast key, as the call came: the wrapped tensors must not meet them again.
        with (
            first.mode if first.mode is not None else contextlib.nullcontext(),
            torch._C._ExcludeDispatchKeyGuard(AUTOCAST_KEYS),
        ):
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        return tree_map(lambda o: cls(o, first.log, first.mode) if isinstance(o, torch.Tensor) else o, out)


# --- inputs ------------------------------------------------------------------------------------


class Inputs:
    """Where a trace runs: on fake CUDA tensors (``cuda``, one ``FakeTensorMode`` per trace) or on
    real CPU ones (``cpu``). ``wrap(tree, log)`` turns a tree of CPU tensors into recorded ones
    there; ``factories()`` is the block the traced code runs in."""

    def __init__(self, device: str) -> None:
        assert device in ("cuda", "cpu"), device
        # No fallback kernels: an op with no fake implementation raises rather than run its real
        # kernel. On a machine with a GPU that kernel would run, on outputs ``factories`` made
        # fake, and write through their null pointers: an illegal memory access that breaks the
        # process's CUDA context for every later test (seen on an H200: 1326 tests of 16 pytest
        # workers failed after gru_cell's trace). Without a GPU it raised anyway.
        self.mode = (
            FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False) if device == "cuda" else None
        )

    def fake(self, t: torch.Tensor) -> torch.Tensor:
        return FakeTensor(self.mode, t, torch.device("cuda"))

    def wrap(self, tree, log: List[str], requires_grad: bool = False):
        def one(t):
            if not isinstance(t, torch.Tensor):
                return t
            inner = self.fake(t.detach().to("meta")) if self.mode else t.detach()
            # Grad on real tensors only: on fake CUDA ones, a CPU build aborts making the autograd
            # node (its device guard asks for CUDA), so the cast cache, for leaves with grad, is
            # traced on CPU alone.
            grad = requires_grad and t.is_floating_point() and self.mode is None
            return Recorded(inner, log, self.mode, requires_grad=grad)

        return tree_map(one, tree)

    @contextlib.contextmanager
    def factories(self) -> Iterator[None]:
        """On fake CUDA, ``empty`` and ``empty_strided`` for the CUDA backend, making fake tensors:
        kernels below autocast that allocate their outputs (the math SDPA, the RMS norm, a
        convolution's bias) call them with no tensor argument, so neither the recording nor the
        fake mode (entered only below the region) sees the call, and a CPU build has no CUDA kernel."""
        if self.mode is None:
            yield
            return
        lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901  (undone below)

        def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
            return self.fake(torch.empty(size, dtype=dtype, device="meta"))

        def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
            return self.fake(torch.empty_strided(size, stride, dtype=dtype, device="meta"))

        lib.impl("empty.memory_format", empty, "CUDA")
        lib.impl("empty_strided", empty_strided, "CUDA")
        try:
            yield
        finally:
            lib._destroy()


# --- the two regions ---------------------------------------------------------------------------


@contextlib.contextmanager
def native(device: str, dtype: torch.dtype) -> Iterator[None]:
    """Native autocast for ``device``. On CUDA its state is set by hand: ``torch.autocast("cuda")``
    turns itself off where CUDA is unavailable. Nesting and the cast cache as torch.autocast does:
    the cache is cleared when the outermost region exits."""
    if device == "cpu":
        with torch.autocast("cpu", dtype=dtype):
            yield
        return
    enabled, before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", before)


def region(device: str, dtype: torch.dtype):
    """The preset that promises ``device``'s native autocast."""
    return HpuAutocastMode(dtype, policy=f"torch-{device}", device_type=device)


REGIONS = {"native": native, "region": region}


# --- traces ------------------------------------------------------------------------------------

Outcome = Tuple[List[str], Optional[str]]


def trace(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    device: str,
    dtype: torch.dtype,
    which: str,
    params: Optional[Tuple[dict, dict]] = None,
) -> Outcome:
    """The calls ``fn(*args, **kwargs)`` makes below autocast inside ``which`` region (``native`` or
    ``region``), and the name of the exception it raised, if any (``trace_in``)."""
    return trace_in(fn, args, kwargs, device, REGIONS[which](device, dtype), params)


def trace_in(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    device: str,
    region: ContextManager,
    params: Optional[Tuple[dict, dict]] = None,
) -> Outcome:
    """The calls ``fn(*args, **kwargs)`` makes below autocast inside ``region`` (any context
    manager: a native autocast, a region of any policy, none), on ``device``'s tensors, and the
    name of the exception it raised, if any. ``params`` (a module's parameters and its buffers, by
    name) are recorded too, the parameters requiring grad as a model's do, and passed as ``fn``'s
    first argument, in one dict."""
    log: List[str] = []
    inputs = Inputs(device)
    args, kwargs = inputs.wrap((args, kwargs), log)
    if params is not None:
        weights, buffers = params
        args = ({**inputs.wrap(weights, log, requires_grad=True), **inputs.wrap(buffers, log)},) + tuple(args)
    del log[:]  # the wrapping's own calls
    torch.manual_seed(0)
    try:
        with inputs.factories(), region:
            fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (the two runs must raise alike)
        return log, type(e).__name__
    return log, None


def _unread_casts_dropped(outcome: Outcome) -> Outcome:
    """The calls of a run that raised, less the casts just before the raise: copies no one read
    (the region casts a banned op's inputs before its kernel raises the ban, native raises first)."""
    calls, err = outcome
    if err is None:
        return outcome
    end = len(calls)
    while end and calls[end - 1].startswith("aten._to_copy.default("):
        end -= 1
    return calls[:end], err


def first_difference(want: Outcome, got: Outcome) -> Optional[str]:
    """``None`` where the two outcomes are equal, else where they part, said in a few lines.
    Where both raised alike, casts no one read before the raise do not count."""
    if want[1] is not None and want[1] == got[1]:
        want, got = _unread_casts_dropped(want), _unread_casts_dropped(got)
    (a, a_err), (b, b_err) = want, got
    if a == b and a_err == b_err:
        return None
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    line = lambda t, err: t[i] if i < len(t) else f"(end: {err or 'returned'})"
    before = f"after {a[i - 1]}" if i else "at the first call"
    return f"call {i}, {before}:\n  native: {line(a, a_err)}\n  region: {line(b, b_err)}"


def compare(
    fn: Callable, args: tuple, kwargs: dict, device: str, dtype: torch.dtype, params: Optional[Tuple[dict, dict]] = None
) -> Tuple[Outcome, Optional[str]]:
    """Native's outcome, and where the region's parts from it (``None``: nowhere)."""
    want = trace(fn, args, kwargs, device, dtype, "native", params)
    got = trace(fn, args, kwargs, device, dtype, "region", params)
    return want, first_difference(want, got)

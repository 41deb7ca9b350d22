"""The mechanism: one engine per thread, owning the region stack, the cast cache and the two
private modes that apply the innermost region's policy.

Data flow of one call (see docs/design.md for the long form)::

    torch.mm(a, b)            -> _FunctionMode: rule for torch.mm? cast a, b above autograd,
                                 call with the dispatch level suppressed
      aten.mm.default(a', b') -> _DispatchMode: suppressed -> call through
    (C++) at::mm(x, y)        -> _DispatchMode: rule for aten.mm.default? cast below autograd,
                                 call, queue the outputs for the autograd bridge
"""

from __future__ import annotations

import threading
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import _C
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import _bridge, _compat, _compile_hooks
from ._table import DEFER, CompiledPolicy, OpRule
from .policy import CastPolicy
from .rules import compute_dtype, has_explicit_dtype, is_eligible

__all__ = ["Region", "Engine", "engine_for_thread", "current_engine"]

_FLOAT32 = torch.float32
_FLOAT64 = torch.float64
_EMPTY: dict = {}
_FunctionType = types.FunctionType
_Tensor = torch.Tensor


class Region:
    """One entry of the region stack: what an ``HpuAutocastMode`` asked for."""

    __slots__ = ("compiled", "dtype", "enabled", "cache_enabled", "observer", "owns_modes")

    def __init__(self, compiled: Optional[CompiledPolicy], dtype: torch.dtype, enabled: bool,
                 cache_enabled: bool, observer: Optional[Callable] = None) -> None:
        self.compiled = compiled
        self.dtype = dtype
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        self.observer = observer
        self.owns_modes = False


class Engine:
    """Per-thread state. The modes hold a reference to it, so autograd's worker threads, to
    which torch propagates the mode stacks, read the same regions."""

    def __init__(self) -> None:
        self.regions: List[Region] = []
        self.region: Optional[Region] = None  # innermost enabled region, or None
        # The innermost enabled region's tables, read first by the modes ({} when none).
        self.functions: dict = _EMPTY
        self.rules: dict = _EMPTY
        self.cache: Dict[int, Tuple[_Tensor, _Tensor]] = {}
        self.suppress = 0
        self.pending: list = []
        self.dispatch_mode = _DispatchMode(self)
        self.function_mode = _FunctionMode(self)
        self.modes_on = False

    # -- region stack -------------------------------------------------------------------
    def push(self, region: Region) -> None:
        if not _dynamo_prepared:
            _prepare_dynamo()
        self.regions.append(region)
        self._set_region(region if region.enabled else None)
        if region.enabled and not self.modes_on:
            self.function_mode.__enter__()
            try:
                self.dispatch_mode.__enter__()
            except BaseException:
                self.function_mode.__exit__(None, None, None)
                raise
            self.modes_on = region.owns_modes = True

    def pop(self, region: Region) -> None:
        if not self.regions or self.regions[-1] is not region:
            raise RuntimeError("hpu_autocast: regions must be exited in the reverse order they were entered")
        self.regions.pop()
        if self.pending:
            self.flush()
        if region.owns_modes:
            # Note: exit even if a mode raises, so no state is left behind.
            self.modes_on = False
            try:
                self.dispatch_mode.__exit__(None, None, None)
            finally:
                self.function_mode.__exit__(None, None, None)
        top = self.regions[-1] if self.regions else None
        self._set_region(top if top is not None and top.enabled else None)
        if not self.regions:
            # As torch.autocast: the cast cache lives as long as the outermost region.
            self.cache.clear()
            self.pending.clear()

    def _set_region(self, region: Optional[Region]) -> None:
        self.region = region
        self.functions = region.compiled.function if region is not None else _EMPTY
        self.rules = region.compiled.dispatch if region is not None else _EMPTY

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        _bridge.attach(pending)

    # -- casting ------------------------------------------------------------------------
    def cast_args(self, rule: OpRule, args: tuple, kwargs: dict, region: Region, above_autograd: bool,
                  positions: Optional[Dict[str, int]] = None):
        """Cast the eligible tensors of one call. Returns ``(args, kwargs, dtype, casts)``, where
        ``casts`` lists ``(original, copy)`` pairs, or ``None`` when the call is not eligible."""
        if has_explicit_dtype(args, kwargs):
            return None
        protected = rule.protected
        pnames = rule.protected_names
        if positions is not None and pnames:
            protected = frozenset(positions[n] for n in pnames if n in positions)
        input_only = rule.input_only and rule.casts_input_only(args)
        action = rule.action
        input_key = None
        if input_only and not args:
            # An input-only op called with its input by keyword (torch.layer_norm(input=x, ...)).
            input_key = next((k for k in ("input", "self") if k in kwargs), None)
        if action is CastPolicy.LOWER:
            target = region.dtype
        elif action is CastPolicy.FP32:
            target = _FLOAT32
        else:
            target = self._widest(rule, args, kwargs, protected, pnames, input_only, input_key, region)
            if target is None:
                return args, kwargs, None, ()
        casts: list = []
        cache = self.cache if region.cache_enabled and target is region.dtype else None

        def cast(t):
            dt = t.dtype
            if dt is target or not t.is_floating_point() or dt is _FLOAT64:
                return t
            if cache is not None:
                hit = cache.get(id(t))
                if hit is not None and hit[0] is t:
                    casts.append((t, hit[1]))
                    return hit[1]
            c = t.to(target)
            # As native autocast: cache casts of float32 leaves that require grad (weights),
            # and only above autograd, where the copy carries its ToCopyBackward.
            # Under no_grad the copy has no ToCopyBackward: caching it would starve a later
            # use with grad enabled of the weight's gradient.
            if (cache is not None and above_autograd and dt is _FLOAT32 and t.requires_grad
                    and t.is_leaf and not t._is_view() and torch.is_grad_enabled()):
                cache[id(t)] = (t, c)
            casts.append((t, c))
            return c

        new_args = list(args)
        for i, a in enumerate(args):
            if i in protected:
                continue
            if isinstance(a, _Tensor):
                new_args[i] = cast(a)
            elif isinstance(a, list):
                new_args[i] = [cast(t) if isinstance(t, _Tensor) else t for t in a]
            elif isinstance(a, tuple):
                new_args[i] = tuple(cast(t) if isinstance(t, _Tensor) else t for t in a)
            if input_only:
                break
        new_kwargs = kwargs
        if input_key is not None and isinstance(kwargs[input_key], _Tensor):
            new_kwargs = {**kwargs, input_key: cast(kwargs[input_key])}
        if kwargs and not input_only:
            new_kwargs = {k: (cast(v) if isinstance(v, _Tensor) and k not in pnames else v) for k, v in kwargs.items()}
        return tuple(new_args), new_kwargs, target, casts

    @staticmethod
    def _widest(rule: OpRule, args: tuple, kwargs: dict, protected, pnames, input_only: bool,
                input_key: Optional[str], region: Region) -> Optional[torch.dtype]:
        """PROMOTE's and FIRST's target: from the dtypes of all the eligible inputs."""
        dtypes = []
        # A written argument is never replaced, but under FIRST it still is the first input:
        # HPU's iadd keeps the dtype of `self` and casts the others to it.
        first = rule.action is CastPolicy.FIRST
        for i, a in enumerate(args):
            if i in protected and not first:
                continue
            if type(a) is _Tensor or isinstance(a, _Tensor):
                if is_eligible(a):
                    dtypes.append(a.dtype)
            elif isinstance(a, (list, tuple)):
                dtypes.extend(t.dtype for t in a if is_eligible(t))
            if input_only:
                break
        if input_key is not None and is_eligible(kwargs[input_key]):
            dtypes.append(kwargs[input_key].dtype)
        if not input_only:
            for k, v in kwargs.items():
                if k not in pnames and is_eligible(v):
                    dtypes.append(v.dtype)
        return compute_dtype(rule.action, dtypes, region.dtype)


def _observe(region: Region, level: str, rule: Optional[OpRule], func: Any, reason: str,
             args: tuple, kwargs: dict, target: Optional[torch.dtype]) -> None:
    # The observer may run torch ops of its own (shape math, FLOP formulas): not the user's.
    engine = engine_for_thread()
    engine.suppress += 1
    try:
        region.observer(level, rule, func, reason, args, kwargs, target)
    finally:
        engine.suppress -= 1


class _FunctionMode(TorchFunctionMode):
    """Applies the policy above autograd to calls it can map to an op in the table."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine
        # Python-level functions being re-entered, to stop at their second hop (see below).
        self._reentered: List[Callable] = []

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        # Note: the hot path. Most calls are of ops the policy leaves alone: one dict lookup,
        # then the call.
        engine = self.engine
        if engine.pending:
            engine.flush()
        frule = engine.functions.get(func)
        if frule is None:
            if type(func) is _FunctionType and _compat.HAS_REDISPATCH and not engine.suppress \
                    and func not in self._reentered and engine.region is not None:
                # A Python-level function (F.cross_entropy, Tensor.__rpow__): run its body with
                # this mode still active, so the builtins it calls are seen.
                # Note: some bodies (Tensor.unflatten) call their C base, which reports the same
                # Python function again; that second hop runs plainly, or it would recurse.
                self._reentered.append(func)
                try:
                    with self:
                        return _compat.redispatch(func, types_, args, kwargs or {})
                finally:
                    self._reentered.pop()
            return func(*args, **kwargs) if kwargs else func(*args)
        kwargs = kwargs or {}
        region = engine.region
        if engine.suppress:
            return func(*args, **kwargs)
        rule = frule.select(args, kwargs)
        if rule is None or rule is DEFER:
            if region.observer is not None and rule is None:
                _observe(region, "function", None, func, "out=" if kwargs.get("out") is not None else "not listed", args, kwargs, None)
            return func(*args, **kwargs)
        return _run(engine, region, rule, func, args, kwargs, "function", frule.positions)


class _DispatchMode(TorchDispatchMode):
    """Applies the policy, by exact overload, to ATen calls the function mode did not handle."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        engine = self.engine
        rule = engine.rules.get(func)
        if rule is None:
            region = engine.region
            if region is None or engine.suppress:
                return func._op(*args, **kwargs) if kwargs else func._op(*args)
            if engine.pending:
                engine.flush()
            compiled = region.compiled
            if compiled.has_defaults:
                rule = compiled.default_rule(func)
            if rule is None:
                if region.observer is not None:
                    _observe(region, "dispatch", None, func, "not listed", args, kwargs or {}, None)
                return func._op(*args, **kwargs) if kwargs else func._op(*args)
        elif engine.suppress:
            return func._op(*args, **kwargs) if kwargs else func._op(*args)
        else:
            region = engine.region
            if engine.pending:
                engine.flush()
        return _run(engine, region, rule, func, args, kwargs or {}, "dispatch", None)


# [Note: Dynamo and our handlers]
# Our handlers run with our dispatch mode popped, so if a torch.compile'd function is running
# (its frame evaluation callback is set) Dynamo would try to compile them, and the Python
# helpers they call. TorchDispatchMode guards against that by wrapping every subclass's
# __torch_dispatch__ in torch._dynamo.disable, a microsecond or more per call (measured 0.7 us
# on an idle AMD EPYC core). Instead, the handlers' code objects are marked once to be skipped
# by Dynamo, recursively: the same effect, at no cost per call. Where torch has no such marking
# (torch._dynamo.types.FrameExecStrategy: 2.9 has it, 2.6 not), the wrapper stays.
_dynamo_prepared = False
_RAW_DISPATCH = getattr(_DispatchMode.__dict__["__torch_dispatch__"], "__wrapped__",
                        _DispatchMode.__dict__["__torch_dispatch__"])


def _prepare_dynamo() -> None:
    global _dynamo_prepared
    _dynamo_prepared = True
    if _compile_hooks.skip_recursively(_RAW_DISPATCH, _FunctionMode.__torch_function__, _bridge.attach):
        _DispatchMode.__torch_dispatch__ = _RAW_DISPATCH


def _pop_ours(engine: Engine):
    """Pop our dispatch mode off torch's stack if it is on top; return it (or ``None``).

    A call handled at the function level, its casts included, must run as it would with no
    mode at all: the mere presence of a Python dispatch mode changes some kernels' paths
    (``isTensorSubclassLike`` is true, so ``linalg_svdvals`` computes U and V and rounds
    differently), and skipping the mode saves a Python round trip per cast and inner op. If
    another mode was pushed above ours (a tracer, a FLOP counter), ours stays, suppressed."""
    n = _C._len_torch_dispatch_stack()
    if n and _C._get_dispatch_stack_at(n - 1) is engine.dispatch_mode:
        return _C._pop_torch_dispatch_stack(None)
    return None


def _run(engine: Engine, region: Region, rule: OpRule, func, args: tuple, kwargs: dict, level: str,
         positions: Optional[Dict[str, int]]):
    """Cast one call by ``rule`` and run it with the policy suppressed for its body."""
    if rule.banned is not None:
        raise RuntimeError(f"{rule.name}: {rule.banned}")
    above = level == "function"
    popped = _pop_ours(engine) if above else None
    engine.suppress += 1
    try:
        cast = engine.cast_args(rule, args, kwargs, region, above, positions)
        if cast is None:
            if region.observer is not None:
                _observe(region, level, rule, func, "explicit dtype", args, kwargs, None)
            return func(*args, **kwargs)
        new_args, new_kwargs, target, casts = cast
        if region.observer is not None:
            _observe(region, level, rule, func, str(rule.action), args, kwargs, target)
        out = func(*new_args, **new_kwargs)
    finally:
        engine.suppress -= 1
        if popped is not None:
            _C._push_on_torch_dispatch_stack(popped)
    if not above and casts and torch.is_grad_enabled():
        _queue_bridge(engine, args, kwargs, out, casts, target)
    return out


def _queue_bridge(engine: Engine, args, kwargs, out, casts, target) -> None:
    if not any(isinstance(a, _Tensor) and a.requires_grad for a in args) and not any(
        isinstance(v, _Tensor) and v.requires_grad for v in kwargs.values()
    ) and not any(isinstance(a, (list, tuple)) and any(isinstance(t, _Tensor) and t.requires_grad for t in a) for a in args):
        return
    outs = out if isinstance(out, (tuple, list)) else (out,)
    outs = [o for o in outs if isinstance(o, _Tensor)]
    if outs:
        engine.pending.append((outs, {id(orig): (orig, target) for orig, _ in casts}))


_tls = threading.local()


def engine_for_thread() -> Engine:
    """This thread's engine, created on first use."""
    engine = getattr(_tls, "engine", None)
    if engine is None:
        engine = _tls.engine = Engine()
    return engine


def current_engine() -> Optional[Engine]:
    return getattr(_tls, "engine", None)

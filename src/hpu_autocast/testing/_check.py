"""``check_policy`` and ``watch_policy``: what a run did against what its policy intends.

Every finding is derived from the engine's events (``events.py``), with three helpers for what
events cannot say:

* module paths: global forward hooks keep a stack of the modules being run, so each finding
  names the innermost one (``encoder.layers.1.mlp.proj``);
* provenance: a small dispatch mode follows float64 and lower-precision tensors from where they
  came from (a parameter, the caller's input, the model's own ``.double()``) through the ops
  that keep their dtype, so a finding says *why* the dtype was there;
* calls no event reports: the engine reports nothing in a disabled region (``disable_casts``)
  nor for a listed op with no floating tensor input; the same dispatch mode sees those calls and
  checks them against the policy. (A ``torch.autocast(enabled=False)`` block of the watched
  region is reported by the engine, ``ineligible: disabled``.)

[Note: which deviations are reported]
A listed op's intended dtype is the region's lower dtype (``lower``) or float32 (``fp32``, and
the two dtype kinds ``fp32_set_opt_dtype`` and ``fp32_append_dtype``, which cast nothing but
make the op compute in float32: a dtype argument the call sets is kept, and reported as an
explicit dtype); ``promote`` and ``first`` intend a dtype relative to the inputs, so only their
eligibility is not checked. An integer-only call whose result is an integer is exact and not reported; one whose
result is floating (``int_tensor * 0.5`` under a lower ``mul``) is. An FP32-list op receiving
lower-precision values is the policy's own doing when a lower op made them (that is what mixed
precision is), so only values the policy did not round are reported: a lower-precision
parameter, the caller's input, the model's own cast. The float32 run, where there is one,
decides what a write or an inf/nan should have been.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .. import _engine, _torch
from .._torch import OpOverload, TorchDispatchMode, keystr, tree_flatten, tree_flatten_with_path
from .. import mode as _mode
from .. import module_map as _module_map
from ..policies.builder import as_policy
from ..events import Event, Outcome, short_dtype
from ..policies.recipes import cast_dtype, is_fp8
from ..log import combine_observers
from ..policies.policy import CastPolicy, Policy

__all__ = [
    "Kind",
    "Deviation",
    "Deviations",
    "PolicyViolation",
    "check_policy",
    "assert_follows_policy",
    "watch_policy",
    "Watch",
]

_F64 = torch.float64
_F32 = torch.float32
_LOW = (torch.bfloat16, torch.float16)
_TO_COPY = _torch.TO_COPY
#: The cast kinds whose op computes in float32: FP32 casts its eligible inputs; the two dtype kinds
#: cast nothing, they set (FP32_SET_OPT_DTYPE) or append (FP32_APPEND_DTYPE) dtype=float32.
_FLOAT32_KINDS = (CastPolicy.FP32, CastPolicy.FP32_SET_OPT_DTYPE, CastPolicy.FP32_APPEND_DTYPE)
_DTYPE_KINDS = _FLOAT32_KINDS[1:]
_current_node = _torch.current_autograd_node


class Kind(enum.Enum):
    """What kind of deviation from a policy's intent."""

    #: A listed op did not compute in the dtype the policy gives it.
    DTYPE = "dtype"
    #: An FP32-list op received values rounded to lower precision by something other than the
    #: policy (a lower-precision parameter, the caller's input, the model's own cast).
    ROUNDED = "rounded"
    #: A parameter or buffer write that the float32 run makes was lost, or changed its dtype.
    WRITE = "write"
    #: An inf or nan that the float32 run does not have.
    NONFINITE = "non-finite"

    def __str__(self) -> str:
        return self.value


# The "why" of a deviation, one of these (``ignore=`` takes them, or a kind).
FLOAT64 = "float64 inputs"
INTEGER = "integer inputs"
EXPLICIT = "explicit dtype"
DISABLED = "disabled block"
OWN_CAST = "the model's own cast"
LOWER_INPUTS = "lower-precision inputs"
WRITE_LOST = "write lost"
WRITE_CAST = "write cast"
WRITE_EXTRA = "written only under the mode"
INF_NAN = "inf/nan"
MAPPED = "mapped module"
BACKWARD = "(backward)"
WHYS = (
    FLOAT64,
    INTEGER,
    EXPLICIT,
    DISABLED,
    OWN_CAST,
    LOWER_INPUTS,
    WRITE_LOST,
    WRITE_CAST,
    WRITE_EXTRA,
    INF_NAN,
    MAPPED,
)


@dataclass(frozen=True)
class Deviation:
    """One way a run departed from its policy's intent (equal calls counted once, in ``calls``)."""

    kind: Kind
    op: Optional[OpOverload]  #: the overload, ``None`` for a write
    #: ``encoder.layers.1.proj``; ``""`` the root module; ``"(backward)"`` a backward call; ``None``
    #: outside any module (or unknown, for a write)
    module: Optional[str]
    why: str  #: one of ``WHYS``
    inputs: tuple = ()  #: the call's tensor input dtypes
    compute: Optional[torch.dtype] = None  #: the dtype it ran in (for a write: the dtype written)
    expected: Optional[torch.dtype] = None  #: the dtype the policy (or the float32 run) gives
    source: Optional[str] = None  #: where the offending dtype or value came from
    calls: int = 1

    def __str__(self) -> str:
        where = "-" if self.module is None else (self.module or "(root)")
        op = "-" if self.op is None else str(self.op)
        sig = f"{','.join(map(short_dtype, self.inputs))} -> {short_dtype(self.compute)}"
        if self.kind is Kind.WRITE:
            sig = f"{short_dtype(self.expected)} -> {short_dtype(self.compute)}"
        elif self.expected is not None:
            sig += f", policy {short_dtype(self.expected)}"
        src = f" ({self.source})" if self.source else ""
        times = f", {self.calls} calls" if self.calls > 1 else ""
        return f"{self.kind}  {where}  {op}  {sig}: {self.why}{src}{times}"


class Deviations(tuple):
    """The deviations of one run, in the order met, with the policy they were checked against.
    Empty (falsy) when the run followed its policy."""

    policy: str = ""
    dtype: Optional[torch.dtype] = None
    #: What ``fn`` returned under the mode (``check_policy``).
    output: object = None

    def __new__(cls, items: Iterable[Deviation] = (), policy: str = "", dtype=None, output=None):
        self = super().__new__(cls, items)
        self.policy, self.dtype, self.output = policy, dtype, output
        return self

    def __str__(self) -> str:
        head = f"policy {self.policy!r} ({short_dtype(self.dtype)})"
        if not self:
            return f"no deviations from {head}"
        noun = "deviation" if len(self) == 1 else "deviations"
        return "\n".join([f"{len(self)} {noun} from {head}:"] + [f"  {d}" for d in self])

    def __repr__(self) -> str:
        return f"Deviations({list(self)!r}, policy={self.policy!r})"


class PolicyViolation(AssertionError):
    """Raised by ``assert_follows_policy`` and the pytest fixture; ``.deviations`` lists them."""

    def __init__(self, deviations: Deviations) -> None:
        super().__init__(str(deviations))
        self.deviations = deviations


# --- where a dtype came from -------------------------------------------------------------------
@dataclass(frozen=True)
class _Origin:
    dtype: torch.dtype
    why: str  # OWN_CAST, or FLOAT64 / LOWER_INPUTS for a parameter or the caller's input
    source: str


def _tensors(tree) -> List[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _first_floating(out) -> Optional[torch.dtype]:
    for t in _tensors(out):
        if t.is_floating_point():
            return t.dtype
    return None


class _ModuleStack:
    """The modules being run (global forward hooks), as dotted paths from the roots given."""

    def __init__(
        self, roots: Dict[str, torch.nn.Module], on_enter: Callable, module_map: Optional[_module_map.ModuleMap] = None
    ) -> None:
        self.names: Dict[int, str] = {}
        for prefix, root in roots.items():
            for name, m in root.named_modules(remove_duplicate=False):
                self.names.setdefault(id(m), ".".join(p for p in (prefix, name) if p))
        self.stack: List[Tuple[torch.nn.Module, str]] = []
        self.on_enter = on_enter
        self.handles = []
        # A region's modules= map, resolved as the map resolves it (its names are relative to the
        # first module called with none in flight): per entry of the stack, its match or None.
        self.map = module_map
        self._resolved = None
        self._hits: List[Optional[tuple]] = []

    def path(self) -> Optional[str]:
        if _current_node() is not None:
            return BACKWARD  # no module is running
        return self.stack[-1][1] if self.stack else None

    def mapped(self) -> Optional[tuple]:
        """``(pattern, name, Override)`` of the innermost module in flight the map matches (the
        one whose entry decides), or ``None`` (no map, no match, or a backward)."""
        if self.map is None or _current_node() is not None:
            return None
        for hit in reversed(self._hits):
            if hit is not None:
                return hit
        return None

    def _path_of(self, module: torch.nn.Module) -> str:
        if self.stack:
            parent, parent_path = self.stack[-1]
            for name, child in parent._modules.items():
                if child is module:
                    return f"{parent_path}.{name}" if parent_path else name
        known = self.names.get(id(module))
        return known if known is not None else type(module).__name__

    def _pre(self, module, args) -> None:
        if self.map is not None:
            root = not _module_map._is_compiled_wrapper(module) and all(
                _module_map._is_compiled_wrapper(m) for m, _ in self.stack
            )  # the map skips compile's wrapper
            if root:
                self._resolved = _module_map._resolve(module, self.map)[0]
            self._hits.append(self._resolved.get(module) if self._resolved is not None else None)
        path = self._path_of(module)
        self.stack.append((module, path))
        self.on_enter(module, path)

    def _post(self, module, args, out) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] is module:
                del self.stack[i:]
                del self._hits[i:]
                break

    def __enter__(self) -> "_ModuleStack":
        from torch.nn.modules import module as m

        self.handles = [
            m.register_module_forward_pre_hook(self._pre),
            m.register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        self.stack.clear()
        self._hits.clear()


class _Calls(TorchDispatchMode):
    """Sees every call below the engine: hands it to ``Watch.ran``."""

    def __init__(self, watch: "Watch") -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.watch.ran(func, args, kwargs, out)
        return out


class Watch:
    """What ``watch_policy`` yields: the region (``mode``), and the deviations met so far
    (``deviations``, filled as the body runs)."""

    def __init__(
        self,
        policy: Policy,
        dtype: torch.dtype,
        device_type: str,
        roots: Dict[str, torch.nn.Module],
        ignore: Iterable = (),
        find_nonfinite: bool = False,
        module_map: Optional[_module_map.ModuleMap] = None,
    ) -> None:
        self.policy = policy
        self.dtype = dtype
        self.device_type = device_type
        if isinstance(ignore, (str, Kind)):  # one why or kind, not its characters
            ignore = (ignore,)
        self.ignore = frozenset(str(getattr(i, "value", i)) for i in ignore)
        #: The ``modules=`` map each call is judged by (Note: module maps), or ``None``.
        self.module_map = module_map
        self.modules = _ModuleStack(roots, self._entered, module_map)
        self.mode: Optional[_mode.HpuAutocastMode] = None
        self._found: Dict[Deviation, int] = {}
        self._origins = WeakTensorKeyDictionary()
        # The last _to_copy below the engine, (input, result): the engine's event for it, if any,
        # comes right after and marks the result as the model's own cast.
        self._last_cast: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self._find_nonfinite = find_nonfinite
        self.nonfinite_at: Optional[Deviation] = None
        self._tables = {
            a: frozenset(op for op, x in policy.table.items() if x is a) for a in (CastPolicy.LOWER,) + _FLOAT32_KINDS
        }
        self._seen_modules: set = set()

    # -- findings
    @property
    def deviations(self) -> Deviations:
        items = [d if n == 1 else _with_calls(d, n) for d, n in self._found.items()]
        return Deviations(items, self.policy.name, self.dtype)

    def ignores(self, deviation: Deviation) -> bool:
        return deviation.why in self.ignore or deviation.kind.value in self.ignore

    def add(self, deviation: Deviation) -> None:
        if self.ignores(deviation):
            return
        self._found[deviation] = self._found.get(deviation, 0) + 1

    def _expected(self, action: Optional[CastPolicy]) -> Optional[torch.dtype]:
        """The dtype ``action`` gives, where it gives one (``promote`` and ``first`` do not)."""
        if action is CastPolicy.LOWER:
            return cast_dtype(_mode.get_dtype() or self.dtype)  # an fp8 region's outputs are bfloat16
        return _F32 if action in _FLOAT32_KINDS else None

    def _action(self, op: OpOverload, policy: Optional[Policy] = None) -> Optional[CastPolicy]:
        if policy is not None and policy is not self.policy:
            action = policy.table.get(op)
            return action if action is CastPolicy.LOWER or action in _FLOAT32_KINDS else None
        for action, ops in self._tables.items():
            if op in ops:
                return action
        return None

    # -- module maps
    # [Note: module maps] In a region with modules=, a call inside a matched module is judged by
    # that module's entry, not by the region's policy: float32 (the map's casting-off region,
    # inputs cast up) intends float32 for every op a policy lists; "off" intends nothing; a lower
    # dtype intends the region's policy in that dtype, a policy that policy in the region's dtype.
    # The module and its entry come from the watch's own module hooks, resolved as the map
    # resolves names, so a run that does not apply the map (a region without it, a region opened
    # inside the module) is judged by the map all the same, and its deviations say "mapped
    # module" and which entry. In an fp8 region, a lower op may compute in fp8 or bfloat16 (a GEMM
    # fp8 does not take); a module mapped to bfloat16 may not compute in fp8.
    def _mapped_expected(self, op: OpOverload, action: Optional[CastPolicy], hit: tuple) -> Optional[torch.dtype]:
        """The dtype a call of ``op`` (its event's ``action``, or the policy's) intends inside the
        mapped module ``hit``: the dtype a region computes a lower op in, float32, or ``None``."""
        override = hit[2]
        if override.kind == "off":
            return None
        if override.kind == "policy":
            action = self._action(op, override.policy)
        elif action is None:
            action = self._action(op)
        if override.kind == "fp32":
            return _F32 if action is CastPolicy.LOWER or action in _FLOAT32_KINDS else None
        if action is CastPolicy.LOWER:
            return override.dtype if override.kind == "dtype" else self.dtype
        return _F32 if action in _FLOAT32_KINDS else None

    def _mapped(self, op, module, hit, inputs, compute, expected) -> None:
        pattern, name, override = hit
        source = f"{name or '(root)'} -> {override}" + ("" if pattern == name else f", by {pattern!r}")
        self.add(Deviation(Kind.DTYPE, op, module, MAPPED, inputs, compute, expected, source))

    # -- origins
    def _entered(self, module: torch.nn.Module, path: str) -> None:
        if id(module) in self._seen_modules:
            return
        self._seen_modules.add(id(module))
        for kind, items in (("parameter", module._parameters), ("buffer", module._buffers)):
            for name, t in items.items():
                self.mark(t, f"{kind} {path}.{name}" if path else f"{kind} {name}")

    def mark(self, t: object, source: str) -> None:
        """Record that ``t`` (if float64 or lower precision) came from ``source``."""
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype is not _F32 and t not in self._origins:
            why = FLOAT64 if t.dtype is _F64 else LOWER_INPUTS
            self._origins[t] = _Origin(t.dtype, why, source)

    def mark_inputs(self, inputs: tuple) -> None:
        for path, t in tree_flatten_with_path(inputs)[0]:
            self.mark(t, f"the caller's input inputs{keystr(path)}")

    def _origin(self, tensors: Iterable, dtype: torch.dtype) -> Optional[_Origin]:
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.dtype is dtype:
                o = self._origins.get(t)
                if o is not None:
                    return o
        return None

    # -- the engine's events
    def observe(self, event: Event) -> None:
        op = event.op
        if op is _TO_COPY and event.args:
            self._claim_cast(event.args[0])
            return
        # The event's action: a listed op's, or a policy default's (hmp-O2 gives fp32 to ops on no list).
        hit = self.modules.mapped()
        expected = self._expected(event.action) if hit is None else self._mapped_expected(op, event.action, hit)
        if expected is None:
            return
        module = self.modules.path()
        args = _tensors((event.args, event.kwargs))
        if (
            hit is not None
            and event.outcome is Outcome.CAST
            and _F64 not in event.inputs
            and not _computes_as(expected, event.compute)
        ):
            self._mapped(op, module, hit, event.inputs, event.compute, expected)
        elif event.outcome is Outcome.INELIGIBLE and not _computes_as(expected, event.compute):
            if event.reason == "float64":
                self._float64(op, module, event.inputs, event.compute, expected, args)
            else:
                why = {"explicit dtype": EXPLICIT, "disabled": DISABLED}.get(event.reason, str(event.reason))
                self.add(Deviation(Kind.DTYPE, op, module, why, event.inputs, event.compute, expected))
        elif event.outcome is Outcome.CAST:
            if _F64 in event.inputs:
                # Some inputs were cast, a float64 one was not: the op ran in float64 (or failed),
                # whatever the event's compute says.
                self._float64(op, module, event.inputs, _F64, expected, args)
            elif event.action in _DTYPE_KINDS and event.compute is not _F32:
                # A dtype argument the call set, which these kinds keep: the op ran in it.
                self.add(Deviation(Kind.DTYPE, op, module, EXPLICIT, event.inputs, event.compute, expected))
            elif expected is _F32:
                for arg, t in _float32_inputs(event):
                    o = self._origins.get(t)
                    if t.dtype in _LOW and o is not None and o.dtype is t.dtype:
                        self.add(
                            Deviation(Kind.ROUNDED, op, module, o.why, event.inputs, _F32, _F32, f"{arg}: {o.source}")
                        )

    def _float64(self, op, module, inputs, compute, expected, args) -> None:
        o = self._origin(args, _F64)
        self.add(
            Deviation(
                Kind.DTYPE, op, module, o.why if o else FLOAT64, inputs, compute, expected, o.source if o else None
            )
        )

    def _claim_cast(self, source: object) -> None:
        # The engine reported a _to_copy: the model's own cast (the engine's casts make no
        # events), whose result the dispatch mode kept.
        last, self._last_cast = self._last_cast, None
        if last is not None and last[0] is source and _current_node() is None:
            out = last[1]
            module = self.modules.path()
            where = f"in {module}" if module else ("in the root module" if module == "" else "outside modules")
            self._origins[out] = _Origin(
                out.dtype, OWN_CAST, f"{short_dtype(source.dtype)} -> {short_dtype(out.dtype)} {where}"
            )

    # -- every call, below the engine
    def ran(self, func: OpOverload, args: tuple, kwargs: dict, out) -> None:
        outs = _tensors(out)
        if not outs:
            return
        ins = _tensors((args, kwargs))
        if func is _TO_COPY:
            o = outs[0]
            if ins and o.is_floating_point() and o.dtype is not ins[0].dtype and (o.dtype is _F64 or o.dtype in _LOW):
                self._last_cast = (ins[0], o)
            return
        if self._origins:
            self._propagate(func, ins, outs)
        if self._find_nonfinite:
            self._check_finite(func, ins, outs)
        computed = _first_floating(outs)
        hit = self.modules.mapped()
        if hit is not None:
            expected = self._mapped_expected(func, None, hit)
            on = [t for t in ins if t.device.type == self.device_type and t.is_floating_point()]
            if (
                expected is None
                or computed is None
                or _computes_as(expected, computed)
                or not on
                or any(t.dtype is _F64 for t in on)
            ):
                return
            if _mode.is_enabled() and _engine.observing():
                return  # the engine's event for the call is judged by observe()
            self._mapped(func, self.modules.path(), hit, tuple(t.dtype for t in ins), computed, expected)
            return
        expected = self._expected(self._action(func))
        if expected is None or computed is None or computed is expected:
            return
        on = [t for t in ins if t.device.type == self.device_type]
        if not on:
            return
        if not _mode.is_enabled():
            if _engine.observing():
                return  # torch.autocast(enabled=False) in the watched region: its events say so
            self.add(
                Deviation(
                    Kind.DTYPE, func, self.modules.path(), DISABLED, tuple(t.dtype for t in ins), computed, expected
                )
            )
        elif not any(t.is_floating_point() for t in on):
            self.add(
                Deviation(
                    Kind.DTYPE, func, self.modules.path(), INTEGER, tuple(t.dtype for t in ins), computed, expected
                )
            )

    def _propagate(self, func, ins, outs) -> None:
        # An output keeps the origin of an input of its dtype; lower precision made by a lower
        # op is the policy's own, not passed on.
        lower_op = func in self._tables[CastPolicy.LOWER]
        for o in outs:
            if o.is_floating_point() and o.dtype is not _F32 and not (lower_op and o.dtype in _LOW):
                origin = self._origin(ins, o.dtype)
                if origin is not None and o not in self._origins:
                    self._origins[o] = origin

    def _check_finite(self, func, ins, outs) -> None:
        if self.nonfinite_at is not None:
            return
        floating = [o for o in outs if o.is_floating_point()]
        if floating and not all(map(_finite, floating)) and all(map(_finite, ins)):
            self.nonfinite_at = Deviation(
                Kind.NONFINITE, func, self.modules.path(), INF_NAN, tuple(t.dtype for t in ins), floating[0].dtype
            )

    # -- the region
    @contextlib.contextmanager
    def running(self, **mode_kwargs) -> Iterator["Watch"]:
        observer = combine_observers(self.observe, mode_kwargs.pop("observer", None))
        self.mode = _mode.HpuAutocastMode(
            self.dtype, policy=self.policy, device_type=self.device_type, observer=observer, **mode_kwargs
        )
        try:
            with self.modules, _Calls(self), self.mode:
                yield self
        except Exception as e:
            if self._found and hasattr(e, "add_note"):
                e.add_note(f"hpu_autocast.testing, before the error: {self.deviations}")
            raise
        finally:
            self._last_cast = None


def _computes_as(expected: torch.dtype, compute: Optional[torch.dtype]) -> bool:
    """Whether a call that computed in ``compute`` did as ``expected`` says (an fp8 region's lower
    op: fp8, or bfloat16 where fp8 does not take it)."""
    if is_fp8(expected):
        return compute is expected or compute is torch.bfloat16
    return compute is expected


def _float32_inputs(event: Event) -> List[Tuple[str, torch.Tensor]]:
    """The inputs a float32-kind op read, as ``(argument, tensor before any cast)``: FP32's cast
    ones (its event lists them), or the two dtype kinds' first argument, which they do not cast
    (the op reads it as it is and computes in float32)."""
    if event.action is CastPolicy.FP32:
        return [(c.arg, c.tensor) for c in event.casts]
    first = event.args[0] if event.args else None
    return [(_torch.schema(event.op).arguments[0].name, first)] if isinstance(first, torch.Tensor) else []


def _with_calls(d: Deviation, n: int) -> Deviation:
    return Deviation(d.kind, d.op, d.module, d.why, d.inputs, d.compute, d.expected, d.source, n)


def _roots(fn: Callable, modules) -> Dict[str, torch.nn.Module]:
    """The modules whose paths findings use: ``modules`` if given, else ``fn`` itself, the module
    of a bound method, or the modules ``fn`` refers to (one is the root; several keep their names)."""
    if modules is not None:
        return {"": modules} if isinstance(modules, torch.nn.Module) else dict(modules)
    if isinstance(fn, torch.nn.Module):
        return {"": fn}
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return {"": owner}
    try:
        refs = inspect.getclosurevars(fn)
    except (TypeError, ValueError):
        return {}
    found = {n: v for n, v in {**refs.globals, **refs.nonlocals}.items() if isinstance(v, torch.nn.Module)}
    if len(found) == 1:
        return {"": next(iter(found.values()))}
    return found


def _split_modules(modules, dtype: torch.dtype, mode_kwargs: dict):
    """``modules=`` as ``(roots, map)``: the modules whose paths findings use (a module, or a dict
    of names to modules), or a module map as ``HpuAutocastMode(modules=)`` takes it (a mapping of
    patterns to dtypes, presets, policies or None), which goes to the mode too (in ``mode_kwargs``)."""
    if modules is None or isinstance(modules, torch.nn.Module) or not isinstance(modules, Mapping) or not modules:
        return modules, None
    is_module = [isinstance(v, torch.nn.Module) for v in modules.values()]
    if all(is_module):
        return modules, None
    if any(is_module):
        raise TypeError(
            "hpu_autocast.testing: modules= is either the modules whose paths findings use (a module, or "
            "a dict of names to modules) or a module map (patterns to dtypes, presets, policies or None), "
            f"not both: got {dict(modules)!r}"
        )
    mode_kwargs["modules"] = modules
    return None, _module_map.parse_modules(modules, dtype)


def _resolve(policy, dtype, device_type) -> Tuple[Policy, str]:
    p = as_policy(policy)
    p.check_dtype(dtype)
    return p, device_type or _mode.default_device_type(p)


@contextlib.contextmanager
def watch_policy(
    dtype: torch.dtype = torch.bfloat16,
    *,
    policy: Union[str, Policy] = "hpu",
    device_type: Optional[str] = None,
    ignore: Iterable = (),
    modules=None,
    **mode_kwargs,
) -> Iterator[Watch]:
    """Run the body in a region of ``policy`` and collect what departs from its intent, from the
    events alone (no float32 run: writes and inf/nan need ``check_policy``).

        >>> with watch_policy(torch.bfloat16, policy="hpu", modules=model) as w:
        ...     model(x)
        >>> assert not w.deviations, w.deviations
    """
    p, device = _resolve(policy, dtype, device_type)
    modules, module_map = _split_modules(modules, dtype, mode_kwargs)
    w = Watch(p, dtype, device, _roots(None, modules) if modules is not None else {}, ignore, module_map=module_map)
    with w.running(**mode_kwargs):
        yield w


# --- check_policy: the mode run against a float32 run ---------------------------------------------


def _put_back(t: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:
    """Give ``t`` the values of ``saved`` again, in place where it still has their dtype and shape."""
    if t.dtype == saved.dtype and t.shape == saved.shape:
        t.copy_(saved)
    else:
        t.data = saved.clone()
    return t


class _Snapshot:
    """The parameters, gradients and buffers of the modules a run touches, to run again from
    the same state and to compare what each run wrote."""

    def __init__(self) -> None:
        self.entries: Dict[int, tuple] = {}  # id(module) -> (module, path, params, grads, buffers)

    def add(self, module: torch.nn.Module, path: str) -> None:
        if id(module) in self.entries:
            return
        for name, m in module.named_modules(remove_duplicate=False):
            if id(m) not in self.entries:
                sub = ".".join(p for p in (path, name) if p)
                clone = {n: (t, t.detach().clone()) for n, t in m._parameters.items() if t is not None}
                grads = {n: (t.grad.detach().clone() if t.grad is not None else None) for n, (t, _) in clone.items()}
                bufs = {n: (t, t.detach().clone()) for n, t in m._buffers.items() if t is not None}
                self.entries[id(m)] = (m, sub, clone, grads, bufs)

    @torch.no_grad()
    def restore(self) -> None:
        for m, _, params, grads, bufs in self.entries.values():
            for n, (t, saved) in params.items():
                m._parameters[n] = _put_back(t, saved)
                t.grad = None if grads[n] is None else grads[n].clone()
            for n, (t, saved) in bufs.items():
                m._buffers[n] = _put_back(t, saved)

    def state(self) -> Dict[str, tuple]:
        """``name -> (dtype, changed, finite, kind, module path)`` for each parameter, gradient and
        buffer now (``changed``: since the snapshot)."""
        out = {}
        for m, path, params, grads, bufs in self.entries.values():
            prefix = f"{path}." if path else ""
            for kind, items in (("parameter", params), ("buffer", bufs)):
                for n, (_, saved) in items.items():
                    now = m._parameters.get(n) if kind == "parameter" else m._buffers.get(n)
                    if now is None:
                        continue
                    changed = (
                        now.dtype != saved.dtype or now.shape != saved.shape or not torch.equal(now.detach(), saved)
                    )
                    out[f"{kind} {prefix}{n}"] = (now.dtype, changed, _finite(now), kind, path)
            for n, (t, _) in params.items():
                g = m._parameters[n].grad if m._parameters.get(n) is not None else None
                if g is not None:
                    out[f"gradient {prefix}{n}"] = (g.dtype, True, _finite(g), "gradient", path)
        return out


def _finite(t: torch.Tensor) -> bool:
    if not t.is_floating_point():
        return True
    with _engine.keys_excluded():  # the check is not the model's: no region sees it
        return bool(torch.isfinite(t.detach()).all())


class _Rng:
    """The RNG state of the CPU and of the region's device, to start every run alike."""

    def __init__(self, device_type: str) -> None:
        self.cpu = torch.random.get_rng_state()
        mod = getattr(torch, device_type, None) if device_type != "cpu" else None
        self.dev = (
            mod
            if mod is not None and hasattr(mod, "get_rng_state") and getattr(mod, "is_initialized", lambda: False)()
            else None
        )
        self.dev_state = self.dev.get_rng_state() if self.dev else None

    def restore(self) -> None:
        torch.random.set_rng_state(self.cpu)
        if self.dev is not None:
            self.dev.set_rng_state(self.dev_state)


def check_policy(
    fn: Callable,
    *inputs,
    dtype: torch.dtype = torch.bfloat16,
    policy: Union[str, Policy] = "hpu",
    device_type: Optional[str] = None,
    reference: bool = True,
    ignore: Iterable = (),
    modules=None,
    **mode_kwargs,
) -> Deviations:
    """Run ``fn(*inputs)`` under ``HpuAutocastMode(dtype, policy=policy)`` and return how it
    departed from the policy's intent (``Deviations``, empty when it did not).

    Reported: a listed op that did not compute in the dtype the policy gives it, and why
    (float64 or integer inputs, an explicit ``dtype=``, a disabled block, the model's own
    cast); an FP32-list op that received values rounded to lower precision by something other
    than the policy; and, against a float32 run of ``fn`` from the same state and RNG
    (``reference=True``), a parameter or buffer write that was lost or cast and an inf/nan the
    float32 run does not have. Each deviation names the op overload, the module path when known
    and the dtypes. ``ignore`` drops deviations of the given whys (``"explicit dtype"``) or kinds
    (``"rounded"``).

    ``fn`` runs twice with ``reference=True`` (thrice when it finds an inf/nan, to name the op
    that made it); the parameters, gradients and buffers of the modules it runs are put back
    between runs, so the state left is the mode run's. Other side effects (an optimizer's own
    state) happen once per run. ``Deviations.output`` is what ``fn`` returned under the mode.
    """
    p, device = _resolve(policy, dtype, device_type)
    modules, module_map = _split_modules(modules, dtype, mode_kwargs)
    roots = _roots(fn, modules)
    snapshot = _Snapshot()
    for prefix, root in roots.items():
        snapshot.add(root, prefix)
    rng = _Rng(device)
    ref_out = ref_state = None
    if reference:
        with _ModuleStack(roots, snapshot.add):
            ref_out = fn(*inputs)
        ref_state = snapshot.state()
        snapshot.restore()
        rng.restore()

    def run(find_nonfinite: bool = False) -> Tuple[Watch, object]:
        w = Watch(p, dtype, device, roots, ignore, find_nonfinite=find_nonfinite, module_map=module_map)
        w.mark_inputs(inputs)
        with w.running(**mode_kwargs):
            return w, fn(*inputs)

    w, out = run()
    found = list(w.deviations)
    if reference:
        state = snapshot.state()
        found += [d for d in _writes(ref_state, state) if not w.ignores(d)]
        nonfinite = _nonfinite(ref_out, out, ref_state, state)
        if nonfinite:
            snapshot.restore()
            rng.restore()
            w3, out = run(find_nonfinite=True)
            at = w3.nonfinite_at or Deviation(Kind.NONFINITE, None, None, INF_NAN)
            shown = ", ".join(nonfinite[:3]) + (f" and {len(nonfinite) - 3} more" if len(nonfinite) > 3 else "")
            d = Deviation(at.kind, at.op, at.module, at.why, at.inputs, at.compute, None, shown)
            if not w.ignores(d):
                found.append(d)
    return Deviations(found, p.name, dtype, out)


def _writes(ref: Dict[str, tuple], now: Dict[str, tuple]) -> List[Deviation]:
    """Parameters and buffers whose write differs from the float32 run's: another dtype, not
    written where it was, written where it was not."""
    found = []
    for name, (dtype, changed, _, kind, path) in now.items():
        if kind == "gradient" or name not in ref:
            continue
        ref_dtype, ref_changed = ref[name][0], ref[name][1]
        if dtype is not ref_dtype:
            why = WRITE_CAST
        elif ref_changed and not changed:
            why = WRITE_LOST
        elif changed and not ref_changed:
            why = WRITE_EXTRA
        else:
            continue
        found.append(Deviation(Kind.WRITE, None, path, why, (), dtype, ref_dtype, name))
    return found


def _nonfinite(ref_out, out, ref_state, state) -> List[str]:
    """What is inf/nan after the mode run and finite after the float32 run: outputs, gradients,
    parameters and buffers, by name."""
    names = []
    ref_leaves = {keystr(p): t for p, t in tree_flatten_with_path(ref_out)[0]}
    for path, t in tree_flatten_with_path(out)[0]:
        r = ref_leaves.get(keystr(path))
        if isinstance(t, torch.Tensor) and isinstance(r, torch.Tensor) and not _finite(t) and _finite(r):
            names.append(f"output out{keystr(path)}")
    for name, (_, _, finite, _, _) in state.items():
        if not finite and ref_state.get(name, (None, None, False))[2]:
            names.append(name)
    return names


def assert_follows_policy(fn: Callable, *inputs, **kwargs):
    """``check_policy``, raising ``PolicyViolation`` (an ``AssertionError``) listing the
    deviations, if any; returns what ``fn`` returned under the mode."""
    found = check_policy(fn, *inputs, **kwargs)
    if found:
        raise PolicyViolation(found)
    return found.output

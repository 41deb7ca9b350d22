"""Compile a ``Policy`` into the two lookup tables the engine reads on its hot path.

* ``dispatch``: ``OpOverload -> OpRule``, read by the dispatch mode for every ATen call.
* ``function``: Python callable (``torch.mm``, ``Tensor.matmul``, ``F.linear``, ...) ->
  ``FuncRule``, read by the function mode for every torch-level call.

[Note: why two levels] A ``TorchDispatchMode`` runs below autograd and after
``CompositeImplicitAutograd`` ops (linear, layer_norm, cross_entropy_loss, ...) have
decomposed. Native autocast sits above both. So a call that the function mode can map to a
policy op is cast there, above autograd, exactly as native autocast does: the casts are
recorded by autograd (``ToCopyBackward``) and a composite's insides are left alone. Calls the
function mode cannot see (ATen calls made from C++, such as the ``mkldnn_rnn_layer`` inside
``nn.LSTM``) are cast by the dispatch mode, by exact overload, with the autograd bridge of
``_bridge.py``.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch._ops import OpOverload

from . import _compat, _ops
from .policy import CastPolicy, Policy
from .names import PYTHON_ALIASES

__all__ = ["OpRule", "FuncRule", "CompiledPolicy", "compile_policy", "DEFER"]


class OpRule:
    """How one overload is handled: its action and the arguments it must not cast."""

    __slots__ = ("op", "name", "action", "input_only", "params_follow", "protected", "protected_names", "banned")

    def __init__(self, op: OpOverload, action: CastPolicy, input_only: bool, banned: Optional[str]) -> None:
        self.op = op
        self.name = str(op)
        self.action = action
        self.input_only = input_only
        # An input-only norm whose kernel off CPU/HPU needs its weight in the input's dtype.
        self.params_follow = input_only and _ops.op_base_name(op) in _ops.PARAMS_FOLLOW_INPUT
        written = _ops.written_positions(op)
        self.protected = frozenset(i for i, _ in written)
        self.protected_names = frozenset(n for _, n in written)
        self.banned = banned

    def casts_input_only(self, args: tuple) -> bool:
        """Whether this call casts its first tensor alone (weight and bias keep their dtype)."""
        if self.params_follow:
            return _ops.first_device_type(args) in _ops.MIXED_PARAMS_DEVICES
        return self.input_only

    def same_handling(self, other: "OpRule") -> bool:
        return (self.action, self.input_only, self.protected, self.banned) == (
            other.action, other.input_only, other.protected, other.banned)

    def __repr__(self) -> str:
        return f"OpRule({self.name}, {self.action})"


#: ``FuncRule.select`` result: the call may be any overload; let the dispatch mode decide.
DEFER = object()


class FuncRule:
    """The policy for one Python callable that stands for an ATen packet."""

    __slots__ = ("qualname", "uniform", "by_overload", "out_rules", "positions")

    def __init__(self, qualname: str, by_overload: Dict[str, OpRule], all_functional: list,
                 out_rules: Dict[str, OpRule], positions: Optional[Dict[str, int]] = None,
                 dtype_bound: frozenset = frozenset()) -> None:
        self.qualname = qualname
        self.by_overload = by_overload
        self.out_rules = out_rules
        # The common case: every functional overload is in the table and handled alike, so
        # the call's overload need not be resolved. Overloads that take a dtype (mm.dtype)
        # do not count: a call of theirs has an explicit dtype and is never eligible.
        rules = [by_overload.get(o) for o in all_functional if o not in dtype_bound]
        first = rules[0] if rules else None
        self.uniform = first if first is not None and all(r is not None and r.same_handling(first) for r in rules) else None
        #: For Python-level wrappers (the fallback without redispatch): argument name -> index.
        self.positions = positions

    def select(self, args: tuple, kwargs: dict):
        """The ``OpRule`` this call is, ``None`` when the policy leaves it alone, or ``DEFER``."""
        if self.positions is not None and self._inplace(args, kwargs):
            return None  # F.dropout(x, inplace=True) writes x: an in-place call is not eligible
        if kwargs.get("out") is not None:
            if not self.out_rules:
                return None
            return self._resolve(args, kwargs, self.out_rules)
        if self.uniform is not None:
            return self.uniform
        return self._resolve(args, kwargs, self.by_overload)

    def _inplace(self, args: tuple, kwargs: dict) -> bool:
        i = self.positions.get("inplace")
        if i is None:
            return False
        return bool(kwargs.get("inplace", args[i] if i < len(args) else False))

    def _resolve(self, args: tuple, kwargs: dict, rules: Dict[str, OpRule]):
        try:
            overload = torch._C._jit_resolve_packet(self.qualname, *args, **kwargs)
        except Exception:
            return DEFER
        return rules.get(overload or "default")


class CompiledPolicy:
    """A policy with a dtype, ready for the engine's hot path."""

    __slots__ = ("policy", "dtype", "dispatch", "function", "has_defaults", "_defaults")

    def __init__(self, policy: Policy, dtype: torch.dtype) -> None:
        self.policy = policy
        self.dtype = dtype
        banned = policy.banned
        self.dispatch: Dict[OpOverload, OpRule] = {
            op: OpRule(op, action, op in policy.input_only, banned.get(op)) for op, action in policy.table.items()
        }
        for op, message in banned.items():
            if op not in self.dispatch:
                self.dispatch[op] = OpRule(op, CastPolicy.FP32, False, message)
        self.function: Dict[Callable, FuncRule] = _function_table(self.dispatch)
        self._defaults: Dict[OpOverload, Optional[OpRule]] = {}
        #: Whether ops not in the table may still have a rule (HMP's ``unlisted``/``inplace``).
        self.has_defaults = policy.unlisted is not None or policy.inplace is not None

    def default_rule(self, op: OpOverload) -> Optional[OpRule]:
        """The rule for an op not in the table under the policy's ``unlisted``/``inplace``
        defaults (HMP), built once per overload. ``out=`` overloads and ops whose
        ``Tensor(a)`` outputs alias an input (views) are left alone."""
        try:
            return self._defaults[op]
        except KeyError:
            pass
        rule = None
        if not _ops.is_out(op) and not _is_view(op):
            action = self.policy.inplace if _ops.is_inplace(op) else (
                self.policy.unlisted if _ops.is_functional(op) else None)
            if action is not None:
                rule = OpRule(op, action, False, None)
        self._defaults[op] = rule
        return rule


def _is_view(op: OpOverload) -> bool:
    # An in-place op returns `Tensor(a!)`: aliased but written, which is not a view.
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


# Namespaces whose builtins carry ATen names unchanged (torch._C._linalg.linalg_vecdot, ...).
def _namespaces() -> list:
    spaces = [torch._C._VariableFunctions, torch._C._nn, torch._C.TensorBase]
    for name in ("_linalg", "_fft", "_special"):
        ns = getattr(torch._C, name, None)
        if ns is not None:
            spaces.append(ns)
    return spaces


#: Python-level wrappers in torch.nn.functional whose ATen name differs from theirs. Used only
#: where ``redispatch_function`` is missing (torch < 2.13), to apply the policy at the wrapper.
F_ALIASES = {"cross_entropy": "cross_entropy_loss", "nll_loss": "nll_loss_nd", "dropout1d": "feature_dropout",
             "dropout2d": "feature_dropout", "dropout3d": "feature_dropout"}


#: Composite builtins that call a policy op from C++ only, so that neither level sees the op by
#: its own name (the dispatch mode sees what it decomposes into). Native autocast casts at the
#: inner call; the function level applies the inner op's rule at the builtin instead, which is
#: the same cast at the same values: the builtin only reshapes before the inner call.
#: builtin name -> the inner op, from the rank of the first argument.
NESTED: Dict[str, Callable[[int], str]] = {
    "nll_loss_nd": lambda rank: "nll_loss" if rank <= 2 else "nll_loss2d",
    # torch.special.softmax / log_softmax call at::softmax / at::log_softmax from C++.
    "special_softmax": lambda rank: "softmax",
    "special_log_softmax": lambda rank: "log_softmax",
}


class NestedRule:
    """``FuncRule.select`` for a builtin of ``NESTED``: the rule of the inner op it will call."""

    __slots__ = ("pick", "inner", "positions")

    def __init__(self, pick: Callable[[int], str], inner: Dict[str, FuncRule]) -> None:
        self.pick = pick
        self.inner = inner
        self.positions = None

    def select(self, args: tuple, kwargs: dict):
        x = args[0] if args else kwargs.get("self")
        rule = self.inner.get(self.pick(x.dim())) if isinstance(x, torch.Tensor) else None
        return rule.select(args, kwargs) if rule is not None else None


def _function_table(dispatch: Dict[OpOverload, OpRule]) -> Dict[Callable, FuncRule]:
    by_packet: Dict[str, Dict[str, OpRule]] = {}
    for op, rule in dispatch.items():
        by_packet.setdefault(_ops.op_base_name(op), {})[op._overloadname] = rule
    table: Dict[Callable, FuncRule] = {}
    spaces = _namespaces()

    def add(fn: Callable, base: str, positions: Optional[Dict[str, int]] = None) -> None:
        rules = by_packet.get(base)
        packet = _ops.find_packet(*(base.split("::") if "::" in base else ("aten", base)))
        if not rules or packet is None:
            return
        ops = list(_ops.overloads(packet))
        functional = [op._overloadname for op in ops if _ops.is_functional(op) or base.endswith("_")]
        func_rules = {o: r for o, r in rules.items() if o in functional}
        out_rules = {o: r for o, r in rules.items() if o not in functional}
        qual = packet._qualified_op_name
        dtype_bound = frozenset(op._overloadname for op in ops if _ops.requires_dtype(op))
        table.setdefault(fn, FuncRule(qual, func_rules, functional, out_rules, positions, dtype_bound))

    for base in by_packet:
        for ns in spaces:
            fn = getattr(ns, base, None)
            if fn is not None and not isinstance(fn, types.FunctionType):
                add(fn, base)
    for alias, target in PYTHON_ALIASES.items():
        if alias.startswith("__") and isinstance(target, str):
            fn = getattr(torch._C.TensorBase, alias, None)
            if fn is not None:
                add(fn, target)
    # torch.ops.* calls (custom ops included) reach the function mode as the packet or the
    # overload itself; an overload names its rule exactly.
    for op, rule in dispatch.items():
        add(op.overloadpacket, _ops.op_base_name(op))
        table.setdefault(op, FuncRule(op.overloadpacket._qualified_op_name, {op._overloadname: rule},
                                      [op._overloadname], {}))
    for name, pick in NESTED.items():
        fn = next((getattr(ns, name) for ns in spaces if hasattr(ns, name)), None)
        inner = {}
        for base in by_packet:
            builtin = next((getattr(ns, base) for ns in spaces if getattr(ns, base, None) in table), None)
            if builtin is not None:
                inner[base] = table[builtin]
        if fn is not None and inner:
            table[fn] = NestedRule(pick, inner)
    if not _compat.HAS_REDISPATCH:
        # Python-level wrappers, matched by name: torch.nn.functional, torch.functional (cdist,
        # stft, norm), and Tensor methods written in Python (Tensor.stft).
        for space in (F, torch.functional, torch.Tensor):
            for name in dir(space):
                fn = getattr(space, name, None)
                if isinstance(fn, types.FunctionType):
                    alias = PYTHON_ALIASES.get(name)
                    base = F_ALIASES.get(name) or (alias if isinstance(alias, str) else name)
                    nested = next((table[getattr(ns, base)] for ns in spaces
                                   if base in NESTED and getattr(ns, base, None) in table), None)
                    if nested is not None:
                        table.setdefault(fn, nested)
                    elif base in by_packet and fn not in table:
                        params = list(inspect.signature(fn, follow_wrapped=False).parameters)
                        add(fn, base, {p: i for i, p in enumerate(params)})
    return table


@functools.lru_cache(maxsize=64)
def compile_policy(policy: Policy, dtype: torch.dtype) -> CompiledPolicy:
    return CompiledPolicy(policy, dtype)

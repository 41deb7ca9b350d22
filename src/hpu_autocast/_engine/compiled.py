"""Compile a ``Policy`` into what the engine reads on its hot path: one ``OpRule`` per overload.

A rule holds everything about an overload that does not depend on the call: its action, the
arguments it writes (never replaced by a cast copy), whether it casts its input alone (Gaudi's
norms), its ban message, its schema's argument names (for events), and where a call's tensors
can be (``walk``: the cast walk looks its positions up).
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from typing import Dict, Optional

import torch

from .. import _torch
from .._facts import ops as _ops
from .._facts.devices import MIXED_PARAMS_DEVICES
from .._torch import OpOverload
from ..policies.policy import CastPolicy, Policy

__all__ = ["OpRule", "CompiledPolicy", "compile_policy"]


#: The cast policies the explicit-dtype rule (``Policy.explicit_dtype``) applies to; the two
#: float32 dtype policies read dtype arguments themselves.
_CASTING = frozenset({CastPolicy.LOWER, CastPolicy.FP32, CastPolicy.PROMOTE, CastPolicy.FIRST})


class OpRule:
    """How one overload is handled."""

    __slots__ = (
        "op",
        "name",
        "action",
        "input_only",
        "params_follow",
        "protected",
        "written_names",
        "into",
        "banned",
        "arg_names",
        "walk",
        "leave_explicit",
        "dtype_args",
        "redispatch",
        "default",
        "native",
        "core",
    )

    def __init__(
        self,
        op: OpOverload,
        action: Optional[CastPolicy],
        input_only: bool = False,
        banned: Optional[str] = None,
        default: Optional[str] = None,
        native=None,
        explicit_dtype: str = "leave",
    ) -> None:
        self.op = op
        self.name = str(op)
        self.action = action
        self.input_only = input_only
        # An input-only norm whose kernel off CPU/HPU needs its weight in the input's dtype.
        self.params_follow = input_only and _ops.op_base_name(op) in _ops.PARAMS_FOLLOW_INPUT
        written = _ops.written_positions(op)
        self.protected = frozenset(i for i, _ in written)
        #: The same by name: a keyword argument (``out=``) is never replaced by a cast copy either.
        self.written_names = frozenset(name for _, name in written)
        #: The written arguments the op returns (an in-place ``self``, ``out=``), by name: the op
        #: computes into copies in its dtype, written back into them (``_inplace.write_back``).
        self.into = frozenset(name for _, name in _ops.result_positions(op))
        self.banned = banned
        self.arg_names = tuple(a.name for a in _torch.schema(op).arguments)
        #: Where a call's tensors can be, by its count of positional arguments (``_ops.tensor_walk``),
        #: for the cast walk to look up rather than find per call; ``None``: found per call (a list
        #: of tensors, ``out=``, or an input-only rule, whose first tensor depends on the device).
        self.walk = None if input_only else _ops.tensor_walk(op)
        #: Whether a call passing a ``torch.dtype`` runs unchanged (``Policy.explicit_dtype`` is
        #: ``"leave"``, seed 003's rule, and the rule casts).
        self.leave_explicit = (
            explicit_dtype == "leave" and action in _CASTING and native is None and bool(_ops.dtype_positions(op))
        )
        #: The dtype arguments the rule reads: FP32_SET_OPT_DTYPE's optional ones (which it sets),
        #: or, where ``leave_explicit``, every one (a call passing one runs unchanged).
        self.dtype_args = (
            _ops.optional_dtype_positions(op)
            if action is CastPolicy.FP32_SET_OPT_DTYPE
            else _ops.dtype_positions(op)
            if self.leave_explicit
            else ()
        )
        #: FP32_APPEND_DTYPE's overload with the dtype argument (``_ops.APPEND_DTYPE``).
        self.redispatch = _ops.append_dtype_overload(op) if action is CastPolicy.FP32_APPEND_DTYPE else None
        #: Which of the policy's defaults for ops on no list made this rule (HMP): ``"unlisted"``
        #: (functional ops) or ``"in-place"``; ``"fused"`` for a fused fast path (Note [fused fast
        #: paths] in _ops); ``None`` for a rule of the table.
        self.default = default
        #: The native autocast key this op is left to (``Policy.native``; its action is then
        #: ``None``): the kernel registered there casts as it was registered to.
        self.native = native
        #: [Note: which calls the core decides] The one place that says which rules the C++ core
        #: applies itself: all but those left to native autocast, banned ops (their error), and
        #: named in-place and ``out=`` overloads (computed into copies, ``_inplace``), which it
        #: hands to the Python kernels. (At each call the core also hands over what only Python
        #: can see: csrc/core.cpp's ``Kernel::operator()``.)
        self.core = action is not None and native is None and banned is None and not self.into

    def casts_input_only(self, device_type: str) -> bool:
        """Whether a call on ``device_type`` casts its first tensor alone (weight and bias keep
        their dtype)."""
        if self.params_follow:
            return device_type in MIXED_PARAMS_DEVICES
        return self.input_only

    def __repr__(self) -> str:
        return f"OpRule({self.name}, {self.action})"


# [Note: what a compiled policy learns after it is built]
# A compiled policy is shared by every region of its policy: ``compile_policy``'s cache keeps the
# 64 most recently used, and each open region holds its own. Besides its rules it keeps three
# things it learns from torch later, not from the policy, and they change in place:
# * ``registered``: its kernels are on the OPS key. ``_dispatch.Keys`` owns what is registered
#   (and skips what is already there); this flag spares a region's entry the walk over the rules.
# * ``_defaults``: HMP's rule for an op on no list, built at the op's first call.
# * ``native_ops``: rules for custom ops registered on native's key after the policy compiled,
#   added to ``rules``/``by_id`` themselves, so an open region of the policy honours them as the
#   next region would (``_native_epoch``: torch.library's record size at the last look).
# Each is a function of the policy and of the dispatcher's registrations, so any compiled copy
# is right: one dropped from the cache and compiled again learns them again. Two threads
# learning one thing at once write equal values (one dict assignment each, atomic under the
# GIL). A rule left for a custom op whose registration was later removed hands the op to a
# native key with no kernel for it: it runs uncast, as under native autocast.
class CompiledPolicy:
    """A policy's rules, keyed by overload, plus its defaults for ops on no list (and what it
    learns from torch later: Note above)."""

    __slots__ = (
        "policy",
        "rules",
        "by_id",
        "has_defaults",
        "_defaults",
        "key",
        "registered",
        "_native_epoch",
        "tables",
    )

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        banned = policy.banned
        self.rules: Dict[OpOverload, OpRule] = {
            op: OpRule(op, action, op in policy.input_only, banned.get(op), explicit_dtype=policy.explicit_dtype)
            for op, action in policy.table.items()
        }
        for op, message in banned.items():
            if op not in self.rules:
                self.rules[op] = OpRule(op, CastPolicy.FP32, False, message, explicit_dtype=policy.explicit_dtype)
        if policy.native is None:  # Note [fused fast paths] (_ops)
            for name in _ops.FUSED_FAST_PATHS:
                packet = getattr(torch.ops.aten, name, None)
                for op in _ops.overloads(packet) if packet is not None else ():
                    if op not in self.rules:
                        self.rules[op] = OpRule(op, CastPolicy.PROMOTE, default="fused")
        #: The same rules keyed by ``id(op)``, which hashes in C (the kernels look them up).
        self.by_id: Dict[int, OpRule] = {id(op): rule for op, rule in self.rules.items()}
        #: Whether ops on no list may still have a rule (HMP's ``unlisted``/``inplace``).
        self.has_defaults = policy.unlisted is not None or policy.inplace is not None
        self._defaults: Dict[OpOverload, Optional[OpRule]] = {}
        #: A short string that tells policies apart (Dynamo guards compiled code on it): the
        #: policy's name and its serial (see ``policy_serial``).
        self.key = f"{policy.name}#{policy_serial(policy)}"
        #: Whether the engine's kernels for these rules are registered (set by the first region
        #: to open; Note: what a compiled policy learns after it is built).
        self.registered = False
        self._native_epoch = None
        #: The C++ core's region kinds for these rules, by device type (``_core._kind``).
        self.tables: dict = {}

    def native_ops(self) -> list:
        """Rules for the custom ops ``Policy.native``'s key has kernels for (given there by
        ``torch.library.register_autocast``) that the table does not name, added since the last
        call; ``[]`` when nothing was registered since. aten ops are the table's alone: one a
        user took off a native policy's lists stays off. The dispatcher is asked again only when
        torch.library's record of Python registrations changed size (asking costs ~0.2 ms)."""
        key = self.policy.native
        if key is None:
            return []
        epoch = _torch.python_registrations() or 0
        if epoch == self._native_epoch:
            return []
        self._native_epoch = epoch
        added = []
        for name in _torch.registrations_for(key):
            if name.startswith("aten::"):
                continue
            op = _ops.overload_named(name)
            if op is None or id(op) in self.by_id:
                continue
            rule = OpRule(op, None, native=getattr(_torch.DispatchKey, key))
            self.rules[op] = self.by_id[id(op)] = rule
            added.append(op)
        return added

    def default_rule(self, op: OpOverload) -> Optional[OpRule]:
        """The rule for an op on no list under the policy's ``unlisted``/``inplace`` defaults
        (HMP), built once per overload. ``out=`` overloads and views are left alone."""
        try:
            return self._defaults[op]
        except KeyError:
            pass
        rule = None
        if not _ops.is_out(op) and not _ops.is_view(op):
            if _ops.is_inplace(op):
                action, which = self.policy.inplace, "in-place"
            else:
                action, which = (self.policy.unlisted if _ops.is_functional(op) else None), "unlisted"
            if action is not None:
                rule = OpRule(op, action, default=which, explicit_dtype=self.policy.explicit_dtype)
        self._defaults[op] = rule
        return rule


# [Note: a compiled policy's key]
# Compiled code is guarded on which policy a region applies (``_compile_guard``), so the key
# must differ whenever two policies could make a kernel do something different: the table, but
# also ``input_only``, ``banned``, ``unlisted``/``inplace``, ``native``... A hash of some of
# the fields missed the others (two policies of one name and table shared a compiled graph) and
# could collide. A serial number cannot: serials only grow and are never reused, and a policy
# keeps the one it was given (on itself). A registry keyed by the policy (dataclass equality:
# every field of its value, so a field added later is covered without more work; not its build
# record, which changes no cast) hands an equal policy the same serial, so it reuses the
# compiled code; its entries are weak, and an equal policy built after all holders of a serial
# were freed gets a new one: a recompilation, never a collision.
# The lru_cache below may drop a compiled policy; compiling it again finds the same serial.
_SERIALS: "weakref.WeakKeyDictionary[Policy, int]" = weakref.WeakKeyDictionary()
_NEXT_SERIAL = itertools.count(1)
_serials_lock = threading.Lock()


def policy_serial(policy: Policy) -> int:
    """A number that no unequal policy ever gets, the same for equal policies while one of
    them holds it."""
    with _serials_lock:
        serial = policy._serial or _SERIALS.get(policy) or next(_NEXT_SERIAL)
        object.__setattr__(policy, "_serial", serial)
        _SERIALS.setdefault(policy, serial)
        return serial


def compile_policy(policy: Policy) -> CompiledPolicy:
    """The compiled form of ``policy``, shared by every region of it (policies are values: its
    ``policy`` may be another policy equal to this one, perhaps with another build record)."""
    compiled = _compiled(policy)
    if not policy._serial:
        # An equal policy's compiled form, from the cache: this one takes its serial too, and
        # keeps it when the cache drops that one (see the Note above).
        policy_serial(policy)
    return compiled


@functools.lru_cache(maxsize=64)
def _compiled(policy: Policy) -> CompiledPolicy:
    return CompiledPolicy(policy)

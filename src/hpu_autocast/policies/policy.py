"""Cast policies as plain, frozen data: a table from ``OpOverload`` to ``CastPolicy``.

A ``Policy`` knows nothing about how casting happens, nor about op names: the engine reads
it, ``hpu_autocast.policies.builder`` builds it from names (which resolve through
``hpu_autocast.policies.names``), and ``hpu_autocast.policies.presets`` says which names make each
preset. How a policy was built is its ``BuildRecord``, kept beside the value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Iterable, Mapping, Optional

import torch

from .._torch import OpOverload
from .._facts import ops as _ops
from .recipes import FP8_DTYPES, RECIPES, Recipe, Tensorwise, supports

__all__ = ["CastPolicy", "Policy", "BuildRecord", "EXPLICIT_DTYPE"]


class CastPolicy(enum.Enum):
    """What happens to an eligible call of an op in the table: ATen's five cast policies
    (``CastPolicy`` in ``aten/src/ATen/autocast_mode.h``, one ``WrapFunction_`` each) and
    Gaudi's lower-first.

    Eligible tensors are floating, not float64, on the region's device, and not written by the
    op; everything else (integer and bool tensors, float64 tensors, Python scalars) passes
    through unchanged.
    """

    #: ATen's ``lower_precision_fp``: every eligible tensor input is cast to the region's
    #: lower-precision dtype; the op computes, and returns, that dtype.
    LOWER = "lower"
    #: ATen's ``fp32``: every eligible tensor input is cast to float32; the op computes in
    #: float32.
    FP32 = "fp32"
    #: ATen's ``fp32_set_opt_dtype``, for ops (softmax, sum, cumsum) with an optional dtype
    #: argument that sets their output type: if the first argument is an eligible tensor, every
    #: optional dtype argument the call leaves unset becomes float32 and nothing is cast (the op
    #: reads its lower-precision input and computes in float32); one the call sets is kept. If
    #: the first argument is not eligible, the call runs unchanged.
    FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"
    #: ATen's ``fp32_append_dtype``, for overloads with no dtype argument (``norm.Scalar``)
    #: whose sibling overload takes one (``norm.ScalarOpt_dtype``): the call goes to that
    #: sibling (``_ops.APPEND_DTYPE``) with dtype float32 if the first argument is an eligible
    #: tensor, else the first argument's own dtype; nothing is cast.
    FP32_APPEND_DTYPE = "fp32_append_dtype"
    #: ATen's ``promote``: every eligible tensor input is cast to the widest floating dtype
    #: among them: float32 if any is float32, else the region's dtype; if they already agree,
    #: nothing is cast. Another lower dtype (a bfloat16 input in a float16 region) raises
    #: ``rules.PromoteError``, as native autocast does.
    PROMOTE = "promote"
    #: Gaudi's and HMP's lower-first: every eligible tensor input is cast to the dtype of the
    #: first eligible tensor input. Given to in-place ops on a promote list (their output is
    #: their first input, whose dtype cannot change) and, by HMP, to ops on no list.
    FIRST = "first"

    # Members are singletons compared by identity: hashed so too, in C (Enum's own hash is a
    # Python method, asked at each kernel call: _engine.kernels._POLICY is keyed by the member).
    __hash__ = object.__hash__

    def __str__(self) -> str:
        return self.value


#: What a call passing a ``torch.dtype`` argument to a LOWER, FP32, PROMOTE or FIRST op gets
#: (``Policy.explicit_dtype``): ``"leave"``, the rule torch.amp's documentation states (seed
#: 003: "Ops called with an explicit dtype=... argument are not eligible"): the call runs
#: unchanged; ``"cast"``, what ATen's ``WrapFunction_`` and Gaudi's ``Hpu_WrapFunction_``
#: really do: the eligible tensors are cast whatever the other arguments say. (The two
#: float32 dtype policies have their own rule for dtype arguments.)
EXPLICIT_DTYPE = ("leave", "cast")


_ACCEPTED = ", ".join(f"CastPolicy.{a.name} or {a.value!r}" for a in CastPolicy)


def _action(value: object, where: str) -> CastPolicy:
    """``value`` as a ``CastPolicy``; its string value (``"lower"``) is accepted too."""
    if isinstance(value, CastPolicy):
        return value
    if isinstance(value, str):
        try:
            return CastPolicy(value)
        except ValueError:
            pass
    raise ValueError(f"{where} = {value!r} is not a cast policy; accepted: {_ACCEPTED}")


def takes(op: OpOverload, action: CastPolicy) -> bool:
    """Whether ``op`` can take ``action``: the two float32 dtype policies need a functional
    overload with a first tensor argument and a dtype argument to set (FP32_SET_OPT_DTYPE) or a
    sibling overload to go to (FP32_APPEND_DTYPE); the others take any op."""
    if action is CastPolicy.FP32_SET_OPT_DTYPE:
        return (
            _ops.first_is_tensor(op)
            and bool(_ops.optional_dtype_positions(op))
            and not (_ops.is_out(op) or _ops.is_inplace(op))
        )
    if action is CastPolicy.FP32_APPEND_DTYPE:
        return _ops.first_is_tensor(op) and _ops.append_dtype_overload(op) is not None
    return True


def _check_kind(op: OpOverload, action: CastPolicy, policy: str) -> None:
    """Raise ``ValueError`` naming ``op`` if it cannot take ``action`` (``takes``)."""
    if takes(op, action):
        return
    if action is CastPolicy.FP32_SET_OPT_DTYPE:
        need = "a functional overload with a first Tensor argument and an optional dtype argument (ScalarType?)"
    else:
        need = f"an entry in ATen's redispatch table, one of: {', '.join(sorted(_ops.APPEND_DTYPE))}"
    raise ValueError(f"Policy {policy!r}: {op} cannot be {action.value}: that cast policy needs {need}")


def _overload(key: object, where: str) -> OpOverload:
    if not isinstance(key, OpOverload):
        raise TypeError(
            f"{where}: {key!r} is a {type(key).__name__}, not an OpOverload such as "
            f"torch.ops.aten.mm.default; to build a policy from op names use hpu_autocast.build_policy"
        )
    return key


@dataclass(frozen=True)
class BuildRecord:
    """How a policy was built: what its build let go of, and what a rebuild from it needs.

    The builder attaches one to each policy it builds (``Policy.record``); ``with_lists`` and
    ``Policy.edit`` read it to resolve new names as the policy's own were resolved, and ``hpu-autocast
    policy`` and ``docs/policies.md`` print it. It is a record of how a policy was made, not part of
    what the policy does: two policies that differ only in their records are equal.
    """

    #: Names from the source lists that this torch does not have.
    missing: tuple = ()
    #: The list names the policy does not apply, as ``(name, list, why)``: under
    #: ``c_names_only``, Python names (``iadd``) and in-place or ``out=`` ones (``add_``).
    ignored: tuple = ()
    #: The ops of the policy a ``with_lists`` (or a list file) started from that the new lists
    #: left on no list, as ``(overload name, the kind it had)``, in table order: a region of the
    #: policy warns of them once (``builder.as_policy``).
    dropped: tuple = ()
    #: Every op of the promote list, also those a lower or FP32 entry overrides: when a user
    #: replaces the lower list (``with_lists``), an op it no longer names falls back to promote.
    promoted: frozenset = frozenset()
    #: The list names were applied as Gaudi's bridge applies them, C++ function names of
    #: functional ops only (the ``hpu`` preset); ``with_lists`` and ``edit`` apply new names so too.
    c_names_only: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dropped", tuple(map(tuple, self.dropped)))
        object.__setattr__(self, "missing", tuple(self.missing))
        object.__setattr__(self, "ignored", tuple(map(tuple, self.ignored)))
        promoted = frozenset(self.promoted)
        for op in promoted:
            _overload(op, "BuildRecord: promoted")
        object.__setattr__(self, "promoted", promoted)

    def __reduce__(self):
        # Overloads travel by qualified name, as in Policy.__reduce__.
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["promoted"] = sorted(map(_ops.qualified_name, self.promoted))
        return (_record_from_names, (state,))


def _record_from_names(state: dict) -> BuildRecord:
    """The inverse of ``BuildRecord.__reduce__``."""
    return BuildRecord(**{**state, "promoted": frozenset(map(_ops.overload_named, state["promoted"]))})


@dataclass(frozen=True)
class Policy:
    """An immutable autocast policy.

    ``table`` maps op overloads to ``CastPolicy`` (or its string value, ``"lower"``). Ops not
    in the table run as their inputs are. ``input_only`` names overloads that cast only their
    first tensor argument (Gaudi's norms: weight, bias and running statistics keep their
    dtype). ``banned`` maps overloads to the error message a call raises inside an enabled
    region. ``dtypes`` are the lower-precision dtypes the policy accepts.

    A policy is a value: equal policies hash alike, and it survives ``copy.deepcopy`` and
    ``pickle`` (overloads travel by qualified name). Its ``record`` (a ``BuildRecord``: how it
    was built, read as ``missing``, ``ignored``, ``promoted`` and ``c_names_only``) travels with it
    but is not part of the value: it takes no part in equality, hashing, or the key compiled code is guarded on.
    """

    name: str
    table: Mapping[OpOverload, CastPolicy]
    input_only: frozenset = frozenset()
    banned: Mapping[OpOverload, str] = field(default_factory=dict)
    dtypes: tuple = (torch.bfloat16, torch.float16)
    #: Applied to functional ops not in the table (HMP: ``FIRST``, "run in the dtype of the
    #: first input"); ``None`` leaves them alone.
    unlisted: Optional[CastPolicy] = None
    #: Applied to in-place ops not in the table (HMP: ``FIRST``); ``None`` leaves them alone.
    inplace: Optional[CastPolicy] = None
    #: The device type a region of this policy casts by default: "cpu" (torch-cpu), "cuda"
    #: (torch-cuda), "xpu" (xpu); ``None`` means the device the package runs on, which the
    #: mode resolves (hpu, hmp, hmp-O2).
    device_type: Optional[str] = None
    #: The native autocast dispatch key whose registrations this policy reproduces
    #: (``"AutocastCPU"`` for torch-cpu): an op registered there that the table does not name
    #: (a custom op of ``torch.library.register_autocast``) is left to that kernel.
    native: Optional[str] = None
    #: What a call passing a ``torch.dtype`` to a LOWER, FP32, PROMOTE or FIRST op gets:
    #: ``"leave"`` (runs unchanged) or ``"cast"`` (cast as any other call); see ``EXPLICIT_DTYPE``.
    explicit_dtype: str = "leave"
    #: How a region of an fp8 dtype (``recipes.FP8_DTYPES``, when ``dtypes`` has one) scales the
    #: operands of the GEMMs it runs in fp8: a ``recipes.Tensorwise`` (the default),
    #: ``recipes.Delayed`` or ``recipes.Rowwise``. Part of the value (equality, hash, pickle, the
    #: compiled key).
    fp8: Recipe = Tensorwise()
    #: GEMMs an fp8 region runs in bfloat16 all the same (``tune`` moves a GEMM here before it moves
    #: anything to float32); the region's other GEMMs run in fp8. No effect in other regions.
    bf16_gemms: frozenset = frozenset()
    #: How the policy was built (``BuildRecord``: what its build let go of, the promote list and
    #: the name rule a rebuild needs); not part of the value.
    record: BuildRecord = field(default=BuildRecord(), compare=False, repr=False)
    _hash: int = field(default=0, init=False, repr=False, compare=False)
    #: Set by ``_table.policy_serial`` (0: none yet); not part of the value.
    _serial: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Note: frozen means frozen all the way down; callers may pass plain dicts. Keys are
        # checked and actions coerced here, so a hand-made policy fails at once, by name.
        table = {
            _overload(k, f"Policy {self.name!r}: table key"): _action(v, f"Policy {self.name!r}: table[{k}]")
            for k, v in self.table.items()
        }
        banned = {_overload(k, f"Policy {self.name!r}: banned key"): v for k, v in self.banned.items()}
        object.__setattr__(self, "table", MappingProxyType(table))
        object.__setattr__(self, "banned", MappingProxyType(banned))
        for name in ("input_only", "bf16_gemms"):
            ops = frozenset(getattr(self, name))
            for op in ops:
                _overload(op, f"Policy {self.name!r}: {name}")
            object.__setattr__(self, name, ops)
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        if not isinstance(self.record, BuildRecord):
            raise TypeError(f"Policy {self.name!r}: record must be a BuildRecord, got {type(self.record).__name__}")
        for name in ("unlisted", "inplace"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _action(getattr(self, name), f"Policy {self.name!r}: {name}"))
        if self.explicit_dtype not in EXPLICIT_DTYPE:
            raise ValueError(
                f"Policy {self.name!r}: explicit_dtype = {self.explicit_dtype!r}; accepted: "
                f"{' or '.join(map(repr, EXPLICIT_DTYPE))}"
            )
        if not isinstance(self.fp8, RECIPES):
            raise TypeError(
                f"Policy {self.name!r}: fp8 = {self.fp8!r}; accepted: recipes.Tensorwise(), "
                "recipes.Delayed(...) or recipes.Rowwise(...)"
            )
        for op, action in table.items():
            _check_kind(op, action, self.name)
        # Once: a region's entry looks the policy up in compile_policy's cache.
        object.__setattr__(
            self,
            "_hash",
            hash(
                (
                    self.name,
                    self.fp8,
                    tuple(sorted(map(str, self.bf16_gemms))),
                    tuple(sorted((str(k), v.value) for k, v in table.items())),
                )
            ),
        )

    def __hash__(self) -> int:
        return self._hash

    @property
    def missing(self) -> tuple:
        """Names from the source lists that this torch does not have (``record.missing``)."""
        return self.record.missing

    @property
    def ignored(self) -> tuple:
        """The list names this policy does not apply, as ``(name, list, why)`` (``record.ignored``)."""
        return self.record.ignored

    @property
    def promoted(self) -> frozenset:
        """Every op of the promote list its build was given (``record.promoted``)."""
        return self.record.promoted

    @property
    def c_names_only(self) -> bool:
        """Whether its lists were applied as Gaudi's bridge applies them (``record.c_names_only``)."""
        return self.record.c_names_only

    def __reduce__(self):
        # Note: torch cannot pickle an OpOverload ("pybind11 ... is not pickleable"), so a
        # policy travels with its overloads' qualified names and finds them again on load
        # (a custom op's library must be loaded there too). deepcopy takes the same road.
        state = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        name = _ops.qualified_name
        state["table"] = {name(op): a for op, a in self.table.items()}
        state["banned"] = {name(op): m for op, m in self.banned.items()}
        state["input_only"] = sorted(map(name, self.input_only))
        state["bf16_gemms"] = sorted(map(name, self.bf16_gemms))
        return (_from_names, (state,))

    def edit(
        self,
        *,
        lower: Optional[Iterable] = None,
        fp32: Optional[Iterable] = None,
        fp32_set_opt_dtype: Optional[Iterable] = None,
        fp32_append_dtype: Optional[Iterable] = None,
        promote: Optional[Iterable] = None,
        first: Optional[Iterable] = None,
        unlisted: Optional[Iterable] = None,
        name: Optional[str] = None,
    ) -> "Policy":
        """A new policy with the named ops moved to these kinds and every other op where it was.

        ``get_preset("hpu").edit(lower=["gelu"], fp32=["softmax"], unlisted=["dropout"])`` puts
        gelu in the region's dtype, softmax in float32, takes dropout off the table, and keeps
        the other ops of ``hpu`` as they were (``with_lists``, by contrast, *replaces* a kind's
        whole list, as Gaudi's list files do). Each keyword is a list of op names in the
        spellings ``build_policy`` takes (``gelu``, ``aten::mm``, ``add.Tensor``), resolved as the
        policy's own lists were (for ``hpu``: as Gaudi's bridge applies them). The kinds are
        ``CastPolicy``'s (``first``: the dtype of the first floating input; ``promote``: in-place
        overloads become ``first``) and ``unlisted``: off the table, so the policy's rule for ops
        on no list applies. The result is named ``"<name>+edit"`` unless ``name`` is given.

        Raises ``PolicyError`` for an unknown name (with the closest valid ones), for an op named
        under two kinds (naming both entries), and for a kind an op cannot take.
        """
        from .builder import edit_policy  # Note: the names live above this data module

        return edit_policy(
            self,
            name=name,
            lower=lower,
            fp32=fp32,
            fp32_set_opt_dtype=fp32_set_opt_dtype,
            fp32_append_dtype=fp32_append_dtype,
            promote=promote,
            first=first,
            unlisted=unlisted,
        )

    def ops(self, action: CastPolicy) -> list:
        """The overloads with ``action``, sorted by name."""
        return sorted((op for op, a in self.table.items() if a is action), key=str)

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Raise ``ValueError`` naming ``dtype`` if this policy cannot run in it (an fp8 dtype runs
        under any policy that runs bfloat16: ``recipes.supports``)."""
        if not supports(self.dtypes, dtype):
            accepted = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
            fp8 = "; fp8 regions need a policy whose dtypes include it or bfloat16" if dtype in FP8_DTYPES else ""
            raise ValueError(
                f"policy {self.name!r} does not support dtype={str(dtype).replace('torch.', '')}; "
                f"accepted: {accepted}{fp8}"
            )

    def __str__(self) -> str:
        counts = ", ".join(f"{a}={len(self.ops(a))}" for a in CastPolicy if self.ops(a))
        return f"Policy({self.name}: {counts})"


def _from_names(state: dict) -> Policy:
    """The inverse of ``Policy.__reduce__``."""
    op = _ops.overload_named
    return Policy(
        **{
            **state,
            "table": {op(k): a for k, a in state["table"].items()},
            "banned": {op(k): m for k, m in state["banned"].items()},
            "input_only": frozenset(map(op, state["input_only"])),
            "bf16_gemms": frozenset(map(op, state.get("bf16_gemms", ()))),
        }
    )

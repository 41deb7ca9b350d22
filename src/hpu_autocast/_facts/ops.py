"""Facts about ATen operators that the rest of the package asks: overloads, composites,
in-place and ``out=`` forms, and which arguments an op writes."""

from __future__ import annotations

import functools
from typing import Iterator, List, Optional

import torch

from .. import _torch
from .._torch import OpOverload, OpOverloadPacket

# Note: the composite batch_norm schemas do not mark their running statistics as written,
# yet the kernels update them in place. A cast copy would swallow those writes, so they are
# named here as data. Positions are looked up in each overload's schema by name.
UNMARKED_WRITES = {
    "batch_norm": ("running_mean", "running_var"),
    "instance_norm": ("running_mean", "running_var"),
    "_batch_norm_impl_index": ("running_mean", "running_var"),
    "native_batch_norm": ("running_mean", "running_var"),
    "_native_batch_norm_legit": ("running_mean", "running_var"),
    "cudnn_batch_norm": ("running_mean", "running_var"),
    "miopen_batch_norm": ("running_mean", "running_var"),
}


#: Norms whose kernels on CPU and HPU accept a lower-precision input with float32 weight and
#: bias (what Gaudi's bridge does for input-only norms), but whose CUDA kernels require the
#: parameters in the input's dtype ("expected scalar type BFloat16 but found Float").
PARAMS_FOLLOW_INPUT = frozenset({"layer_norm", "native_layer_norm", "group_norm", "native_group_norm"})


#: [Note: fused fast paths] The fused kernels PyTorch's modules call on their inference fast
#: path (``nn.TransformerEncoderLayer``, ``nn.TransformerEncoder``, ``nn.MultiheadAttention``
#: in eval under no_grad). Their C++ insides call some ATen ops through the dispatcher (which
#: reach a region's kernels) and others directly (which do not), so a policy that casts some of
#: the ops inside feeds a bfloat16 activation to a float32 GEMM ("mat1 and mat2 must have the
#: same dtype"). torch guards these paths with ``torch.is_autocast_enabled()``, which asks about
#: CUDA alone: on CUDA a region answers it and the modules take their slow path; on CPU they
#: do not, and native CPU autocast's lists happen to agree with the insides. Policies that are
#: not native's run each of these ops whole: promoted to its widest floating input, with the
#: region's kernels kept out of its insides (``_table.CompiledPolicy``).
FUSED_FAST_PATHS = ("_transformer_encoder_layer_fwd", "_native_multi_head_attention")


def overloads(packet: OpOverloadPacket) -> Iterator[OpOverload]:
    """The overloads of ``packet`` that exist in the dispatcher (TorchScript-only ones such as
    ``aten::mul.left_t`` are skipped)."""
    for name in packet.overloads():
        try:
            op = getattr(packet, name)
        except (AttributeError, RuntimeError):
            continue
        if _takes_tensors(op):
            yield op


def _takes_tensors(op: OpOverload) -> bool:
    # TorchScript's scalar/list overloads (aten::mul.int, aten::mul.left_t) take no tensor
    # and never reach the dispatcher with one.
    try:
        return any("Tensor" in str(a.type) for a in _torch.schema(op).arguments)
    except RuntimeError:
        return False


@functools.lru_cache(maxsize=None)
def is_composite(op: OpOverload) -> bool:
    """True when ``op`` decomposes above autograd, before a dispatch mode sees it."""
    return has_kernel(op, "CompositeImplicitAutograd")


def is_out(op: OpOverload) -> bool:
    """True for ``out=`` overloads: they write keyword-only tensor arguments."""
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in _torch.schema(op).arguments)


def is_inplace(op: OpOverload) -> bool:
    """True for in-place overloads (``aten.add_.Tensor``): they write their ``self``."""
    args = _torch.schema(op).arguments
    return bool(args) and not is_out(op) and args[0].alias_info is not None and args[0].alias_info.is_write


def is_functional(op: OpOverload) -> bool:
    """True when the overload writes none of its arguments."""
    return not _torch.schema(op).is_mutable


@functools.lru_cache(maxsize=None)
def is_view(op: OpOverload) -> bool:
    """True for ops that neither compute nor cast, only re-describe a tensor: views (an output
    aliases an input it does not write: ``t``, ``view``, ``detach``) and in-place views
    (``detach_``, ``t_``, ``squeeze_``: tagged ``inplace_view``). Other in-place ops return a
    written ``Tensor(a!)`` and compute."""
    if _INPLACE_VIEW is not None and _INPLACE_VIEW in op.tags:
        return True
    return any(r.alias_info is not None and not r.alias_info.is_write for r in _torch.schema(op).returns)


_INPLACE_VIEW = getattr(torch.Tag, "inplace_view", None)


def op_base_name(op: OpOverload) -> str:
    """``aten.add_.Tensor`` -> ``add_``."""
    return _torch.schema(op).name.split("::", 1)[-1]


@functools.lru_cache(maxsize=None)
def written_positions(op: OpOverload) -> tuple:
    """Positions and names of the arguments ``op`` writes: ``((index, name), ...)``."""
    unmarked = UNMARKED_WRITES.get(op_base_name(op), ())
    out = []
    for i, a in enumerate(_torch.schema(op).arguments):
        if (a.alias_info is not None and a.alias_info.is_write) or a.name in unmarked:
            out.append((i, a.name))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def result_positions(op: OpOverload) -> tuple:
    """The written arguments ``op`` returns (an in-place ``self``, ``out=``): ``((index, name), ...)``.
    Its other writes (batch norm's running statistics) are side effects."""
    returned = set()
    for r in _torch.schema(op).returns:
        if r.alias_info is not None and r.alias_info.is_write:
            returned |= set(r.alias_info.before_set)
    return tuple(
        (i, a.name)
        for i, a in enumerate(_torch.schema(op).arguments)
        if a.alias_info is not None and a.alias_info.is_write and set(a.alias_info.before_set) & returned
    )


def qualified_name(op: OpOverload) -> str:
    """``aten.addmm.default`` spelled as Python does."""
    return str(op)


def overload_named(qualified: str) -> Optional[OpOverload]:
    """The overload a qualified name spells, Python's ``"aten.addmm.default"`` or the
    dispatcher's ``"aten::addmm"`` / ``"aten::addmm.out"``; ``None`` if there is none."""
    if "::" in qualified:
        namespace, _, rest = qualified.partition("::")
        packet, _, overload = rest.partition(".")
    else:
        namespace, packet, overload = qualified.split(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def find_packet(namespace: str, name: str) -> Optional[OpOverloadPacket]:
    """``torch.ops.<namespace>.<name>`` if that is an op, else ``None`` (also for the other
    attributes of a namespace, such as ``torch.ops.aten.__name__``)."""
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return None
    return packet if isinstance(packet, OpOverloadPacket) else None


def all_overloads(namespace: str = "aten") -> Iterator[OpOverload]:
    """Every overload registered with the dispatcher in ``namespace``.

    Note: ``dir(torch.ops.aten)`` lists only the packets looked up so far in this process; the
    dispatcher's own table is complete.
    """
    prefix = namespace + "::"
    for qualified in sorted(_torch.all_op_names()):
        if not qualified.startswith(prefix):
            continue
        base, _, overload = qualified[len(prefix) :].partition(".")
        packet = find_packet(namespace, base)
        if packet is None:
            continue
        try:
            yield getattr(packet, overload or "default")
        except (AttributeError, RuntimeError):
            continue


def has_kernel(op: OpOverload, key: str) -> bool:
    """Whether ``op`` has a kernel for dispatch key ``key`` (False for TorchScript-only
    overloads such as ``aten::einsum.sublist``, which the dispatcher does not know)."""
    try:
        return _torch.has_kernel_for(op.name(), key)
    except RuntimeError:
        return False


def registered_for(key: str, namespace: str = "aten") -> List[OpOverload]:
    """The overloads of ``namespace`` with a kernel registered for dispatch key ``key`` (such as
    ``"AutocastCPU"``), from the dispatcher's own list, sorted by name."""
    prefix = namespace + "::"
    ops = (overload_named(q) for q in _torch.registrations_for(key) if q.startswith(prefix))
    return sorted((op for op in ops if op is not None), key=str)


# --- the dtype arguments (the float32 dtype policies and explicit dtype arguments) ---------------

#: [Note: fp32_append_dtype's redispatch table] ATen's ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``
#: (autocast_mode.h) as data: each overload with no dtype argument that ``fp32_append_dtype``
#: casts, and the sibling overload it calls instead, with the dtype appended (ATen registers
#: both for CUDA and XPU). Each sibling's arguments are its source's plus one trailing
#: ``ScalarType dtype`` (``append_dtype_overload`` checks it). The Dimname twin is an operator
#: Python reaches up to torch 2.11 (a GPU machine's torch registered it for AutocastCUDA) and not
#: in 2.13: ``overload_named`` finds it where it exists, and nothing of it is built elsewhere.
APPEND_DTYPE = {
    "aten::norm.Scalar": "aten::norm.ScalarOpt_dtype",
    "aten::norm.ScalarOpt_dim": "aten::norm.ScalarOpt_dim_dtype",
    "aten::norm.names_ScalarOpt_dim": "aten::norm.names_ScalarOpt_dim_dtype",
}


def _is_dtype(a) -> bool:
    return "ScalarType" in str(getattr(a, "real_type", a.type))


def dtype_positions(op: OpOverload) -> tuple:
    """Positions of ``op``'s arguments typed ``ScalarType`` or ``ScalarType?`` (a call passing
    one there passes an explicit dtype)."""
    return tuple(i for i, a in enumerate(_torch.schema(op).arguments) if _is_dtype(a))


def optional_dtype_positions(op: OpOverload) -> tuple:
    """Positions of ``op``'s ``ScalarType?`` arguments: what ``fp32_set_opt_dtype`` sets."""
    return tuple(
        i for i, a in enumerate(_torch.schema(op).arguments) if _is_dtype(a) and isinstance(a.type, _torch.OptionalType)
    )


@functools.lru_cache(maxsize=None)
def tensor_walk(op: OpOverload) -> Optional[tuple]:
    """Where a call of ``op`` can pass a tensor, when only its positional ``Tensor`` and ``Tensor?``
    arguments can: per count ``n`` of positional arguments a call passes (a Python kernel gets
    those, trailing defaults left off, and nothing but keyword-only arguments by keyword), the
    positions among the first ``n`` that are typed so, in argument order.
    ``None`` where the schema takes a list of tensors or a keyword-only tensor (``out=``)."""
    slots, positional = [], 0
    for i, a in enumerate(_torch.schema(op).arguments):
        t = a.type.getElementType() if isinstance(a.type, _torch.OptionalType) else a.type
        if isinstance(t, _torch.TensorType) and not a.kwarg_only:
            slots.append(i)
        elif "Tensor" in str(a.type):
            return None
        positional += not a.kwarg_only
    return tuple(tuple(i for i in slots if i < n) for n in range(positional + 1))


def first_is_tensor(op: OpOverload) -> bool:
    """Whether ``op``'s first argument is a ``Tensor`` (the float32 dtype policies read it)."""
    args = _torch.schema(op).arguments
    return bool(args) and isinstance(args[0].type, _torch.TensorType)


@functools.lru_cache(maxsize=None)
def append_dtype_overload(op: OpOverload) -> Optional[OpOverload]:
    """The overload ``fp32_append_dtype`` calls for ``op`` (``APPEND_DTYPE``), or ``None``: none
    listed, or one whose arguments are not ``op``'s plus a trailing dtype."""
    name = APPEND_DTYPE.get(op.name())
    target = overload_named(name) if name is not None else None
    if target is None:
        return None
    mine, theirs = _torch.schema(op).arguments, _torch.schema(target).arguments
    if len(theirs) != len(mine) + 1 or not _is_dtype(theirs[-1]) or isinstance(theirs[-1].type, _torch.OptionalType):
        return None
    return target

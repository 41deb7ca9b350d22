"""Higher-order operators in a region: ``torch.cond``, ``while_loop``, ``scan``, ``map``,
``flex_attention``, and those a user makes.

[Note: higher-order operators on the borrowed keys]
A higher-order operator dispatches in Python (``HigherOrderOperator.dispatch``) to its kernel for
the highest key of the call, and raises at a key where it has none and which it does not skip
("could not find kernel for HigherOrderOperator cond at dispatch key DispatchKey.AutocastIPU").
torch makes every one skip its own autocast keys (``torch._ops.
_HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS``), so that the ops inside it (a branch of
``cond``, a loop's body) reach autocast one by one; the keys this package borrows are not on that
list, and every higher-order operator called in a region raised, in eager code and compiled.
``cover`` gives every one torch has registered (``torch._ops._higher_order_ops``) what it has on
torch's autocast keys, on the borrowed keys: at each region's entry when the registry or the keys
changed since (a length and a key compared), which reaches those made later; one made inside a
region is reached at the next region's entry. Only the borrowed keys are touched (torch's list is
not), and an operator with a kernel of its own there keeps it. Per operator:

* most skip both keys (``fallthrough``), as they skip torch's;
* those torch gives a kernel on its own autocast keys (``flex_attention``: it casts query, key and
  value to the autocast dtype, then runs on with autocast off) get one on the ops key that runs
  torch's, in a region whose policy reproduces native autocast (``Policy.native``), for a call on
  the region's device; any other call runs with the engine's keys off, left whole: what a policy
  says of the ops inside would reach them in eager code only (a compiled graph holds the operator
  as one node, run with autocast off), so it says nothing of them, eager or compiled;
* those whose backward traces their functions again (``cond``, ``while_loop``, ``map``, ``scan``,
  ``associative_scan``: ``materialize_as_graph`` under the forward's dispatch keys) get a kernel on
  the ops key that binds each function to the region state of the call and passes the call on
  below the key. Native autocast's state is its key, so that tracing casts as the forward did;
  the engine's state is the region's frame, gone by then, so a function called outside the state
  it was bound to runs in a region with it, as a checkpoint's recomputation does
  (``_torch_autocast``), and the backward sees the forward's casts.

  Native's key stays on for the whole of that tracing, the backward formulas included (the joint
  function ``create_bw_fn`` makes: the branch, then ``torch.autograd.grad``): so an op the branch
  ran in float32 under ``torch.autocast(enabled=False)`` has its backward traced with autocast on,
  and an ``mm`` there computes in the lower dtype. For ``cond``, whose joint functions are made in
  the forward and kept on its autograd node (``_true_bw_fn``, ``_false_bw_fn``), the kernel wraps
  them so that each whole joint runs in a region with the forward's state, and the gradients are
  native's bit for bit (``_joint_in_region``). The other replayed operators make their joint
  functions in the backward, from the functions alone; their opted-out ops' backward runs as the
  forward ran it (in float32, where native's casts).
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

import torch

from . import dispatch as _dispatch, regions as _regions
from .. import _torch
from . import torch_autocast as _torch_autocast
from .._facts.devices import native_autocast_keys

__all__ = ["cover"]

_HIGHER_ORDER_OPS = _torch.HIGHER_ORDER_OPS
#: The operators whose backward traces their functions again (the Note).
_REPLAYED = frozenset({"cond", "while_loop", "map_impl", "scan", "associative_scan"})
_NATIVE_KEYS = native_autocast_keys()
_lock = threading.Lock()
_seen: tuple = (-1, None, None)  # the registry's size and the keys at the last ``cover``


def cover(k: "_dispatch.Keys") -> None:
    """Give every higher-order operator what the Note says on the borrowed keys ``k``."""
    global _seen
    if len(_HIGHER_ORDER_OPS) == _seen[0] and k.ops is _seen[1] and k.all is _seen[2]:
        return
    with _lock:
        for op in list(_HIGHER_ORDER_OPS.values()):
            for key in (k.ops, k.all):
                if key in op.py_kernels or not op.non_fallthrough_keys.has(key):
                    continue
                kernel = _kernel_for(op) if key == k.ops else None
                if kernel is None:
                    op.fallthrough(key)
                else:
                    op.py_impl(key)(kernel)
        _seen = (len(_HIGHER_ORDER_OPS), k.ops, k.all)


def _kernel_for(op) -> Optional[Callable]:
    """The ops key's kernel for ``op`` (the Note's second and third kinds); ``None``: it skips the key."""
    if any(key in op.py_kernels for key in _NATIVE_KEYS):
        return _natively_cast(op)
    if op.name() in _REPLAYED and _torch.hop_keyset is not None:
        return _bound(op)
    return None


def _natively_cast(op) -> Callable:
    """``op`` cast as torch casts it under a policy reproducing native autocast, else left whole."""

    def kernel(*args, **kwargs):
        frame = _regions.innermost()
        impl = None
        if frame is not None and frame.enabled and frame.region.compiled is not None:
            region = frame.region
            native = _torch.dispatch_key(region.compiled.policy.native or "")
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if native is not None and first is not None and first.device.type == region.device_type:
                impl = op.py_kernels.get(native)
        k = _dispatch._keys
        with k.excluded():
            return impl(*args, **kwargs) if impl is not None else op(*args, **kwargs)

    kernel.__name__ = kernel.__qualname__ = f"hpu_autocast_kernel[{op.name()}]"
    return kernel


def _bound(op) -> Callable:
    """``op`` with its functions bound to the call's region state, passed on below the ops key."""

    def kernel(*args, **kwargs):
        if _regions.innermost() is not None:
            args = tuple(_bind(a) if _is_function(a) else a for a in args)
        below = _torch.hop_keyset(op, args, kwargs) & _torch.keyset_after(_dispatch._keys.ops)
        out = op.dispatch(below.highestPriorityTypeId(), *args, **kwargs)
        if op.name() == "cond" and _regions.innermost() is not None:
            _joint_in_region(out)
        return out

    kernel.__name__ = kernel.__qualname__ = f"hpu_autocast_kernel[{op.name()}]"
    return kernel


#: The joint functions torch's ``CondAutogradOp`` keeps on its node (the Note); where a torch
#: keeps none under these names, its backward is traced as before.
_COND_JOINTS = ("_true_bw_fn", "_false_bw_fn")


def _joint_in_region(out) -> None:
    """Wrap the joint functions on the autograd node of ``cond``'s outputs ``out`` to run whole in
    a region with the calling context's state now (the Note)."""
    for t in _torch.tree_leaves(out):
        node = getattr(t, "grad_fn", None)
        if node is None or getattr(node, "_hpu_autocast_joint", False):
            continue
        if all(callable(getattr(node, name, None)) for name in _COND_JOINTS):
            for name in _COND_JOINTS:
                setattr(node, name, _torch_autocast.recompute_in_region(getattr(node, name)))
            node._hpu_autocast_joint = True


def _is_function(a) -> bool:
    return callable(a) and not isinstance(a, (torch.Tensor, _torch.OperatorBase))


def _bind(fn: Callable) -> Callable:
    """``fn`` bound to the calling context's region state now: called under it (the same innermost
    frame), it runs as it is; called elsewhere (a backward traced after the region exited), it runs
    in a region with that state."""
    frame = _regions.innermost()
    elsewhere = _torch_autocast.recompute_in_region(fn)

    def bound(*args, **kwargs):
        if _regions.innermost() is frame:
            return fn(*args, **kwargs)
        return elsewhere(*args, **kwargs)

    return bound

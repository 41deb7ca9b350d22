"""hypothesis strategies for testing models and policies (imported on first use: the public
functions in ``hpu_autocast.testing`` import this module, which imports hypothesis).

    policies()                  valid policies: presets with some ops moved between lists
    eligible_tensors()          tensors autocast may cast, of random shapes and lower dtypes
    inputs_for(op)              (args, kwargs) that ``op`` accepts, checked on meta tensors
    model_inputs(example)       inputs like ``example``, batch and sequence sizes varied
    module_maps(model)          ``modules=`` maps over a model's module names

Tensors are made on ``device`` (default: the device a region would cast on this machine, as
``HpuAutocastMode`` picks it), from a drawn seed, so an example shrinks to small shapes and
its values are reproducible.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from hypothesis import assume
from hypothesis import strategies as st

from .. import _engine, _torch
from .._torch import OpOverload
from .._facts import ops as _ops
from .. import mode as _mode
from ..policies.policy import CastPolicy, Policy
from ..policies.builder import get_preset
from ..policies.presets import preset_names
from ..policies.recipes import AMAX_COMPUTE, WEIGHT_GRAD, Delayed, Rowwise, Tensorwise, is_fp8, supports

__all__ = ["policies", "eligible_tensors", "inputs_for", "model_inputs", "module_maps", "ELIGIBLE_DTYPES"]

#: The dtypes autocast casts: floating, not float64.
ELIGIBLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _device(device: Optional[Union[str, torch.device]]) -> torch.device:
    return torch.device(device if device is not None else _mode.default_device_type())


def _make(shape: Sequence[int], dtype: torch.dtype, seed: int, device: torch.device) -> torch.Tensor:
    """A tensor from ``seed``: normal values for floating dtypes, small integers, random bools."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if dtype is torch.bool:
        t = torch.rand(shape, generator=g) > 0.5
    elif not dtype.is_floating_point:
        t = torch.randint(-4, 5, shape, generator=g, dtype=dtype)
    else:
        t = torch.randn(shape, generator=g).to(dtype)
    return t.to(device)


_SEEDS = st.integers(0, 2**31 - 1)


# --- policies ------------------------------------------------------------------------------------
def _usable_presets(device: str) -> List[str]:
    """Presets a region on ``device`` casts for: device-neutral ones and the device's own."""
    return [n for n in preset_names() if get_preset(n).device_type in (None, device)]


@functools.lru_cache(maxsize=None)
def _registered_ops() -> List[OpOverload]:
    return sorted((op for op in _ops.all_overloads("aten") if _ops.is_functional(op)), key=str)


def policies(
    *,
    presets: Optional[Iterable[str]] = None,
    ops: Union[None, str, Iterable[OpOverload]] = None,
    max_changes: int = 6,
    dtype: Optional[torch.dtype] = None,
    device: Optional[Union[str, torch.device]] = None,
) -> st.SearchStrategy[Policy]:
    """Valid policies: a preset (or an empty table) with up to ``max_changes`` ops moved to
    another list (lower, fp32, promote) or taken off.

    ``presets``: the names to start from (default: those a region on ``device`` casts for;
    ``[]`` starts from an empty table only). ``ops``: the overloads changes are drawn from
    (default: every op of those presets; ``"registered"``: every functional ATen overload).
    ``dtype``: only policies that accept it. Each op is on one list at most, by construction,
    and the result is a ``Policy`` (which validates itself), named for what was drawn. With an
    fp8 ``dtype``, its scaling recipe is drawn too (``recipes()``).
    """
    dev = _device(device).type
    names = list(presets) if presets is not None else _usable_presets(dev)
    bases = [get_preset(n) for n in names]
    if dtype is not None:
        bases = [b for b in bases if supports(b.dtypes, dtype)]
    if ops == "registered":
        pool = _registered_ops()
    elif ops is not None:
        pool = sorted(set(ops), key=str)
    else:
        pool = sorted({op for b in bases for op in b.table}, key=str)
    if not pool:
        raise ValueError("policies(): no ops to draw from; pass ops= or presets=")
    empty = Policy("empty", {}, dtypes=(dtype,) if dtype is not None else (torch.bfloat16, torch.float16))
    actions = [CastPolicy.LOWER, CastPolicy.FP32, CastPolicy.PROMOTE, None]

    @st.composite
    def draw_policy(draw) -> Policy:
        base = draw(st.sampled_from(bases + [empty]))
        changes = draw(st.dictionaries(st.sampled_from(pool), st.sampled_from(actions), max_size=max_changes))
        table = dict(base.table)
        for op, action in changes.items():
            if action is None:
                table.pop(op, None)
            else:
                table[op] = action
        moved = ",".join(f"{op}={a or 'off'}" for op, a in sorted(changes.items(), key=lambda kv: str(kv[0])))
        return dataclasses.replace(
            base,
            name=f"{base.name}+{{{moved}}}" if changes else base.name,
            table=table,
            fp8=draw(recipes()) if is_fp8(dtype) else base.fp8,
            input_only=frozenset(op for op in base.input_only if op in table),
            banned={op: m for op, m in base.banned.items() if op in table},
        )

    return draw_policy()


def recipes() -> st.SearchStrategy:
    """fp8 scaling recipes (``Policy.fp8``): ``Tensorwise()``, a ``Delayed`` of drawn history
    length (1..8), margin (0..2) and amax computation, or a ``Rowwise`` of drawn weight gradient."""
    return st.one_of(
        st.just(Tensorwise()),
        st.builds(
            Delayed, history=st.integers(1, 8), margin=st.integers(0, 2), amax_compute=st.sampled_from(AMAX_COMPUTE)
        ),
        st.builds(Rowwise, weight_grad=st.sampled_from(WEIGHT_GRAD)),
    )


# --- module maps ---------------------------------------------------------------------------------
#: What a module map's entry may say (docs/modules.md), but a Policy: float32, casting off, the
#: lower dtypes; presets are added by ``module_maps(presets=...)``.
MAP_VALUES = (torch.float32, "fp32", None, "off", torch.bfloat16, torch.float16)


def module_maps(
    model: torch.nn.Module,
    *,
    values: Sequence[object] = MAP_VALUES,
    presets: Iterable[str] = (),
    max_entries: int = 4,
    globs: bool = True,
) -> st.SearchStrategy[Dict[str, object]]:
    """``modules=`` maps over ``model``'s module names (``""`` the model itself): up to
    ``max_entries`` entries, each an exact name or, with ``globs``, a glob made from one (its last
    part replaced by ``*``, or ``*`` before it), mapped to one of ``values`` or ``presets``
    (preset names). Every pattern matches a module of ``model``, so no map warns. Some maps make
    a model raise, as the hand-edited model would (docs/modules.md, Limits): ``None`` on a module
    given lower activations beside float32 weights, a lower module inside a float32 one; leave
    such values out, or ``reject()`` the draw on the dtype-mismatch error."""
    names = [n for n, _ in model.named_modules()]
    choices = list(values) + list(presets)

    def patterns(name: str) -> List[str]:
        out = [name]
        if globs and name:
            head, _, _ = name.rpartition(".")
            out += [f"{head}.*" if head else "*", f"*{name}"]
        return out

    pattern = st.sampled_from(names).flatmap(lambda n: st.sampled_from(patterns(n)))
    return st.dictionaries(pattern, st.sampled_from(choices), max_size=max_entries)


# --- tensors -------------------------------------------------------------------------------------
def shapes(min_dims: int = 0, max_dims: int = 3, max_side: int = 4) -> st.SearchStrategy[tuple]:
    """Shapes of ``min_dims`` to ``max_dims`` dimensions of size 1 to ``max_side``."""
    return st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


def eligible_tensors(
    shape=None,
    *,
    dtypes: Sequence[torch.dtype] = ELIGIBLE_DTYPES,
    device: Optional[Union[str, torch.device]] = None,
    min_dims: int = 0,
    max_dims: int = 3,
    max_side: int = 4,
) -> st.SearchStrategy[torch.Tensor]:
    """Tensors autocast may cast: floating, not float64, on ``device``.

    ``shape``: a fixed shape, a strategy of shapes, or ``None`` for ``min_dims``..``max_dims``
    dimensions of size 1..``max_side``. ``dtypes`` defaults to the eligible ones (float32,
    bfloat16, float16); others (float64, integers, bool) may be named to draw ineligible tensors.
    """
    dev = _device(device)
    if shape is None:
        shape_st = shapes(min_dims, max_dims, max_side)
    elif isinstance(shape, st.SearchStrategy):
        shape_st = shape
    else:
        shape_st = st.just(tuple(shape))
    return st.builds(lambda s, d, seed: _make(s, d, seed, dev), shape_st, st.sampled_from(list(dtypes)), _SEEDS)


# --- inputs for an op ----------------------------------------------------------------------------
def _sizes(draw, max_side: int, n: int) -> List[int]:
    return [draw(st.integers(1, max_side)) for _ in range(n)]


def _family(name: str, draw, max_side: int) -> Optional[Dict[str, object]]:
    """Shapes (and a few fixed arguments) by argument name, for ops whose arguments must agree
    in ways a broadcast does not say."""
    b, n, k, m = _sizes(draw, max_side, 4)
    if name == "mm":
        return {"self": (n, k), "mat2": (k, m)}
    if name == "bmm":
        return {"self": (b, n, k), "mat2": (b, k, m)}
    if name == "addmm":
        return {"self": (n, m), "mat1": (n, k), "mat2": (k, m)}
    if name == "baddbmm":
        return {"self": (b, n, m), "batch1": (b, n, k), "batch2": (b, k, m)}
    if name == "addbmm":
        return {"self": (n, m), "batch1": (b, n, k), "batch2": (b, k, m)}
    if name == "mv":
        return {"self": (n, k), "vec": (k,)}
    if name in ("dot", "vdot"):
        return {"self": (k,), "tensor": (k,)}
    if name == "matmul":
        return {"self": (b, n, k), "other": (k, m)}
    if name == "linear":
        return {"input": (b, n, k), "weight": (m, k), "bias": (m,)}
    if name in ("conv1d", "conv2d", "conv3d"):
        d = int(name[-2])
        side = draw(st.integers(2, max(2, max_side)))
        return {"input": (b, k, *[side] * d), "weight": (m, k, *[2] * d), "bias": (m,)}
    if name in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
        d = int(name[-2])
        return {"input": (b, k, *[n] * d), "weight": (k, m, *[2] * d), "bias": (m,)}
    if name == "layer_norm":
        return {"input": (b, n, k), "normalized_shape": [k], "weight": (k,), "bias": (k,)}
    if name == "group_norm":
        return {"input": (b, 2 * k, n), "num_groups": 2, "weight": (2 * k,), "bias": (2 * k,)}
    if name == "scaled_dot_product_attention":
        s = draw(st.integers(1, max_side))
        return {"query": (b, 2, n, k), "key": (b, 2, s, k), "value": (b, 2, s, m)}
    if name == "embedding":
        return {"weight": (n, k), "indices": ("index", n, (b, m))}
    if name in ("nll_loss", "nll_loss_nd", "cross_entropy_loss"):
        return {"self": (b, k), "target": ("index", k, (b,)), "weight": None}
    return None


def _smallest(strategy):
    """A stand-in for ``draw`` that checks which arguments have a rule (no example is drawn)."""
    return 1


def _broadcast(draw, base: tuple) -> tuple:
    # A suffix of ``base`` with some dimensions set to 1: broadcasts against it.
    other = tuple(d if draw(st.booleans()) else 1 for d in base)
    return other[draw(st.integers(0, len(other))) :]


def _scalar_for(arg, draw, ndim: int):
    t = str(arg.type)
    name = arg.name
    if t in ("int", "SymInt"):
        if name == "dim":
            return draw(st.integers(-ndim, ndim - 1)) if ndim else 0
        return 1
    if t in ("List[int]", "Optional[List[int]]") and "dim" in name:
        return [draw(st.integers(-ndim, ndim - 1))] if ndim else []
    if name == "rounding_mode":
        return draw(st.sampled_from(["trunc", "floor"]))
    if t in ("Scalar", "float", "number"):
        return draw(st.sampled_from([2, 0.5, -1.5]))
    if t == "bool":
        return draw(st.booleans())
    raise _NoRule(f"a required argument {name}: {t}")


def _kind(arg) -> str:
    """``Tensor``, ``Tensor?``, ``Tensor[]``, or the schema's spelling of another type."""
    t = arg.type
    if isinstance(t, _torch.OptionalType) and isinstance(t.getElementType(), _torch.TensorType):
        return "Tensor?"
    if isinstance(t, _torch.ListType) and isinstance(t.getElementType(), (_torch.TensorType, _torch.OptionalType)):
        return "Tensor[]"
    return "Tensor" if isinstance(t, _torch.TensorType) else str(t)


class _NoRule(Exception):
    pass


def inputs_for(
    op: OpOverload,
    *,
    dtypes: Sequence[torch.dtype] = ELIGIBLE_DTYPES,
    mixed: bool = False,
    device: Optional[Union[str, torch.device]] = None,
    max_side: int = 4,
    check: bool = True,
) -> st.SearchStrategy[tuple]:
    """``(args, kwargs)`` that ``op`` accepts: shapes from the op's family (GEMMs, convolutions,
    norms, attention, embedding, losses) or, for other ops, one shape its tensors broadcast
    against; required numbers and dims drawn to fit; optional arguments left at their defaults.

    ``dtypes``: the dtypes tensors are drawn from (default the eligible ones); one per call
    unless ``mixed``, which draws one per tensor (what a region receives when a model mixes
    them). ``check``: each drawn call is run once, outside any region, and examples that raise
    are discarded (with ``mixed``, floating tensors run as float32: the shapes and the other
    dtypes are checked, the mix is the region's to resolve).
    Raises ``ValueError`` at once for an op with an argument no rule covers.
    """
    if not isinstance(op, OpOverload):
        raise TypeError(f"inputs_for(): {op!r} is not an OpOverload such as torch.ops.aten.mm.default")
    dev = _device(device)
    name = _ops.op_base_name(op)
    # Read once: torch before 2.9 builds new Argument objects, which compare by identity, on
    # every read of FunctionSchema.arguments, and the membership tests below need the same ones.
    arguments = list(_torch.schema(op).arguments)
    dtypes = list(dtypes)
    positional, required_kw = _required(op, arguments, name, max_side)

    @st.composite
    def draw_inputs(draw):
        family = _family(name, draw, max_side) or {}
        base = draw(shapes(0 if not family else 1, 3, max_side))
        call_dtype = draw(st.sampled_from(dtypes))
        extra = [a for a in arguments if a not in positional and (a.name in family or a in required_kw)]
        args, kwargs = [], {}
        for a in positional + extra:
            value = _value(a, family, base, call_dtype, draw, dtypes, mixed, dev, first_tensor)
            if a in positional:
                args.append(value)
            elif value is not None:
                kwargs[a.name] = value
        args = tuple(args)
        if check:
            assume(_accepted(op, args, kwargs, mixed))
        return args, kwargs

    first_tensor = next((a for a in arguments if _kind(a) == "Tensor"), None)
    return draw_inputs()


def _value(a, family: dict, base: tuple, call_dtype: torch.dtype, draw, dtypes: list, mixed: bool, dev, first_tensor):
    """One argument's value for ``inputs_for``: a tensor of its family's shape (or the base
    shape, or one broadcasting against it), a list of two, or a number or dim that fits."""
    t = _kind(a)
    dtype = draw(st.sampled_from(dtypes)) if mixed else call_dtype
    spec = family.get(a.name, "absent")
    if t in ("Tensor", "Tensor?"):
        if spec is None or (spec == "absent" and t == "Tensor?"):
            return None
        if isinstance(spec, tuple) and spec and spec[0] == "index":
            _, high, shape = spec
            g = torch.Generator().manual_seed(draw(_SEEDS))
            return torch.randint(0, high, shape, generator=g).to(dev)
        # The first tensor takes the base shape, the others broadcast against it.
        shape = spec if spec != "absent" else (base if a is first_tensor else _broadcast(draw, base))
        return _make(shape, dtype, draw(_SEEDS), dev)
    if t == "Tensor[]":
        return [_make(base, draw(st.sampled_from(dtypes)) if mixed else dtype, draw(_SEEDS), dev) for _ in range(2)]
    if spec != "absent":
        return spec
    return _scalar_for(a, draw, len(base))


def _required(op: OpOverload, arguments: list, name: str, max_side: int) -> Tuple[list, list]:
    """The arguments every call passes: the leading positional ones without a default, and the
    keyword-only ones without one. Raises ``ValueError`` for one that no rule can draw."""
    positional = []
    for a in arguments:
        if a.kwarg_only or a.has_default_value():
            break
        positional.append(a)
    required_kw = [a for a in arguments if a.kwarg_only and not a.has_default_value()]
    family_names = set(_family(name, _smallest, max_side) or ())
    for a in positional + required_kw:
        if _kind(a) not in ("Tensor", "Tensor?", "Tensor[]") and a.name not in family_names:
            try:
                _scalar_for(a, _smallest, 1)
            except _NoRule as e:
                raise ValueError(f"inputs_for({op}): no rule for {e}") from None
    return positional, required_kw


def _accepted(op: OpOverload, args: tuple, kwargs: dict, mixed: bool) -> bool:
    """Whether ``op`` runs on these inputs, outside any region (with ``mixed``, floating tensors
    as float32: the shapes and the other dtypes decide)."""

    def prepare(x):
        if isinstance(x, torch.Tensor):
            return x.float() if mixed and x.is_floating_point() else x
        if isinstance(x, list):
            return [prepare(i) for i in x]
        return x

    try:
        with _engine.keys_excluded():
            op(*[prepare(a) for a in args], **{k: prepare(v) for k, v in kwargs.items()})
    except Exception:
        return False
    return True


# --- model inputs --------------------------------------------------------------------------------
def model_inputs(
    example,
    *,
    batch: tuple = (1, 8),
    seq: Optional[tuple] = (1, 64),
    batch_dim: int = 0,
    seq_dim: int = 1,
    device: Optional[Union[str, torch.device]] = None,
):
    """Inputs shaped like ``example`` (a tensor, or a tuple, list or dict of them), with one batch
    size from ``batch`` and one sequence length from ``seq`` (inclusive ranges) for all of them.

    Every tensor's ``batch_dim`` takes the batch size; tensors with more than ``seq_dim``
    dimensions take the sequence length there (``seq=None`` keeps it). Values are drawn like
    the example's: floating tensors normal in its dtype, integer tensors (token ids, labels)
    between its smallest and largest value, bool tensors random. Other leaves are kept.
    Tensors are made on the example's device unless ``device`` is given.
    """
    leaves, spec = _torch.tree_flatten(example)

    @st.composite
    def draw_inputs(draw):
        b = draw(st.integers(*batch))
        s = draw(st.integers(*seq)) if seq is not None else None
        out = []
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor):
                out.append(leaf)
                continue
            shape = list(leaf.shape)
            if len(shape) > batch_dim:
                shape[batch_dim] = b
            if s is not None and len(shape) > seq_dim:
                shape[seq_dim] = s
            dev = torch.device(device) if device is not None else leaf.device
            g = torch.Generator().manual_seed(draw(_SEEDS))
            if leaf.dtype is torch.bool:
                t = torch.rand(shape, generator=g) > 0.5
            elif leaf.dtype.is_floating_point:
                t = torch.randn(shape, generator=g).to(leaf.dtype)
            else:
                lo, hi = (int(leaf.min()), int(leaf.max())) if leaf.numel() else (0, 1)
                t = torch.randint(lo, hi + 1, shape, generator=g, dtype=leaf.dtype)
            out.append(t.to(dev))
        return _torch.tree_unflatten(out, spec)

    return draw_inputs()

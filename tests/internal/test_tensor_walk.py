"""The cast walk's looked-up positions (``OpRule.walk``, from ``_ops.tensor_walk``): where a call's
tensors can be, read from the schema once, must be where the walk finds them per call
(``_walk.positions`` without the plan) for every overload a preset has a rule for."""

import pytest
import torch

from hpu_autocast._engine import walk as _walk
from hpu_autocast._facts import ops as _ops
from hpu_autocast._engine.compiled import OpRule, compile_policy
from hpu_autocast.policies.builder import as_policy
from hpu_autocast.policies.policy import CastPolicy

aten = torch.ops.aten


@pytest.mark.parametrize(
    "op, walk",
    [
        (aten.mm.default, ((), (0,), (0, 1))),
        (aten.linear.default, ((), (0,), (0, 1), (0, 1, 2))),  # bias is Tensor?: a slot that may hold None
        (aten.addmm.default, ((), (0,), (0, 1), (0, 1, 2))),  # beta, alpha keyword-only Scalars
        (aten.add.Tensor, ((), (0,), (0, 1))),  # alpha keyword-only
        (aten.softmax.int, ((), (0,), (0,), (0,))),  # dim and dtype? are no tensors
    ],
)
def test_the_walk_of_a_schema(op, walk):
    assert _ops.tensor_walk(op) == walk


@pytest.mark.parametrize("op", [aten.cat.default, aten.stack.default, aten.mm.out, aten.index.Tensor])
def test_a_list_of_tensors_or_a_keyword_tensor_has_no_walk(op):
    assert _ops.tensor_walk(op) is None  # the walk finds those per call


def test_an_input_only_rule_finds_its_positions_per_call():
    assert OpRule(aten.layer_norm.default, CastPolicy.FP32, input_only=True).walk is None
    assert OpRule(aten.layer_norm.default, CastPolicy.FP32).walk is not None


def _full_call(op):
    """Every positional argument of ``op``: a tensor where the schema says Tensor or Tensor?,
    else its default (or a placeholder number)."""
    args = []
    for a in op._schema.arguments:
        if a.kwarg_only:
            break
        is_tensor = "Tensor" in str(a.type)
        args.append(torch.ones(2) if is_tensor else (a.default_value if a.has_default_value() else 1))
    return args


@pytest.mark.parametrize("preset", ["torch-cpu", "torch-cuda", "hpu"])
def test_the_walk_is_where_the_walk_finds_tensors_per_call(preset):
    compiled = compile_policy(as_policy(preset))
    checked = 0
    for op, rule in compiled.rules.items():
        if rule.walk is None:
            continue
        args = _full_call(op)
        for n in range(len(args) + 1):
            found = _walk.positions(_without_walk(rule), args[:n], {}, "cpu")
            # (per call, a list argument is looked into too: an int[] holds no tensor)
            assert tuple(i for i in found if _holds_tensor(args[i])) == rule.walk[n], (op, n)
            checked += 1
    assert checked > 50


def _holds_tensor(a) -> bool:
    return isinstance(a, torch.Tensor) or (isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a))


def _without_walk(rule: OpRule) -> OpRule:
    plain = OpRule.__new__(OpRule)
    for name in OpRule.__slots__:
        setattr(plain, name, getattr(rule, name))
    plain.walk = None
    return plain

"""Test your own model and policy: did every op run in the dtype the policy gives it?

    >>> from hpu_autocast.testing import check_policy
    >>> print(check_policy(model, x, dtype=torch.bfloat16, policy="hpu"))
    1 deviation from policy 'hpu' (bf16):
      dtype  encoder.layers.1.mlp.proj  aten.linear.default  f64,f64,f64 -> f64, policy bf16: the model's own cast (bf16 -> f64 in encoder.layers.1.mlp)

* ``check_policy(fn, *inputs, dtype=, policy=)`` returns the ``Deviations`` of one run;
  ``assert_follows_policy`` raises them as a ``PolicyViolation`` (an ``AssertionError``).
* ``watch_policy(dtype, policy=)``: a region that collects deviations as its body runs.
* hypothesis strategies: ``policies()``, ``eligible_tensors()``, ``inputs_for(op)``,
  ``model_inputs(example)`` and ``module_maps(model)``. They need ``hypothesis``; nothing else here imports it.
* the pytest fixture ``hpu_autocast_region`` (plugin ``pytest_hpu_autocast``, installed with the
  package) runs a test body in a watched region and fails the test on a deviation.

docs/testing.md has the long form.
"""

from __future__ import annotations

from ._check import (
    WHYS,
    Deviation,
    Deviations,
    Kind,
    PolicyViolation,
    Watch,
    assert_follows_policy,
    check_policy,
    watch_policy,
)

for _cls in (Deviation, Deviations, Kind, PolicyViolation, Watch):
    _cls.__module__ = __name__  # shown as hpu_autocast.testing.PolicyViolation in a failure
del _cls

__all__ = [
    "check_policy",
    "assert_follows_policy",
    "watch_policy",
    "Watch",
    "Deviation",
    "Deviations",
    "Kind",
    "PolicyViolation",
    "WHYS",
    "policies",
    "eligible_tensors",
    "inputs_for",
    "model_inputs",
    "module_maps",
]


def _load():
    try:
        from . import _strategies as s
    except ImportError as e:
        if getattr(e, "name", None) == "hypothesis" or "hypothesis" in str(e):
            raise ImportError("hpu_autocast.testing's strategies need hypothesis: pip install hypothesis") from None
        raise
    return s


def policies(*args, **kwargs):
    """A hypothesis strategy of valid policies (``_strategies.policies`` has the arguments)."""
    return _load().policies(*args, **kwargs)


def eligible_tensors(*args, **kwargs):
    """A hypothesis strategy of tensors autocast may cast (``_strategies.eligible_tensors``)."""
    return _load().eligible_tensors(*args, **kwargs)


def inputs_for(*args, **kwargs):
    """A hypothesis strategy of ``(args, kwargs)`` an op overload accepts (``_strategies.inputs_for``)."""
    return _load().inputs_for(*args, **kwargs)


def model_inputs(*args, **kwargs):
    """A hypothesis strategy of inputs like an example, batch and sequence sizes varied
    (``_strategies.model_inputs``)."""
    return _load().model_inputs(*args, **kwargs)


def module_maps(*args, **kwargs):
    """A hypothesis strategy of ``modules=`` maps over a model's module names
    (``_strategies.module_maps``)."""
    return _load().module_maps(*args, **kwargs)


for _f in (policies, eligible_tensors, inputs_for, model_inputs, module_maps):
    _f.__doc__ += "\n\n    Needs hypothesis (``pip install hypothesis``); imported on the first call."
del _f

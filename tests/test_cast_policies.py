"""ATen's five cast policies, as ``torch-cuda`` gives them: the ATen calls that reach below
autocast under a ``torch-cuda`` region equal native CUDA autocast's (overload, input dtypes, dtype
arguments), on fake CUDA tensors, for the calls where the policies differ (issue 28): losses that
decompose, reductions with an optional dtype (``fp32_set_opt_dtype``), norms that gain one
(``fp32_append_dtype``), a lower-precision GEMM, a float32 norm.

The calls are recorded by a wrapper tensor subclass, not a TorchDispatchMode: while a dispatch
mode is active the C++ core hands every call to the Python kernels, so a mode would only test
those. Each case runs under both engines in this process: a plain region (the C++ core where it is
built) and an observing region (whose calls the Python kernels always decide).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

from hpu_autocast import HpuAutocastMode

#: Every autocast dispatch key (native ones and those the engine borrows): a recorded call runs
#: below all of them, as the call that reached the recorder did.
_AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
for _name in dir(torch._C.DispatchKey):
    if _name.startswith("Autocast"):
        _AUTOCAST_KEYS = _AUTOCAST_KEYS | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _name))


class Recorded(torch.Tensor):
    """A tensor that writes each ATen call reaching it (below autocast) into ``log`` as
    ``(overload, input dtypes and dtype arguments in argument order)``, then runs it on the
    tensor it wraps."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor, log: list):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                device=elem.device)
        r.elem, r.log = elem, log
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_flatten((args, kwargs))[0]
        log = next(a.log for a in leaves if isinstance(a, Recorded))
        log.append((str(func), tuple(str(a.dtype if isinstance(a, torch.Tensor) else a) for a in leaves
                                     if isinstance(a, (torch.Tensor, torch.dtype)))))
        inner = tree_map(lambda a: a.elem if isinstance(a, Recorded) else a, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            out = func(*inner[0], **inner[1])
        return tree_map(lambda t: Recorded(t, log) if isinstance(t, torch.Tensor) else t, out)


def _x(dtype):
    return torch.randn(4, 6).to(dtype)


#: name -> (function, its tensor arguments as functions of the input dtype).
CASES = {
    "cross_entropy": (F.cross_entropy, lambda d: (_x(d), torch.tensor([0, 1, 2, 5]))),
    "sum": (lambda x: x.sum(), lambda d: (_x(d),)),
    "sum(0)": (lambda x: x.sum(0), lambda d: (_x(d),)),
    "prod": (lambda x: x.prod(), lambda d: (_x(d),)),
    "cumsum": (lambda x: x.cumsum(0), lambda d: (_x(d),)),
    "softmax": (lambda x: x.softmax(-1), lambda d: (_x(d),)),
    "log_softmax": (lambda x: x.log_softmax(-1), lambda d: (_x(d),)),
    "softmax(dtype=float64)": (lambda x: x.softmax(-1, dtype=torch.float64), lambda d: (_x(d),)),
    "vector_norm": (torch.linalg.vector_norm, lambda d: (_x(d),)),
    "norm": (lambda x: x.norm(), lambda d: (_x(d),)),
    "norm(2, dim=0)": (lambda x: x.norm(2, dim=0), lambda d: (_x(d),)),
    "norm.Scalar": (lambda x: torch.ops.aten.norm.Scalar(x, 3), lambda d: (_x(d),)),
    "norm.ScalarOpt_dim": (lambda x: torch.ops.aten.norm.ScalarOpt_dim(x, 2, [1]), lambda d: (_x(d),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), lambda d: (_x(d), torch.randn(6), torch.randn(6))),
    "linear": (F.linear, lambda d: (_x(d), torch.randn(3, 6), torch.randn(3))),
    "mm": (torch.mm, lambda d: (_x(d), torch.randn(6, 2))),
}


def _trace(fn, tensors, region) -> list:
    """The calls below autocast of ``fn`` on fake CUDA tensors made from ``tensors``, in ``region``."""
    mode, log = FakeTensorMode(allow_non_fake_inputs=False), []
    args = [Recorded(FakeTensor(mode, t.to("meta"), torch.device("cuda")), log) for t in tensors]
    with region:
        fn(*args)
    return log


class _Native:
    """Native CUDA autocast switched on by hand: ``torch.autocast("cuda")`` switches itself off
    where CUDA is unavailable."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __enter__(self):
        self.was = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", self.dtype)

    def __exit__(self, *exc):
        torch.set_autocast_enabled("cuda", self.was[0])
        torch.set_autocast_dtype("cuda", self.was[1])


#: The two engines in one process: a plain region (the C++ core, where built) and an observing
#: one (the Python kernels decide every call of an observing region).
ENGINES = {"core": {}, "python": {"observer": lambda event: None}}


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("inputs", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_cuda_reaches_below_autocast_as_native_does(name, dtype, inputs, engine):
    fn, make = CASES[name]
    torch.manual_seed(0)
    tensors = make(inputs)
    native = _trace(fn, tensors, _Native(dtype))
    ours = _trace(fn, tensors, HpuAutocastMode(dtype, policy="torch-cuda", **ENGINES[engine]))
    assert ours == native


def test_the_trace_tells_the_policies_apart():
    # Native passes dtype=float32 to sum (fp32_set_opt_dtype) and leaves its input alone; a policy
    # that casts the input to float32 instead (the old approximation) is seen in the trace.
    from hpu_autocast import with_lists, get_preset
    native = _trace(lambda x: x.sum(), (_x(torch.bfloat16),), _Native(torch.bfloat16))
    assert native == [("aten.sum.default", ("torch.bfloat16", "torch.float32"))]
    cast = with_lists(get_preset("torch-cuda"), fp32=["sum"], name="sum as fp32")
    ours = _trace(lambda x: x.sum(), (_x(torch.bfloat16),), HpuAutocastMode(torch.bfloat16, policy=cast))
    assert ours[-1] == ("aten.sum.default", ("torch.float32",))

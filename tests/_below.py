"""What reaches below autocast: the ATen calls a function makes after every autocast key (native
or the engine's) has had its say, as ``(overload, dtypes)``, where ``dtypes`` are the tensor
arguments' dtypes and the ``torch.dtype`` arguments, in argument order.

The calls are recorded by a wrapper tensor subclass (``Recorded``), whose ``__torch_dispatch__``
runs at the Python key, below every autocast key; not by a TorchDispatchMode: while a dispatch
mode is active the C++ core hands every call to the Python kernels, so a mode would only see
those. On ``"cuda"`` the wrapped tensors are fake CUDA tensors (``FakeTensor`` on device
``cuda``), which reach torch's ``AutocastCUDA`` kernels without a GPU; on ``"cpu"`` real ones.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["Recorded", "trace", "NativeCUDA"]

#: Every autocast dispatch key (native ones and those the engine borrows): a recorded call runs
#: below all of them, as the call that reached the recorder did.
_AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
for _name in dir(torch._C.DispatchKey):
    if _name.startswith("Autocast"):
        _AUTOCAST_KEYS = _AUTOCAST_KEYS | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _name))

Call = Tuple[str, Tuple[str, ...]]


class Recorded(torch.Tensor):
    """A tensor that writes each ATen call reaching it into ``log`` (``Call``), then runs the call
    on the tensors it wraps, below every autocast key."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor, log: list):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                device=elem.device, storage_offset=elem.storage_offset())
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


def trace(fn: Callable, args: tuple, kwargs: dict, region, device: str) -> Tuple[List[Call], Optional[type]]:
    """The calls below autocast of ``fn(*args, **kwargs)`` inside ``region`` (a context manager),
    with the tensors wrapped (fake CUDA tensors on ``"cuda"``), and the type of the exception it
    raised, if any."""
    log: List[Call] = []
    mode = FakeTensorMode() if device == "cuda" else None

    def wrap(t):
        if not isinstance(t, torch.Tensor):
            return t
        inner = FakeTensor(mode, t.to("meta"), torch.device("cuda")) if mode is not None else t
        return Recorded(inner, log)

    args, kwargs = tree_map(wrap, (args, kwargs))
    try:
        with region:
            torch.manual_seed(0)
            fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (callers compare it)
        return log, type(e)
    return log, None


class NativeCUDA:
    """Native CUDA autocast switched on by hand: ``torch.autocast("cuda")`` switches itself off
    where CUDA is unavailable."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __enter__(self) -> None:
        self.was = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", self.dtype)

    def __exit__(self, *exc) -> None:
        torch.set_autocast_enabled("cuda", self.was[0])
        torch.set_autocast_dtype("cuda", self.was[1])

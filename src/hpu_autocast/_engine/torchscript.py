"""TorchScript inside a region: scripted and traced code is cast as ``torch.autocast`` casts it
where that can be exact (policy ``torch-cpu`` on CPU), and refused everywhere else.

[Note: TorchScript inside a region]
What native autocast does to a ``torch.jit.script``ed or ``torch.jit.trace``d function called in
``torch.autocast("cpu")`` is not what it does to the same Python code run eagerly. The graph
executor keeps one optimized graph per autocast state (``GraphFunction::currentSpecialization``:
CPU and CUDA autocast on or off, read from the thread's dispatch-key state), and builds it with
the JIT's own autocast pass (``torch/csrc/jit/passes/autocast.cpp``), which inserts
``_autocast_to_reduced_precision`` / ``_to_full_precision`` nodes by lists of its own (``mv``
lowered, ``add`` promoted to float32 when an input's dtype was not profiled...), with the dtype
``torch.get_autocast_dtype("cpu")`` has when the graph is built. Then the interpreter runs each
node through the dispatcher, where the autocast kernels (native's, and this package's: its key
is in the thread's included set) cast as they cast eager calls; and the executor rewrites ops
before they run (``addmm`` into ``mm`` and ``add``), so a kernel sees other calls than eager code
makes. Inside a region native autocast is suspended, so the executor picked its autocast-off
graph and the values differed from native's.

So a call into TorchScript from Python (``ScriptFunction.__call__``, ``ScriptMethod.__call__``:
scripted and traced functions and every method of a scripted, traced, frozen or loaded module
go through them) is looked at while a region is open:
* in a region of the ``torch-cpu`` preset (the policy native's CPU kernels are) casting CPU
  tensors, the call runs with native CPU autocast's state switched on, in the region's dtype,
  for the call alone: the executor picks, and if need be builds, the graph native autocast
  would run, and the engine's kernels, which are native's CPU kernels bit for bit, do what
  native's would (native's own kernels then see inputs already cast, and change nothing). Its
  cast cache is off for the call, so nothing cast in it outlives the region (the engine's cache
  serves the call, with the region's lifetime);
* in any other enabled region the call is refused, with an error naming the function: no
  native behaviour exists to reproduce, and the executor's rewrites mean a policy's kernels
  would not see the calls they see in eager code;
* in a disabled region (``disable_casts``), or outside any, the call is torch's.
The graph executor keys its graphs on autocast being on, not on the dtype: a function first
run under bfloat16 keeps bfloat16's casts under float16, with native autocast as here.
A call into TorchScript that does not come from Python (``torch.jit.fork`` of a scripted
function) is not seen; nor is a torchbind method (no graph: it is run as it is).

The two ``__call__`` are replaced when the first region opens and put back when the last one
closes, with ``_torch_autocast``'s patches (its Note: the count of open regions). That costs ~1.3 us a region (CPython updates the
type's call slot each time), measured in docs/performance.md: an earlier version put them back
lazily, at the first call into TorchScript outside regions, which saved that time and left
torch's objects replaced between regions; the guarantee is worth more than the microseconds.
"""

from __future__ import annotations

import warnings
from typing import Callable, Dict


from .. import _torch
from . import regions as _regions
from .compiled import policy_serial
from ..policies.builder import get_preset

__all__ = ["PATCHED", "install", "restore"]

#: The classes whose ``__call__`` is every call from Python into TorchScript.
PATCHED = (_torch.ScriptFunction, _torch.ScriptMethod)
#: The preset whose scripted code native autocast casts, by the device it casts.
_NATIVE_PRESET = {"cpu": "torch-cpu"}

_real: Dict[type, Callable] = {}


def _call_as_native(frame: _regions.Frame, call: Callable, fn, args: tuple, kwargs: dict):
    """``call(fn, ...)`` with native autocast on for the region's device, in its dtype, with
    native's cast cache off (see the Note)."""
    device = frame.region.device_type
    before = (
        _torch.native_autocast_enabled(device),
        _torch.native_autocast_dtype(device),
        _torch.autocast_cache_enabled(),
    )
    _torch.set_native_autocast_enabled(device, True)
    _torch.set_native_autocast_dtype(device, frame.dtype)
    _torch.set_autocast_cache_enabled(False)
    try:
        return call(fn, *args, **kwargs)
    finally:
        _torch.set_native_autocast_enabled(device, before[0])
        _torch.set_native_autocast_dtype(device, before[1])
        _torch.set_autocast_cache_enabled(before[2])


def _reproduces_native(frame: _regions.Frame) -> bool:
    region = frame.region
    preset = _NATIVE_PRESET.get(region.device_type)
    return preset is not None and policy_serial(region.compiled.policy) == policy_serial(get_preset(preset))


def _has_graph(fn) -> bool:
    try:
        fn.graph
    except RuntimeError:  # a torchbind method: C++, no TorchScript graph
        return False
    return True


def _name(fn) -> str:
    if isinstance(fn, _torch.ScriptMethod):
        return f"{fn.owner._type().name()}.{fn.name}"
    return fn.name


def _refusal(fn, frame: _regions.Frame) -> RuntimeError:
    region = frame.region
    kind = "method" if isinstance(fn, _torch.ScriptMethod) else "function"
    return RuntimeError(
        f"hpu_autocast: the TorchScript {kind} {_name(fn)!r} was called inside a region of policy "
        f"{region.compiled.policy.name!r} ({str(frame.dtype).replace('torch.', '')} on {region.device_type}). "
        "Scripted and traced code is not cast as eager code is: the JIT rewrites ops before they run "
        "(addmm into mm and add) and casts by its own lists, which reproduce policy 'torch-cpu' on cpu "
        "alone. Call the Python function or module itself inside the region (torch.compile it for "
        "speed), use HpuAutocastMode(policy='torch-cpu') on cpu, or call the scripted code under "
        "hpu_autocast.disable_casts() (or outside the region)"
    )


def _wrap(cls: type) -> Callable:
    def __call__(self, *args, **kwargs):
        call = _real[cls]
        frame = _regions.innermost()
        if frame is None or not frame.enabled or frame.region.compiled is None:
            return call(self, *args, **kwargs)
        if _reproduces_native(frame):
            return _call_as_native(frame, call, self, args, kwargs)
        if not _has_graph(self):
            return call(self, *args, **kwargs)
        raise _refusal(self, frame)

    __call__.__qualname__ = f"{cls.__name__}.__call__"
    return __call__


_SF, _SM = PATCHED
_installed = False
#: Set when another library replaced a wrapper of ours: from then on theirs stays, it calls ours,
#: and nothing is installed or restored again (ours over theirs would call itself).
_foreign = False


def install() -> None:
    """The first region opens (``_torch_autocast.acquire``, under its lock): calls into
    TorchScript go through ``_wrap``, unless they still do from an earlier region."""
    global _installed
    if _installed or _foreign:
        return
    _real[_SF] = vars(_SF)["__call__"]  # read each time: another library may patch too
    _real[_SM] = vars(_SM)["__call__"]
    _SF.__call__ = _wrap_sf
    _SM.__call__ = _wrap_sm
    _installed = True


def restore() -> None:
    """No region is open in the process (``_torch_autocast.release``, under its lock): torch's
    own ``__call__`` back."""
    global _installed, _foreign
    if not _installed or _foreign:
        return
    _installed = False
    for cls, wrapper in ((_SF, _wrap_sf), (_SM, _wrap_sm)):
        if vars(cls)["__call__"] is wrapper:
            cls.__call__ = _real[cls]
        else:
            _foreign = True
            warnings.warn(
                f"hpu_autocast: torch._C.{cls.__name__}.__call__ was replaced while it was "
                "hpu_autocast's; leaving the replacement in place",
                RuntimeWarning,
                stacklevel=5,
            )


_wrap_sf, _wrap_sm = _wrap(_SF), _wrap(_SM)

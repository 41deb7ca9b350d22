"""How a region treats ``torch.compile``: compiled code called inside it runs eagerly, under the
policy, without leaving Dynamo in a worse state.

[Note: torch.compile inside a region]
Dynamo refuses to trace a frame while a non-infra ``TorchDispatchMode`` is on the stack (the
engine's dispatch mode is one): ``convert_frame`` returns "non-infra torch dispatch mode present"
and the frame runs eagerly, under the policy, with right values. Measured on torch 2.13, with
nothing done about it, this has two costs (docs/graphs.md has the numbers):

* the skip is applied to the frame's *code object* for the rest of the process
  (``ConvertFrameReturn.apply_to_code``), so one call of a compiled model inside a region makes
  it, and every module sharing its ``forward``, run eagerly outside regions too, until
  ``torch._dynamo.reset()``;
* whenever ``_run`` pops the engine's dispatch mode for a call, the stack is empty and Dynamo
  compiles the engine's own helpers (``cast_args``, ``cast``, ``is_eligible``), with graph
  breaks and recompiles per tensor.

So, while any thread holds an enabled region, the compiler's stance is ``"force_eager"``
(``torch.compiler.set_stance``): compiled callables run their original code, Dynamo never sees
the frames and marks nothing. The stance is process-wide, so it is counted across threads and
restored when the last region exits; other threads' compiled code runs eagerly meanwhile. The
package's files are also added to Dynamo's skip list, so a compiled function that itself enters
a region (where the stance cannot be changed: torch forbids it inside a compiled frame) neither
traces the policy machinery nor compiles the engine's helpers.

Nothing here imports ``torch._dynamo`` (a second to import): if it is not loaded, nothing has
been compiled and there is nothing to do. (The engine loads it at the first region's entry,
through ``skip_recursively``, to mark its handlers skipped; see ``_engine._prepare_dynamo``.)
"""

from __future__ import annotations

import sys
import threading
import warnings

import torch

__all__ = ["region_entered", "region_exited"]

_lock = threading.Lock()
_regions = 0  # regions holding the forced stance: those that pushed the modes, any thread
_restore = None  # the set_stance object whose __exit__ restores the stance we replaced
_skipping = False


def _skip_our_files() -> None:
    global _skipping
    if _skipping:
        return
    try:
        from torch._dynamo import trace_rules

        trace_rules.add(__package__)
    except Exception:  # a torch without it: Dynamo traces into the package (slower, same values)
        pass
    _skipping = True


def skip_recursively(*fns) -> bool:
    """Mark the code of ``fns`` to be skipped by Dynamo together with everything they call, and
    put the package on Dynamo's skip list. Loads ``torch._dynamo`` (what a ``TorchDispatchMode``'s
    first call does anyway). Returns False where torch has no such marking (older than 2.9)."""
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:
        return False
    _skip_our_files()
    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    for fn in fns:
        set_code_exec_strategy(fn.__code__, skip)
    return True


def region_entered() -> bool:
    """Called when a region pushes the engine's modes. Returns whether it forced the stance
    (pass the result to ``region_exited``)."""
    global _regions, _restore
    if "torch._dynamo" not in sys.modules:
        return False
    _skip_our_files()
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:
        return False
    with _lock:
        if _regions == 0:
            try:
                _restore = set_stance("force_eager")
            except Exception:
                # Entered from a frame Dynamo is running: torch forbids changing the stance
                # there (RuntimeError). The dispatch mode still makes Dynamo skip what runs
                # inside. Never fail the region's entry over this.
                return False
        _regions += 1
        return True


def region_exited(forced: bool) -> None:
    global _regions, _restore
    if not forced:
        return
    with _lock:
        _regions -= 1
        if _regions == 0:
            restore, _restore = _restore, None
            try:
                restore.__exit__(None, None, None)
            except RuntimeError:
                warnings.warn("hpu_autocast: could not restore torch.compile's stance on region exit "
                              "(exited inside a compiled frame); it stays 'force_eager'",
                              RuntimeWarning, stacklevel=3)
            _clear_stale_mode_flags()


#: torch's process-global "a dispatch mode is active" flags (torch/utils/_python_dispatch.py).
_MODE_FLAGS = ("_is_in_torch_dispatch_mode", "_is_in_non_infra_torch_dispatch_mode",
               "_is_in_any_mode_without_ignore_compile_internals")


def _clear_stale_mode_flags() -> None:
    """Clear torch's global dispatch-mode flags once no region of ours is open in any thread.

    Each ``TorchDispatchMode.__exit__`` restores those flags to what its ``__enter__`` saw. The
    modes are per thread but the flags are not, so regions that overlap in two threads and end
    in another order leave them set. torch older than 2.10 decides from that flag that a mode is
    active and then never compiles anything again (seen on 2.9.1: every ``torch.compile``d call
    ran eagerly). Called with the lock held, when the last region has exited; a mode of another
    library open in another thread at that moment would be the one case this misjudges."""
    if torch._C._len_torch_dispatch_stack() != 0:
        return
    from torch.utils import _python_dispatch

    for name in _MODE_FLAGS:
        if getattr(_python_dispatch, name, False) is True:
            setattr(_python_dispatch, name, False)


if "torch._dynamo" in sys.modules:
    _skip_our_files()

"""Drop-in for Habana Mixed Precision (``habana_frameworks.torch.hpex.hmp``, seed 001).

An old Gaudi script runs here by changing only its import line::

    from hpu_autocast import hmp            # was: from habana_frameworks.torch.hpex import hmp
    hmp.convert(bf16_file_path="", fp32_file_path="", isVerbose=False)
    ...
    with hmp.disable_casts():
        optimizer.step()

``convert`` turns the ``hmp`` policy (bfloat16) on for the calling thread until the process
ends, as HMP's decorators do; ``disable_casts`` turns it off for a block.

[Note: no cast cache under convert]
``torch.autocast`` keeps casts of weights for the life of the outermost region, which a
training loop re-enters every step. ``convert`` opens one region for the whole process, so a
cache would hand the forward a stale copy of a weight the optimizer has since updated. HMP
casts on every call; so does this region (``cache_enabled=False``).

[Note: backward runs uncast under convert]
HMP casts by wrapping Python functions, so the backward pass (C++ autograd) is never cast: it
runs in the dtypes autograd's own ``ToCopyBackward`` nodes give it. A region left open for
the whole process would also see backward's ATen calls (``mul`` inside ``div``'s backward
would be lowered to bfloat16). So ``convert`` wraps ``torch.autograd.backward`` and
``torch.autograd.grad`` (``Tensor.backward`` calls the former) to run with casting off, and
``reset`` restores them. Code that bound those functions before ``convert``
(``from torch.autograd import grad``) bypasses the wrapper.

``hmp.reset()`` (not part of HMP) undoes ``convert``; tests use it to clean up.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from typing import Optional

import torch
import torch.autograd

from . import _torch
from .mode import HpuAutocastMode
from .policies.builder import get_preset, policy_from_files

__all__ = ["convert", "disable_casts", "reset", "is_converted", "LOGGER_NAME"]

#: ``isVerbose=True`` writes one line per decision to this logger, printed to stdout as HMP did.
LOGGER_NAME = "hpu_autocast.hmp"

_OPT_LEVELS = {"O1": "hmp", "O2": "hmp-O2"}

# Thread -> the region convert() opened there.
_converted = threading.local()


def _uncast(fn):
    @functools.wraps(fn)
    def run_uncast(*args, **kwargs):
        if not is_converted():
            return fn(*args, **kwargs)
        with HpuAutocastMode(enabled=False):
            return fn(*args, **kwargs)

    run_uncast._hpu_autocast_hmp = True
    return run_uncast


class _PrintHandler(logging.Handler):
    # Resolves sys.stdout at each record, so redirected/captured stdout sees the lines.
    def emit(self, record: logging.LogRecord) -> None:
        import sys

        try:
            print(self.format(record), file=sys.stdout)
        except Exception:  # pragma: no cover - logging must not raise
            self.handleError(record)


def _verbose_logger() -> logging.Logger:
    log = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _PrintHandler) for h in log.handlers):
        log.addHandler(_PrintHandler())
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return log


def convert(opt_level: str = "O1", bf16_file_path: str = "", fp32_file_path: str = "", isVerbose: bool = False) -> None:
    """Turn mixed precision on for this thread until the process ends (HMP's ``convert``).

    Args:
        opt_level: ``"O1"`` (HMP's lists, or the user's) or ``"O2"`` (GEMMs and convolutions
            in bfloat16, everything else float32; list files are ignored with a warning).
        bf16_file_path, fp32_file_path: text files with one op per line replacing HMP's
            default BF16/FP32 list; ``""`` keeps the default. Bad names raise ``PolicyError``
            naming the file and line.
        isVerbose: log each precision decision (printed to stdout, one line per op).
    """
    if opt_level not in _OPT_LEVELS:
        raise ValueError(f"hmp.convert: opt_level must be one of {sorted(_OPT_LEVELS)}, got {opt_level!r}")
    if is_converted():
        raise RuntimeError("hmp.convert was already called in this thread; call hmp.reset() first")
    if opt_level == "O2":
        if bf16_file_path or fp32_file_path:
            warnings.warn(
                "hmp.convert(opt_level='O2') ignores bf16_file_path and fp32_file_path: O2 runs "
                "GEMMs and convolutions in bfloat16 and everything else in float32",
                UserWarning,
                stacklevel=2,
            )
        policy = get_preset("hmp-O2")
    else:
        policy = policy_from_files("hmp", lower=bf16_file_path or None, fp32=fp32_file_path or None)
    observer = None
    if isVerbose:
        from .log import make_log_observer

        observer = make_log_observer(_verbose_logger())
    mode = HpuAutocastMode(torch.bfloat16, policy=policy, cache_enabled=False, observer=observer)
    mode.__enter__()
    _converted.mode = mode
    _torch.wrap_autograd(_uncast)  # counted: restored when no thread is converted


def is_converted() -> bool:
    """True when ``convert`` is in force in this thread."""
    return getattr(_converted, "mode", None) is not None


def reset() -> None:
    """Undo ``convert`` in this thread (HMP has no such call; for tests and notebooks).

    A region entered after ``convert`` and still open stays in force until it exits."""
    mode: Optional[HpuAutocastMode] = getattr(_converted, "mode", None)
    if mode is None:
        return
    mode.__exit__(None, None, None)
    _converted.mode = None
    _torch.unwrap_autograd()


def disable_casts() -> HpuAutocastMode:
    """A block in which nothing is cast (HMP's ``disable_casts``); float32 tensors entering it
    stay float32, bfloat16 ones stay bfloat16 (cast them with ``.float()`` as HMP asks)."""
    return HpuAutocastMode(enabled=False)

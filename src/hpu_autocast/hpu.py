"""Gaudi (HPU) detection, without importing ``habana_frameworks`` unless it is there.

``habana_frameworks.torch`` is not on the package registries, so it is never a dependency:
everything here degrades to "no HPU" when it is absent.
"""

from __future__ import annotations

import importlib.util
import sys

import torch

__all__ = ["backend_loaded", "hpu_importable", "default_cache_enabled", "check_dtype"]

_MODULE = "habana_frameworks.torch"


def backend_loaded() -> bool:
    """True once the Gaudi PyTorch bridge has been imported in this process."""
    return _MODULE in sys.modules


def hpu_importable() -> bool:
    """True when the Gaudi bridge could be imported (without importing it)."""
    if backend_loaded():
        return True
    try:
        return importlib.util.find_spec("habana_frameworks") is not None
    except (ImportError, ValueError):
        return False


def default_cache_enabled() -> bool:
    """Autocast's cast cache: on, except on HPU where graph mode deduplicates casts (seed 000)."""
    return not backend_loaded()


def check_dtype(dtype: torch.dtype) -> None:
    """On HPU, float16 is not supported (seed 000)."""
    if backend_loaded() and dtype == torch.float16:
        raise ValueError("dtype=float16 is not supported on HPU; use dtype=torch.bfloat16")

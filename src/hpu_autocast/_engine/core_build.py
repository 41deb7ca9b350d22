"""Building the C++ core (``csrc/core.cpp``) and finding a build made earlier.

The core is built once, by ``hpu-autocast build-core`` (or ``python -m hpu_autocast build-core``),
never on the hot path: ``torch.utils.cpp_extension`` compiles it against the installed torch
(about 30 s) into a directory named for everything the binary depends on (torch's version, the
Python ABI, the source's hash), so a build for another torch is never loaded. Where none is
there (no compiler, never built), the Python kernels run, with the same results.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Optional

import torch

__all__ = ["SOURCE", "MODULE", "build_dir", "built_path", "build"]

#: The core's one source file.
SOURCE = Path(__file__).with_name("csrc") / "core.cpp"
#: The extension module's name (what ``PyInit_`` it exports).
MODULE = "hpu_autocast_core"


def _tag() -> str:
    """What a build depends on: torch's version and C++ ABI, the Python ABI, the source."""
    source = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    abi = int(torch.compiled_with_cxx11_abi())
    return f"torch{torch.__version__}-abi{abi}-{sys.implementation.cache_tag}-{source}"


def build_dir() -> Path:
    """Where the build for this torch and source lives: ``$HPU_AUTOCAST_CORE_DIR`` or
    ``~/.cache/hpu_autocast/core``, then a directory named by ``_tag``."""
    root = os.environ.get("HPU_AUTOCAST_CORE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hpu_autocast", "core"
    )
    return Path(root) / _tag()


def built_path() -> Optional[Path]:
    """The built module for this torch and source, if one was built."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for name in (MODULE + ".so", MODULE + suffix):
        path = build_dir() / name
        if path.is_file():
            return path
    return None


def build(verbose: bool = False) -> Path:
    """Compile the core for the installed torch (a no-op when built already); returns the module's
    path. Raises ``RuntimeError`` naming what is missing when it cannot be built."""
    path = built_path()
    if path is not None:
        return path
    import logging

    # A CUDA build of torch on a machine without CUDA logs a warning about CUDA_HOME when
    # cpp_extension is imported; the core compiles no CUDA code.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension

    directory = build_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # HPU_AUTOCAST_CORE_DIR naming a file, a read-only cache, ...
        where = (
            f" (HPU_AUTOCAST_CORE_DIR={os.environ['HPU_AUTOCAST_CORE_DIR']!r})"
            if os.environ.get("HPU_AUTOCAST_CORE_DIR")
            else ""
        )
        raise RuntimeError(
            f"hpu_autocast: the C++ core's build directory {directory}{where} cannot be made: "
            f"{e.strerror or e}; point HPU_AUTOCAST_CORE_DIR at a writable directory"
        ) from None
    _ninja_on_path()
    try:
        cpp_extension.load(
            name=MODULE, sources=[str(SOURCE)], build_directory=str(directory), extra_cflags=["-O2"], verbose=verbose
        )
    except (RuntimeError, OSError, ImportError, SystemExit) as e:
        raise RuntimeError(
            f"hpu_autocast: the C++ core could not be built in {directory}: {e}; "
            "it needs a C++ compiler (g++ or clang++), ninja (`pip install ninja`), and torch's headers "
            "(the Python kernels run meanwhile, with the same results)"
        ) from e
    path = built_path()
    if path is None:
        raise RuntimeError(f"hpu_autocast: the C++ core was built in {directory}, but no {MODULE} module is there")
    return path


def _ninja_on_path() -> None:
    """torch's extension builder runs ``ninja`` from ``PATH``; where only the ``ninja`` wheel is
    installed (``pip install ninja``, into an environment whose ``bin`` is not on ``PATH``), its
    binary is put on ``PATH`` for this process."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return  # cpp_extension's own error says ninja is missing
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")

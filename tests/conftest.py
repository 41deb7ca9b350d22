"""Suite-wide pytest options.

``--as-if-cuda`` runs the suite as if this machine had a GPU: the device type a region casts for
when given none (``_devices.default_device_type``) resolves to ``cuda``, as it does where
``torch.cuda.is_available()``. A test written for CPU tensors that leaves the region's
``device_type`` to the default then casts nothing, as on a GPU machine; so this finds, without a
GPU, the tests that must say ``device_type="cpu"`` (or follow the default device). Tensors are
still made on CPU: a test that makes CUDA tensors skips here as it does without the option.
The fresh interpreters tests start (``subprocess``) inherit the emulation through an environment
variable (``_devices.AS_IF_CUDA_ENV``; Note: the test suite's GPU emulation).
"""

from __future__ import annotations

import os

import pytest
import torch


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--as-if-cuda",
        action="store_true",
        help="resolve a region's default device type to cuda, as on a machine with a GPU",
    )


#: [Note: engine_independent tests] A test marked ``engine_independent`` checks what neither the
#: engine (the C++ core or the Python kernels) nor the default device type changes: an import's
#: hygiene, a command that runs no region, a fresh interpreter that picks its engine itself. They
#: are the suite's slowest (each starts interpreters), so CI's second run on one torch (the Python
#: kernels, --as-if-cuda) leaves them out (``-m "not engine_independent"``, .ci/run); the runs
#: with the C++ core, on each torch, keep them.
ENGINE_INDEPENDENT = (
    "engine_independent: checks what neither the engine nor the default device type changes "
    "(CI's Python-kernel run leaves these out; Note: engine_independent tests)"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", ENGINE_INDEPENDENT)
    if config.getoption("--as-if-cuda"):
        from hpu_autocast._facts import devices as _devices

        # The one answer default_device_type() caches (asked once per process), here and, by the
        # environment, in every interpreter a test starts (set before collection, so that the
        # environments test modules copy at import have it too).
        _devices._cuda = True
        os.environ[_devices.AS_IF_CUDA_ENV] = "1"


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.getoption("--as-if-cuda"):
        from hpu_autocast._facts import devices as _devices

        os.environ.pop(_devices.AS_IF_CUDA_ENV, None)


@pytest.fixture
def machine_device(request: pytest.FixtureRequest) -> str:
    """The device type a region given none should cast for here, by the machine and not by the
    package (the oracle for tests of ``default_device_type``): ``cuda`` where torch sees a GPU or
    the suite runs ``--as-if-cuda``, else ``cpu`` (no Gaudi bridge is loaded in the suite)."""
    return "cuda" if torch.cuda.is_available() or request.config.getoption("--as-if-cuda") else "cpu"

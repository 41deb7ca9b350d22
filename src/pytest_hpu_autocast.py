"""pytest plugin of hpu_autocast: the ``hpu_autocast_region`` fixture.

    def test_forward(hpu_autocast_region):          # the body runs in a watched region
        model(x)                                     # a deviation from the policy fails the test

    @pytest.mark.hpu_autocast(policy="torch-cpu", dtype=torch.float16, ignore=["explicit dtype"])
    def test_forward_fp16(hpu_autocast_region): ...

The fixture yields ``hpu_autocast.testing.Watch`` (``.deviations``, ``.mode``); the marker's
keywords are ``watch_policy``'s (``dtype``, ``policy``, ``device_type``, ``ignore``,
``modules``), and so are those of an indirect parametrization (``params`` as dicts). After the
test body, deviations fail the test with the list of them, as a ``PolicyViolation``.

Note: installed as the ``pytest11`` entry point ``pytest_hpu_autocast`` (the module's own name,
so ``-p pytest_hpu_autocast`` is harmless where the entry point is loaded too). It lives outside
the ``hpu_autocast`` package so that loading it, which pytest does in every run of an
environment that has the package, imports neither torch nor hypothesis: the fixture imports
what it needs when a test asks for it, and the hook below is one stash lookup per test.
"""

from __future__ import annotations

import pytest

_WATCH = pytest.StashKey()


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "hpu_autocast(dtype=torch.bfloat16, policy='hpu', device_type=None, ignore=(), modules=None): "
        "the region of the hpu_autocast_region fixture",
    )


@pytest.fixture
def hpu_autocast_region(request):
    """Run the test body in an ``HpuAutocastMode`` region that collects deviations from its
    policy (``hpu_autocast.testing.watch_policy``); the test fails if there are any."""
    from hpu_autocast.testing import watch_policy

    options = {}
    marker = request.node.get_closest_marker("hpu_autocast")
    if marker is not None:
        if marker.args:
            options["dtype"] = marker.args[0]
        options.update(marker.kwargs)
    param = getattr(request, "param", None)
    if isinstance(param, dict):
        options.update(param)
    with watch_policy(**options) as watch:
        request.node.stash[_WATCH] = watch
        yield watch


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    __tracebackhide__ = True
    result = yield
    watch = item.stash.get(_WATCH, None)
    if watch is not None and watch.deviations:
        from hpu_autocast.testing import PolicyViolation

        raise PolicyViolation(watch.deviations)
    return result

"""The package's public surface: ``__all__`` names what exists, shadows no submodule, and each
public name is documented; no two modules of the package share a name."""

from __future__ import annotations

import collections
import importlib
import importlib.util
import os
import pathlib
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import hpu_autocast

PACKAGE = pathlib.Path(hpu_autocast.__file__).resolve().parent
#: Modules that import an optional framework, by the framework (only they may, and only they fail
#: to import without it).
NEEDS = {"hpu_autocast.integrations.lightning": "pytorch_lightning"}


def _submodules() -> dict:
    """Every module of the package by dotted name (subpackages walked)."""
    return {info.name: info for info in pkgutil.walk_packages([str(PACKAGE)], "hpu_autocast.")}


def test_every_name_in_all_exists():
    missing = [name for name in hpu_autocast.__all__ if not hasattr(hpu_autocast, name)]
    assert not missing
    assert len(set(hpu_autocast.__all__)) == len(hpu_autocast.__all__)


def test_no_name_in_all_shadows_a_submodule():
    # `hpu_autocast.trace` must not be a function on one import order and the module on another:
    # a name that is also a submodule's must be that submodule.
    for name in hpu_autocast.__all__:
        if f"hpu_autocast.{name}" in _submodules():
            assert getattr(hpu_autocast, name) is importlib.import_module(f"hpu_autocast.{name}"), name


def test_importing_every_submodule_leaves_the_public_names_as_they_were():
    before = {name: getattr(hpu_autocast, name) for name in hpu_autocast.__all__}
    for name in _submodules():
        if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
            continue
        if not name.endswith("__main__") and not name.endswith("._strategies"):  # runs the CLI; needs hypothesis
            importlib.import_module(name)
    assert {name: getattr(hpu_autocast, name) for name in hpu_autocast.__all__} == before


def _defines_nothing(name: str) -> bool:
    """Whether a module only re-exports (``hpu_autocast.builder``, the documented path of
    ``policies/builder.py``): nothing in it was defined there, so no traceback names it."""
    module = importlib.import_module(name)
    return not any(getattr(v, "__module__", None) == name for v in vars(module).values())


def test_no_two_modules_share_a_name():
    by_name = collections.defaultdict(list)
    for name in _submodules():
        by_name[name.rpartition(".")[2]].append(name)
    shared = {k: [n for n in v if not _defines_nothing(n)] for k, v in by_name.items() if len(v) > 1}
    assert {k: v for k, v in shared.items() if len(v) > 1} == {}
    assert _defines_nothing("hpu_autocast.builder") and not _defines_nothing("hpu_autocast.policies.builder")


@pytest.mark.parametrize("name", hpu_autocast.__all__)
def test_every_public_name_is_documented(name):
    value = getattr(hpu_autocast, name)
    doc = vars(value).get("__doc__") if isinstance(value, type) else value.__doc__  # a class's own
    assert doc and doc.strip(), f"hpu_autocast.{name} has no docstring"


@pytest.mark.engine_independent
def test_the_package_imports_no_framework_and_says_what_a_recipe_needs():
    # In a fresh process: `import hpu_autocast` and `hpu_autocast.integrations` load no Lightning;
    # with Lightning missing (None in sys.modules reads as not installed; both packages, as a GPU
    # machine's image has `lightning` beside pytorch-lightning), the plugin's module
    # raises an ImportError that names what to install.
    script = textwrap.dedent("""
        import sys
        import hpu_autocast, hpu_autocast.integrations
        print(sorted(m for m in sys.modules if "lightning" in m.split(".")[0]))
        sys.modules["pytorch_lightning"] = sys.modules["lightning"] = None
        try:
            import hpu_autocast.integrations.lightning
        except ImportError as e:
            print(type(e).__name__, e)
    """)
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    loaded, error = run.stdout.splitlines()
    assert loaded == "[]"
    assert error.startswith(
        "ImportError hpu_autocast.integrations.lightning needs PyTorch Lightning, which is not "
        'installed: pip install "pytorch-lightning>=2.6"'
    )

"""The package's public surface: ``__all__`` names what exists, shadows no submodule, and each
public name is documented; no two modules of the package share a name."""

from __future__ import annotations

import collections
import importlib
import pathlib
import pkgutil

import pytest

import hpu_autocast

PACKAGE = pathlib.Path(hpu_autocast.__file__).resolve().parent


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
        if not name.endswith("__main__") and not name.endswith("._strategies"):  # runs the CLI; needs hypothesis
            importlib.import_module(name)
    assert {name: getattr(hpu_autocast, name) for name in hpu_autocast.__all__} == before


def test_no_two_modules_share_a_name():
    by_name = collections.defaultdict(list)
    for name in _submodules():
        by_name[name.rpartition(".")[2]].append(name)
    assert {k: v for k, v in by_name.items() if len(v) > 1} == {}


@pytest.mark.parametrize("name", hpu_autocast.__all__)
def test_every_public_name_is_documented(name):
    value = getattr(hpu_autocast, name)
    doc = vars(value).get("__doc__") if isinstance(value, type) else value.__doc__  # a class's own
    assert doc and doc.strip(), f"hpu_autocast.{name} has no docstring"

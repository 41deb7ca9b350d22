"""The import paths users are shown keep working after the package's layout changed (issue 30):
every ``hpu_autocast.<name>`` that README.md and docs/ spell resolves (a module, or a name in
one), the console script and ``python -m hpu_autocast`` name functions that exist, and
pyproject's package data ships the C++ core's source where the build looks for it."""

from __future__ import annotations

import fnmatch
import importlib
import pathlib
import re

import pytest

import hpu_autocast
from hpu_autocast._engine import core_build
from hpu_autocast.policies import builder, gaudi

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(hpu_autocast.__file__).resolve().parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Paths the docs name as gone (migration.md: torch's own checkpoint does it now).
GONE = {"hpu_autocast.checkpoint"}
SPELLED = sorted(
    {
        m
        for path in DOCS
        for m in re.findall(r"\bhpu_autocast(?:\.[A-Za-z_][A-Za-z0-9_]*)+", path.read_text())
        if not m.endswith(".py")
    }
    - GONE
)
#: ``from hpu_autocast.x import y`` as the docs write it: ``hpu_autocast.x`` must be a module.
FROM_IMPORTS = sorted({m for path in DOCS for m in re.findall(r"from (hpu_autocast[\w.]*) import", path.read_text())})


def _resolve(path: str) -> object:
    """What a dotted path names: the longest importable module, then attributes of it."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        except ImportError as e:  # an optional extra that is not installed names itself
            if "is not installed" in str(e):
                pytest.skip(str(e))
            raise
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def test_the_docs_spell_paths_here():
    assert "hpu_autocast.builder.policy_from_files" in SPELLED and "hpu_autocast.testing" in SPELLED


@pytest.mark.parametrize("path", SPELLED)
def test_each_path_the_docs_spell_resolves(path):
    assert _resolve(path) is not None


@pytest.mark.parametrize("path", FROM_IMPORTS)
def test_each_module_the_docs_import_from_is_a_module(path):
    # graphs.md wrote `from hpu_autocast.trace import cast_nodes`: `trace` is a function.
    assert type(_resolve(path)).__name__ == "module", path


def test_the_paths_named_gone_are_gone():
    for path in GONE:
        with pytest.raises(AttributeError):
            _resolve(path)


def test_the_builders_documented_path_is_a_module_of_the_builders_public_names():
    # A plain module (no sys.modules alias): each public name is the policies builder's object.
    import hpu_autocast.builder as documented

    assert documented is hpu_autocast.builder and documented.__name__ == "hpu_autocast.builder"
    assert documented.__all__ == builder.__all__ + gaudi.__all__
    assert all(
        getattr(documented, name) is getattr(module, name) for module in (builder, gaudi) for name in module.__all__
    )


def test_the_console_script_and_main_module_name_functions_that_exist():
    text = (ROOT / "pyproject.toml").read_text()
    target = re.search(r'^hpu-autocast = "([\w.]+):(\w+)"', text, re.M)
    assert callable(getattr(importlib.import_module(target.group(1)), target.group(2)))
    assert "from .cli import main" in (PACKAGE / "__main__.py").read_text()


def test_the_package_data_ships_the_cores_source():
    text = (ROOT / "pyproject.toml").read_text()
    globs = re.findall(r'"([^"]+\.cpp)"', text)
    source = core_build.SOURCE.relative_to(PACKAGE).as_posix()
    assert core_build.SOURCE.is_file() and any(fnmatch.fnmatch(source, g) for g in globs), (source, globs)

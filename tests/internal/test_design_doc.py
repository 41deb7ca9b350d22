"""docs/design.md's module tables name every module of the package by its path in it."""

from __future__ import annotations

import pathlib

import hpu_autocast

PACKAGE = pathlib.Path(hpu_autocast.__file__).resolve().parent
DESIGN = pathlib.Path(__file__).resolve().parents[2] / "docs" / "design.md"


def test_every_module_is_in_the_design_table():
    text = DESIGN.read_text()
    table = text[text.index("## Modules") : text.index("## Layers")]
    missing = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if f"`{p.relative_to(PACKAGE).as_posix()}`" not in table
    ]
    assert not missing
    assert "`src/pytest_hpu_autocast.py`" in table

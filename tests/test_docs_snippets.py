"""Every ```python block of README.md and docs/*.md runs, each in a fresh namespace.

A block that cannot run here says so on the line before it, and is counted:

* ``<!-- not run: REASON -->``: it needs what the suite has not (a GPU, a Gaudi, a file of the
  reader's), or it is a fragment of a larger program;
* ``<!-- needs: FEATURE -->``: it shows a feature that is not in this tree yet; it is skipped while
  the marker is there, and runs once the marker is removed (with the feature's merge).

Blocks run in a temporary working directory (files they write stay out of the checkout), with a
fixed seed, on CPU tensors: a region left to its default device casts the machine's tensors, so
under ``--as-if-cuda`` (the suite's GPU emulation) a block that means CPU tensors says
``device_type="cpu"``, as a reader's code on a GPU machine would have to.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from typing import List, Optional

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*(not run|needs):\s*(.+?)\s*-->")


@dataclasses.dataclass(frozen=True)
class Snippet:
    path: pathlib.Path
    line: int  # of the block's first code line
    code: str
    not_run: Optional[str]  # the reason, from <!-- not run: ... -->
    needs: Optional[str]  # the feature, from <!-- needs: ... -->

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets(path: pathlib.Path) -> List[Snippet]:
    """The ```python blocks of ``path``, each with the marker on the last non-blank line before it."""
    text = path.read_text()
    out = []
    for m in _FENCE.finditer(text):
        before = [line for line in text[: m.start()].splitlines() if line.strip()]
        mark = _MARK.search(before[-1]) if before else None
        kind, value = (mark.group(1), mark.group(2)) if mark else (None, None)
        out.append(
            Snippet(
                path,
                text.count("\n", 0, m.start()) + 2,
                m.group(1),
                value if kind == "not run" else None,
                value if kind == "needs" else None,
            )
        )
    return out


SNIPPETS = [s for path in DOCS for s in snippets(path)]


def test_the_snippets_are_found_and_counted():
    # The parser finds the README's blocks; each unrun block gives its reason (counted here, so a
    # block marked away shows in the numbers).
    readme = [s for s in SNIPPETS if s.path.name == "README.md"]
    assert len(readme) >= 6
    # Every Python block of the README runs: a newcomer copies them (the features they needed are in).
    assert not [s.id for s in readme if s.not_run or s.needs]
    not_run = [s for s in SNIPPETS if s.not_run]
    needs = [s for s in SNIPPETS if s.needs]
    assert all(s.not_run.strip() for s in not_run) and all(s.needs.strip() for s in needs)
    runs = [s for s in SNIPPETS if not s.not_run and not s.needs]
    assert len([s for s in runs if s.path.name == "README.md"]) >= 4, [s.id for s in runs]


def test_a_marker_binds_the_block_after_it(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text(
        "<!-- not run: needs a GPU -->\n```python\nx = 1\n```\n\ntext\n\n```python\ny = 2\n```\n"
        "<!-- needs: edit -->\n\n```python\nz = 3\n```\n"
    )
    found = snippets(doc)
    assert [(s.line, s.code, s.not_run, s.needs) for s in found] == [
        (3, "x = 1\n", "needs a GPU", None),
        (9, "y = 2\n", None, None),
        (14, "z = 3\n", None, "edit"),
    ]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.id)
def test_snippet_runs(snippet, tmp_path, monkeypatch):
    if snippet.not_run:
        pytest.skip(f"not run: {snippet.not_run}")
    if snippet.needs:
        pytest.skip(f"needs {snippet.needs}, not merged yet (the marker goes with the merge)")
    monkeypatch.chdir(tmp_path)
    environ = dict(os.environ)  # a block may set Gaudi's list variables: undone after it
    torch.manual_seed(0)
    try:
        exec(compile(snippet.code, snippet.id, "exec"), {"__name__": "__snippet__"})
    finally:
        os.environ.clear()
        os.environ.update(environ)

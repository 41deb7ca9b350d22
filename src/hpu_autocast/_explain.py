"""Torch's dtype-mismatch errors explained where a region closes: which op, what the region's
policy does with it, the input dtypes, and the edit that fixes it.

[Note: explaining a dtype error at the region's exit]
An op the policy does not list has no kernel on the borrowed key, so the engine never sees the
call that fails: the explanation cannot come from the kernel. It is made at the region's
``__exit__``, from the exception alone, and only when torch's message is one of its dtype
mismatches (``DTYPE_MISMATCH``): every other exception, and every call that does not raise, is
left exactly as it was (the cost of a call that does not raise is nothing; of an exit without an
exception, one test). The op comes from two places: the innermost source line outside this package
and torch's ``_ops`` (the call the user or torch's module wrote: ``F.linear(...)``), each name
that resolves to an op, and the kernel that torch's message names (``mat1 and mat2``: addmm).
The input dtypes are those torch's message names. The explanation is an exception note
(``add_note``, Python 3.11); before 3.11, where tracebacks print no notes, it is appended to the
message. A region nested in another adds it once (the innermost region's policy is the one that ran).
"""

from __future__ import annotations

import linecache
import os
import re
from typing import List, Optional

import torch

from .policies.names import PolicyError, resolve
from .policies.policy import Policy

__all__ = ["DTYPE_MISMATCH", "explain", "note"]

#: Torch's messages for operands of two dtypes (CPU and CUDA kernels, torch 2.x).
DTYPE_MISMATCH = re.compile(
    r"same dtype|dtypes must be the same|dtypes match|expected scalar type \S+ but found"
    r"|expected dtype \S+ for .* but got dtype|type \(.*\) and \w+ type \(.*\) should be the same"
)

#: What a message names -> the kernel that raised it.
_RAISED_BY = (
    (re.compile(r"\bmat1 and mat2\b"), "addmm"),
    (re.compile(r"\bm1 and m2\b"), "mm"),
    (re.compile(r"\bbatch1\b"), "baddbmm"),
    (re.compile(r"both vectors"), "dot"),
    (re.compile(r"(weight|bias) type"), "convolution"),
    (re.compile(r"for `end`"), "lerp"),
    (re.compile(r"Index put"), "index_put"),
)
_DTYPE_WORD = re.compile(r"(?i)(bfloat16|half|float8\w*|float16|float32|float64|float|double)")
_DTYPE_NAME = {
    "bfloat16": "bfloat16",
    "half": "float16",
    "float16": "float16",
    "float": "float32",
    "float32": "float32",
    "double": "float64",
    "float64": "float64",
}
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_TORCH_OPS = os.path.join(os.path.dirname(torch.__file__), "_ops.py")
_MARK = "_hpu_autocast_explained"


def _dtypes(message: str) -> List[str]:
    found = [_DTYPE_NAME.get(w.lower(), w.lower()) for w in _DTYPE_WORD.findall(message)]
    return list(dict.fromkeys(found))


def _called(tb) -> List[str]:
    """The op names called on the innermost source line outside this package and torch's ``_ops``."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    for tb in reversed(frames):
        file = tb.tb_frame.f_code.co_filename
        if file.startswith(_PACKAGE) or file == _TORCH_OPS:
            continue
        line = linecache.getline(file, tb.tb_lineno)
        names = []
        for name in _CALL.findall(line):
            try:
                if name not in names and resolve(name):
                    names.append(name)
            except PolicyError:
                pass
        if names:
            return names
    return []


def _what(policy: Policy, name: str) -> str:
    """What ``policy`` does with the op ``name``: ``"unlisted"`` or its kinds (``"lower"``)."""
    ops = resolve(name)
    return " / ".join(sorted({policy.table[op].value for op in ops if op in policy.table})) or "unlisted"


def explain(exc: BaseException, policy: Optional[Policy], dtype: Optional[torch.dtype]) -> Optional[str]:
    """The explanation of ``exc`` under ``policy``, or ``None`` when it is no dtype mismatch."""
    if policy is None or not isinstance(exc, RuntimeError) or not exc.args or not isinstance(exc.args[0], str):
        return None
    message = exc.args[0].split("\n", 1)[0]
    if not DTYPE_MISMATCH.search(message):
        return None
    called = _called(exc.__traceback__)
    raised = next((op for pattern, op in _RAISED_BY if pattern.search(message)), None)
    names = called + ([raised] if raised and raised not in called else [])
    if not names:
        return None
    kinds = {n: _what(policy, n) for n in names}
    op = names[0]
    inputs = _dtypes(message)
    region = str(dtype).replace("torch.", "") if dtype is not None else "lower-precision"
    said = [f"{op} is {kinds[op]}"] + [f"{n}, which torch's message names, is {kinds[n]}" for n in names[1:]]
    if "unlisted" in kinds.values():
        rule = (
            f"the policy's rule for ops on no list, {policy.unlisted.value}, applies"
            if policy.unlisted
            else "an op on no list runs as its inputs are"
        )
        said.append(rule)
    fix = (
        f"policy.edit(lower=[{op!r}]) runs it in {region} (fp32=[{op!r}]: in float32) and keeps the rest of the policy"
        if kinds[op] == "unlisted"
        else f"cast its inputs to one dtype, or give it another kind: policy.edit(fp32=[{op!r}])"
    )
    got = f" (inputs {' and '.join(inputs)})" if len(inputs) > 1 else ""
    return (
        f"hpu_autocast: {op} raised torch's dtype-mismatch error{got} in a {region} region of policy "
        f"{policy.name!r}, where {'; '.join(said)}. Fix: {fix}; `hpu-autocast policy` prints the table."
    )


def note(exc: BaseException, policy: Optional[Policy], dtype: Optional[torch.dtype]) -> None:
    """Add ``explain``'s text to ``exc`` once (Note: explaining a dtype error at the region's exit)."""
    if getattr(exc, _MARK, False):
        return
    try:
        text = explain(exc, policy, dtype)
    except Exception:  # noqa: BLE001  (an explanation must never replace the user's error)
        return
    if text is None:
        return
    setattr(exc, _MARK, True)
    if hasattr(exc, "add_note"):
        exc.add_note(text)
    else:  # pragma: no cover - Python < 3.11
        exc.args = (f"{exc.args[0]}\n{text}", *exc.args[1:])

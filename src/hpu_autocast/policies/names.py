"""The one resolver from the op names users write to the ``OpOverload`` keys policies use.

Accepted spellings (see ``resolve``)::

    addmm  aten::addmm  aten.addmm  aten.addmm.default  addmm.out  aten::addmm.out
    truediv  iadd  __matmul__  cross_entropy   (Python-level names, via PYTHON_ALIASES)
    mylib::myop  mylib.myop.default              (custom ops registered with torch.library)

A bare name covers the packet's functional overloads (for a composite such as ``linear``,
its entry). In-place and ``out=`` overloads are covered only when spelled: ``add_``,
``addmm.out``, ``iadd``. An overload is one the packet lists (``packet.overloads()``); any other
attribute of a packet (``mm.overloads``) is an unknown overload.
"""

from __future__ import annotations

import difflib
import functools
import os
from typing import List, Optional, Tuple, Union


from .._facts import ops as _ops
from .. import _torch
from .._torch import OpOverload

__all__ = [
    "PolicyError",
    "PYTHON_ALIASES",
    "Source",
    "Entry",
    "describe",
    "user_stacklevel",
    "is_python_name",
    "resolve",
    "suggestions",
]

#: Python-level spellings used by the seed documents and by HMP/Gaudi list files, mapped to
#: ATen packet names. A tuple maps to several packets. None of them is itself the name of an
#: ATen (C++) function (``is_python_name``).
PYTHON_ALIASES = {
    "truediv": "div",
    "__truediv__": "div",
    "__rtruediv__": "div",
    "__rdiv__": "div",
    "__div__": "div",
    "itruediv": "div_",
    "iadd": "add_",
    "isub": "sub_",
    "imul": "mul_",
    "__iadd__": "add_",
    "__add__": "add",
    "__radd__": "add",
    "__sub__": "sub",
    "__rsub__": "rsub",
    "__mul__": "mul",
    "__rmul__": "mul",
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "__pow__": "pow",
    "__rpow__": "pow",
    "cross_entropy": "cross_entropy_loss",
    "multi_dot": "linalg_multi_dot",
    "grid_sample": "grid_sampler",
    "GRUCell": "gru_cell",
    "LSTMCell": "lstm_cell",
    "RNNCell": ("rnn_tanh_cell", "rnn_relu_cell"),
    "dropout1d": "feature_dropout",
    "dropout2d": "feature_dropout",
    "dropout3d": "feature_dropout",
    # Python functions whose policy is that of the ATen op they call (seed 003's CUDA list).
    "normalize": "norm",
    "softmin": "softmax",
}

#: Where a name came from, for error messages: (file or None, line or None), or, for a name read
#: from a JSON document or a dict, (file or None, key) with the key as a string
#: (``"autocast_bf16_ops[3]"``).
Source = Tuple[Optional[str], Optional[Union[int, str]]]
#: An op name and where it came from (``Source`` or ``None``), as lists hold them for messages.
Entry = Tuple[str, Optional[Source]]


class PolicyError(ValueError):
    """A policy could not be built: an unknown op name, a bad list file, a conflict."""


def _where(source: Optional[Source]) -> str:
    if not source:
        return ""
    file, line = source
    if isinstance(line, str):
        return f" ({file}, key {line})" if file is not None else f" (dict key {line})"
    if file is None:
        return ""
    return f" ({file}, line {line})" if line is not None else f" ({file})"


def describe(name: str, source: Optional[Source] = None) -> str:
    """``'mm' (lower.txt, line 3)``, ``'mm' (gaudi_config.json, key autocast_bf16_ops[3])`` or
    ``'mm' (dict key autocast_bf16_ops[3])``: a name and where it came from, for messages."""
    return f"{name!r}{_where(source)}"


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` called by the caller of this function
    point at the first frame outside this package: the user's line, however deep the package's
    own calls go (Python 3.12's ``skip_file_prefixes``, for every Python this package runs on).
    The builder's and Gaudi's readers warn about names so."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = _torch.caller_frame(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


@functools.lru_cache(maxsize=1)
def _known_names() -> tuple:
    names = set(PYTHON_ALIASES)
    # Note: dir(torch.ops.aten) lists only packets already looked up; ask the dispatcher.
    for qualified in _torch.all_op_names():
        ns, _, rest = qualified.partition("::")
        name = rest.partition(".")[0]
        if ns == "aten" and (not name.startswith("_") or name.startswith("_convolution")):
            names.add(name)
    return tuple(sorted(names))


def suggestions(name: str, n: int = 3) -> List[str]:
    """The closest valid names to ``name``."""
    bare = name.split("::")[-1].split(".")[-1] if "::" in name else name.replace("aten.", "")
    return difflib.get_close_matches(bare, _known_names(), n=n, cutoff=0.6)


def _unknown(name: str, source: Optional[Source], why: str = "unknown op") -> PolicyError:
    close = suggestions(name)
    hint = f"; closest valid names: {', '.join(close)}" if close else ""
    return PolicyError(f"{why} {name!r}{_where(source)}{hint}")


def _split(name: str) -> Tuple[str, str, Optional[str]]:
    """``(namespace, packet name, overload or None)`` for one spelling."""
    if "::" in name:
        ns, rest = name.split("::", 1)
        base, _, overload = rest.partition(".")
        return ns, base, overload or None
    parts = name.split(".")
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    if len(parts) == 2:
        # "aten.addmm" (namespace.name) or "addmm.out" (name.overload)?
        if _ops.find_packet(parts[0], parts[1]) is not None and _ops.find_packet("aten", parts[0]) is None:
            return parts[0], parts[1], None
        return "aten", parts[0], parts[1]
    return "aten", name, None


def is_python_name(name: str) -> bool:
    """True for a Python-level spelling (``truediv``, ``iadd``, ``__matmul__``, ``cross_entropy``,
    also as ``aten::truediv``): a key of ``PYTHON_ALIASES`` that no ATen function is called. C++
    code, such as Gaudi's bridge reading its list files, does not know these names."""
    ns, base, overload = _split(name.strip())
    return ns == "aten" and overload is None and base in PYTHON_ALIASES and _ops.find_packet("aten", base) is None


def resolve(name: str, source: Optional[Source] = None) -> List[OpOverload]:
    """The overloads ``name`` stands for. Raises ``PolicyError`` naming it when it is unknown."""
    if not isinstance(name, str) or not name.strip():
        raise PolicyError(f"op names must be non-empty strings, got {name!r}{_where(source)}")
    name = name.strip()
    if name in PYTHON_ALIASES:
        targets = PYTHON_ALIASES[name]
        targets = (targets,) if isinstance(targets, str) else targets
        return [op for t in targets for op in resolve(t, source)]
    ns, base, overload = _split(name)
    if ns == "aten" and base in PYTHON_ALIASES and overload is None:
        return resolve(base, source)
    packet = _ops.find_packet(ns, base)
    if packet is None:
        raise _unknown(name, source)
    if overload is not None:
        # Note: only the names the packet lists are overloads; any other attribute of it
        # (``mm.overloads``, ``mm.__name__``) is a method or a string, never a policy key.
        try:
            op = getattr(packet, overload) if overload in packet.overloads() else None
        except (AttributeError, RuntimeError):
            op = None
        if not isinstance(op, OpOverload):
            valid = ", ".join(sorted(packet.overloads()))
            raise PolicyError(f"unknown overload {name!r}{_where(source)}; {ns}::{base} has: {valid}")
        return [op]
    ops = list(_ops.overloads(packet))
    if base.endswith("_"):
        # A spelled in-place packet: every overload of it.
        return ops
    functional = [op for op in ops if _ops.is_functional(op)]
    if not functional:
        raise _unknown(name, source, why="op has no functional overload:")
    return functional

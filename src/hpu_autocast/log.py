"""The decision log: one compact line per engine event, through ``logging``.

    aten.linear.default  lower  f32,f32,f32 -> bf16
    aten.relu.default  not listed  bf16 -> bf16
    aten.cross_entropy_loss.default  fp32  bf16,i64 -> f32

Each line reads ``overload  decision  input dtypes -> compute dtype``. The decision is the
policy's ``lower``/``fp32``/``promote``/``first`` (``first (unlisted)`` or ``first (in-place)``
when the rule is the policy's default for ops on no list, HMP's), ``not listed``, ``native``
(left to native autocast's kernel), or ``ineligible: <why>`` (``explicit dtype``, ``float64``,
``disabled``). Which calls make a line is the engine's
choice, documented in ``events.py``: the log formats events and decides nothing.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from .events import Event, Outcome, short_dtype

__all__ = ["LOGGER_NAME", "decision", "format_line", "make_log_observer", "combine_observers"]

#: The logger the decision lines go to, at DEBUG.
LOGGER_NAME = "hpu_autocast"


def decision(event: Event) -> str:
    """The decision column: ``lower``, ``first (unlisted)``, ``not listed``, ``ineligible: float64``."""
    if event.outcome is Outcome.UNLISTED:
        return "not listed"
    if event.outcome is Outcome.INELIGIBLE:
        return f"ineligible: {event.reason}"
    if event.outcome is Outcome.NATIVE:
        return "native"
    return f"{event.action} ({event.default})" if event.default else str(event.action)


def format_line(event: Event) -> str:
    ins = ",".join(short_dtype(d) for d in event.inputs)
    return f"{event.op}  {decision(event)}  {ins} -> {short_dtype(event.compute)}"


def make_log_observer(logger: Optional[logging.Logger] = None) -> Callable[[Event], None]:
    """An observer writing one DEBUG line per event to ``logger`` (default: the ``hpu_autocast``
    logger). What ``HpuAutocastMode(verbose=True)`` installs.

    The lines are visible once that logger is enabled for DEBUG, e.g.
    ``logging.basicConfig(level=logging.DEBUG)``. When it is not, each event costs one
    ``isEnabledFor`` check; a region without ``verbose`` installs nothing.
    """
    log = logger if logger is not None else logging.getLogger(LOGGER_NAME)

    def observe(event: Event) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s", format_line(event))

    return observe


def combine_observers(*observers: Optional[Callable[[Event], None]]) -> Optional[Callable[[Event], None]]:
    """One observer calling each given one in order (``None`` entries skipped). A region has
    one observer slot; ``None`` when none is given, the observer itself when one is."""
    obs = tuple(o for o in observers if o is not None)
    if not obs:
        return None
    if len(obs) == 1:
        return obs[0]

    def observe(event: Event) -> None:
        for o in obs:
            o(event)

    return observe

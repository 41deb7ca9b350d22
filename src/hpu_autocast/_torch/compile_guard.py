"""What ``torch.compile`` needs from the engine: a guard that recompiles a frame traced inside a
region when the region's policy, dtype, device or on/off state differs.

[Note: torch.compile inside a region]
Dynamo traces Python; the engine is dispatcher kernels, which Dynamo never sees as Python: its
fake-tensor propagation and AOTAutograd's tracing dispatch every op like eager code does, so the
kernels run there and their casts are recorded as ``_to_copy`` nodes of the graph. Dynamo
already guards on the thread's autocast state (``GlobalStateGuard``), which covers whether the
engine's key is on, but not *which* policy and dtype a region applies. So while Dynamo traces,
the first kernel that runs installs one guard on ``hpu_autocast._engine.GUARD.token``, a
property that describes the calling context's innermost region; a compiled frame called under
another region fails it and is traced again (once per distinct region state, then cached).

Only Dynamo's internals offer this (``install_guard``, ``AttrSource``, ``GuardBuilder.EQUALS_MATCH``,
and a source for the package: ``ImportSource`` from torch 2.13, the tracing frame's
``import_source`` before); where a torch lacks them nothing is installed and a frame compiled
under one policy would keep its casts under another.

Dynamo's surface, all of it here (tests/internal/test_private_surface.py keeps it so), each
imported only once Dynamo is loaded, checked present on torch 2.4.1, 2.13.0 and 2.14.1 (the
suite on 2.13.0); "fallback" is what a torch without it gets:

* ``torch._guards.TracingContext.try_get``: whether Dynamo traces (``tracing``); missing: never.
* ``torch._dynamo.guards.install_guard``, ``GuardBuilder.EQUALS_MATCH``, ``source.AttrSource``:
  the region guard (``install``); missing: no guard (a warning once).
* ``torch._dynamo.source.ImportSource`` (torch >= 2.13; 2.4.1 lacks it), else the tracing frame's
  ``import_source`` (``symbolic_convert.InstructionTranslator``): the package as a guard source.
* ``torch._dynamo.trace_rules`` (``get_torch_obj_rule_map``, the skip lists) and
  ``torch._dynamo.variables.torch``: the package run, not traced, and torch's getters answered for
  a region (``skip_package``, ``settle_torch_rules``); missing: Dynamo's defaults.
* ``torch._dynamo.utils.counters``: whether anything was compiled (``observing_opened``).
* ``torch._dynamo.eval_frame`` stance (``torch.compiler.set_stance``'s, torch >= 2.6): observing
  regions run compiled code eagerly; missing: compiled code runs as compiled.
* the ``_dynamo_marked_constant`` attribute ``torch._dynamo.assume_constant_result`` sets
  (``assume_constant``), set without importing Dynamo; ignored where Dynamo reads it not.
* ``torch._functorch.config.enable_autograd_cache`` (torch >= 2.5) and its ConfigModule entry
  (``_config[...].user_override``, a ContextVar on 2.13 and 2.14; ``_hash_dirty_var``,
  ``_mark_get_dict_dirty``): AOTAutograd's cache off in a region's thread
  (``autograd_cache_off``; its Note); missing: no cache to turn off, or a process-wide write.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import threading
import warnings
from typing import Callable, Optional

import torch

from . import Held as _Held

__all__ = ["tracing", "install", "observing_opened", "observing_closed", "assume_constant", "autograd_cache_off"]

_PACKAGE = "hpu_autocast"


_try_get = None  # TracingContext.try_get, once Dynamo is loaded


def tracing() -> bool:
    """True while Dynamo traces a frame in this thread (cheap when Dynamo is not loaded; every
    policy op's kernel asks, so the import is done once)."""
    global _try_get
    if _try_get is None:
        if "torch._dynamo" not in sys.modules:
            return False
        from torch._guards import TracingContext

        _try_get = TracingContext.try_get
    return _try_get() is not None


def _package_source():
    """A Dynamo source for the imported ``hpu_autocast`` package (``ImportSource`` is new in
    torch 2.13; before it, the tracer in flight imports it into the frame's globals)."""
    try:
        from torch._dynamo.source import ImportSource
    except ImportError:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        try:
            tx = InstructionTranslator.current_tx()
        except AttributeError:  # torch < 2.13 reads a thread-local never set where Dynamo has not traced
            return None
        return tx.import_source(_PACKAGE) if tx is not None else None
    return ImportSource(_PACKAGE)


def skip_package() -> None:
    """Put this package on Dynamo's skip list, once Dynamo is loaded.

    Dynamo evaluates every Python frame run under a compiled function, and a kernel is a
    Python frame: in a compiled function that opens a region itself (whose ``with`` breaks the
    graph), the ops run eagerly after the break would have Dynamo trace the engine, with graph
    breaks per tensor and, on some torch versions, failures inside it. Skipped, the package's
    code runs as plain Python there; the kernels still run inside the tracing of a graph
    (fake tensors, AOT), which is how the casts get into it."""
    global skipped
    if skipped or "torch._dynamo" not in sys.modules:
        return
    skipped = True
    try:
        from torch._dynamo import trace_rules

        trace_rules.add(_PACKAGE)  # the whole package, not this subpackage (__package__)
    except Exception:  # pragma: no cover - a torch without it: Dynamo traces into the package
        pass


skipped = False


def settle_torch_rules(pairs: Callable[[], list]) -> None:
    """Teach Dynamo, once it is loaded, that each ``(torch's, ours)`` pair ``pairs()`` gives is one
    function: whichever its tables hold, they then hold both, with the same rule.

    [Note: Dynamo's tables and the patched getters]
    Dynamo knows torch's functions by identity, in tables built at two times: the getters it
    folds to constants (``torch.is_autocast_enabled`` among them) when it is imported, the rest
    at its first trace (``trace_rules.get_torch_obj_rule_map``). While a region is open,
    ``torch.is_autocast_enabled`` is the region's getter (``_torch_autocast``), so a table built
    then holds ours and one built outside holds torch's; a getter in one table and not in the
    other goes into the graph as a torch op that returns no tensor, and the compile fails. This
    adds entries for our functions (and torch's, where a table was built inside a region); it
    changes no rule of torch's. Called when the first region opens and when the last closes;
    it settles again whenever Dynamo has rebuilt its rule map since (``trace_rules.
    clear_lru_cache``, which ``torch.distributed.init_process_group`` calls: a table rebuilt
    without our getters made a compiled ``torch.is_autocast_enabled`` in a region a call to a
    skipped function, refused under ``fullgraph``)."""
    global _rule_tables, _settled_map
    if _rule_tables is None:
        if "torch._dynamo" not in sys.modules:
            return
        try:
            from torch._dynamo.trace_rules import get_torch_obj_rule_map
            from torch._dynamo.variables import torch as torch_variables
        except ImportError:  # pragma: no cover - a torch without these tables has nothing to disagree
            _rule_tables = ()
            return
        folds = [
            getattr(torch_variables, n, None)
            for n in ("constant_fold_functions", "constant_fold_functions_need_guards")
        ]
        _rule_tables = (get_torch_obj_rule_map, [t for t in folds if isinstance(t, dict)])
    if not _rule_tables:
        return
    rule_map_of, folds = _rule_tables
    rule_map = rule_map_of()
    if rule_map is _settled_map:
        return
    for table in (rule_map, *folds):
        for theirs, ours in pairs():
            for known, other in ((theirs, ours), (ours, theirs)):
                if known in table and other not in table:
                    table[other] = table[known]
    _settled_map = rule_map


#: Dynamo's rule map getter and its constant-fold tables, once Dynamo is loaded (``()``: none).
_rule_tables: Optional[tuple] = None
#: The rule map last settled (Dynamo builds a new one when it clears its caches).
_settled_map: object = None


def install() -> None:
    """Guard the frame Dynamo is tracing on the innermost region's state (idempotent: Dynamo's
    guard set deduplicates equal guards)."""
    skip_package()
    try:
        from torch._dynamo.guards import GuardBuilder, install_guard
        from torch._dynamo.source import AttrSource
    except ImportError:
        return
    package = _package_source()
    if package is None:  # no frame being traced (AOT tracing after Dynamo's own)
        return
    source = AttrSource(AttrSource(AttrSource(package, "_engine"), "GUARD"), "token")
    install_guard(source.make_guard(GuardBuilder.EQUALS_MATCH))


# [Note: observing regions run compiled code eagerly]
# A compiled graph runs without Python, so an observer (record=True, verbose=True, observer=...)
# would see the calls Dynamo traced once, on fake tensors, and none of the real ones. So while a
# region with an observer is open, the compiler's stance is "force_eager": compiled callables run
# their original code, under the region, and the observer sees each call. The stance is
# process-wide (torch has no per-thread one), counted across threads and restored when the last
# observing region exits (torch before 2.6 has no stance: a patch does the same, ``_ForceEager``).
# Nothing is done when Dynamo is not loaded: nothing compiled exists.
# The warning is given once, at the first observing region opened after Dynamo compiled a frame.
_lock = threading.Lock()
_observing = 0
_restore = None
_warned = False


def observing_opened() -> bool:
    """An observing region opens; returns whether it counted (pass that to ``observing_closed``)."""
    global _observing, _restore, _warned
    if "torch._dynamo" not in sys.modules:
        return False
    set_stance = getattr(torch.compiler, "set_stance", None) or _ForceEager  # torch < 2.6: no set_stance
    with _lock:
        if _observing == 0:
            try:
                _restore = set_stance("force_eager")
            except Exception:  # entered inside a compiled frame: torch forbids changing the stance
                return False
            if not _warned and _compiled_anything():  # once a process: a loop opens a region per step
                _warned = True
                warnings.warn(
                    "hpu_autocast: compiled code runs eagerly while a region with an observer "
                    "(record=True, verbose=True, observer=...) is open, so the observer sees each call",
                    UserWarning,
                    stacklevel=4,
                )
        _observing += 1
        return True


def _compiled_anything() -> bool:
    """Whether Dynamo has compiled a frame in this process: the warning above concerns compiled
    code, and Dynamo is loaded without any (``torch.optim``'s optimizers import it)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - a torch without the counters: warn, as before
        return True
    return counters["frames"]["total"] > 0


class _ForceEager:
    """torch before 2.6 has no ``torch.compiler.set_stance``; its "force_eager" stance hands each
    compiled callable's wrapper no frame callback (``None``: Python runs the original code), and
    this does the same by patching the ``set_eval_frame`` those wrappers call, until ``__exit__``
    puts the original back. As ``set_stance`` does, it refuses inside a compiled frame. (A
    wrapper restoring a callback it saw before the patch, in a thread already inside a compiled
    frame, restores none: its frame's later calls run eagerly too, until it returns.)"""

    def __init__(self, stance: str) -> None:
        assert stance == "force_eager"
        from torch._dynamo import eval_frame

        original = eval_frame.set_eval_frame
        current = original(None)
        original(current)
        if current not in (None, False):
            raise RuntimeError("attempted to force eager inside a compiled frame")
        self._module, self._original = eval_frame, original
        eval_frame.set_eval_frame = lambda callback: original(None)

    def __exit__(self, *exc) -> None:
        self._module.set_eval_frame = self._original


def observing_closed(counted: bool) -> None:
    global _observing, _restore
    if not counted:
        return
    with _lock:
        _observing -= 1
        if _observing == 0:
            restore, _restore = _restore, None
            try:
                restore.__exit__(None, None, None)
            except RuntimeError:
                warnings.warn(
                    "hpu_autocast: could not restore torch.compile's stance (exited inside a compiled "
                    "frame); it stays 'force_eager'",
                    RuntimeWarning,
                    stacklevel=4,
                )


def assume_constant(fn: Callable) -> Callable:
    """Mark a getter as ``torch._dynamo.assume_constant_result`` does (the same attribute, set
    without importing Dynamo): torch.compile then calls it while tracing and uses its answer as a
    constant, as it does for torch's own getters, instead of tracing into the context variable
    the answer comes from (which breaks the graph)."""
    fn._dynamo_marked_constant = True
    return fn


# [Note: AOTAutograd's cache and a region]
# AOTAutograd's cache (``torch._functorch.config.enable_autograd_cache``, torch >= 2.5, on by
# default for inductor; in memory and on disk) keys a compiled graph by Dynamo's graph, the grad
# mode and torch's autocast state as ``torch.is_autocast_enabled`` / ``get_autocast_dtype``
# answer. A region's casts enter the graph only when AOT traces it (the kernels run on fake
# tensors), so two regions that answer alike (two bfloat16 policies; a bfloat16 and an fp8 region)
# shared one key: a step compiled under one policy was served under the other, the casts of the
# first (measured: ``mm`` unlisted by ``edit`` still ran in bfloat16, in one process and, through
# the disk cache, in the next). While a thread has a region open, the cache is off for it; the
# graph inductor generates from the traced graph, casts in it, is still cached (inductor's own
# FX graph cache keys the traced graph). Where config writes are per context (torch 2.13, 2.14:
# each entry's ``user_override`` a ContextVar) the thread's first region turns it off and its last
# puts back exactly what was there (the unset marker included); where they are process-wide,
# the first region open in the process turns it off and the last puts it back.
_AOT_CACHE = "enable_autograd_cache"


def autograd_cache_off() -> Optional[Callable[[], None]]:
    """Turn AOTAutograd's cache off for the calling thread's regions (Note: AOTAutograd's cache
    and a region); returns what puts it back (``None``: nothing to put back)."""
    switch = _aot_switch()
    if switch is None:
        return None
    if switch.__class__ is tuple:  # per context: the entry's ContextVar, set and put back
        override, stale = switch
        prior = override.get()
        if prior is False:  # off here already (a user's, or an enclosing context's)
            return None
        override.set(False)
        stale()

        def restore() -> None:
            override.set(prior)  # the unset marker too: the config reads as before
            stale()

        return restore
    switch.acquire()
    return switch.release


@functools.lru_cache(maxsize=None)
def _aot_switch():
    """How this torch keeps ``enable_autograd_cache``, asked once: ``None`` (no such cache), a
    ``Held`` write of it (process-wide writes: the first region open in the process turns it off,
    the last puts it back), or ``(ContextVar, stale)`` where writes are per context
    (``stale`` marks the config's cached hash and dict as torch's own ``__setattr__`` does)."""
    try:
        from torch._functorch import config  # 2 ms, once; imports no Dynamo
    except ImportError:
        return None
    if not hasattr(config, _AOT_CACHE):
        return None
    override = getattr(getattr(config, "_config", {}).get(_AOT_CACHE), "user_override", None)
    hash_dirty = getattr(config, "_hash_dirty_var", None)
    dict_dirty = getattr(config, "_mark_get_dict_dirty", None)
    if isinstance(override, contextvars.ContextVar) and hash_dirty is not None and dict_dirty is not None:

        def stale() -> None:
            hash_dirty.set(True)
            dict_dirty(_AOT_CACHE)

        return override, stale
    return _Held(lambda: _set_aot_cache(config, False), lambda prior: _set_aot_cache(config, prior))


def _set_aot_cache(config, value: object) -> object:
    """Write ``enable_autograd_cache`` process-wide; returns what it was."""
    prior = getattr(config, _AOT_CACHE)
    setattr(config, _AOT_CACHE, value)
    return prior

"""Issue 19, "Borrowed dispatch keys and backends that load later": the autocast keys the engine
borrows leave a backend free to register its own autocast fallback and kernels after the first
region, and regions (observing ones included) keep casting afterwards (``_dispatch``'s Note:
borrowing keys that a backend may claim later).

Each case runs in a fresh process, since a dispatcher registration lasts for the process. A
"PrivateUse1 backend" is what one registers when it loads: ``rename_privateuse1_backend``, a
fallthrough fallback on ``AutocastPrivateUse1`` and a list kernel there (``mm``), here through
``torch.library`` (a C++ backend does the same from its static initialisation). "Gaudi's bridge"
is the stand-in's registration on ``AutocastHPU`` (``_fake_habana``). The backends' kernels
record every call, and the regions' results are checked against native ``torch.autocast("cpu")``
(torch-cpu, bit for bit) and the hmp policy's lists.

Before: every case failed at the backend's registration, "Tried to register multiple backend
fallbacks for the same dispatch key AutocastPrivateUse1" (the engine held that key's fallback).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
ENV = dict(
    os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
)

_PRELUDE = textwrap.dedent("""
    import torch, torch.nn as nn
    from torch.library import Library, fallthrough_kernel
    import hpu_autocast
    from hpu_autocast import HpuAutocastMode
    from hpu_autocast._engine import dispatch as _dispatch

    torch.manual_seed(0)
    MODEL = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Softmax(-1)).eval()
    X = torch.randn(4, 8)
    called = []  # the backends' list kernels, each time one runs

    def check_regions():
        # Regions cast after the backend loaded, observing ones included: torch-cpu as native
        # autocast does, bit for bit; hmp (whose defaults for ops on no list need the observing
        # key) as its lists say: linear lower, softmax float32.
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            native = MODEL(X)
        for record in (False, True):
            with torch.no_grad(), HpuAutocastMode(policy="torch-cpu", record=record) as mode:
                out = MODEL(X)
            assert out.dtype == native.dtype and torch.equal(out, native), record
        report = mode.report()
        assert report.casts == 3 and {r.op for r in report.rows} >= {"aten.native_layer_norm.default"}
        with torch.no_grad(), HpuAutocastMode(policy="hmp", device_type="cpu"):
            hidden = MODEL[0](X)
            assert hidden.dtype == torch.bfloat16 and torch.softmax(hidden, -1).dtype == torch.float32
        assert called == [], called  # no region of ours ever reached a backend's kernel
        return str(report)

    def list_kernel(key_name):
        op = torch.ops.aten.mm.default
        below = torch._C._dispatch_keyset_full_after(getattr(torch._C.DispatchKey, key_name))

        def kernel(keyset, a, b):
            called.append(key_name)
            return op.redispatch(keyset & below, a, b)
        return kernel

    def load_privateuse1_backend():
        torch.utils.rename_privateuse1_backend("foo")
        fallback = Library("_", "IMPL", "AutocastPrivateUse1")
        if hasattr(fallback, "fallback"):
            fallback.fallback(fallthrough_kernel, "AutocastPrivateUse1")
        else:  # torch < 2.5 has no Library.fallback
            fallback.m.fallback_fallthrough()
        kernels = Library("aten", "IMPL")
        try:
            kernels.impl("mm", list_kernel("AutocastPrivateUse1"), "AutocastPrivateUse1", with_keyset=True)
        except RuntimeError as e:  # torch < 2.5's Python bookkeeping; a C++ backend never meets it
            if "already a kernel registered from python" not in str(e):
                raise
            kernels.m.impl("mm", "AutocastPrivateUse1", list_kernel("AutocastPrivateUse1"), True)
        return fallback, kernels

    def backend_autocast_works(key_name):
        # The backend's own autocast, switched on as it would be for its tensors: its kernel
        # runs for mm, and an op it does not list falls through its fallback.
        key = getattr(torch._C.DispatchKey, key_name)
        torch._C._dispatch_tls_set_dispatch_key_included(key, True)
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
        try:
            torch.mm(X, X.t()), torch.add(X, X), X.view(-1)
        finally:
            torch._C._dispatch_tls_set_dispatch_key_included(key, False)
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, True)
        assert called == [key_name], called
        called.clear()
""")


def run(body: str, *, gaudi_installed: bool = False, tmp_path=None) -> str:
    env = dict(ENV)
    if gaudi_installed:  # a findable habana_frameworks that is never imported
        (tmp_path / "habana_frameworks").mkdir()
        (tmp_path / "habana_frameworks" / "__init__.py").write_text('raise ImportError("not here")\n')
        env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    r = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(body)], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_a_privateuse1_backend_loads_after_regions():
    # The case: regions (plain and observing) run, then a PrivateUse1 backend loads. Its
    # registrations succeed, its autocast works, and regions keep casting without touching it.
    out = run("""
        before = check_regions()
        libs = load_privateuse1_backend()
        backend_autocast_works("AutocastPrivateUse1")
        assert check_regions() == before  # the observing region saw the same calls
        print(_dispatch._keys.ops_name, _dispatch._keys.all_name)
    """)
    assert out.split() == ["AutocastIPU", "AutocastHPU"]  # PrivateUse1 never borrowed


def test_a_privateuse1_backend_after_an_observing_region_where_gaudi_is_installed(tmp_path):
    # With Gaudi's bridge installed (not loaded), the observing key is AutocastPrivateUse1, kept
    # off AutocastHPU for the bridge. A PrivateUse1 backend loading after an observing region
    # registers its fallback (none is held between observing regions), its kernel overrides the
    # engine's there, and the next observing region gives the key up: it removes its own
    # registrations (the backend's autocast no longer passes through them) and moves to HPU.
    out = run(
        """
        before = check_regions()
        print(_dispatch._keys.all_name)
        libs = load_privateuse1_backend()
        assert check_regions() == before
        print(_dispatch._keys.all_name)
        backend_autocast_works("AutocastPrivateUse1")
        regs = torch._C._dispatch_get_registrations_for_dispatch_key("AutocastPrivateUse1")
        print(len(regs))  # only the backend's mm: none of the engine's left
    """,
        gaudi_installed=True,
        tmp_path=tmp_path,
    )
    assert out.split() == ["AutocastPrivateUse1", "AutocastHPU", "1"]


def test_gaudi_loads_after_regions_and_then_a_privateuse1_backend():
    # Gaudi's bridge loads after an observing region borrowed AutocastHPU: the same, the other
    # way. Then a PrivateUse1 backend loads too: both keys are claimed, so an observing region
    # is refused with an error naming both; regions that do not observe keep casting.
    out = run("""
        import sys, _fake_habana
        before = check_regions()
        print(_dispatch._keys.all_name)
        _fake_habana._register_autocast_hpu()  # what importing habana_frameworks.torch registers
        assert check_regions() == before
        print(_dispatch._keys.all_name)
        libs = load_privateuse1_backend()
        try:
            HpuAutocastMode(record=True).__enter__()
        except RuntimeError as e:
            print(str(e))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            native = MODEL(X)
        with torch.no_grad(), HpuAutocastMode(policy="torch-cpu"):
            assert torch.equal(MODEL(X), native)
        assert called == []
    """)
    lines = out.splitlines()
    assert lines[:2] == ["AutocastHPU", "AutocastPrivateUse1"]
    assert (
        "needs a second autocast dispatch key" in lines[2]
        and "PrivateUse1 backend 'foo'" in lines[2]
        and "Regions that do not observe still cast" in lines[2]
    )
    assert "AutocastHPU (a library registered a fallback there)" in lines[2]


def test_a_backend_loading_inside_an_observing_region_still_fails():
    # The limit that remains (documented): while an observing region is open, the observing
    # key's fallback is held, so a backend claiming that key then fails as before.
    out = run("""
        def claim(key_name):
            fallback = Library("_", "IMPL", key_name)
            if hasattr(fallback, "fallback"):
                fallback.fallback(fallthrough_kernel, key_name)
            else:  # torch < 2.5
                fallback.m.fallback_fallthrough()
            return fallback

        with HpuAutocastMode(record=True):
            try:
                claim(_dispatch._keys.all_name)
            except RuntimeError as e:
                print("refused:", "multiple backend fallbacks" in str(e))
        fallback = claim(_dispatch._keys.all_name)
        print("after: ok")
    """)
    assert out.split("\n")[:2] == ["refused: True", "after: ok"]

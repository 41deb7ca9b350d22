"""What the installed torch's native autocast does where torch versions differ: one probe each,
for the tests that compare against it to adapt to (skip, or leave a case out)."""

from __future__ import annotations

import torch


def _caches_with_grad() -> bool:
    w = torch.randn(2, 2, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            torch.mm(w, w)
        return torch.mm(w, w).requires_grad


#: Whether native's cast cache makes a weight's copy with grad on, also under no_grad, and none in
#: inference mode (pytorch#158232, in torch 2.13). Before it (2.4, and 2.9 still), native served a
#: copy made under no_grad to a later use with grad, which then got no gradient; the region does
#: what torch 2.13 and later do.
CACHES_WITH_GRAD = _caches_with_grad()

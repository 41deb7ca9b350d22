"""The source documents the presets are specified from, as the tests read them.

``tests/seeds`` holds copies of ``../shared/seeds`` under names that say what each document
is; ``SHARED`` is the one place that maps them to the shared (hashed) names.
"""

from __future__ import annotations

import pathlib

SEEDS = pathlib.Path(__file__).resolve().parent / "seeds"

#: tests/seeds name -> ../shared/seeds name.
SHARED = {
    "000_gaudi_autocast.txt": "000_6bf55abaf442eb78.txt",  # Intel Gaudi: Mixed Precision Training with PyTorch Autocast
    "001_gaudi_hmp.txt": "001_83843ec91814cefc.txt",  # Habana Mixed Precision (HMP)
    "002_xpu_amp.txt": "002_fa0c2f6cc3790981.txt",  # Intel XPU: Auto Mixed Precision (torch.xpu.amp)
    "003_torch_amp.txt": "003_d937faa20b0e481f.txt",  # PyTorch: torch.amp (the CUDA and CPU lists)
}


def seed_text(name: str) -> str:
    """The text of ``tests/seeds/<name>``."""
    return (SEEDS / name).read_text()

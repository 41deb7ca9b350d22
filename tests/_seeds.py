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

#: tests/seeds name -> the SHA-256 of the shared document it copies, so that a fresh clone (which
#: has no ../shared beside it) still checks every copy against its original; where ../shared/seeds
#: is beside the checkout, tests/test_hpu_preset.py also checks these digests against the originals.
SHA256 = {
    "000_gaudi_autocast.txt": "2d368996aa1204dfbc0e59309bf66fd38e6d0e926f832a5ecd5bfa0448a2282b",
    "001_gaudi_hmp.txt": "2ac4cc2454b13192cd2fb3a214f5a6592d8085b73826d52b9b22a8bec673e2f1",
    "002_xpu_amp.txt": "8a843881687c48d08b4f6cd23cea3c918715e1a576867870ecc4964480a09c4a",
    "003_torch_amp.txt": "7f638151086d0b309c08e38857ccdcfdd6a83b94e969e1683ff63093696302dd",
}


def seed_text(name: str) -> str:
    """The text of ``tests/seeds/<name>``."""
    return (SEEDS / name).read_text()

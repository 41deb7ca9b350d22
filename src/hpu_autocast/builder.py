"""``hpu_autocast.builder``, the documented path of the policies' builder (docs/migration.md,
docs/hpu.md): policies from list files, Gaudi's environment variables and optimum-habana's
``gaudi_config.json``. It re-exports the public names of ``hpu_autocast.policies.builder``, where
they live, and nothing else: a monkeypatch of the builder's state (``_warned_findings``, the
files read) goes to that module, the one the package uses."""

from .policies import builder as _builder
from .policies.builder import *  # noqa: F403 (the builder's public names, as its __all__ lists them)

__all__ = list(_builder.__all__)

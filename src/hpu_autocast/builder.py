"""``hpu_autocast.builder``, the documented path of the policies' builder (docs/migration.md,
docs/hpu.md): policies from op names, list files, Gaudi's environment variables and
optimum-habana's ``gaudi_config.json``. It re-exports the public names of
``hpu_autocast.policies.builder`` and ``hpu_autocast.policies.gaudi``, where they live, and nothing
else: a monkeypatch of the builder's state (``_warned_dropped``, the files read) goes to those
modules, the ones the package uses."""

from .policies import builder as _builder, gaudi as _gaudi
from .policies.builder import *  # noqa: F403 (the builder's public names, as its __all__ lists them)
from .policies.gaudi import *  # noqa: F403 (Gaudi's readers' public names, likewise)

__all__ = list(_builder.__all__) + list(_gaudi.__all__)

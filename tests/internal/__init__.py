"""Tests of the package's internals: private modules (``hpu_autocast._engine``, its
``dispatch`` and ``entry``, ``_facts.ops``, ``cli.report_command``, ...), private names, and
the package's source layout (the layers as packages, torch's private surface, the import graph,
the code's shape, the design doc's map). The tests one level up test what users see, through
the public API; a few of them also read a private name where the check needs one (which engine
runs, the autograd stash, a compiled policy, a builder's internals, the borrowed keys):
``test_borrowed_keys``, ``test_builder``, ``test_compile``, ``test_core``, ``test_gaudi_config``,
``test_policy``, ``test_training_ddp`` and ``test_trust``.

Note: this file makes the directory a package, ``internal``, so that its modules may share a
name with a test module one level up (``internal.test_builder`` beside ``test_builder``), and so
that pytest puts ``tests/`` on ``sys.path`` for them, where the shared helpers (``_samples``,
``_parity``, ``_seeds``) and the public test modules whose fixtures they reuse are found.
"""

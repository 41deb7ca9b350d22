"""Tests of the package's internals: private modules (``hpu_autocast._engine``, ``_dispatch``,
``_ops``, ``_report_cli``, ...), private names, and the package's source layout. The tests one
level up use the public API only.

Note: this file makes the directory a package, ``internal``, so that its modules may share a
name with a test module one level up (``internal.test_builder`` beside ``test_builder``), and so
that pytest puts ``tests/`` on ``sys.path`` for them, where the shared helpers (``_samples``,
``_parity``, ``_seeds``) and the public test modules whose fixtures they reuse are found.
"""

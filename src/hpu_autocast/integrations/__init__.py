"""Recipes for training frameworks that choose mixed precision themselves.

* ``hpu_autocast.integrations.lightning``: ``HpuAutocastPrecision``, a PyTorch Lightning precision
  plugin (``Trainer(plugins=[HpuAutocastPrecision(...)])``). Needs ``pytorch-lightning``
  (the ``lightning`` extra).

Each recipe is a module of its own and imports its framework; this package imports none of
them, so ``import hpu_autocast.integrations`` never loads a framework. (Hugging Face's
``Trainer`` and ``accelerate`` need no module: ``examples/trainer_example.py`` and
``examples/accelerate_example.py`` show the few lines each takes.)
"""

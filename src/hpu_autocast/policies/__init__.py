"""Policies: what a region casts, as data. The ``Policy`` value and its ``CastPolicy`` kinds
(``policy``), names made overloads (``names``), the dtype rules (``rules``), the fp8 scaling
recipes (``recipes``), how Gaudi's bridge reads names, list files, its variables and
``gaudi_config.json`` (``gaudi``), the presets as data (``presets``), and the one builder, from
names, presets, files and configurations to a ``Policy`` (``builder``), over the facts about
ATen's operators and the devices (``_facts``)."""

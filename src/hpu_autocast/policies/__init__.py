"""Policies: what a region casts, as data. The ``Policy`` value and its ``CastPolicy`` kinds
(``policy``), names made overloads (``names``), the dtype rules (``rules``), the one builder
(``_build``) and the presets it builds (``presets``), policies from what a user names
(``builder``), and a policy compiled for the kernels (``_table``), over the facts about ATen's
operators and the devices they read (``_ops``, ``_devices``)."""

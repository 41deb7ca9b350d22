"""Facts about torch that every layer above asks, read from torch through ``_torch``: ATen's
operators as the dispatcher knows them (``ops``: overloads, registrations, composites, schemas'
dtype arguments and written arguments, where a call's tensors can be, ATen's redispatch table for
``fp32_append_dtype``) and what a device is (``devices``: the device types a region may name, the
devices with a native autocast and its keys, the HPU's rules, the default device). Below the
policies, which name ops and devices by them; it imports nothing of the package but ``_torch``."""

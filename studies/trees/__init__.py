"""Which LongSpec tree is fastest for this device, draft and kind of text."""

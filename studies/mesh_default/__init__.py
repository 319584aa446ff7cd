"""Whether the default method decodes on a mesh (`decode.py --mesh model=3`) as it does on one device."""

"""Decoding methods, one folder each, with the same file roles (`registry` describes how one registers):

    __init__.py   registers the method (drafter builder + options) and its training kinds
    config.py     its decode options: a frozen dataclass whose fields are flags (`registry.option`)
    drafter.py    the drafter (`lsjax.engine.types.Drafter`)
    model.py      the draft model, where it has one
    checkpoint.py reading and checking its trained weights (`lsjax.artifacts`)
    train.py      its trainer (`train.py --config`), export.py its export

Subpackages are imported by `registry` on first lookup; nothing here imports them eagerly.
"""

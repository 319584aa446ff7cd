"""The command lines: `lsjax-decode` (`decode.py`) and `lsjax-train` (`train.py`). Each parses its flags into
frozen configs once, builds, runs and reports; the top-level scripts only call `main()` here."""

"""One named error for a damaged checkpoint file, whichever reader trips over it."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

from lsjax.errors import CorruptFileError, LsjaxError

# What the readers raise on a truncated or damaged file: a header field read past the end (struct), a mapped
# tensor or an mmap that does not fit the file, bad JSON or UTF-8 (ValueError), an offset past the end
# (IndexError, OverflowError).
_CORRUPT = (struct.error, ValueError, IndexError, OverflowError, EOFError)


@contextlib.contextmanager
def reading(path: str | Path, what: str):
    """Turns a reader's low-level failure on a damaged file into a one-line CorruptFileError; lsjax's own
    errors (unsupported, missing or misshapen tensors) pass through unchanged."""
    try:
        yield
    except LsjaxError:
        raise
    except _CORRUPT as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorruptFileError(f"{path}: truncated or corrupt {what} ({reason})") from None
